"""The evaluation table of a Gemma-3 report, a row per evaluation of a record kept by ``gemma3_records.py``:

    python docs/experiments/gemma3_rows.py docs/experiments/gemma3_attempt13_report.json

Columns as the reports in docs/results.md have them: NQ EM, HotpotQA EM, macro EM (with both sources), F1 (macro
with both sources, else overall), searches per question, retrieval hit, answered share, and wall seconds: the
recipe's stage time (``times.tsv``: ``eval base (search)`` for ``base_search``), else the evaluation's own
``perf.seconds`` marked ``*`` (an arm run outside the recipe; its stage wall is longer by the model's loading).
A figure the summary lacks is left blank. Rows come in the record's order; rename and bold them by hand.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HEADER = ("| arm | NQ EM | HotpotQA EM | macro EM | F1 | searches / question | retrieval hit | answered | wall |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def stage_name(evaluation: str) -> str:
    """``rl_search`` -> ``eval rl (search)``: the recipe's name for the stage that wrote the evaluation."""
    model, _, mode = evaluation.rpartition("_")
    return f"eval {model} ({mode})"


def _num(value, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else ""


def _pct(value) -> str:
    return f"{100 * value:.1f}".removesuffix(".0") + "%" if isinstance(value, (int, float)) else ""


def row(name: str, summary: dict, stage_seconds: dict) -> str:
    sources = summary.get("by_source", {})
    both = {"nq", "hotpotqa"} <= set(sources)
    macro = summary.get("macro", {}) if both else {}
    seconds = stage_seconds.get(stage_name(name))
    wall = f"{seconds:,} s" if seconds is not None else (
        f"{round(summary['perf']['seconds']):,} s *" if "seconds" in summary.get("perf", {}) else "")
    searches = summary.get("searches")
    cells = [_num(sources.get("nq", {}).get("em"), 3), _num(sources.get("hotpotqa", {}).get("em"), 3),
             _num(macro.get("em"), 3), _num(macro.get("f1", summary.get("f1")), 3),
             "0" if searches == 0 else _num(searches, 3),
             _pct(summary.get("retrieval_hit")) if searches else "",
             _pct(summary.get("stop_reasons", {}).get("answered", 0.0)), wall]
    return f"| {name} | " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        raise SystemExit(f"{path}: no such record (write one with docs/experiments/gemma3_records.py)")
    record = json.loads(path.read_text(encoding="utf-8"))
    held = record.get("evaluations")
    if not held:
        raise SystemExit(f"{path}: holds no evaluations (a selection record keeps arms: not a report's table)")
    print(HEADER)
    for name, evaluation in held.items():
        print(row(name, evaluation["summary"], record.get("stage_seconds", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
