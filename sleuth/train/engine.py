"""The rollout engine of a training run: which backend generates, its lifecycle, and the weight push.

``rollout.backend: hf`` / ``hf_static`` generate with the very module being trained (built at the first
rollout and kept: a compiled step too); ``vllm`` holds an engine of its own, built from the policy's
config with dummy weights after any resume, the trainer's weights pushed into it at start and after
every update (:meth:`RolloutEngine.push`; LoRA merged out of place, FSDP shards gathered), asleep during
the update when ``rollout.vllm_sleep``. Under torchrun with a tensor-parallel vLLM engine,
``rollout.vllm_tensor_parallel_size`` ranks generate their questions together (:meth:`share`).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from sleuth.models import base_model, unwrap
from sleuth.rollout.hf_static import hf_backend
from sleuth.rollout.loop import run_rollouts
from sleuth.train import distributed as par


def trainer_weights(model) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` in Hugging Face naming: ``model``'s state dict, detached (no copy).

    A peft LoRA model gives its base weights with the active adapters' deltas added out of place
    (the trainer's weights are never touched) and no adapter tensors. FSDP2's DTensor shards are
    gathered one by one (a collective, in the same order on every rank)."""
    model = unwrap(model)
    base = base_model(model)
    if base is model:
        return [(name, t.full_tensor() if isinstance(t, DTensor) else t.detach())
                for name, t in model.state_dict().items()]
    from peft.tuners.lora import LoraLayer

    deltas = {}
    with torch.no_grad():
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer) and not getattr(mod, "merged", False):
                for adapter in mod.active_adapters:
                    if adapter in mod.lora_A:
                        delta = mod.get_delta_weight(adapter)
                        deltas[f"{name}.weight"] = deltas.get(f"{name}.weight", 0) + delta
        out = []
        for name, t in base.state_dict().items():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            out.append((name, (t + deltas[name].to(t.dtype)) if name in deltas else t.detach()))
    return out


class RolloutEngine:
    def __init__(self, cfg, policy, tokenizer, ctx, work_dir: Path):
        self.cfg, self.policy, self.tokenizer, self.ctx, self.work_dir = cfg, policy, tokenizer, ctx, Path(work_dir)
        self.vllm = None  # the vLLM engine (rollout.backend: vllm), built by start()
        self._hf = None  # the HF-family backend, built at the first rollout and kept (a compiled step too)

    def start(self) -> None:
        """Build the vLLM engine (every rank at once under torchrun), holding the policy's current weights."""
        if self.cfg.rollout.backend != "vllm":
            return
        from sleuth.rollout.vllm_backend import VLLMBackend  # lazy: only rollout.backend=vllm runs need it

        self.vllm = VLLMBackend.from_trainer(base_model(self.policy), self.tokenizer, self.work_dir / "vllm_engine",
                                             self.cfg.rollout, dtype=self.cfg.model.dtype, seed=self.cfg.train.seed,
                                             rank=self.ctx.rank, world_size=self.ctx.world_size)
        self.push()

    @property
    def tp(self) -> int:
        """Ranks that generate together: a tensor-parallel vLLM engine's group (1 otherwise)."""
        return self.cfg.rollout.vllm_tensor_parallel_size if self.vllm is not None else 1

    @property
    def samples_from_policy(self) -> bool:
        """Whether the rollout samples with the trained module itself (the HF backends), not another engine."""
        return self.vllm is None

    def backend(self):
        """What generates: the vLLM engine, else the HF backend ``rollout.backend`` names."""
        if self.vllm is not None:
            return self.vllm
        if self._hf is None:
            self._hf = hf_backend(self.policy, self.tokenizer, self.cfg.rollout)
        return self._hf

    def share(self, questions: list, per_rank: int) -> tuple[list, range | None, list]:
        """``(generated, keep, mine)``: the questions this rank generates (its tensor-parallel group's),
        which of their trajectories it keeps (None: all) and its own share of the step's questions."""
        rank, tp = self.ctx.rank, self.tp
        mine = questions[rank * per_rank : (rank + 1) * per_rank]
        first = rank // tp * tp
        together = questions[first * per_rank : (first + tp) * per_rank]
        own = range((rank - first) * per_rank, (rank - first + 1) * per_rank)
        return together, (own if tp > 1 else None), mine

    def rollout(self, questions, fmt, retriever, *, step: int = 0, greedy: bool = False, group_size=None, keep=None):
        """Trajectories and rollout metrics for ``questions`` (``sleuth.rollout.loop.run_rollouts``)."""
        self.policy.eval()
        rc = self.cfg.rollout
        return run_rollouts(questions, self.backend(), self.tokenizer, fmt, retriever, rc, seed=self.cfg.train.seed,
                            step=step, k=self.cfg.retrieval.topk, greedy=greedy, group_size=group_size, keep=keep)

    def release(self) -> None:
        """After the rollout: a sleeping vLLM engine frees its weights and KV cache for the update."""
        if self.vllm is not None:
            self.vllm.sleep()

    def push(self) -> dict[str, float]:
        """The policy's current weights into the vLLM engine (every rank; waking it); ``perf/weight_sync_s``."""
        if self.vllm is None:
            return {}
        t0 = time.perf_counter()
        with par.gathered(self.policy):  # FSDP: the push gathers the full weights on every rank
            self.vllm.load_weights(trainer_weights(self.policy))
        return {"perf/weight_sync_s": time.perf_counter() - t0}

    def close(self) -> None:
        """Shut the vLLM engine down (while the process group is alive); a no-op without one."""
        engine, self.vllm = self.vllm, None
        if engine is not None:
            engine.close()
