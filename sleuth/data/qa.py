"""Load QA sets: FlashRAG jsonl, plain JSON lists, and Search-R1 parquet (written by
:mod:`sleuth.data.searchr1_parquet`).

Formats read by :func:`load_questions` (chosen by file suffix):

* ``.jsonl`` (FlashRAG / ``../shared/data`` style): one object per line,
  ``{"id", "question", "golden_answers": [str, ...] | str, "data_source"?}``.
* ``.json``: a list of such objects.
* ``.parquet`` (Search-R1, ``scripts/data_process/nq_search.py``): ``data_source``, ``prompt`` (chat
  messages), ``reward_model.ground_truth.target``, ``extra_info.{split,index}``, and usually the
  FlashRAG columns ``id``, ``question``, ``golden_answers`` that Search-R1 keeps. The question text
  comes from ``question`` when present, else from the last user message after ``"Question: "``.

Question ids are globally unique: ``"{data_source}/{split}/{row id}"``, where ``split`` is the
``split`` argument, else the row's ``extra_info.split`` (parquet), else the file stem, and the row id
is the row's ``id`` (else ``extra_info.index``, else the row's position). GRPO groups are keyed by it.
Text files (``.jsonl``, ``.json``) must be UTF-8. Every problem in a file is an error naming the file,
the line (or row) and the field.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sleuth.errors import DataError
from sleuth.types import Question

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


class QADataError(DataError):
    """A QA file (or hub dataset) that cannot be read as questions; the message names the input."""


# ---------------------------------------------------------------------------------------------
# Reading raw rows: (where, row) pairs, ``where`` = "file:line N" / "file: item N" / "file: row N"
# ---------------------------------------------------------------------------------------------


def _utf8(raw: bytes, path: Path, first_line: int = 1) -> str:
    """``raw`` (file text from ``first_line`` on) decoded as UTF-8, or an error naming file and line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + raw.count(b"\n", 0, e.start)
        column = e.start - raw.rfind(b"\n", 0, e.start)
        raise QADataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {column}); "
            "QA files must be UTF-8: re-save the file as UTF-8"
        ) from None


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict]]:
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            line = _utf8(raw, path, n)
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise QADataError(f"{where}: bad JSON ({e.msg} at column {e.colno}); fix or remove the line")
            if not isinstance(row, dict):
                raise QADataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def _json_list_rows(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        data = json.loads(_utf8(path.read_bytes(), path))
    except json.JSONDecodeError as e:
        raise QADataError(f"{path}:{e.lineno}: bad JSON ({e.msg} at column {e.colno})")
    if not isinstance(data, list):
        raise QADataError(f"{path}: expected a JSON list of question objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        where = f"{path}: item {i}"
        if not isinstance(row, dict):
            raise QADataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        yield where, row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq  # lazy: sleuth --help start-up (sleuth.eval.cli imports this module)

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise QADataError(f"{path}: not a readable parquet file ({e})") from e
    n = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield f"{path}: row {n}", _from_searchr1_row(f"{path}: row {n}", row)
            n += 1


def _from_searchr1_row(where: str, row: dict) -> dict:
    """Map a Search-R1 parquet row onto the FlashRAG fields (``split`` from ``extra_info``)."""
    out: dict[str, Any] = {"data_source": row.get("data_source")}
    extra = row.get("extra_info") or {}
    out["id"] = row.get("id") if row.get("id") is not None else extra.get("index")
    out["split"] = extra.get("split")
    question = row.get("question")
    if question is None:
        question = _question_from_prompt(where, row.get("prompt"))
    out["question"] = question
    target = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    out["golden_answers"] = target if target is not None else row.get("golden_answers")
    return out


def _question_from_prompt(where: str, prompt: Any) -> str:
    """The text after the last ``"Question: "`` in the last user message of a Search-R1 prompt."""
    if not isinstance(prompt, list):
        raise QADataError(f"{where}: field 'prompt' must be a list of chat messages (no 'question' column)")
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1] if users else None
    if not isinstance(content, str) or "Question: " not in content:
        raise QADataError(
            f"{where}: field 'prompt': no user message with 'Question: ' to recover the question from"
        )
    return content.rsplit("Question: ", 1)[1].strip()


_READERS = {".jsonl": _jsonl_rows, ".json": _json_list_rows, ".parquet": _parquet_rows}


# ---------------------------------------------------------------------------------------------
# Rows -> questions
# ---------------------------------------------------------------------------------------------


def _golden_answers(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise QADataError(
            f"{where}: field 'golden_answers' must be a list of strings or a string, got {value!r}"
        )
    answers = []
    for a in value:
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise QADataError(f"{where}: field 'golden_answers' holds {a!r}; answers must be strings")
        answers.append(str(a))
    if not answers:
        raise QADataError(f"{where}: field 'golden_answers' is empty; a question needs at least one answer")
    return tuple(answers)


def raw_rows(path: str | Path) -> Iterator[tuple[str, dict]]:
    """The rows of a QA file as read, ``(where, row)``; ``where`` is what a loaded question's
    ``meta["source"]`` names (Search-R1 parquet rows already mapped onto the FlashRAG fields)."""
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None or not path.is_file():
        load_questions(path)  # the error that names the problem
    return reader(path)


def row_to_question(where: str, row: dict, *, position: int, data_source: str, split: str) -> Question:
    """Build one :class:`Question` from a FlashRAG-style row; errors name ``where`` and the field."""
    text = row.get("question")
    if text is None:
        raise QADataError(f"{where}: missing field 'question'")
    if not isinstance(text, str) or not text.strip():
        raise QADataError(f"{where}: field 'question' must be a non-empty string, got {text!r}")
    if "golden_answers" not in row or row["golden_answers"] is None:
        raise QADataError(f"{where}: missing field 'golden_answers'")
    answers = _golden_answers(where, row["golden_answers"])
    row_id = row.get("id")
    row_id = str(position) if row_id is None or str(row_id) == "" else str(row_id)
    qid = f"{data_source}/{split}/{row_id}"
    meta = {"row_id": row_id, "split": split, "source": where}
    return Question(id=qid, text=text, golden_answers=answers, data_source=data_source, meta=meta)


def _directory_message(path: Path) -> str:
    """The error for a directory given where a QA file is expected, naming QA files found in it."""
    found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in _READERS and p.is_file())
    hint = f" (found in it: {', '.join(found[:5])}{' ...' if len(found) > 5 else ''})" if found else ""
    return f"{path}: is a directory, not a QA file; give a .jsonl, .json or .parquet file{hint}"


class PerSourceLimit:
    """The rule of every question limit (``sleuth eval --limit``, ``data.limit``,
    ``train.eval_limit``): the first ``limit`` questions *of each data source*, in file order.

    A file that merges several datasets ordered by source, like Search-R1's ``test.parquet`` (NQ,
    then TriviaQA, ...), so gives ``limit`` questions of each, not ``limit`` of the first dataset
    only; a file with one source gives its first ``limit`` questions, as a plain cut would.
    ``limit=None`` takes everything.
    """

    def __init__(self, limit: int | None):
        self.limit = limit
        self.taken: Counter[str] = Counter()

    def take(self, source: str) -> bool:
        """Whether one more question of ``source`` is kept (it is then counted)."""
        if self.limit is not None and self.taken[source] >= self.limit:
            return False
        self.taken[source] += 1
        return True


def load_questions(
    path: str | Path,
    *,
    data_source: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Question]:
    """Read a QA file (``.jsonl``, ``.json`` list, or Search-R1 ``.parquet``) into questions.

    ``data_source``: keep only rows of this source; rows without a ``data_source`` field are
    labelled with it (default label: the file stem). ``split``: the middle part of the ids (default:
    the row's ``extra_info.split`` for parquet, else the file stem). ``limit``: at most this many
    questions *per data source* (the first ones of each source, see :class:`PerSourceLimit`), so
    a merged file such as Search-R1's ``test.parquet`` (NQ rows, then TriviaQA, ...) keeps every
    source. Raises :class:`QADataError` naming file, line and field.
    """
    path = Path(path)
    if path.is_dir():
        raise QADataError(_directory_message(path))
    if not path.is_file():
        raise QADataError(f"{path}: no such QA file")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise QADataError(f"{path}: unknown QA file type {path.suffix!r}; use .jsonl, .json or .parquet")
    if limit is not None and limit < 0:
        raise QADataError(f"limit must be >= 0, got {limit}")
    questions: list[Question] = []
    seen: dict[str, str] = {}
    sources: set[str] = set()
    n_rows = 0
    keep = PerSourceLimit(limit)
    for position, (where, row) in enumerate(reader(path)):
        n_rows += 1
        row_source = row.get("data_source")
        if row_source is not None and not isinstance(row_source, str):
            raise QADataError(f"{where}: field 'data_source' must be a string, got {row_source!r}")
        source = row_source or data_source or path.stem
        sources.add(source)
        if data_source is not None and source != data_source:
            continue
        if not keep.take(source):
            continue  # this source has its share; later rows may belong to other sources
        row_split = split or row.get("split") or path.stem
        q = row_to_question(where, row, position=position, data_source=source, split=str(row_split))
        if q.id in seen:
            raise QADataError(f"duplicate question id {q.id!r}: {seen[q.id]} and {where}; ids must be unique")
        seen[q.id] = where
        questions.append(q)
    if n_rows == 0:
        raise QADataError(f"{path}: empty file, no questions")
    if not questions and limit != 0:
        raise QADataError(f"{path}: no rows with data_source {data_source!r}; found {sorted(sources)}")
    return questions


# ---------------------------------------------------------------------------------------------
# The hub path
# ---------------------------------------------------------------------------------------------


def load_hub(name: str, split: str, *, limit: int | None = None) -> list[Question]:
    """Questions of one FlashRAG dataset from the Hugging Face hub
    (``datasets.load_dataset("RUC-NLPIR/FlashRAG_datasets", name)``); needs ``datasets`` and internet."""
    try:
        import datasets  # lazy: optional dependency (sleuth[hub])
    except ImportError as e:
        raise QADataError("load_hub needs the 'datasets' package: pip install 'sleuth[hub]'") from e
    try:
        ds = datasets.load_dataset(HUB_REPO, name)[split]
    except KeyError as e:
        raise QADataError(f"{HUB_REPO}/{name}: no split {split!r}") from e
    except Exception as e:  # offline, unknown config, hub errors: all surface as one clear message
        raise QADataError(
            f"could not load {HUB_REPO}/{name} from the Hugging Face hub ({type(e).__name__}: {e}); "
            "if you are offline, download the jsonl once and use load_questions(path)"
        ) from e
    questions = []
    for i, row in enumerate(ds):
        if limit is not None and i >= limit:
            break
        where = f"{HUB_REPO}/{name}/{split}: row {i}"
        questions.append(row_to_question(where, dict(row), position=i, data_source=name, split=split))
    return questions
