"""The demo's report: ``report.md`` plus PNG plots a person can look at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sleuth.eval.metrics import EvalSummary


def _plots(out: Path, result: dict, base: EvalSummary, trained: EvalSummary, metrics_path: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.plot([r["step"] for r in rows], [r.get("reward/mean") or 0 for r in rows], label="reward (EM)")
        ax.plot([r["step"] for r in rows], [r.get("rollout/searches_mean") or 0 for r in rows], label="searches / sample")
        ax.set_xlabel("GRPO step")
        ax.set_title("Training with search")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "reward.png", dpi=110)
        plt.close(fig)
        names.append("reward.png")

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    kinds = ["single-hop", "two-hop", "all"]
    before = [result["base_single_hop_em"], result["base_two_hop_em"], result["base_em"]]
    after = [result["single_hop_em"], result["two_hop_em"], result["trained_em"]]
    x = range(len(kinds))
    axes[0].bar([i - 0.2 for i in x], before, width=0.4, label="base")
    axes[0].bar([i + 0.2 for i in x], after, width=0.4, label="trained")
    if result.get("no_search_em") is not None:
        axes[0].axhline(result["no_search_em"], color="gray", ls="--", label="trained, no search")
    axes[0].set_xticks(list(x), kinds)
    axes[0].set_ylim(0, 1)
    axes[0].set_title("Test EM")
    axes[0].legend(fontsize=7)
    axes[1].bar(["base", "trained"], [base.searches, trained.searches], color=["C0", "C1"])
    axes[1].set_title("Searches per question")
    fig.tight_layout()
    fig.savefig(out / "em.png", dpi=110)
    plt.close(fig)
    names.append("em.png")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    reasons = sorted(set(base.stop_reasons) | set(trained.stop_reasons))
    left = [0.0, 0.0]
    for reason in reasons:
        vals = [base.stop_reasons.get(reason, 0.0), trained.stop_reasons.get(reason, 0.0)]
        ax.barh(["base", "trained"], vals, left=left, label=reason)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlim(0, 1)
    ax.set_title("How trajectories end (share of test questions)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "stop_reasons.png", dpi=110)
    plt.close(fig)
    names.append("stop_reasons.png")
    return names


def _example(row: dict) -> list[str]:
    return [
        f"- gold: {', '.join(row['golden_answers'])}; answer: {row['answer']!r}; EM {row['em']:.0f}; "
        f"searches {row['searches']}",
        "",
        "```text",
        row.get("response", "").strip(),
        "```",
        "",
    ]


def write_report(out: Path, result: dict, *, base: tuple, trained: tuple, metrics_path: Path, setting: dict,
                 try_it: list[str] = (), view_it: str | None = None) -> None:
    (base_summary, base_rows), (trained_summary, trained_rows) = base, trained
    plots = _plots(out, result, base_summary, trained_summary, metrics_path)
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"
    lines = [
        "# Sleuth demo: a tiny model learns to search",
        "",
        f"Model `{setting['model']}`, {setting['steps']} GRPO steps with search; "
        f"{result['rl_minutes']:.1f} minutes of RL; whole demo {result['wall_minutes']:.1f} minutes.",
        "",
        "| | base | trained with search | trained without search |",
        "|---|---|---|---|",
        f"| test EM | {fmt(result['base_em'])} | {fmt(result['trained_em'])} | {fmt(result['no_search_em'])} |",
        f"| single-hop EM | {fmt(result['base_single_hop_em'])} | {fmt(result['single_hop_em'])} | |",
        f"| two-hop EM | {fmt(result['base_two_hop_em'])} | {fmt(result['two_hop_em'])} | |",
        f"| searches / question | {fmt(result['base_searches_per_question'])} | "
        f"{fmt(result['searches_per_question'])} | 0 |",
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
        "## Example trajectories (the same test questions before and after training)",
        "",
    ]
    by_id = {r["id"]: r for r in trained_rows}
    picks = [r for r in base_rows if r["id"] in by_id][:2]
    for row in picks:
        lines += [f"### {row['question']}", "", "**Base model**", ""] + _example(row)
        lines += ["**Trained**", ""] + _example(by_id[row["id"]])
    if try_it:
        lines += ["## Try the trained model", "",
                  "The world is in `world/` and the trained run in `with_search/` (its `config.yaml` gives "
                  "`ask` and `eval` the protocol and budget it was trained with):", "",
                  "```bash", *try_it, "```", ""]
    if view_it:
        lines += ["## Look at the trajectories", "",
                  "Open the run in the viewer (curves, every logged trajectory with its searches and which tokens "
                  "were trained, the same question across steps; the second directory is the run trained "
                  "without search, compared question by question), then browse http://127.0.0.1:8765/:", "",
                  "```bash", view_it, "```", ""]
    (out / "report.md").write_text("\n".join(lines))
