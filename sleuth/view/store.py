"""What ``sleuth view`` reads: a run directory (``metrics.jsonl``, ``samples.jsonl``, ``config.yaml``)
or an eval directory (``trajectories.jsonl``, ``results.json``, ``setting.json``), read-only.

A JSONL file is indexed, never held: :class:`JsonlIndex` keeps each complete line's byte offset and
a few fields (step, question id, data source, reward, EM, F1, stop reason, searches, and the
question and queries for full-text search); a record is read back from its offset when it is shown.
Indexing runs on a background thread (:meth:`JsonlIndex.poke`), so a large file opens at once and
its rows become filterable as the index grows; a later poke reads only what was appended (a run
still going). A last line without its newline (a torn write, or one being written) is not read
until it is complete; a line that does not parse is skipped and counted; a file that shrank or was
replaced (a resumed run rewrites its logs without the steps it re-does) is indexed again from the start.
"""

from __future__ import annotations

import json
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.errors import RunDirError
from sleuth.reward.metrics import score_prediction

CHUNK_BYTES = 4 << 20  # read this much of a file per step of the indexer
TEXT_LIMIT = 300  # characters of a question kept in the index (list rows); the full one is in the record


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def normalize(row: dict) -> dict:
    """A samples.jsonl or trajectories.jsonl row with the fields the viewer reads, whatever version of
    Sleuth wrote it: ``question_id``, ``data_source`` (from the id's first part when missing), ``em``
    and ``f1`` (scored from the answer when missing) and ``searches`` (the number of queries)."""
    out = dict(row)
    qid = row.get("question_id", row.get("id"))
    out["question_id"] = str(qid) if qid is not None else ""
    if not isinstance(out.get("data_source"), str):
        out["data_source"] = out["question_id"].split("/", 1)[0] if "/" in out["question_id"] else "unknown"
    golds = row.get("golden_answers") if isinstance(row.get("golden_answers"), list) else []
    out["golden_answers"] = [str(g) for g in golds]
    if _num(row.get("em")) is None or _num(row.get("f1")) is None:
        answer = row.get("answer")
        scores = score_prediction(answer if isinstance(answer, str) else None, out["golden_answers"])
        if _num(row.get("em")) is None:
            out["em"] = scores.em
        if _num(row.get("f1")) is None:
            out["f1"] = scores.f1
    queries = row.get("queries") if isinstance(row.get("queries"), list) else []
    out["queries"] = [str(q) for q in queries]
    if _num(row.get("searches")) is None:
        out["searches"] = len(out["queries"])
    return out


@dataclass
class Columns:
    """The indexed fields of every row, one list per field (a row is its position)."""

    offsets: array = field(default_factory=lambda: array("q"))
    lengths: array = field(default_factory=lambda: array("q"))
    step: list = field(default_factory=list)
    qid: list = field(default_factory=list)
    source: list = field(default_factory=list)
    reward: list = field(default_factory=list)
    em: list = field(default_factory=list)
    f1: list = field(default_factory=list)
    stop: list = field(default_factory=list)
    searches: list = field(default_factory=list)
    question: list = field(default_factory=list)
    answer: list = field(default_factory=list)
    haystack: list = field(default_factory=list)  # lower-cased question + queries, for full-text search
    by_qid: dict = field(default_factory=dict)  # question id -> rows

    def add(self, offset: int, length: int, row: dict) -> None:
        row = normalize(row)
        step = row.get("step")
        n = len(self.offsets)
        self.step.append(step if isinstance(step, int) and not isinstance(step, bool) else None)
        self.qid.append(row["question_id"])
        self.source.append(row["data_source"])
        self.reward.append(_num(row.get("reward")))
        self.em.append(_num(row.get("em")))
        self.f1.append(_num(row.get("f1")))
        self.stop.append(row.get("stop_reason") if isinstance(row.get("stop_reason"), str) else None)
        self.searches.append(int(_num(row.get("searches")) or 0))
        question = str(row.get("question", ""))
        self.question.append(question[:TEXT_LIMIT])
        answer = row.get("answer")
        self.answer.append(answer[:TEXT_LIMIT] if isinstance(answer, str) else None)
        self.haystack.append("\n".join([question, *row["queries"]]).lower())
        self.by_qid.setdefault(row["question_id"], []).append(n)
        # the offset last: a reader sees a row once all its fields are there (len(offsets) is the count)
        self.lengths.append(length)
        self.offsets.append(offset)


