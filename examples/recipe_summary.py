"""``OUT_DIR/summary.md`` of ``examples/smollm2_nq.sh``: EM/F1 per dataset for base, SFT and SFT+RL
with and without search (the evaluations that ran), a paired bootstrap of SFT+RL against SFT,
searches per question and stop reasons, the SFT loss and the GRPO reward / searches-per-step plots,
and example trajectories of the same questions before and after.

    python examples/recipe_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

MODELS = [("base", "base"), ("sft", "SFT"), ("rl", "SFT+RL")]
MODES = [("search", "search"), ("direct", "no search")]


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _evals(out: Path) -> dict[tuple[str, str], dict]:
    """``(model, mode) -> {"summary", "rows"}`` for the evaluations found under ``OUT/eval``."""
    found = {}
    for model, _ in MODELS:
        for mode, _ in MODES:
            d = out / "eval" / f"{model}_{mode}"
            results = d / "results.json"
            if results.is_file():
                rows = {r["id"]: r for r in _rows(d / "trajectories.jsonl")}
                found[(model, mode)] = {"summary": json.loads(results.read_text())["summary"], "rows": rows}
    return found


def paired_bootstrap(a: list[float], b: list[float], n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``b - a`` over paired items and its 95% percentile interval (``n`` resamples)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_bootstrap needs two equally long, non-empty lists")
    diffs = [y - x for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    return sum(diffs) / len(diffs), means[int(0.025 * n)], means[int(0.975 * n) - 1]


def _table(evals: dict) -> list[str]:
    sources = sorted({s for e in evals.values() for s in e["summary"]["by_source"]})
    head = ["model", "mode", *[f"{s} EM" for s in sources], *[f"{s} F1" for s in sources], "avg EM",
            "searches / question"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, name in MODELS:
        for mode, mode_name in MODES:
            e = evals.get((model, mode))
            if e is None:
                continue
            s = e["summary"]
            by = s["by_source"]
            cells = [name, mode_name, *[f"{by[x]['em']:.3f}" if x in by else "" for x in sources],
                     *[f"{by[x]['f1']:.3f}" if x in by else "" for x in sources],
                     f"{s['macro'].get('em', s['em']):.3f}", f"{s['searches']:.2f}"]
            out.append("| " + " | ".join(cells) + " |")
    return out


def _stops(evals: dict) -> list[str]:
    out = []
    for model, name in MODELS:
        e = evals.get((model, "search"))
        if e is not None:
            stops = ", ".join(f"{k} {v:.0%}" for k, v in e["summary"]["stop_reasons"].items())
            out.append(f"- {name} (search): {stops}")
    return out


def _comparison(evals: dict) -> list[str]:
    sft, rl = evals.get(("sft", "search")), evals.get(("rl", "search"))
    if sft is None or rl is None:
        return []
    ids = [i for i in sft["rows"] if i in rl["rows"]]
    if not ids:
        return []
    mean, lo, hi = paired_bootstrap([sft["rows"][i]["em"] for i in ids], [rl["rows"][i]["em"] for i in ids])
    out = [f"SFT+RL minus SFT, EM with search, paired over {len(ids)} questions: {mean:+.3f} "
           f"(95% bootstrap interval {lo:+.3f} to {hi:+.3f}; 10,000 resamples, seed 0)."]
    direct = evals.get(("rl", "direct"))
    if direct is not None:
        ratio = rl["summary"]["em"] / direct["summary"]["em"] if direct["summary"]["em"] else float("inf")
        out.append(f"SFT+RL with search / without: EM {rl['summary']['em']:.3f} / {direct['summary']['em']:.3f} "
                   f"({ratio:.1f}x).")
    return out


def _plots(out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = []
    rl = _rows(out / "rl" / "metrics.jsonl")
    if rl:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        steps = [r["step"] for r in rl]
        ax.plot(steps, [r.get("reward/mean") or 0 for r in rl], label="reward")
        ax.plot(steps, [r.get("reward/em") or 0 for r in rl], label="EM")
        ax.plot(steps, [r.get("rollout/searches_mean") or 0 for r in rl], label="searches / sample")
        ax.set_xlabel("GRPO step")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "reward.png", dpi=110)
        plt.close(fig)
        lines += ["![GRPO reward, EM and searches per step](reward.png)", ""]
    sft = _rows(out / "sft" / "metrics.jsonl")
    if sft:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([r["step"] for r in sft], [r.get("sft/loss") or 0 for r in sft])
        ax.set_xlabel("SFT step")
        ax.set_ylabel("loss (trained tokens)")
        fig.tight_layout()
        fig.savefig(out / "sft_loss.png", dpi=110)
        plt.close(fig)
        lines += ["![SFT loss per step](sft_loss.png)", ""]
    return lines


def _examples(evals: dict, n_per_source: int = 2) -> list[str]:
    have = [(m, name) for m, name in MODELS if (m, "search") in evals]
    if not have:
        return []
    first = evals[(have[0][0], "search")]["rows"]
    picked, per = [], {}
    for qid, row in first.items():
        if per.get(row["data_source"], 0) < n_per_source:
            per[row["data_source"]] = per.get(row["data_source"], 0) + 1
            picked.append(qid)
    out = []
    for qid in picked:
        row = first[qid]
        out += [f"### {row['question']} (gold: {', '.join(row['golden_answers'])})", ""]
        for model, name in have:
            r = evals[(model, "search")]["rows"].get(qid)
            if r is None:
                continue
            text = (r.get("response") or "").strip()
            text = text if len(text) < 1500 else text[:1500] + " …"
            out += [f"**{name}** (EM {r['em']:.0f}, {r['searches']} searches, {r['stop_reason']}):", "", "```",
                    text, "```", ""]
    return out


def _wall(out: Path) -> list[str]:
    path = out / "times.tsv"
    if not path.is_file():
        return []
    total: dict[str, float] = {}  # a rerun of the script (it resumes) appends its stages again: summed
    runs: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stage, seconds = line.split("\t")
        total[stage] = total.get(stage, 0.0) + float(seconds)
        runs[stage] = runs.get(stage, 0) + 1
    lines = ["| stage | wall time |", "|---|---|"]
    for stage, seconds in total.items():
        note = f" ({runs[stage]} invocations, summed)" if runs[stage] > 1 else ""
        lines.append(f"| {stage} | {seconds / 60:.1f} min{note} |")
    return lines


def write_summary(out: Path) -> Path:
    evals = _evals(out)
    md = ["# SmolLM2-135M-Instruct learns to search: SFT, then GRPO", "",
          "Written by `examples/recipe_summary.py` from the run in this directory (`sft/`, `rl/`, `eval/`).", ""]
    md += ["## Evaluation", ""]
    if evals:
        md += _table(evals) + [""] + _comparison(evals) + [""] + ["Stop reasons:", ""] + _stops(evals) + [""]
    else:
        md += ["No evaluation ran (`--no-eval`): evaluate `sft/` and `rl/` with `sleuth eval --model DIR`.", ""]
    md += ["## Wall time", ""] + _wall(out) + ["", "## Training curves", ""] + _plots(out)
    md += ["## Example trajectories (greedy, with search)", ""] + _examples(evals)
    path = out / "summary.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/recipe_summary.py OUT_DIR")
    print(write_summary(Path(sys.argv[1])))
