"""Score jsonl files of model responses against gold answers (``sleuth reward score``).

Each row holds a full response (think/search/information/answer text after the prompt) and the
gold answers. The answer is extracted as Search-R1 does (:func:`sleuth.reward.tags.extract_answer`)
and scored with EM, cover-EM and token F1; a response without an answer scores 0 on all three
(unless ``no_answer_as`` names a stand-in prediction).
The means are Search-R1's validation EM (``compute_score_em``) and sub-EM, so they can be compared
with published runs digit for digit.

Field names may be dotted paths into nested objects (``reward_model.ground_truth.target``). A row
that is not a JSON object, lacks a field, or has a field of the wrong type stops the run with an
error naming the file, the line and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.errors import DataError
from sleuth.reward.metrics import score_prediction
from sleuth.reward.tags import extract_answer


class BadRowError(DataError):
    """A row of an input file cannot be scored; the message names file, line and field."""


JSONL_HINT = "reward score reads JSON Lines: UTF-8 text, one JSON object per line"


@dataclass
class Totals:
    """Running sums of one group of rows; ``means()`` gives the reported numbers."""

    n: int = 0
    em: float = 0.0
    cover_em: float = 0.0
    f1: float = 0.0
    no_answer: int = 0

    def add(self, em: float, cover: float, f1: float, answered: bool) -> None:
        self.n += 1
        self.em += em
        self.cover_em += cover
        self.f1 += f1
        self.no_answer += 0 if answered else 1

    def merge(self, other: "Totals") -> None:
        self.n += other.n
        self.em += other.em
        self.cover_em += other.cover_em
        self.f1 += other.f1
        self.no_answer += other.no_answer

    def means(self, digits: int = 6) -> dict[str, float | int]:
        """``{"n", "em", "cover_em", "f1", "no_answer"}`` with means rounded to ``digits``."""
        d = max(self.n, 1)
        return {
            "n": self.n,
            "em": round(self.em / d, digits),
            "cover_em": round(self.cover_em / d, digits),
            "f1": round(self.f1 / d, digits),
            "no_answer": self.no_answer,
        }


@dataclass
class FileScore:
    path: str
    totals: Totals = field(default_factory=Totals)
    by_group: dict[str, Totals] = field(default_factory=dict)


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line_number, row)`` for each non-blank line; a bad line raises :class:`BadRowError`."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadRowError(f"{path}:{line_no}: not UTF-8 text ({e.reason}); {JSONL_HINT}") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadRowError(f"{path}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise BadRowError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            yield line_no, row


def get_field(row: dict, dotted: str, where: str) -> Any:
    """The value at a dotted path (an exact top-level key wins); ``where`` prefixes the error."""
    if dotted in row:
        return row[dotted]
    value: Any = row
    walked = []
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            under = f" under {'.'.join(walked)!r}" if walked else ""
            keys = sorted(value)[:8] if isinstance(value, dict) else type(value).__name__
            raise BadRowError(
                f"{where}: missing field {dotted!r} (no key {key!r}{under}; found {keys}); "
                "name the right one with --response-field / --answers-field / --group-by"
            )
        value = value[key]
        walked.append(key)
    return value


def _answers(value: Any, field_name: str, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        return value
    what = "an empty list" if value == [] else f"{type(value).__name__} {json.dumps(value)[:60]}"
    raise BadRowError(
        f"{where}: field {field_name!r} must be a string or a non-empty list of strings, got {what}"
    )


def _check_input_file(path: Path) -> None:
    """Refuse, naming ``path``, what is not a file or is a parquet file (before reading any line)."""
    if path.is_dir():
        raise BadRowError(f"--input {path} is a directory; give a JSON Lines file ({JSONL_HINT})")
    if not path.is_file():
        raise BadRowError(f"input file not found: {path} (check the --input path)")
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            raise BadRowError(
                f"{path}: is a parquet file; {JSONL_HINT}. Convert it first, e.g. "
                "pandas.read_parquet(src).to_json(dst, orient='records', lines=True)"
            )


def score_file(
    path: str | Path,
    response_field: str = "response",
    answers_field: str = "golden_answers",
    group_field: str | None = None,
    no_answer_as: str | None = None,
) -> FileScore:
    """Mean EM / cover-EM / F1 of one jsonl file (and per value of ``group_field`` if given).

    ``no_answer_as`` is the prediction used for a response without an answer (None: score 0;
    ``"Beijing"`` reproduces Search-R1, which falls back to its instruction's example answer).
    """
    path = Path(path)
    _check_input_file(path)
    result = FileScore(str(path))
    for line_no, row in iter_jsonl(path):
        where = f"{path}:{line_no}"
        response = get_field(row, response_field, where)
        if not isinstance(response, str):
            raise BadRowError(
                f"{where}: field {response_field!r} must be a string (the model response), "
                f"got {type(response).__name__}"
            )
        golds = _answers(get_field(row, answers_field, where), answers_field, where)
        answer = extract_answer(response)
        s = score_prediction(no_answer_as if answer is None else answer, golds)
        result.totals.add(s.em, s.cover_em, s.f1, answer is not None)
        if group_field is not None:
            group = str(get_field(row, group_field, where))
            result.by_group.setdefault(group, Totals()).add(s.em, s.cover_em, s.f1, answer is not None)
    if result.totals.n == 0:
        raise BadRowError(f"{path}: no rows to score (the file is empty)")
    return result
