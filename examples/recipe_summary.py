"""``OUT_DIR/summary.md`` of a recipe (:data:`RECIPES`): EM/F1 per dataset for each model and mode that was
evaluated, paired bootstraps of the recipe's comparisons, searches per question and stop reasons, the
training curves, and example trajectories of the same questions before and after.

* ``smollm2`` (``examples/smollm2_nq.sh``): base, SFT and SFT+RL with and without search; SFT+RL against SFT.
* ``gemma3_zero`` (``examples/gemma3_zero.sh``): base (search, no search, RAG), RL from zero and the SFT route
  (SFT then RL on the same budget) with and without search, and each on the confirmation set when one ran;
  RL against base and against base's RAG.

    python examples/recipe_summary.py OUT_DIR [--recipe smollm2|gemma3_zero]
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Recipe:
    title: str
    models: list[tuple[str, str]]  # (run name under OUT_DIR and eval/, label)
    modes: list[tuple[str, str]]  # (eval directory suffix, label)
    compare: list[tuple[tuple[str, str], tuple[str, str]]]  # ((model, mode) before, (model, mode) after)
    search_ratio: str  # the model whose EM with search over without is reported
    curves: list[tuple[str, str]]  # (run directory, label) of RL runs to plot
    sources: str  # what the run directories are, for the header


RECIPES = {
    "smollm2": Recipe(
        "SmolLM2-135M-Instruct learns to search: SFT, then GRPO",
        [("base", "base"), ("sft", "SFT"), ("rl", "SFT+RL")], [("search", "search"), ("direct", "no search")],
        [(("sft", "search"), ("rl", "search"))], "rl", [("rl", "GRPO")], "`sft/`, `rl/`, `eval/`"),
    "gemma3_zero": Recipe(
        "The base Gemma-3-270M learns to search by RL alone",
        [("base", "base"), ("rl", "RL from zero"), ("sft_rl", "SFT route (SFT+RL)")],
        [("search", "search"), ("direct", "no search"), ("rag", "RAG"), ("confirm", "search, confirmation set")],
        [(("base", "search"), ("rl", "search")), (("base", "rag"), ("rl", "search")),
         (("sft_rl", "search"), ("rl", "search")), (("base", "confirm"), ("rl", "confirm")),
         (("sft_rl", "confirm"), ("rl", "confirm"))],
        "rl", [("rl_stage1", "RL from zero, stage 1"), ("rl", "RL from zero"), ("sft_rl", "SFT route's RL")],
        "`rl_stage1/` (two-stage rewards), `rl/`, `sft/`, `sft_rl/`, `eval/`"),
}


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _evals(out: Path, recipe: Recipe) -> dict[tuple[str, str], dict]:
    """``(model, mode) -> {"summary", "rows"}`` for the evaluations found under ``OUT/eval``."""
    found = {}
    for model, _ in recipe.models:
        for mode, _ in recipe.modes:
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


def search_ratio(em: float, em0: float) -> str:
    """EM with search over EM without, as the summary words it (no ratio of a zero denominator)."""
    if em0:
        return f"{em / em0:.1f}x"
    return "no ratio: both 0" if not em else "no ratio: 0 without search"


def _table(evals: dict, recipe: Recipe) -> list[str]:
    sources = sorted({s for e in evals.values() for s in e["summary"]["by_source"]})
    head = ["model", "mode", *[f"{s} EM" for s in sources], *[f"{s} F1" for s in sources], "avg EM",
            "searches / question", "answered"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, name in recipe.models:
        for mode, mode_name in recipe.modes:
            e = evals.get((model, mode))
            if e is None:
                continue
            s = e["summary"]
            by = s["by_source"]
            cells = [name, mode_name, *[f"{by[x]['em']:.3f}" if x in by else "" for x in sources],
                     *[f"{by[x]['f1']:.3f}" if x in by else "" for x in sources],
                     f"{s['macro'].get('em', s['em']):.3f}", f"{s['searches']:.2f}",
                     f"{s['stop_reasons'].get('answered', 0.0):.0%}"]
            out.append("| " + " | ".join(cells) + " |")
    return out


def _stops(evals: dict, recipe: Recipe) -> list[str]:
    out = []
    for model, name in recipe.models:
        e = evals.get((model, "search"))
        if e is not None:
            stops = ", ".join(f"{k} {v:.0%}" for k, v in e["summary"]["stop_reasons"].items())
            out.append(f"- {name} (search): {stops}")
    return out


def _comparison(evals: dict, recipe: Recipe) -> list[str]:
    labels = {**dict(recipe.models), **{f"mode:{m}": name for m, name in recipe.modes}}
    out = []
    for before, after in recipe.compare:
        a, b = evals.get(before), evals.get(after)
        ids = [i for i in a["rows"] if i in b["rows"]] if a is not None and b is not None else []
        if not ids:
            continue
        mean, lo, hi = paired_bootstrap([a["rows"][i]["em"] for i in ids], [b["rows"][i]["em"] for i in ids])
        out.append(f"{labels[after[0]]} ({labels['mode:' + after[1]]}) minus {labels[before[0]]} "
                   f"({labels['mode:' + before[1]]}), EM, paired over {len(ids)} questions: {mean:+.3f} "
                   f"(95% bootstrap interval {lo:+.3f} to {hi:+.3f}; 10,000 resamples, seed 0).")
    search, direct = evals.get((recipe.search_ratio, "search")), evals.get((recipe.search_ratio, "direct"))
    if search is not None and direct is not None:
        em, em0 = search["summary"]["em"], direct["summary"]["em"]
        out.append(f"{labels[recipe.search_ratio]} with search / without: EM {em:.3f} / {em0:.3f} "
                   f"({search_ratio(em, em0)}).")
    return out


def _plots(out: Path, recipe: Recipe) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = []
    for run, label in recipe.curves:
        rl = _rows(out / run / "metrics.jsonl")
        if not rl:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.2))
        steps = [r["step"] for r in rl]
        ax.plot(steps, [r.get("reward/mean") or 0 for r in rl], label="reward")
        ax.plot(steps, [r.get("reward/em") or 0 for r in rl], label="EM")
        ax.plot(steps, [r.get("rollout/searches_mean") or 0 for r in rl], label="searches / sample")
        ax.plot(steps, [r.get("rollout/answered_frac") or 0 for r in rl], label="answered share")
        ax.set_xlabel(f"{label} step")
        ax.legend()
        fig.tight_layout()
        name = "reward.png" if run == "rl" else f"reward_{run}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        lines += [f"![{label} reward, EM, searches and answered share per step]({name})", ""]
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


def _examples(evals: dict, recipe: Recipe, n_per_source: int = 2) -> list[str]:
    have = [(m, name) for m, name in recipe.models if (m, "search") in evals]
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


def write_summary(out: Path, recipe: str = "smollm2") -> Path:
    r = RECIPES[recipe]
    evals = _evals(out, r)
    md = [f"# {r.title}", "",
          f"Written by `examples/recipe_summary.py` from the run in this directory ({r.sources}).", ""]
    md += ["## Evaluation", ""]
    if evals:
        md += _table(evals, r) + [""] + _comparison(evals, r) + [""] + ["Stop reasons:", ""] + _stops(evals, r) + [""]
    else:
        md += ["No evaluation ran (`--no-eval`): evaluate the runs with `sleuth eval --model DIR`.", ""]
    md += ["## Wall time", ""] + _wall(out) + ["", "## Training curves", ""] + _plots(out, r)
    md += ["## Example trajectories (greedy, with search)", ""] + _examples(evals, r)
    path = out / "summary.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


if __name__ == "__main__":
    args = sys.argv[1:]
    recipe = "smollm2"
    if len(args) == 3 and args[1] == "--recipe" and args[2] in RECIPES:
        recipe = args[2]
    elif len(args) != 1:
        sys.exit(f"usage: python examples/recipe_summary.py OUT_DIR [--recipe {'|'.join(RECIPES)}]")
    print(write_summary(Path(args[0]), recipe))
