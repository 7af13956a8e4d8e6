"""vLLM in-process backend (optional: ``pip install 'sleuth[gpu]'`` on a CUDA machine).

``vllm`` is imported only when the backend is built, so the rest of Sleuth never needs it. One
``LLM.generate`` call per round with one ``SamplingParams`` per row (its own seed and token cap),
prompts given as token ids. ``include_stop_str_in_output=True`` keeps the token that completed
a stop string (our stop rule); the sampled ids come back as ``CompletionOutput.token_ids``.

Logprobs: we ask the engine for ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10), i.e. after
temperature, which matches our convention while top-k/top-p are off; older vLLM returns raw
logprobs (temperature 1) and the engine is built without the option.

Training (``rollout.backend: vllm``, :meth:`VLLMBackend.from_trainer`): the engine is built in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) from the policy's config and tokenizer with
``load_format="dummy"`` (no checkpoint is written or read), then :meth:`VLLMBackend.load_weights`
takes the trainer's weights (``sleuth.train.engine`` unwraps, merges LoRA and gathers FSDP shards):
at start and after every update. The push calls the vLLM
model's own ``load_weights`` (which maps Hugging Face names onto its fused layers) through, in
order of preference: the model runner reached by attribute (V0, and V1 in-process:
``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model``), or
``LLM.apply_model`` (V1; ships the weights to the worker when the engine runs in another
process). The prefix cache is reset after a push: cached keys/values were computed by the old
weights.

Under torchrun every rank builds its own engine at the same time, in vLLM's external launcher
mode (``distributed_executor_backend="external_launcher"``): the engine joins the trainer's
process group instead of spawning workers; ``rollout.vllm_tensor_parallel_size`` ranks hold one
engine (they must submit the same prompts, with the same engine seed). Each rank pushes the full
weights into its engine (vLLM's ``load_weights`` keeps its tensor-parallel slice). With ``rollout.vllm_sleep`` the engine sleeps (level 2: weights
and KV cache freed) from the end of a rollout until the next push, which wakes the weights'
memory, loads them, then wakes the KV cache. :meth:`VLLMBackend.close` shuts the engine down
while the process group is alive. Written against vLLM 0.32.0 (``pip install 'sleuth[gpu]'``)
and tested on CPU against a stub engine only: it has not run on a GPU here.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from sleuth.errors import ConfigError, UserError
from sleuth.rollout.backends import GenerationResult, SamplingParams, check_prompts, finish_from_server, row_caps
from sleuth.rollout.hf_backend import eos_ids  # the same eos set as the HF backend

MAX_TEMPERATURE = 2.0  # vLLM 0.32/0.33 SamplingParams refuse a higher temperature
INSTALL_HINT = "pip install 'sleuth[gpu]' on a CUDA machine, or set rollout.backend=hf"
# where the model lives in a vLLM engine built in this process (newest first)
MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",  # V0 >= 0.6; V1 in-process
    "llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model",  # V1
    "llm_engine.model_executor.driver_worker.model_runner.model",  # older V0
)


class VLLMUnavailable(UserError, ImportError):
    """vLLM cannot run here (not installed, or no CUDA): printed by the CLI as an input error."""


def vllm_available() -> bool:
    """True when ``import vllm`` works (it needs a CUDA build of torch)."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def cuda_available() -> bool:
    return torch.cuda.is_available()


