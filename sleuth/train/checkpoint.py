"""Checkpoints that resume exactly and are never half-written.

Layout of a run directory ``OUT``::

    OUT/checkpoints/step_000010/policy/        save_pretrained: loadable by transformers and vLLM as is
    OUT/checkpoints/step_000010/adapter/       (LoRA only) the peft adapters; policy/ holds merged weights
    OUT/checkpoints/step_000010/critic.pt      (PPO only) critic state dict
    OUT/checkpoints/step_000010/trainer_state.pt  optimizer, scheduler, step, RNG states, data cursor
                                               (FSDP runs: the optimizer state keyed by parameter name)
    OUT/checkpoints/latest                     one line: the name of the newest complete checkpoint

A checkpoint is written into ``step_XXXXXX.tmp-<pid>`` and renamed into place only when complete;
``latest`` is replaced atomically after that. A kill during a save leaves the previous ``latest``
pointing at a complete checkpoint; leftover ``.tmp-*`` directories are removed on the next save.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    policy,
    tokenizer,
    trainer_state: dict[str, Any],
    critic: torch.nn.Module | None = None,
    critic_state: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically; keep the newest ``keep`` complete ones.

    ``policy`` is a plain Hugging Face model (FSDP runs pass one rebuilt from the gathered state);
    ``critic_state`` (a full state dict) replaces ``critic.state_dict()`` when given."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    for stale in ckpt_root.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
    name = f"step_{step:06d}"
    final = ckpt_root / name
    tmp = ckpt_root / f"{name}.tmp-{os.getpid()}"
    if hasattr(policy, "merge_and_unload"):  # LoRA: adapters for resuming, merged weights to serve
        policy.save_pretrained(tmp / "adapter")
        merged = copy.deepcopy(policy).merge_and_unload()
        merged.save_pretrained(tmp / "policy")
    else:
        policy.save_pretrained(tmp / "policy")
    tokenizer.save_pretrained(tmp / "policy")
    if critic_state is None and critic is not None:
        critic_state = critic.state_dict()
    if critic_state is not None:
        torch.save(critic_state, tmp / "critic.pt")
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(ckpt_root / "latest", name + "\n")
    complete = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and ".tmp-" not in p.name)
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None when there is none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    if not (path / "trainer_state.pt").exists():
        raise FileNotFoundError(f"{pointer} names {path.name}, which is incomplete or missing")
    return path


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    # weights_only=False: the state holds numpy RNG state and plain Python objects we wrote ourselves.
    return torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)


def load_policy_weights(policy, ckpt: Path) -> None:
    """Load a checkpoint's trained weights into ``policy`` (plain or FSDP-sharded): the LoRA
    adapters when the checkpoint has them, else the full ``policy/`` safetensors."""
    from safetensors.torch import load_file

    from sleuth.train import distributed as par

    if (ckpt / "adapter").exists():  # LoRA: the adapters are the trained state
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, load_file(str(ckpt / "adapter" / "adapter_model.safetensors")))
        return
    state: dict[str, torch.Tensor] = {}
    for w in sorted((ckpt / "policy").glob("*.safetensors")):
        state.update(load_file(str(w)))
    missing, unexpected = par.load_model_state(policy, state)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"checkpoint {ckpt} does not match the model: missing {missing}, unexpected {unexpected}")
    if policy.config.tie_word_embeddings and not par.is_sharded(policy):  # FSDP keeps the tie itself
        policy.tie_weights()


def optimizer_state(model, optimizer: torch.optim.Optimizer, *, sharded: bool) -> dict[str, Any]:
    """What a checkpoint stores for ``optimizer``: ``state_dict()`` (keyed by position), or for an
    FSDP model the gathered full state keyed by parameter name (a collective; full on rank 0)."""
    if not sharded:
        return optimizer.state_dict()
    from sleuth.train import distributed as par

    return par.full_optimizer_state(model, optimizer)


def load_optimizer_state(model, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, where: Path) -> None:
    """Restore ``optimizer`` from :func:`optimizer_state`'s output. A name-keyed state (from an
    FSDP run) loads into plain and sharded models alike; a position-keyed one only into plain ones."""
    from sleuth.train import distributed as par

    by_name = any(isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"])
    if by_name:
        par.load_optimizer_state(model, optimizer, state)
    elif par.is_sharded(model):
        raise ValueError(
            f"checkpoint {where}: its optimizer state was written by a run without train.parallel=fsdp; "
            "resume it with the same train.parallel (or in one process)"
        )
    else:
        optimizer.load_state_dict(state)
