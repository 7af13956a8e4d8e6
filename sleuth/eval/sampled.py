"""Sampled evaluation (``sleuth eval --samples N --temperature T``): pass@k beside the mean over samples.

Each question is answered ``N`` times at temperature ``T``. Exact match is then reported two ways: the
mean over all samples (mean@N, the figure a policy's sampling gets per try) and pass@k, the chance that
at least one of ``k`` samples is right, with the unbiased estimator of Chen et al. (2021, "Evaluating
Large Language Models Trained on Code"): for a question with ``c`` right of ``n`` samples,
``pass@k = 1 - C(n - c, k) / C(n, k)``, averaged over questions. Every sample is written with its
``reward`` (its exact match), so ``sleuth sft --set sft.source=trajectories --set sft.min_reward=1``
fine-tunes on the model's own right answers (rejection sampling, the iterated RFT baseline).
"""

from __future__ import annotations

from collections import defaultdict
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one question with ``c`` right answers among ``n`` samples (``k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def ks(n: int) -> list[int]:
    """The k reported for ``n`` samples: 1, 2, 4, ... up to n, and n."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return [*out, n]


def sampled_figures(rows: list[dict], samples: int, temperature: float) -> dict:
    """``results.json["sampled"]``: pass@k over all questions and per data source (rows: one per sample,
    ``id``, ``data_source``, ``em``)."""
    by_q: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_q[r["id"]].append(r)

    def block(groups: list[list[dict]]) -> dict:
        out = {"questions": len(groups)}
        for k in ks(samples):
            vals = [pass_at_k(len(g), sum(int(r["em"] == 1.0) for r in g), k) for g in groups if len(g) >= k]
            out[f"pass@{k}"] = sum(vals) / len(vals) if vals else 0.0
        return out

    sources: dict[str, list[list[dict]]] = defaultdict(list)
    for g in by_q.values():
        sources[g[0].get("data_source", "unknown")].append(g)
    return {"samples": samples, "temperature": temperature, **block(list(by_q.values())),
            "by_source": {src: block(gs) for src, gs in sorted(sources.items())}}


def sampled_lines(fig: dict) -> list[str]:
    """The ``report.md`` section of a sampled eval."""
    keys = [k for k in fig if k.startswith("pass@")]
    lines = [f"## Sampled: {fig['samples']} samples a question at temperature {fig['temperature']:g}", "",
             "EM and F1 above are means over every sample (mean@N). pass@k (%): the chance that one of k samples "
             "is right (unbiased estimator).", "", "| Source | questions | " + " | ".join(keys) + " |",
             "|" + "---|" * (len(keys) + 2)]
    for name, b in [*fig["by_source"].items(), ("All", fig)]:
        lines.append(f"| {name} | {b['questions']} | " + " | ".join(f"{100 * b[k]:.1f}" for k in keys) + " |")
    return lines + [""]
