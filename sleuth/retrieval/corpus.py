"""Corpus store: passages on disk (Arrow IPC, memory-mapped), looked up by row or by id.

Ingest reads a JSON Lines corpus in one streaming pass. Two row schemas are accepted:

* Search-R1 / wiki-18: ``{"id": ..., "contents": "\\"Title\\"\\ntext"}`` (first line = title,
  surrounding double quotes stripped);
* FlashRAG-style: ``{"id": ..., "title": ..., "text": ...}`` (``title`` may be missing).

Bad rows (invalid JSON, not an object, no id, no text) are **errors** naming the file and line by
default; with ``skip_bad=True`` (``--skip-bad`` for ``sleuth index build``) they are skipped,
counted, and the count plus the first few reasons are returned in :class:`IngestStats` (and stored
in the index's ``meta.json``). Blank lines are ignored. Duplicate ids are always an error naming both lines.

On disk (``<dir>/``): ``passages.arrow`` (columns id, title, text) and ``id_hash.npy`` /
``id_rows.npy`` (64-bit id hashes sorted, and the row of each). Reading memory-maps all three, so
a corpus of millions of passages costs no Python objects until a passage is asked for.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa

from sleuth.errors import DataError
from sleuth.retrieval.base import IndexFileError, index_file_error
from sleuth.types import Passage

ARROW_FILE = "passages.arrow"
HASH_FILE = "id_hash.npy"
ROWS_FILE = "id_rows.npy"
SOURCE_FILE = "source.json"
_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])
_BATCH_ROWS = 8192
_MAX_REASONS = 5
SKIP_BAD_HINT = "fix the line, or skip bad lines (--skip-bad for sleuth index build, skip_bad=True in Python)"
JSONL_SHAPE = 'JSON Lines (one {"id": ..., "contents": "\\"Title\\"\\ntext"} object per line)'
_BINARY_MAGIC = {b"PAR1": "a Parquet file", b"ARROW1": "an Arrow file", b"\x1f\x8b": "a gzip file",
                 b"PK\x03\x04": "a zip file", b"SQLite format 3": "a SQLite database"}


class CorpusError(DataError):
    """A corpus file or store is malformed; the message names the file (and line)."""


@dataclass
class IngestStats:
    """What one ingest did: rows written, lines skipped (with ``skip_bad``), file hash."""

    path: str
    n_passages: int = 0
    n_skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    sha256: str = ""


def id_hash(pid: str) -> int:
    """Stable 64-bit hash of a passage id (blake2b), used for the id -> row table."""
    return int.from_bytes(hashlib.blake2b(pid.encode("utf-8"), digest_size=8).digest(), "little")


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None


def parse_row(line: str, where: str) -> tuple[str, str, str]:
    """Parse one jsonl row into ``(id, title, text)``; raise CorpusError naming ``where``."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        msg = e.msg.removesuffix(" at")  # "Unterminated string starting at" + " at column 5"
        raise CorpusError(f"{where}: not valid JSON ({msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    pid = row.get("id", row.get("_id"))
    if pid is None or isinstance(pid, (bool, dict, list)) or str(pid) == "":
        raise CorpusError(f"{where}: missing or empty 'id' field (fields present: {sorted(row)})")
    if isinstance(row.get("contents"), str):
        p = Passage.from_contents(str(pid), row["contents"])
        return p.id, p.title, p.text
    if isinstance(row.get("text"), str):
        title = row.get("title") or ""
        if not isinstance(title, str):
            raise CorpusError(f"{where}: 'title' must be a string, got {type(title).__name__}")
        return str(pid), title.strip(), row["text"].strip()
    raise CorpusError(
        f"{where}: needs a string 'contents' field or a string 'text' field "
        f"(fields present: {sorted(row)})"
    )


def progress_bar(show: bool, bytes_: bool = False):
    """A rich progress bar on stderr (so ``--json`` stdout stays clean); a no-op when hidden."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn() if bytes_ else MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not show,
        transient=True,
    )


def ingest_jsonl(
    path: str | Path, out_dir: str | Path, *, skip_bad: bool = False, show_progress: bool = True
) -> IngestStats:
    """Stream ``path`` (jsonl) into a corpus store in ``out_dir``; see the module docstring."""
    path, out_dir = Path(path), Path(out_dir)
    check_corpus_file(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = IngestStats(path=str(path))
    sha = hashlib.sha256()
    hashes, lines = array("Q"), array("q")  # compact: no Python object per passage
    cols: dict[str, list[str]] = {"id": [], "title": [], "text": []}
    progress = progress_bar(show_progress, bytes_=True)
    arrow_path = out_dir / ARROW_FILE
    try:
        with open(path, "rb") as f, pa.OSFile(str(arrow_path), "wb") as sink, \
                pa.ipc.new_file(sink, _SCHEMA) as writer, progress:
            task = progress.add_task(f"ingest {path.name}", total=path.stat().st_size)
            for lineno, raw in enumerate(f, start=1):
                sha.update(raw)
                progress.advance(task, len(raw))
                if not raw.strip():
                    continue
                try:
                    pid, title, text = parse_row(_decode(raw, f"{path}:{lineno}"), f"{path}:{lineno}")
                except CorpusError as e:
                    if not skip_bad:
                        raise CorpusError(f"{e}; {SKIP_BAD_HINT}") from None
                    stats.n_skipped += 1
                    if len(stats.skipped_examples) < _MAX_REASONS:
                        stats.skipped_examples.append(str(e))
                    continue
                for name, value in (("id", pid), ("title", title), ("text", text)):
                    cols[name].append(value)
                hashes.append(id_hash(pid))
                lines.append(lineno)
                if len(cols["id"]) >= _BATCH_ROWS:
                    writer.write_batch(pa.record_batch(cols, schema=_SCHEMA))
                    cols = {k: [] for k in cols}
            if cols["id"]:
                writer.write_batch(pa.record_batch(cols, schema=_SCHEMA))
        stats.n_passages = len(hashes)
        stats.sha256 = sha.hexdigest()
        if stats.n_passages == 0:
            raise CorpusError(_no_passages(stats))
        _write_id_table(np.frombuffer(hashes, dtype=np.uint64), np.frombuffer(lines, dtype=np.int64),
                        out_dir, path)
        (out_dir / SOURCE_FILE).write_text(json.dumps(asdict(stats), indent=2))
    except BaseException:
        for name in (ARROW_FILE, HASH_FILE, ROWS_FILE, SOURCE_FILE):
            (out_dir / name).unlink(missing_ok=True)
        raise
    return stats


def check_corpus_file(path: Path) -> None:
    """Refuse a corpus path that is missing, a directory, or a binary file (e.g. Parquet)."""
    if path.is_dir():
        raise CorpusError(f"corpus {path} is a directory; give the path of a corpus file in {JSONL_SHAPE}")
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(4096)
    kind = next((name for magic, name in _BINARY_MAGIC.items() if head.startswith(magic)), None)
    if kind or b"\x00" in head:
        raise CorpusError(f"corpus file {path} is {kind or 'a binary file'}, but a corpus must be "
                          f"{JSONL_SHAPE}; convert it, e.g. pandas.read_parquet(...).to_json(..., "
                          "orient='records', lines=True)")


def _no_passages(stats: IngestStats) -> str:
    """Why an ingest produced nothing: an empty file, or (with skip_bad) only bad lines."""
    if not stats.n_skipped:
        return f"corpus file {stats.path} holds no passages"
    return (f"corpus file {stats.path} holds no good passages: all {stats.n_skipped} non-blank "
            f"lines were skipped as bad, e.g. {stats.skipped_examples[0]}")


def _write_id_table(hashes: np.ndarray, lines: np.ndarray, out_dir: Path, src: Path) -> None:
    """Sort id hashes, reject duplicate ids (naming both lines), save hash and row arrays."""
    order = np.argsort(hashes, kind="stable")
    sorted_h = hashes[order]
    same = np.nonzero(sorted_h[1:] == sorted_h[:-1])[0]
    if len(same):
        ids = CorpusStore(out_dir, check=False)
        for j in same:  # equal hashes: a duplicate id, or (astronomically rarely) a collision
            a, b = int(order[j]), int(order[j + 1])
            if ids.id_at(a) == ids.id_at(b):
                raise CorpusError(
                    f"{src}: duplicate passage id {ids.id_at(a)!r} on lines {lines[a]} and "
                    f"{lines[b]}; passage ids must be unique"
                )
    np.save(out_dir / HASH_FILE, sorted_h)
    np.save(out_dir / ROWS_FILE, order.astype(np.int64))


class CorpusStore:
    """Read-only, memory-mapped passages: ``get(row)``, ``get_many(rows)``, ``row_of(id)``."""

    def __init__(self, directory: str | Path, *, check: bool = True):
        self.dir = Path(directory)
        arrow_path = self.dir / ARROW_FILE
        if not arrow_path.is_file():
            raise CorpusError(f"{self.dir} is not a corpus store ({ARROW_FILE} is missing)")
        try:
            self._source = pa.memory_map(str(arrow_path), "r")
            self.table = pa.ipc.open_file(self._source).read_all()
        except (OSError, ValueError) as e:  # pa.ArrowInvalid is a ValueError
            raise index_file_error(arrow_path, e) from None
        self._batches = self.table.to_batches()
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches])[:-1]
        if check:
            self._hash, self._rows = (_load_array(self.dir / name) for name in (HASH_FILE, ROWS_FILE))
            if len(self._hash) != self.table.num_rows:
                raise IndexFileError(f"{self.dir}: id table and passages disagree in length")

    def __len__(self) -> int:
        return self.table.num_rows

    def id_at(self, row: int) -> str:
        return self.get_many([row])[0].id

    def get(self, row: int, score: float | None = None) -> Passage:
        """The passage at ``row`` (0-based)."""
        return self.get_many([row], [score])[0]

    def get_many(self, rows, scores=None) -> list[Passage]:
        """Passages at ``rows`` (in that order), with the matching ``scores`` when given.

        Reads single values from the record batch holding each row (zero-copy slices of the
        memory map): ``Table.take`` would concatenate the chunks of a column on every call.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if scores is None:
            scores = [None] * len(rows)
        out = []
        for row, s in zip(rows.tolist(), scores):
            if not 0 <= row < len(self):
                raise IndexError(f"row {row} out of range for a corpus of {len(self)} passages")
            b = int(np.searchsorted(self._starts, row, side="right")) - 1
            batch, off = self._batches[b], row - int(self._starts[b])
            pid, title, text = (batch.column(j)[off].as_py() for j in range(3))
            out.append(Passage(pid, title, text, None if s is None else float(s)))
        return out

    def row_of(self, pid: str) -> int:
        """The row of passage id ``pid``; KeyError when absent."""
        h = np.uint64(id_hash(str(pid)))
        j = int(np.searchsorted(self._hash, h))
        while j < len(self._hash) and self._hash[j] == h:
            row = int(self._rows[j])
            if self.id_at(row) == str(pid):
                return row
            j += 1
        raise KeyError(f"passage id {pid!r} is not in the corpus at {self.dir}")

    def get_by_id(self, pid: str) -> Passage:
        return self.get(self.row_of(pid))

    def fingerprint(self) -> str:
        """The sha256 of the source file (from ingest), identifying this corpus in caches."""
        src = self.dir / SOURCE_FILE
        if src.is_file():
            return json.loads(src.read_text())["sha256"]
        return hashlib.sha256(f"{len(self)}|{self.id_at(0)}|{self.id_at(len(self) - 1)}".encode()).hexdigest()

    def iter_texts(self, batch_rows: int = 4096, start: int = 0,
                   stop: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """Yield ``(first_row, texts)`` batches of index text (title line + text) for rows [start, stop)."""
        stop = len(self) if stop is None else min(stop, len(self))
        for lo in range(start, stop, batch_rows):
            part = self.table.slice(lo, min(batch_rows, stop - lo)).select(["title", "text"]).to_pydict()
            yield lo, [index_text(t, x) for t, x in zip(part["title"], part["text"])]


def _load_array(path: Path) -> np.ndarray:
    """A memory-mapped .npy array; a missing or corrupt file is an IndexFileError."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError:  # numpy's text ("pickled data ... allow_pickle") would mislead here
        raise IndexFileError(f"{path} is not a valid .npy array") from None
    except (OSError, EOFError) as e:
        raise index_file_error(path, e) from None


def index_text(title: str, text: str) -> str:
    """The text a retriever indexes for a passage: the title line, then the body."""
    return f"{title}\n{text}" if title else text

