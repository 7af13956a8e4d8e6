"""Issue #34's pre-registered analysis on the confirmation set C (docs/results.md, "RL beats SFT?").

    python bench/rl_gain_confirm.py --a1 DIR --a2 DIR [DIR ...] [--a3 DIR] [--json]

Each DIR is a finished ``sleuth eval`` of C (``trajectories.jsonl``: one row per question with ``id``,
``em``, ``f1``, ``answer``). Reported, as registered:

* every arm's EM, F1 and answered share on C (A2 per seed and with its seeds averaged);
* **the primary endpoint**: A2 - A1 in EM paired by question, A2's seeds averaged per question (kept paired:
  a question's A2 score is the mean of its seeds' 0/1 EM), with the mean, the two-sided 95% and the one-sided
  95% lower bound of a paired bootstrap (10,000 resamples of the questions, numpy seed 0); and A2 - A1 for
  each seed alone (``sleuth.eval.paired.paired_comparison``: 95% interval, gained / lost, and EM on the
  questions both answer);
* A2 - A3 the same way when ``--a3`` is given.

Success (registered): the one-sided lower bound above 0, the point estimate >= +0.03, both seeds positive;
also A2 - A3 >= +0.02, and EM on the questions both A1 and A2 answer up by >= +0.01 (each seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from sleuth.eval.paired import paired_comparison

RESAMPLES, SEED = 10_000, 0


def load(run: Path) -> dict[str, dict]:
    """An eval's rows by question id."""
    path = Path(run) / "trajectories.jsonl"
    if not path.is_file():
        raise SystemExit(f"{run}: no trajectories.jsonl (is it a finished `sleuth eval` output directory?)")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


def averaged(seeds: list[dict[str, dict]]) -> dict[str, dict]:
    """One row per question all seeds answered: EM and F1 the seeds' mean, ``answered`` the share of seeds
    that gave an answer."""
    common = set(seeds[0]).intersection(*seeds[1:])
    out = {}
    for qid in common:
        rows = [s[qid] for s in seeds]
        out[qid] = {"id": qid, "em": float(np.mean([float(r["em"]) for r in rows])),
                    "f1": float(np.mean([float(r["f1"]) for r in rows])),
                    "answered": float(np.mean([r.get("answer") is not None for r in rows]))}
    return out


def bootstrap(diffs: np.ndarray, *, seed: int = SEED, resamples: int = RESAMPLES) -> dict:
    """Mean of paired differences, its two-sided 95% interval and one-sided 95% lower bound (percentiles of
    ``resamples`` bootstrap means, the questions resampled with replacement)."""
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, diffs.size, size=(resamples, diffs.size))].mean(axis=1)
    return {"n": int(diffs.size), "mean": float(diffs.mean()), "ci95": [float(np.percentile(means, 2.5)),
            float(np.percentile(means, 97.5))], "lower95_one_sided": float(np.percentile(means, 5.0))}


def diff(ours: dict[str, dict], base: dict[str, dict], key: str = "em") -> dict:
    ids = sorted(set(ours) & set(base))
    if not ids:
        raise SystemExit("the two evaluations share no question id")
    return bootstrap(np.array([float(ours[i][key]) - float(base[i][key]) for i in ids]))


def summary(rows: dict[str, dict]) -> dict:
    vals = list(rows.values())
    answered = [r["answered"] if "answered" in r else float(r.get("answer") is not None) for r in vals]
    return {"n": len(vals), "em": float(np.mean([float(r["em"]) for r in vals])),
            "f1": float(np.mean([float(r["f1"]) for r in vals])), "answered": float(np.mean(answered))}


def analyse(a1: dict, a2_seeds: list[dict], a3: dict | None = None) -> dict:
    a2 = averaged(a2_seeds)
    per_seed = [paired_comparison(list(s.values()), a1, seed=SEED, resamples=RESAMPLES)["overall"] for s in a2_seeds]
    out = {
        "arms": {"A1": summary(a1), **{f"A2 seed {i}": summary(s) for i, s in enumerate(a2_seeds)},
                 "A2 (seeds averaged)": summary(a2), **({"A3": summary(a3)} if a3 is not None else {})},
        "primary_A2_minus_A1": diff(a2, a1),
        "f1_A2_minus_A1": diff(a2, a1, "f1"),
        "per_seed_A2_minus_A1": per_seed,
    }
    p = out["primary_A2_minus_A1"]
    out["success"] = {
        "lower_bound_above_0": p["lower95_one_sided"] > 0, "point_at_least_0.03": p["mean"] >= 0.03,
        "both_seeds_positive": all(s["em_diff"] > 0 for s in per_seed),
        "answered_by_both_at_least_0.01": all(s["answered_by_both"]["em_diff"] >= 0.01 for s in per_seed),
    }
    if a3 is not None:
        out["A2_minus_A3"] = diff(a2, a3)
        out["per_seed_A2_minus_A3"] = [paired_comparison(list(s.values()), a3, seed=SEED,
                                                         resamples=RESAMPLES)["overall"] for s in a2_seeds]
        out["success"]["A2_minus_A3_at_least_0.02"] = out["A2_minus_A3"]["mean"] >= 0.02
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a1", type=Path, required=True, help="A1's eval of C")
    ap.add_argument("--a2", type=Path, nargs="+", required=True, help="A2's evals of C, one per seed")
    ap.add_argument("--a3", type=Path, default=None, help="A3's eval of C")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    res = analyse(load(args.a1), [load(d) for d in args.a2], load(args.a3) if args.a3 else None)
    for name, s in res["arms"].items():
        print(f"{name:>20}: EM {s['em']:.3f}  F1 {s['f1']:.3f}  answered {s['answered']:.1%}  (n {s['n']})")
    p = res["primary_A2_minus_A1"]
    print(f"A2 - A1 (seeds averaged): EM {p['mean']:+.4f}, 95% {p['ci95'][0]:+.4f} to {p['ci95'][1]:+.4f}, "
          f"one-sided lower {p['lower95_one_sided']:+.4f} (n {p['n']})")
    for i, s in enumerate(res["per_seed_A2_minus_A1"]):
        print(f"  seed {i}: EM {s['em_diff']:+.4f} ({s['em_ci95'][0]:+.4f} to {s['em_ci95'][1]:+.4f}), "
              f"{s['gained']} gained / {s['lost']} lost, both answered {s['answered_by_both']['em_diff']:+.4f} "
              f"(n {s['answered_by_both']['n']})")
    if "A2_minus_A3" in res:
        d = res["A2_minus_A3"]
        print(f"A2 - A3: EM {d['mean']:+.4f}, 95% {d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}")
    print("success:", res["success"])
    if args.json:
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
