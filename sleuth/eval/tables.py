"""What the tables of ``report.md`` share (the main table of :mod:`sleuth.eval.report`, the
baseline table of :mod:`sleuth.eval.baseline`): the Search-R1 paper's dataset order and names,
percent cells, and the source columns of a summary in that order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DATASETS = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
DISPLAY = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA",
           "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle"}  # fmt: skip


def pct(x: float | None) -> str:
    """A share as a percent cell (one decimal); ``–`` when unknown."""
    return "–" if x is None else f"{100 * x:.1f}"


def source_columns(by_source: Mapping[str, Any]) -> list[str]:
    """The data sources of a summary's ``by_source``: the paper's datasets in its order, then the
    others in theirs."""
    ours = list(by_source)
    return [d for d in DATASETS if d in ours] + [d for d in ours if d not in DATASETS]
