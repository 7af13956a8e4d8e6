"""FlashRAG-style QA files -> Search-R1 training and test parquet (``sleuth data prepare``).

Search-R1 (``scripts/data_process/qa_search_{train,test}_merge.py``) trains on NQ + HotpotQA train
and tests on seven sets, taking each set's ``test`` split when it has one and ``dev`` otherwise.
:func:`prepare` does the same from local files (or from the hub with ``hub=True``):

* every ``--train`` file is merged (in the order given) into ``OUT/train.parquet``;
* every ``--test`` file is test data, whatever split its path names, with one exception taken from
  Search-R1: a dataset's ``dev``/``val`` files are left out when a ``test`` file of that dataset is
  given. The files used are merged into ``OUT/test.parquet``.

No input file is dropped silently: files merged into one dataset, a dev file left out, and a file
named as train data but given under ``--test`` each get a note (``summary["notes"]``); a file
given twice under one flag is an error.

Dataset and split come from the path: ``nq/test.jsonl`` (FlashRAG layout), ``dev/nq.jsonl``
(``../shared/data`` layout) or ``nq_test.jsonl``; a file that names no split is taken as ``train``
for ``--train`` and ``test`` for ``--test``. Rows keep their own ``data_source`` when they have one.
Question ids are ``{data_source}/{split}/{row id}``; a duplicate id across the merged files is an
error naming both files (so every id in a written parquet is unique and reads back the same).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sleuth.data.qa import QADataError, load_hub, load_questions
from sleuth.data.searchr1_parquet import write_searchr1_parquet
from sleuth.types import Question

SPLITS = ("train", "dev", "test", "val", "validation")
DEV_SPLITS = ("dev", "val", "validation")


def dataset_and_split(path: str | Path, default_split: str) -> tuple[str, str]:
    """``(dataset, split)`` named by a QA file's path (see the module docstring)."""
    p = Path(path)
    stem = p.name.split(".")[0]
    if stem in SPLITS:
        return p.parent.name or stem, stem
    if p.parent.name in SPLITS:
        return stem, p.parent.name
    for split in SPLITS:
        for sep in ("_", "-", "."):
            if stem.endswith(sep + split) and len(stem) > len(split) + 1:
                return stem[: -len(split) - 1], split
    return stem, default_split


def _load(path: str, dataset: str, split: str, limit: int | None) -> list[Question]:
    """Questions of one file, labelled ``dataset`` when the rows carry no ``data_source``."""
    qs = load_questions(path, split=split, limit=limit)
    stem = Path(path).name.split(".")[0]
    out = []
    for q in qs:
        if q.data_source == stem and stem != dataset:  # defaulted to the file stem: use the dataset name
            q = dataclasses.replace(q, id=f"{dataset}/{split}/{q.meta['row_id']}", data_source=dataset)
        out.append(q)
    return out


def _check_unique(groups: list[tuple[str, list[Question]]], split: str) -> list[Question]:
    """Merge, checking the ids the parquet will read back as (``{source}/{split}/{row id}``)."""
    seen: dict[str, str] = {}
    merged = []
    for where, qs in groups:
        for q in qs:
            qid = f"{q.data_source}/{split}/{q.meta.get('row_id', q.id)}"
            if qid in seen:
                raise QADataError(f"duplicate question id {qid!r} in {seen[qid]} and {where}; "
                                  "ids must be unique across the merged files")  # fmt: skip
            seen[qid] = where
            merged.append(q)
    return merged