class VLLMBackend:
    """Batched generation with an in-process ``vllm.LLM``."""

    def __init__(self, model: str, eos_token_ids: list[int] | None = None, **engine_kwargs):
        try:
            import vllm
        except ImportError as e:
            raise VLLMUnavailable(f"the vLLM backend needs vllm ({e}): {INSTALL_HINT}") from e
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        try:
            self.llm = vllm.LLM(model=model, **engine_kwargs)
        except TypeError:  # vLLM without logprobs_mode
            engine_kwargs.pop("logprobs_mode")
            self.llm = vllm.LLM(model=model, **engine_kwargs)
        if eos_token_ids is None:
            eos_token_ids = [self.llm.get_tokenizer().eos_token_id]
        self.eos_token_ids = list(eos_token_ids)

    @classmethod
    def from_trainer(cls, model, tokenizer, work_dir, rollout, *, dtype: str, seed: int = 0,
                     rank: int = 0, world_size: int = 1) -> "VLLMBackend":
        """An engine for training rollouts on ``model``'s architecture (the plain ``transformers`` model,
        unwrapped), with dummy weights until the trainer pushes its own (:meth:`load_weights`).

        ``work_dir`` receives the config and tokenizer the engine is built from (kilobytes; one
        directory per rank under torchrun); ``rollout`` is the run's ``RolloutConfig`` (engine
        options, ``max_context_tokens``). Under torchrun (``world_size > 1``) every rank calls
        this at the same time (building the engines is a collective): vLLM's external launcher
        mode reuses the trainer's process group, ``rollout.vllm_tensor_parallel_size`` ranks hold
        one engine, and the ranks of such a group share the engine's seed (they must sample
        alike). Errors name what is missing and what to do (:class:`VLLMUnavailable`, a ``UserError``).
        """
        tp = rollout.vllm_tensor_parallel_size
        if world_size % tp:
            raise UserError(f"rollout.vllm_tensor_parallel_size={tp} must divide the number of ranks ({world_size})")
        if rollout.temperature > MAX_TEMPERATURE:
            raise UserError(f"rollout.temperature={rollout.temperature}: vLLM samples at temperatures up to "
                            f"{MAX_TEMPERATURE} (it refuses higher ones); lower it or use rollout.backend=hf")
        require_vllm("rollout.backend=vllm")
        work_dir = Path(work_dir) / f"rank_{rank}" if world_size > 1 else Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        plain = model
        if not plain.config.architectures:  # vLLM picks its model class from this field
            plain.config.architectures = [type(plain).__name__]
        plain.config.save_pretrained(work_dir)
        if getattr(plain, "generation_config", None) is not None:  # vLLM stops on its eos ids too
            plain.generation_config.save_pretrained(work_dir)
        tokenizer.save_pretrained(work_dir)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: pushes are copies
        engine = {"load_format": "dummy", "dtype": dtype, "seed": seed + rank // tp,
                  "max_model_len": rollout.max_context_tokens, "enforce_eager": rollout.vllm_enforce_eager,
                  "gpu_memory_utilization": rollout.vllm_gpu_memory_utilization,
                  "enable_sleep_mode": rollout.vllm_sleep}  # fmt: skip
        if world_size > 1:  # one engine per rank (tp = 1) or per group of tp ranks, on the trainer's group
            engine.update(distributed_executor_backend="external_launcher", tensor_parallel_size=tp)
        with kept_rng_state():  # building the engine seeds every generator: the run's stay as they were
            backend = cls(str(work_dir), eos_token_ids=eos_ids(plain, tokenizer), **engine)
        backend.sleep_mode = rollout.vllm_sleep
        return backend

    sleep_mode = False  # engines built by from_trainer with rollout.vllm_sleep
    asleep = False

    def sleep(self) -> None:
        """Free the engine's weights and KV cache until the next :meth:`load_weights` (vLLM sleep
        level 2: nothing is kept, the next push brings the weights); a no-op without sleep mode."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs in Hugging Face naming into the engine (waking it first: its
        weights' memory, then, once they are in, its KV cache); returns how many tensors were pushed.
        The trainer's side (unwrapping, LoRA merge, FSDP gathering) is ``sleuth.train.engine``'s."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        load_into_engine(self.llm, weights)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):
            reset()
        return len(weights)

    def close(self) -> None:
        """Shut the engine down now, while the process group is alive (its finalizer would otherwise
        run at some later garbage collection and tear the trainer's process group down with it)."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None) or getattr(llm, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def _params(self, params: SamplingParams, seed: int | None, cap: int):
        import vllm

        if not params.is_greedy and params.temperature > MAX_TEMPERATURE:
            raise ConfigError(f"temperature {params.temperature}: vLLM samples at temperatures up to {MAX_TEMPERATURE}")

        return vllm.SamplingParams(
            n=1,
            temperature=0.0 if params.is_greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=cap,
            seed=None if seed is None else seed % (2**31 - 1),
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            logprobs=0,
        )

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[GenerationResult]:
        """All rows in one ``LLM.generate`` call; results in prompt order."""
        check_prompts(prompts, seeds)
        if self.llm is None or self.asleep:
            raise RuntimeError("this vLLM engine is " + ("closed" if self.llm is None else
                               "asleep: load_weights() wakes it with the current weights"))
        caps = row_caps(params, len(prompts), max_new_tokens)
        results = [GenerationResult([], [], "length") for _ in prompts]
        rows = [i for i, c in enumerate(caps) if c > 0]
        if not rows:
            return results
        outs = self.llm.generate(
            [{"prompt_token_ids": list(prompts[i])} for i in rows],
            [self._params(params, None if seeds is None else seeds[i], caps[i]) for i in rows],
            use_tqdm=False,
        )
        for i, out in zip(rows, outs):
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = [float(comp.logprobs[j][t].logprob) for j, t in enumerate(ids)] if comp.logprobs else [0.0] * len(ids)
            finish, stop = finish_from_server(comp.finish_reason, comp.stop_reason)
            results[i] = GenerationResult(ids, lps, finish, stop)
        return results


def require_vllm(what: str) -> None:
    """``what`` needs an importable vllm and a CUDA GPU: a clear :class:`VLLMUnavailable` otherwise."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise VLLMUnavailable(f"{what} needs vllm, which is not importable ({e}): {INSTALL_HINT}") from e
    if not cuda_available():
        raise VLLMUnavailable(f"{what} needs a CUDA GPU and none is visible: {INSTALL_HINT}")


@contextlib.contextmanager
def kept_rng_state():
    """Restore the torch (CPU and CUDA), ``random`` and numpy generators on exit."""
    import random

    import numpy as np

    cpu, py, npy = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        random.setstate(py)
        np.random.set_state(npy)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class _LoadWeights:
    """``apply_model`` callable (picklable, for engines in another process): ``model.load_weights``."""

    def __init__(self, weights):
        self.weights = weights

    def __call__(self, model):
        loaded = model.load_weights(self.weights)
        return None if loaded is None else len(loaded)


def _attr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def load_into_engine(llm, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Call the engine model's ``load_weights(weights)``: by attribute when the model lives in this
    process (V0, V1 in-process), else through ``LLM.apply_model`` (V1); a clear error otherwise."""
    for path in MODEL_PATHS:
        try:
            model = _attr_path(llm, path)
        except AttributeError:
            continue
        if callable(getattr(model, "load_weights", None)):
            model.load_weights(weights)
            return
    if callable(getattr(llm, "apply_model", None)):
        llm.apply_model(_LoadWeights(weights))
        return
    import importlib.metadata as md

    try:
        version = md.version("vllm")
    except md.PackageNotFoundError:
        version = "unknown"
    raise RuntimeError(
        f"cannot push weights into this vLLM engine (vllm {version}): it exposes neither "
        f"llm.{MODEL_PATHS[0]} nor LLM.apply_model; use vLLM >= 0.8 or rollout.backend=hf"
    )