class JsonlIndex:
    """The rows of one JSONL file, indexed on a background thread (see the module docstring).

    ``keep_rows`` keeps each parsed row in memory instead (``metrics.jsonl``: small rows, all drawn)."""

    def __init__(self, path: Path, *, keep_rows: bool = False):
        self.path = Path(path)
        self.keep_rows = keep_rows
        self.cols = Columns()
        self.rows: list[dict] = []
        self.skipped = 0  # complete lines that are not a JSON object
        self.torn_tail = False  # the file ends in a line without its newline (not indexed)
        self.generation = 0  # bumped when the file shrank and was indexed again
        self._pos = 0  # where the first line not yet indexed starts
        self._read_to = 0  # how far the indexer has read (the torn tail included)
        self._target = 0  # the file's size when indexing was last asked for
        self._size_seen = 0
        self._file_id: tuple[int, int] | None = None  # (device, inode) of the file indexed
        self._lock = threading.Lock()  # one indexer at a time
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def __len__(self) -> int:
        return len(self.rows) if self.keep_rows else len(self.cols.offsets)

    @property
    def complete(self) -> bool:
        """Whether everything the file held when indexing was last asked for is indexed."""
        return self._read_to >= self._target

    def _stat(self) -> tuple[int, tuple[int, int] | None]:
        """The file's size and identity (0, None while it does not exist)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return 0, None
        return st.st_size, (st.st_dev, st.st_ino)

    def _replaced(self, size: int, file_id) -> bool:
        """Whether the file is not the one indexed: shorter, or another file under the same name (a
        resumed run rewrites its logs into a new file and renames it over the old one)."""
        return size < self._size_seen or (self._file_id is not None and file_id != self._file_id)

    def poke(self) -> None:
        """Start indexing what is new in the file, unless an indexer is already running."""
        if self._thread is not None and self._thread.is_alive():
            return
        size, file_id = self._stat()
        replaced = self._replaced(size, file_id)
        if size == self._size_seen and not replaced:
            return  # nothing new (a line being written shows up in the size)
        if replaced:
            self._read_to = 0  # the indexer starts again
        self._target = size
        self._thread = threading.Thread(target=self.refresh, name=f"index {self.path.name}", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the running indexer (if any) is done (tests, benchmarks)."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def refresh(self) -> None:
        """Index the complete lines appended since the last call (all of them the first time)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._refresh()
        except OSError as e:
            self.error = f"{self.path}: {e.strerror or e}"
        finally:
            self._lock.release()

    def _refresh(self) -> None:
        size, file_id = self._stat()
        if self._replaced(size, file_id):  # rewritten (a resumed run dropped its last steps): start again
            self.cols, self.rows = Columns(), []
            self._pos, self._read_to, self.skipped = 0, 0, 0
            self.generation += 1
        self._size_seen = self._target = size
        self._file_id = file_id
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            pending = b""
            while True:
                chunk = f.read(CHUNK_BYTES)
                if not chunk:
                    break
                data = pending + chunk
                start = 0
                while True:
                    end = data.find(b"\n", start)
                    if end < 0:
                        break
                    self._add(self._pos + start, data[start:end])
                    start = end + 1
                self._pos += start
                pending = data[start:]
                self._read_to = self._pos + len(pending)
            self.torn_tail = bool(pending.strip())

    def _add(self, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except ValueError:
            self.skipped += 1
            return
        if not isinstance(row, dict):
            self.skipped += 1
            return
        if self.keep_rows:
            self.rows.append(row)
        else:
            self.cols.add(offset, len(line), row)

    def read(self, i: int) -> dict:
        """Row ``i``, read back from the file and normalised (:func:`normalize`)."""
        if self.keep_rows or not 0 <= i < len(self):
            raise IndexError(i)
        with open(self.path, "rb") as f:
            f.seek(self.cols.offsets[i])
            return normalize(json.loads(f.read(self.cols.lengths[i])))


@dataclass
class Filter:
    """Which indexed rows to list; None leaves a field unconstrained."""

    data_source: str | None = None
    stop_reason: str | None = None
    step_min: int | None = None
    step_max: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    em: float | None = None  # rows whose EM equals this (0 or 1)
    searches_min: int | None = None
    searches_max: int | None = None
    text: str | None = None  # case-insensitive substring of the question or a query
    question_id: str | None = None

    def matches(self, cols: Columns, n: int) -> list[int]:
        """The rows among the first ``n`` that pass, in file order."""
        rows = cols.by_qid.get(self.question_id, []) if self.question_id is not None else range(n)
        text = self.text.lower() if self.text else None
        out = []
        for i in rows:
            if i >= n:
                continue
            step, reward, searches = cols.step[i], cols.reward[i], cols.searches[i]
            if ((self.data_source is not None and cols.source[i] != self.data_source)
                    or (self.stop_reason is not None and cols.stop[i] != self.stop_reason)
                    or (self.step_min is not None and (step is None or step < self.step_min))
                    or (self.step_max is not None and (step is None or step > self.step_max))
                    or (self.reward_min is not None and (reward is None or reward < self.reward_min))
                    or (self.reward_max is not None and (reward is None or reward > self.reward_max))
                    or (self.em is not None and cols.em[i] != self.em)
                    or (self.searches_min is not None and searches < self.searches_min)
                    or (self.searches_max is not None and searches > self.searches_max)
                    or (text is not None and text not in cols.haystack[i])):
                continue
            out.append(i)
        return out


def facets(cols: Columns, n: int) -> dict:
    """What the filters can choose from: data sources, stop reasons (with counts), the step range."""
    sources: dict[str, int] = {}
    stops: dict[str, int] = {}
    for i in range(n):
        sources[cols.source[i]] = sources.get(cols.source[i], 0) + 1
        if cols.stop[i] is not None:
            stops[cols.stop[i]] = stops.get(cols.stop[i], 0) + 1
    steps = [s for s in cols.step[:n] if s is not None]
    return {"data_sources": sources, "stop_reasons": stops,
            "steps": [min(steps), max(steps)] if steps else None}


RUN_FILES = ("metrics.jsonl", "samples.jsonl", "config.yaml")
EVAL_FILES = ("trajectories.jsonl", "results.json", "setting.json")


class ViewError(RunDirError):
    """A directory the viewer cannot open; the message names it and says what it expected."""


class Source:
    """One directory opened by the viewer: a training (or SFT) run, or an eval's output."""

    def __init__(self, path: str | Path, name: str | None = None):
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise ViewError(f"{path}: not a directory; give a run directory (sleuth train/sft --out) "
                            "or an eval directory (sleuth eval --out)")
        if any((self.path / f).is_file() for f in EVAL_FILES):
            self.kind = "eval"
            samples = "trajectories.jsonl"
        elif any((self.path / f).is_file() for f in RUN_FILES):
            self.kind = "run"
            samples = "samples.jsonl"
        else:
            raise ViewError(f"{path}: holds none of {', '.join(RUN_FILES)} (a run directory) nor "
                            f"{', '.join(EVAL_FILES)} (an eval directory)")
        self.name = name or self.path.name
        self.samples = JsonlIndex(self.path / samples)
        self.metrics = JsonlIndex(self.path / "metrics.jsonl", keep_rows=True)
        self._facets: tuple = (None, None)  # ((generation, rows), facets): the page asks for them every few seconds
        self._results: tuple = (None, None)  # ((mtime, size), results.json read)

    def poke(self) -> None:
        self.samples.poke()
        self.metrics.poke()

    def _text(self, name: str, limit: int = 200_000) -> str | None:
        try:
            with open(self.path / name, encoding="utf-8", errors="replace") as f:
                return f.read(limit)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def results(self) -> dict | None:
        """An eval's ``results.json`` (without its question list), or None; read again only when it changed."""
        try:
            st = (self.path / "results.json").stat()
        except FileNotFoundError:
            return None
        key = (st.st_mtime_ns, st.st_size)
        if self._results[0] != key:
            self._results = (key, self._read_results())
        return self._results[1]

    def _read_results(self) -> dict | None:
        text = self._text("results.json", 50_000_000)
        if text is None:
            return None
        try:
            out = json.loads(text)
        except ValueError:
            return {"error": "results.json does not parse (being written?)"}
        if isinstance(out, dict):
            out.pop("question_ids", None)
        return out if isinstance(out, dict) else None

    def facets(self) -> dict:
        """:func:`facets` of the rows indexed so far, counted again only when rows were added."""
        n = len(self.samples)
        key = (self.samples.generation, n)
        if self._facets[0] != key:
            self._facets = (key, facets(self.samples.cols, n))
        return self._facets[1]

    def info(self) -> dict:
        n = len(self.samples)
        return {
            "name": self.name, "path": str(self.path), "kind": self.kind,
            "samples": n, "samples_file": self.samples.path.name,
            "indexed": self.samples.complete, "skipped_lines": self.samples.skipped,
            "torn_tail": self.samples.torn_tail, "metric_rows": len(self.metrics.rows),
            "error": self.samples.error or self.metrics.error,
            "config": self._text("config.yaml") if self.kind == "run" else self._text("setting.json"),
            "results": self.results() if self.kind == "eval" else None,
            "facets": self.facets(),
        }