def choose_test_files(files: list[str]) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Per dataset, the ``(file, split)`` pairs that make its test data, and notes for the user.

    Every file is test data, whatever split its path names, except that a dataset's dev/val files
    are left out when a test file of that dataset is given (Search-R1: test, else dev). Several
    files left for one dataset are merged. Each of these decisions gets a note.
    """
    by_dataset: dict[str, list[tuple[str, str]]] = {}
    for f in files:
        name, split = dataset_and_split(f, "test")
        by_dataset.setdefault(name, []).append((f, split))
    chosen: dict[str, list[tuple[str, str]]] = {}
    notes: list[str] = []
    for name, pairs in by_dataset.items():
        has_test = any(split == "test" for _, split in pairs)
        keep = [(f, split) for f, split in pairs if not (has_test and split in DEV_SPLITS)]
        notes += [f"{name}: not using {split} file {f}: a test file of {name!r} is given (test, else dev)"
                  for f, split in pairs if (f, split) not in keep]  # fmt: skip
        notes += [f"{name}: {f} is named as {split} data; used as test data (given under --test)"
                  for f, split in keep if split not in ("test", *DEV_SPLITS)]  # fmt: skip
        if len(keep) > 1:
            notes.append(f"{name}: merged {len(keep)} test files: {', '.join(f for f, _ in keep)}")
        chosen[name] = keep
    return chosen, notes


def _train_notes(files: list[str]) -> list[str]:
    """A note per dataset whose train data comes from several files (they are merged)."""
    by_dataset: dict[str, list[str]] = {}
    for f in files:
        by_dataset.setdefault(dataset_and_split(f, "train")[0], []).append(f)
    merged = [(name, fs) for name, fs in by_dataset.items() if len(fs) > 1]
    return [f"{name}: merged {len(fs)} train files: {', '.join(fs)}" for name, fs in merged]


def _check_no_repeats(train: list[str], test: list[str]) -> None:
    for flag, entries in (("--train", train), ("--test", test)):
        repeated = sorted({e for e in entries if entries.count(e) > 1})
        if repeated:
            raise QADataError(f"{flag} names {', '.join(repeated)} more than once; give each file (or dataset) once")


def _write(qs: list[Question], path: Path, fmt, split: str) -> Path:
    try:
        return write_searchr1_parquet(qs, path, fmt, split=split)
    except OSError as e:
        raise QADataError(f"cannot write {path} ({e.strerror}); give --out a directory you can write to") from None


def _hub_test(name: str, limit: int | None) -> tuple[list[Question], str]:
    try:
        return load_hub(name, "test", limit=limit), "test"
    except QADataError as e:
        if "no split" not in str(e):
            raise
        return load_hub(name, "dev", limit=limit), "dev"


def prepare(train: list[str], test: list[str], out: str | Path, fmt=None, *, hub: bool = False,
            limit: int | None = None) -> dict:  # fmt: skip
    """Write ``OUT/train.parquet`` and/or ``OUT/test.parquet``; return what was written.

    With ``hub=True`` the entries of ``train``/``test`` are FlashRAG dataset names (``nq``,
    ``hotpotqa`` …) loaded with :func:`sleuth.data.qa.load_hub` (needs internet).
    """
    if not train and not test:
        raise QADataError("nothing to prepare: give --train and/or --test files")
    _check_no_repeats(train, test)
    out = Path(out)
    summary: dict = {"out": str(out), "notes": []}
    if train:
        if hub:
            groups = [(f"hub:{n}/train", load_hub(n, "train", limit=limit)) for n in train]
        else:
            groups = [(f, _load(f, *dataset_and_split(f, "train"), limit)) for f in train]
            summary["notes"] += _train_notes(train)
        qs = _check_unique(groups, "train")
        path = _write(qs, out / "train.parquet", fmt, "train")
        summary["train"] = {"path": str(path), "n": len(qs), "files": [w for w, _ in groups]}
    if test:
        if hub:
            loaded = {n: _hub_test(n, limit) for n in test}
            groups = [(f"hub:{n}/{split}", qs) for n, (qs, split) in loaded.items()]
            chosen = {n: [f"hub:{n}/{split}"] for n, (_, split) in loaded.items()}
        else:
            picks, notes = choose_test_files(test)
            summary["notes"] += notes
            groups = [(f, _load(f, name, split, limit)) for name, pairs in picks.items() for f, split in pairs]
            chosen = {name: [f for f, _ in pairs] for name, pairs in picks.items()}
        qs = _check_unique(groups, "test")
        path = _write(qs, out / "test.parquet", fmt, "test")
        summary["test"] = {"path": str(path), "n": len(qs), "chosen": chosen,
                           "by_source": _counts(qs)}  # fmt: skip
    return summary


def _counts(qs: list[Question]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for q in qs:
        counts[q.data_source] = counts.get(q.data_source, 0) + 1
    return counts
