"""A training run's curve on its training questions, a row a step, as the Gemma-3 reports quote it:

    python docs/experiments/gemma3_curves.py runs/gemma3/zero16/rl docs/experiments/gemma3_attempt14_report.json

Each argument is a training stage's directory (or its ``metrics.jsonl``), or a run's records in git
(``gemma3_records.py``'s JSON: its ``rl`` stage, or ``FILE.json:STAGE``); one markdown table each, with per step: the
mean reward, the groups with a spread in reward of those drawn, the dynamic-sampling rounds, searches per sample,
the answered share, the samples cut by the turn's token budget (``max_tokens``) and by the context
(``context_full``) of those drawn, the cut samples in the trained batch (``rollout/overlong_trajectories``: left out
of the loss under ``train.overlong=mask``), the rows left out of the update's passes (``algo/rows_skipped``, under
``train.skip_zero_advantage``), the share of token slots the update computed (``perf/computed_token_share``), the
policy's entropy, the step's seconds, the seconds after its rollouts (``perf/train_s``: the update and the weights'
step) and the update's memory peak. Counts are the logged ones; a figure the run did not log (or its records did not
keep: those written before 2026-11-30 kept 12 figures a step) is left blank. Steps are the rows that carry a reward
(the trainer's evaluation rows are left out); the last line sums the step seconds.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemma3_records import steps as stage_steps  # noqa: E402  (how the records read a stage's steps)

COLUMNS = (  # (header, metric, digits)
    ("reward", "reward/mean", 3), ("groups with a spread", "groups/reward_variance_count", 0),
    ("groups drawn", "groups/count", 0), ("rounds", "sampling/rounds", 0),
    ("searches", "rollout/searches_mean", 2), ("answered", "rollout/answered_frac", 2),
    ("cut by the turn's budget", "rollout/stop/max_tokens", 0), ("cut by the context", "rollout/stop/context_full", 0),
    ("drawn", "rollout/trajectories", 0), ("cut in the batch", "rollout/overlong_trajectories", 0),
    ("rows skipped", "algo/rows_skipped", 0), ("computed share", "perf/computed_token_share", 2),
    ("entropy", "algo/entropy", 2), ("step s", "perf/step_s", 0), ("after rollouts s", "perf/train_s", 0),
    ("update peak GiB", "mem/update_peak_gib", 2),
)


def recorded_steps(arg: str) -> list[dict]:
    """The training steps a records file keeps (``FILE.json`` or ``FILE.json:STAGE``), numbered from 1 where the
    records did not keep the step."""
    name, _, stage = arg.rpartition(".json")  # the last ".json": a folder's name may hold one
    path, stage = Path(name + ".json"), stage.removeprefix(":") or "rl"
    if not path.is_file():
        raise SystemExit(f"{path}: no such records file")
    stages = json.loads(path.read_text(encoding="utf-8")).get("training", {})
    if stage not in stages:
        raise SystemExit(f"{path}: no training stage {stage!r} (it has: {', '.join(stages) or 'none'})")
    return [{"step": i, **r} for i, r in enumerate(stages[stage]["per_step"], 1)]


def steps(path: Path) -> list[dict]:
    """The training steps of a stage's directory (or of its ``metrics.jsonl``)."""
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        raise SystemExit(f"{path}: no metrics.jsonl (give a training stage's directory, e.g. runs/gemma3/zero11/rl)")
    return stage_steps(metrics)


def _cell(value, digits: int) -> str:
    return "" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = ["| step | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|---:|" + "---:|" * len(COLUMNS)]
    for r in rows:
        lines.append(f"| {r['step']} | " + " | ".join(_cell(r.get(m), d) for _, m, d in COLUMNS) + " |")
    seconds = sum(r.get("perf/step_s", 0.0) for r in rows)
    lines.append(f"\n{len(rows)} steps, {seconds / 60:.1f} minutes of steps")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    for arg in args:
        rows = recorded_steps(arg) if arg.endswith(".json") or ".json:" in arg else steps(Path(arg))
        print(f"### {arg}\n\n{table(rows)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
