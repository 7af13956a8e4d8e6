"""Checkpoints that resume exactly and are never half-written.

Layout of a run directory ``OUT``::

    OUT/checkpoints/step_000010/policy/        save_pretrained: loadable by transformers and vLLM as is
    OUT/checkpoints/step_000010/adapter/       (LoRA only) the peft adapters; policy/ holds merged weights
    OUT/checkpoints/step_000010/critic.pt      (PPO only) critic state dict
    OUT/checkpoints/step_000010/trainer_state.pt  optimizer, scheduler, step, RNG states, data cursor
                                               (FSDP runs: the optimizer state keyed by parameter name)
    OUT/checkpoints/latest                     one line: the name of the newest complete checkpoint

A checkpoint is written into ``step_XXXXXX.tmp-<pid>``, flushed to disk, and renamed into place
only when complete; ``latest`` is replaced atomically after that, and older checkpoints are deleted
only then. A kill at any moment leaves ``latest`` naming a complete checkpoint; leftover ``.tmp-*``
directories are removed on the next save. The checkpoint ``latest`` names is never replaced in
place (no rename can swap a directory atomically): a trainer whose state is that checkpoint (it
resumed from it, or just wrote it) does not save it again.

Reading a checkpoint runs no code from it: ``trainer_state.pt`` and ``critic.pt`` are loaded with
``torch.load(weights_only=True)`` (tensors and plain data only), so resuming a run someone else made
is safe. A damaged file (truncated by a kill or a full disk) is a :class:`CheckpointError` naming the
file and the previous checkpoint to resume from.

The rest of the run directory's policy (``config.yaml``, refusing to write over an earlier run) is
in :mod:`sleuth.train.rundir`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sleuth.errors import RunDirError
from sleuth.train import distributed as par
from sleuth.run_layout import previous_checkpoint
from sleuth.files import fsync_path, fsync_tree, write_text_atomic


class CheckpointError(RunDirError):
    """A checkpoint that cannot be used (damaged, missing a file, or holding more than plain data);
    the message names the file and what to do."""


def rng_state() -> dict[str, Any]:
    """The RNG states, in types that ``torch.load(weights_only=True)`` reads back: Python's state
    tuple as is, numpy's with its key as a list of ints (not an ndarray), torch's as tensors."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": (str(kind), key.tolist(), int(pos), int(has_gauss), float(gauss)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s output (also the older one, whose numpy key is an ndarray)."""
    random.setstate(state["python"])
    kind, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _latest_name(ckpt_root: Path) -> str | None:
    """The checkpoint name ``latest`` holds, or None when there is no ``latest``."""
    pointer = ckpt_root / "latest"
    return pointer.read_text(encoding="utf-8").strip() if pointer.exists() else None


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
    """Write checkpoint ``step`` atomically; keep the newest ``keep`` complete ones (``keep=0``: all).

    ``policy`` is a plain Hugging Face model (FSDP runs pass one rebuilt from the gathered state);
    ``critic_state`` (a full state dict) replaces ``critic.state_dict()`` when given.

    Order, so that a kill at any point leaves ``latest`` naming a complete checkpoint: write into a
    ``.tmp-<pid>`` directory, flush it to disk, rename it into place, point ``latest`` at it, and
    only then delete older checkpoints. A checkpoint directory of the same step that ``latest`` does
    not name (a run rewound by hand) is replaced; the one ``latest`` names is refused
    (:class:`CheckpointError`): replacing it would leave a moment with no complete checkpoint, and a
    trainer at that step holds exactly its state (``Trainer.save`` does not write it again)."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = ckpt_root / name
    if _latest_name(ckpt_root) == name and final.exists():
        raise CheckpointError(f"checkpoint {final} is the one {ckpt_root / 'latest'} names; it is not written "
                              "again in place (a kill midway would leave no complete checkpoint)")
    for stale in ckpt_root.glob("*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
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
    fsync_tree(tmp)
    if final.exists():  # not the one `latest` names (refused above): no reader depends on it
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(ckpt_root)
    write_text_atomic(ckpt_root / "latest", name + "\n")
    # pruned first: steps after this one (left by a run rewound by hand: no longer its history), then the oldest
    older = sorted((p for p in ckpt_root.glob("step_*") if p.is_dir() and ".tmp-" not in p.name and p != final),
                   key=lambda p: (p.name < final.name, p.name))
    for old in older[: max(len(older) - (keep - 1), 0)] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def damaged_checkpoint_error(ckpt: Path, file: Path, problem: str) -> CheckpointError:
    """The error for a checkpoint file that cannot be read: names it and the way out (the previous
    checkpoint, when one is left)."""
    prev = previous_checkpoint(ckpt)
    pointer = ckpt.parent / "latest"
    if prev is not None:
        hint = (f"resume from the previous checkpoint {prev.name} instead: write its name into {pointer} "
                f"(echo {prev.name} > {pointer}) and run --resume again, then delete {ckpt.name}")
    else:
        hint = "no earlier checkpoint is left: restore the file from a copy, or start the run again with --overwrite"
    return CheckpointError(f"checkpoint {ckpt} is damaged: {file} {problem}; {hint}")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None when there is none."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    if not (path / "trainer_state.pt").exists():
        prev = previous_checkpoint(path)
        hint = (f"write the name of a complete one into it (echo {prev.name} > {pointer})" if prev is not None
                else "start the run again with --overwrite")
        raise FileNotFoundError(f"{pointer} names {path.name}, which is incomplete or missing; {hint}")
    return path


def _numpy_globals() -> list:
    """What a numpy array in a checkpoint needs under ``weights_only``: trainer states written before
    the numpy RNG key was stored as a list hold one. Building an array runs no code of the file's."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_checkpoint_file(ckpt: Path, name: str) -> Any:
    """``torch.load`` a file of a checkpoint with ``weights_only=True``: tensors and plain data, never
    code. A missing, truncated or unreadable file, and one holding other objects (a pickled class or
    function, which could run code), are a :class:`CheckpointError` naming the file."""
    path = ckpt / name
    if not path.is_file():
        raise damaged_checkpoint_error(ckpt, path, "is missing")
    scope = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5; else allow them process-wide
    if scope is None:
        torch.serialization.add_safe_globals(_numpy_globals())
    try:
        with scope(_numpy_globals()) if scope is not None else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" not in str(e).lower():
            raise damaged_checkpoint_error(ckpt, path, f"cannot be read ({str(e).strip()[:200]})") from None
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain data (a pickled class or function, which could "
            f"run code when loaded), so it is not loaded: Sleuth never writes such a file. Resume only from "
            f"checkpoints written by Sleuth; delete {ckpt.name} or point {ckpt.parent / 'latest'} at another"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:  # truncated zip, empty file, bad bytes
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]  # EOFError has no message
        raise damaged_checkpoint_error(
            ckpt, path, f"is truncated or corrupt ({why}; a kill or a full disk while it was written?)") from None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.pt`` (optimizer, scheduler, cursor, step, RNG states), read
    with ``weights_only=True``: see :func:`load_checkpoint_file`."""
    return load_checkpoint_file(ckpt, "trainer_state.pt")


def _load_safetensors(ckpt: Path, file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except SafetensorError as e:
        raise damaged_checkpoint_error(ckpt, file, f"is truncated or corrupt ({e}; a kill or a full disk while "
                                       "it was written?)") from None
    except FileNotFoundError:
        raise damaged_checkpoint_error(ckpt, file, "is missing") from None


def load_policy_weights(policy, ckpt: Path) -> None:
    """Load a checkpoint's trained weights into ``policy`` (plain or FSDP-sharded): the LoRA
    adapters when the checkpoint has them, else the full ``policy/`` safetensors."""
    if (ckpt / "adapter").exists():  # LoRA: the adapters are the trained state
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, _load_safetensors(ckpt, ckpt / "adapter" / "adapter_model.safetensors"))
        return
    files = sorted((ckpt / "policy").glob("*.safetensors"))
    if not files:
        raise damaged_checkpoint_error(ckpt, ckpt / "policy", "holds no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for w in files:
        state.update(_load_safetensors(ckpt, w))
    missing, unexpected = par.load_model_state(policy, state)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise CheckpointError(f"checkpoint {ckpt} does not match the model: missing {missing}, unexpected {unexpected}")
    if policy.config.tie_word_embeddings and not par.is_sharded(policy):  # FSDP keeps the tie itself
        policy.tie_weights()


def optimizer_state(model, optimizer: torch.optim.Optimizer, *, sharded: bool) -> dict[str, Any]:
    """What a checkpoint stores for ``optimizer``: ``state_dict()`` (keyed by position), or for an
    FSDP model the gathered full state keyed by parameter name (a collective; full on rank 0)."""
    if not sharded:
        return optimizer.state_dict()
    return par.full_optimizer_state(model, optimizer)


def load_optimizer_state(model, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, where: Path) -> None:
    """Restore ``optimizer`` from :func:`optimizer_state`'s output. A name-keyed state (from an
    FSDP run) loads into plain and sharded models alike; a position-keyed one only into plain ones."""
    by_name = any(isinstance(p, str) for g in state.get("param_groups", []) for p in g["params"])
    if by_name:
        par.load_optimizer_state(model, optimizer, state)
    elif par.is_sharded(model):
        raise CheckpointError(
            f"checkpoint {where}: its optimizer state was written by a run without train.parallel=fsdp; "
            "resume it with the same train.parallel (or in one process)"
        )
    else:
        optimizer.load_state_dict(state)
