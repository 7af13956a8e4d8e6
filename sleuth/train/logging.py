"""Metrics and sample logging: ``OUT/metrics.jsonl`` always, TensorBoard / W&B when asked, a rich
progress line on the terminal, and a few sample trajectories per step in ``OUT/samples.jsonl``.

A resumed run appends to both files after :func:`truncate_jsonl` dropped the rows of the steps it
re-does, and continues the same W&B run: its id is kept in ``OUT/wandb_id.txt``."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from sleuth.errors import RunDirError
from sleuth.eval.metrics import score_trajectory
from sleuth.records import SEGMENT_TEXT_LIMIT, prompt_record, segment_records, turn_records
from sleuth.files import fsync_path, write_text_atomic
from sleuth.types import Trajectory


def _clean(value: Any) -> Any:
    """JSON-safe scalars: NaN/inf become None (and are still visible as missing values)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def trajectory_record(traj: Trajectory, max_chars: int = SEGMENT_TEXT_LIMIT) -> dict[str, Any]:
    """A human-readable dump of one trajectory: the question, its scores (``score_trajectory``: EM,
    F1, searches, stop reason ...), the reward, every turn with its searches' passages, the prompt,
    and the segments after it with their masks (kind) and roles (``sleuth.records``)."""
    scores = score_trajectory(traj)
    del scores["id"]  # this file calls it question_id
    return {
        "question_id": traj.question.id,
        **scores,
        "sample_index": traj.sample_index,
        "reward": traj.reward,
        "passage_ids": traj.passage_ids,
        "turns_detail": turn_records(traj),
        "prompt": prompt_record(traj, max_chars),
        "segments": segment_records(traj, max_chars),
    }


def _step_of(line: bytes) -> int | None:
    """The ``step`` of one logged row, or None when the line is not such a row."""
    try:
        row = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) else None


def truncate_jsonl(path: Path, step: int) -> bool:
    """Keep the rows of ``path`` (one JSON object with a ``step`` per line) up to ``step``: a resumed
    run re-does the steps after its checkpoint. True when the file was rewritten.

    Crash-safe: the file is streamed line by line (a samples file reaches tens of MB) into a
    temporary file beside it, which is flushed to disk and renamed over it in one step, so a kill at
    any moment leaves the old file or the new one, never a part of either. Nothing is rewritten when
    nothing is dropped. A torn last line (a kill or a full disk while it was written) is dropped
    with a warning naming the file; an unreadable line before the last means the file was damaged
    some other way: a RunDirError names the file and the line, and the file is left as it is."""
    if not path.exists():
        return False
    for stale in path.parent.glob(f"{path.name}.tmp-*"):  # left by a rewrite that was killed
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    changed, torn = False, None  # torn: the number of an unreadable line, acceptable only as the last
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            for number, line in enumerate(src, 1):
                if not line.strip():
                    changed = True
                    continue
                if torn is not None:
                    raise RunDirError(
                        f"{path} line {torn} is not a logged row (not a JSON object with a step); the file was "
                        "damaged: delete that line (keep a copy of the file), then run --resume again")
                row_step = _step_of(line)
                if row_step is None:
                    torn, changed = number, True
                elif row_step > step:
                    changed = True
                else:
                    if not line.endswith(b"\n"):  # a complete last row without its newline: appends go after it
                        line, changed = line + b"\n", True
                    dst.write(line)
            if not changed:
                return False
            dst.flush()
            os.fsync(dst.fileno())
        if torn is not None:
            warnings.warn(f"{path}: dropped its last line (line {torn}), which was cut off (the run was killed "
                          "or the disk was full while writing it)", stacklevel=2)
        os.replace(tmp, path)
        fsync_path(path.parent)  # the rename itself reaches the disk
        return True
    finally:
        tmp.unlink(missing_ok=True)


def truncate_logs(out: Path, step: int) -> None:
    """Drop the rows of ``metrics.jsonl`` and ``samples.jsonl`` after ``step`` (a resumed run re-does
    the steps after its checkpoint), each file streamed and replaced atomically (:func:`truncate_jsonl`)."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        truncate_jsonl(out / name, step)


def wandb_run_id(out: Path, *, resume: bool) -> str:
    """The W&B run id of the run in ``out``: on resume the one kept in ``out/wandb_id.txt`` (so the
    same W&B run continues), else a new one, written there before W&B starts."""
    path = out / "wandb_id.txt"
    if resume and path.is_file():
        run_id = path.read_text(encoding="utf-8").strip()
        if run_id:
            return run_id
    run_id = uuid.uuid4().hex[:16]
    write_text_atomic(path, run_id + "\n")
    return run_id


class MetricsLogger:
    """One metrics dict per step, written everywhere it was asked to go (rank 0 only)."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        total_steps: int,
        tensorboard: bool = False,
        wandb: bool = False,
        config: dict | None = None,
        enabled: bool = True,
        progress: bool = True,
        resume: bool = False,
        label: str = "train",
    ):
        self.out = Path(out_dir)
        self.enabled = enabled
        self.total_steps = total_steps
        self._tb = self._wandb = self._progress = None
        self._t0 = time.time()
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        mode = "a" if resume else "w"
        self._metrics = open(self.out / "metrics.jsonl", mode)
        self._samples = open(self.out / "samples.jsonl", mode)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.out / "tensorboard"))
        if wandb:
            try:
                import wandb as wb
            except ImportError as e:
                raise ImportError("train.wandb=true needs `pip install 'sleuth[logging]'`") from e
            # resume="allow": continue the W&B run of this id, or start it when W&B has none
            self._wandb = wb.init(project="sleuth", config=config or {}, dir=str(self.out),
                                  id=wandb_run_id(self.out, resume=resume), resume="allow")
        if progress:
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn(f"[bold]{label}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._task = self._progress.add_task("train", total=total_steps, info="")
            self._progress.start()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        failed = row.get("rollout/failed_search_trajectories") or 0
        if failed:  # on the terminal too: a count in metrics.jsonl is easy to miss
            note = (f"step {step}: {failed:.0f} of {row.get('rollout/trajectories', 0):.0f} trajectories had a "
                    "failed search (retrieval errors); they were left out of the loss")
            if self._progress is not None:
                self._progress.console.print(f"[yellow]{note}")
            else:
                print(f"sleuth: warning: {note}", file=sys.stderr)
        if self._progress is not None:
            info = "  ".join(
                f"{k.split('/')[-1]}={row[k]:.3f}"
                for k in ("reward/mean", "reward/em", "rollout/searches_mean", "algo/loss", "sft/loss")
                if isinstance(row.get(k), (int, float))
            )
            self._progress.update(self._task, completed=step, info=info)

    def log_samples(self, step: int, trajectories: list[Trajectory], n: int | str = 2) -> None:
        """The first ``n`` trajectories (``"all"``: every one) into ``samples.jsonl``."""
        if not self.enabled:
            return
        for traj in trajectories if n == "all" else trajectories[:n]:
            self._samples.write(json.dumps({"step": step, **trajectory_record(traj)}) + "\n")
        self._samples.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.stop()
        self._metrics.close()
        self._samples.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
