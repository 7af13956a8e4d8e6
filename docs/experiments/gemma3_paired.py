"""Paired EM difference between two evaluations kept by ``gemma3_records.py`` (e.g. one attempt's RL model against
another's), question by question, with the recipe summary's paired bootstrap (95%, 10,000 resamples, seed 0):

    python docs/experiments/gemma3_paired.py docs/experiments/gemma3_attempt2_report.json:rl_search \\
        docs/experiments/gemma3_attempt3_report.json:rl_search

Each side is ``RECORD.json:EVALUATION`` (an evaluation under the record's ``evaluations``, or a selection arm under
its ``arms``). Prints B - A over the questions both hold (they must be the same set: a different set is an error,
not a smaller comparison), overall and per source.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from recipe_summary import paired_bootstrap  # noqa: E402  (the summary's bootstrap, so the figures compare)


def _questions(spec: str) -> dict[str, dict]:
    path, sep, name = spec.rpartition(":")
    if not sep or not Path(path).is_file():
        raise SystemExit(f"{spec}: expected RECORD.json:EVALUATION with an existing RECORD.json")
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    held = record.get("evaluations") or record.get("arms") or {}
    if name not in held:
        raise SystemExit(f"{spec}: {path} has no evaluation {name!r} (it has: {', '.join(sorted(held))})")
    return {q["id"]: q for q in held[name]["questions"]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = (_questions(s) for s in args)
    if set(a) != set(b):
        print(f"the two evaluations hold different questions ({len(set(a) - set(b))} only in A, "
              f"{len(set(b) - set(a))} only in B): not comparable", file=sys.stderr)
        return 2
    ids = list(a)  # A's order, as the recipe summary pairs them (the bootstrap draws depend on it)
    groups = {"all": ids}
    for source in sorted({a[i].get("source", "?") for i in ids}):
        groups[source] = [i for i in ids if a[i].get("source", "?") == source]
    for name, sel in groups.items():
        mean, lo, hi = paired_bootstrap([float(a[i]["em"]) for i in sel], [float(b[i]["em"]) for i in sel])
        print(f"{name}: n={len(sel)}  EM A {sum(a[i]['em'] for i in sel) / len(sel):.3f}  "
              f"B {sum(b[i]['em'] for i in sel) / len(sel):.3f}  B - A {mean:+.3f} ({lo:+.3f} to {hi:+.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
