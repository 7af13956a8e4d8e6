"""Shared pieces of the GPU benchmarks (``bench/gpu_train.py``, ``gpu_decode.py``, ``gpu_retrieval.py``).

* :data:`SPECS`: vendor spec-sheet peaks (bf16 dense tensor TFLOP/s, HBM TB/s) looked up by a
  substring of ``torch.cuda.get_device_name()``; every script takes ``--peak-tflops`` /
  ``--bandwidth`` to override them (and to give them on CPU, where nothing is looked up).
* :func:`qwen2_config`: the ~0.5B Qwen2 architecture (Qwen2.5-0.5B's shapes, tied embeddings,
  494M parameters) or, with ``tiny=True``, a few-layer toy of it that runs in seconds on CPU.
* :func:`timed`: wall time of a callable with the device synchronised around it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

# (substring of the device name, label, bf16 dense TFLOP/s, HBM TB/s); more specific names first
SPECS = [
    ("H100 PCIe", "H100 PCIe", 756.0, 2.0),
    ("H100 NVL", "H100 NVL", 835.0, 3.9),
    ("H100", "H100 SXM", 989.0, 3.35),
    ("H200", "H200", 989.0, 4.8),
    ("A100-SXM4-80GB", "A100 SXM 80GB", 312.0, 2.039),
    ("A100 80GB PCIe", "A100 PCIe 80GB", 312.0, 1.935),
    ("A100", "A100 40GB", 312.0, 1.555),
]


def add_common_args(ap) -> None:
    ap.add_argument("--device", default="auto", help="auto (cuda when available) | cuda | cuda:N | cpu")
    ap.add_argument("--tiny", action="store_true", help="toy sizes that run in seconds on CPU (smoke test)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary (always the last line)")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: no CUDA GPU is visible here (use --device cpu)")
    return device


def device_spec(device: torch.device, peak_tflops: float | None = None,
                bandwidth_tbs: float | None = None) -> dict:
    """``{"device_name", "spec", "peak_tflops", "bandwidth_tbs"}``; overrides win over the table."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    label, peak, bw = None, None, None
    for key, lab, p, b in SPECS if device.type == "cuda" else []:
        if key in name:
            label, peak, bw = lab, p, b
            break
    return {
        "device_name": name,
        "spec": label,
        "peak_tflops": peak_tflops if peak_tflops is not None else peak,
        "bandwidth_tbs": bandwidth_tbs if bandwidth_tbs is not None else bw,
    }


def qwen2_config(tiny: bool = False):
    """Qwen2.5-0.5B's architecture (random weights are built from it), or a toy of it."""
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
                           max_position_embeddings=4096, bos_token_id=None, eos_token_id=None)
    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=32768, bos_token_id=None, eos_token_id=None)


def build_model(config, device: torch.device, dtype: torch.dtype, attn: str = "sdpa", seed: int = 0):
    """A randomly initialised causal LM from ``config``, created directly on ``device``."""
    from transformers import AutoModelForCausalLM

    config._attn_implementation = attn
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def num_params(model) -> int:
    """Parameters, tied ones counted once (``parameters()`` de-duplicates shared tensors)."""
    return sum(p.numel() for p in model.parameters())


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int = 1) -> float:
    """Best wall time of ``repeats`` calls, the device synchronised before and after each."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def peak_memory_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def report(result: dict, as_json: bool) -> None:
    """Human-readable lines (unless ``--json``), then the JSON summary as the last stdout line."""
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    if not as_json:
        for k, v in result.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):  # a table: one line per row
                print(f"{k:>34}:")
                for row in v:
                    print(" " * 36 + ", ".join(f"{rk}={fmt(rv)}" for rk, rv in row.items()))
            else:
                print(f"{k:>34}: {fmt(v)}")
    print(json.dumps(result), flush=True)


# SmolLM2-135M's architecture (a Llama): the GPU check's random-weight stand-in when the GGUF did not
# reach the machine, and the shape its tiny dry-run copies.
def smollm2_config(tiny: bool = False):
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
                           max_position_embeddings=2048, bos_token_id=None, eos_token_id=None)
    return LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                       num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                       max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                       bos_token_id=None, eos_token_id=None)


def add_model_arg(ap, default: str = "random-smollm2") -> None:
    ap.add_argument("--model", default=default,
                    help="a .gguf file / model directory / hub name (real weights, loaded by Sleuth's "
                         "load_policy), random-smollm2 (SmolLM2-135M's shape, random weights), or "
                         "random-qwen2 (Qwen2.5-0.5B's shape); --tiny shrinks the random ones")


def load_bench_model(spec: str, device: torch.device, tiny: bool = False, seed: int = 0):
    """``(model, tokenizer or None, label)``: float32 parameters on ``device`` (Sleuth's master
    weights; compute dtype comes from autocast). ``random-smollm2`` / ``random-qwen2`` build the
    architecture with random weights (no tokenizer), anything else goes through
    :func:`sleuth.models.load_policy` as a training run would."""
    if spec in ("random-smollm2", "random-qwen2"):
        config = smollm2_config(tiny) if spec == "random-smollm2" else qwen2_config(tiny)
        return build_model(config, device, torch.float32, seed=seed), None, spec + ("-tiny" if tiny else "")
    from sleuth.models import load_policy

    model, tokenizer = load_policy(spec, dtype="float32", device=str(device))
    return model, tokenizer, spec


def partial(result: dict, t0: float) -> None:
    """The summary so far, marked partial, on stderr: a step killed by its timeout still leaves its
    figures (the GPU check reads a step's last JSON line) and where the time went (``elapsed_s``)."""
    import sys

    print(json.dumps({**result, "partial": True, "elapsed_s": round(time.perf_counter() - t0, 2)}, default=str),
          file=sys.stderr, flush=True)
