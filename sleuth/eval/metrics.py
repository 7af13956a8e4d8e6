"""Scoring finished trajectories and summarising them per data source.

One row per trajectory (:func:`score_trajectory`, a dict: it is a line of ``trajectories.jsonl``),
then :func:`summarize` turns rows into an :class:`EvalSummary`: means overall and per
``data_source``, the macro average, failed searches, the LLM-judge figures when rows carry a
verdict, and (set by ``evaluate``) wall time. The overall figures are means over *questions* (micro
average); the per-source table lets a reader form the macro average the Search-R1 paper reports
(``avg`` column).

``EvalSummary.to_dict()`` is the ``summary`` of ``results.json`` (keys and their order as written
since the first version). The summary types also read as a read-only mapping under those keys, so
code that takes the JSON form of a summary (a baseline's ``results.json``) takes a live one too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sleuth.reward.tags import answer_in_texts
from sleuth.reward.trajectory import answer_scores
from sleuth.types import Trajectory

MEAN_KEYS = ("em", "cover_em", "f1", "searches", "turns", "retrieval_hit", "tokens", "sampled_tokens")
MACRO_KEYS = ("em", "cover_em", "f1")


def score_trajectory(traj: Trajectory) -> dict[str, Any]:
    """EM / cover-EM / F1 of the trajectory's parsed answer, with its search statistics."""
    scores = answer_scores(traj)
    return {
        "id": traj.question.id,
        "data_source": traj.question.data_source,
        "question": traj.question.text,
        "golden_answers": list(traj.question.golden_answers),
        "answer": traj.answer,
        "em": scores.em,
        "cover_em": scores.cover_em,
        "f1": scores.f1,
        "searches": traj.num_searches,
        "turns": traj.num_turns,
        "retrieval_hit": float(answer_in_texts(traj.retrieved_text, traj.question.golden_answers)),
        "tokens": len(traj.token_ids) - traj.prompt_len,
        "sampled_tokens": traj.num_sampled_tokens,
        "invalid": traj.num_invalid,
        "stop_reason": traj.stop_reason.value if traj.stop_reason else None,
        "queries": list(traj.queries),
    }


class _ReadOnlyMapping(Mapping[str, Any]):
    """``summary["em"]``, ``"judge" in summary``, ``summary.get(...)``: the keys of ``to_dict()``,
    the values as held (nested summaries stay typed). Not JSON: write ``to_dict()``."""

    def _keys(self) -> list[str]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(getattr(self, k)) for k in self._keys()}


def _plain(value: Any) -> Any:
    if isinstance(value, _ReadOnlyMapping):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(eq=True)
class EvalPerf(_ReadOnlyMapping):
    """Speed of the questions run in one invocation (0 when nothing was left to run)."""

    seconds: float = 0.0  # wall time (under torchrun: the slowest rank's)
    generate_s: float = 0.0
    retrieve_s: float = 0.0
    questions_per_s: float = 0.0
    ranks: int | None = None  # processes that evaluated, when several did (``Trainer.evaluate``)

    def _keys(self) -> list[str]:
        keys = ["seconds", "generate_s", "retrieve_s", "questions_per_s"]
        return keys + (["ranks"] if self.ranks is not None else [])


@dataclass(eq=True)
class SourceSummary(_ReadOnlyMapping):
    """The figures of a group of rows (one data source, or all of them): means of
    :data:`MEAN_KEYS`, the share of each stop reason, and the judge's figures when judged."""

    n: int
    em: float
    cover_em: float
    f1: float
    searches: float
    turns: float
    retrieval_hit: float
    tokens: float
    sampled_tokens: float
    stop_reasons: dict[str, float]
    judge: float | None = None  # mean verdict over the judged rows (None when every call failed)
    judge_failures: int | None = None  # None: no row went to a judge (no judge figures at all)

    @property
    def judged(self) -> bool:
        return self.judge_failures is not None

    def _keys(self) -> list[str]:
        return ["n", *MEAN_KEYS, "stop_reasons"] + (["judge", "judge_failures"] if self.judged else [])


@dataclass(eq=True)
class EvalSummary(SourceSummary):
    """The figures of a whole evaluation: all rows (micro average, the inherited fields), each
    data source, the macro average (mean over sources of :data:`MACRO_KEYS`), failed searches
    (``retrieval_errors`` in ``retrieval_error_questions`` questions) and ``perf``."""

    by_source: dict[str, SourceSummary] = field(default_factory=dict)
    macro: dict[str, float] = field(default_factory=dict)
    retrieval_errors: int = 0
    retrieval_error_questions: int = 0
    perf: EvalPerf | None = None

    def _keys(self) -> list[str]:
        keys = ["n", *MEAN_KEYS, "stop_reasons", "by_source", "macro", "retrieval_errors",
                "retrieval_error_questions"]  # fmt: skip
        keys += ["judge", "judge_failures"] if self.judged else []
        return keys + (["perf"] if self.perf is not None else [])


def _group(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The :class:`SourceSummary` fields of ``rows``."""
    n = len(rows)
    out: dict[str, Any] = {"n": n}
    for key in MEAN_KEYS:
        out[key] = sum(float(r[key]) for r in rows) / n if n else 0.0
    stops = Counter(r["stop_reason"] for r in rows)
    out["stop_reasons"] = {str(k): v / n for k, v in sorted(stops.items(), key=lambda kv: str(kv[0]))}
    if any("judge" in r for r in rows):
        verdicts = [r["judge"] for r in rows if r.get("judge") is not None]
        out["judge"] = sum(verdicts) / len(verdicts) if verdicts else None
        out["judge_failures"] = sum(1 for r in rows if "judge" in r and r["judge"] is None)
    return out


def summarize(rows: list[dict[str, Any]]) -> EvalSummary:
    """The :class:`EvalSummary` of eval rows (:func:`score_trajectory` rows, plus
    ``retrieval_errors`` and a ``judge`` verdict where known). ``perf`` is left unset."""
    by_source: dict[str, list] = defaultdict(list)
    for r in rows:
        by_source[r["data_source"]].append(r)
    sources = {src: SourceSummary(**_group(rs)) for src, rs in sorted(by_source.items())}
    k = len(sources) or 1
    return EvalSummary(
        **_group(rows),
        by_source=sources,
        macro={m: sum(getattr(s, m) for s in sources.values()) / k for m in MACRO_KEYS},
        retrieval_errors=sum(int(r.get("retrieval_errors", 0)) for r in rows),
        retrieval_error_questions=sum(1 for r in rows if r.get("retrieval_errors")),
    )
