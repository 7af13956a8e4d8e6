"""Paired comparison of two evals of the same questions (``sleuth eval --baseline DIR``).

Two runs on the same questions are compared question by question: the difference in EM (and F1) with a
95% interval from a paired bootstrap (the questions resampled with replacement, the same resample for
both runs; a fixed seed, so a report is reproducible), the questions one run gets right and the other
wrong (gained, lost), and the difference split by whether both runs gave an answer or only one did,
which separates "answers more often" from "answers better". Per data source and over all questions.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where the comparison runs: `sleuth --help` loads this module
    import numpy as np

RESAMPLES = 2000


def _interval(diffs: np.ndarray, rng: np.random.Generator, resamples: int) -> list[float]:
    import numpy as np

    if diffs.size == 0:
        return [0.0, 0.0]
    idx = rng.integers(0, diffs.size, size=(resamples, diffs.size))
    means = diffs[idx].mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _block(pairs: list[tuple[dict, dict]], rng: np.random.Generator, resamples: int) -> dict:
    import numpy as np

    ours_em = np.array([float(a["em"]) for a, _ in pairs])
    base_em = np.array([float(b["em"]) for _, b in pairs])
    em_d = ours_em - base_em
    f1_d = np.array([float(a["f1"]) - float(b["f1"]) for a, b in pairs])
    answered = np.array([(a.get("answer") is not None, b.get("answer") is not None) for a, b in pairs]).reshape(-1, 2)
    both = answered.all(axis=1) if len(pairs) else np.zeros(0, bool)
    one = answered.any(axis=1) & ~both if len(pairs) else np.zeros(0, bool)
    return {
        "n": len(pairs),
        "em_diff": float(em_d.mean()) if em_d.size else 0.0, "em_ci95": _interval(em_d, rng, resamples),
        "f1_diff": float(f1_d.mean()) if f1_d.size else 0.0, "f1_ci95": _interval(f1_d, rng, resamples),
        "gained": int(((ours_em == 1) & (base_em == 0)).sum()), "lost": int(((ours_em == 0) & (base_em == 1)).sum()),
        "answered_by_both": {"n": int(both.sum()), "em_diff": float(em_d[both].mean()) if both.any() else 0.0},
        "answered_by_one": {"n": int(one.sum()), "em_diff": float(em_d[one].mean()) if one.any() else 0.0},
    }


def paired_comparison(ours: list[dict], base: dict[str, dict], *, seed: int = 0, resamples: int = RESAMPLES) -> dict:
    """``{"overall": ..., "by_source": {source: ...}, "seed", "resamples"}`` over the questions of ``ours``
    (eval rows: ``id``, ``data_source``, ``em``, ``f1``, ``answer``) that ``base`` (rows by id) holds."""
    import numpy as np

    pairs = [(r, base[r["id"]]) for r in ours if r["id"] in base]
    by_source: dict[str, list] = defaultdict(list)
    for a, b in pairs:
        by_source[a.get("data_source", "unknown")].append((a, b))
    rng = np.random.default_rng(seed)
    return {"overall": _block(pairs, rng, resamples),
            "by_source": {src: _block(p, rng, resamples) for src, p in sorted(by_source.items())},
            "seed": seed, "resamples": resamples, "unpaired": len(ours) - len(pairs)}


def paired_lines(paired: dict) -> list[str]:
    """The ``report.md`` table of :func:`paired_comparison` (points)."""
    head = ["Source", "n", "Δ EM [95% CI]", "Δ F1 [95% CI]", "gained", "lost", "Δ EM both answered (n)",
            "Δ EM one answered (n)"]
    lines = [f"Paired by question: this run − baseline, 95% interval from {paired['resamples']} bootstrap resamples "
             f"of the questions (seed {paired['seed']}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pts(x: float) -> str:
        return f"{100 * x:+.1f}"

    rows = [*paired["by_source"].items(), ("All", paired["overall"])]
    for name, b in rows:
        lines.append("| " + " | ".join([
            name, str(b["n"]),
            f"{pts(b['em_diff'])} [{pts(b['em_ci95'][0])}, {pts(b['em_ci95'][1])}]",
            f"{pts(b['f1_diff'])} [{pts(b['f1_ci95'][0])}, {pts(b['f1_ci95'][1])}]",
            str(b["gained"]), str(b["lost"]),
            f"{pts(b['answered_by_both']['em_diff'])} ({b['answered_by_both']['n']})",
            f"{pts(b['answered_by_one']['em_diff'])} ({b['answered_by_one']['n']})"]) + " |")
    return lines + [""]
