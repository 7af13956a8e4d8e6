"""Where a run keeps its checkpoints: ``RUN/checkpoints/step_NNNNNN/`` (complete once it holds
``trainer_state.pt``) and ``RUN/checkpoints/latest`` (the newest one's name). Written by the trainer
(:mod:`sleuth.train.checkpoint`); read there and wherever a run directory stands for a model
(:mod:`sleuth.models`)."""

from __future__ import annotations

from pathlib import Path


def previous_checkpoint(ckpt: Path) -> Path | None:
    """The newest complete checkpoint of the same run older than ``ckpt``, or None."""
    root = ckpt.parent
    older = [p for p in root.glob("step_*") if p.is_dir() and ".tmp-" not in p.name and p.name < ckpt.name
             and (p / "trainer_state.pt").exists()]
    return max(older, default=None)
