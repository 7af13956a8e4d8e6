"""``sleuth data filter``: split a QA file by whether the retriever finds a gold answer for the question.

The test is DPR's top-k "has answer" (Karpukhin et al. 2020), read as Search-R1's ``is_retrieval_correct``
reads a response: a normalised gold answer is a substring of a normalised passage (its title and text), among
the top ``k`` passages retrieved with the question's own text as the query (Search-R1's preprocessing, as
``sleuth eval --rag`` sends it). It measures what a search for the question can give a policy: training on the
questions it keeps is R1-Searcher's kind of data selection (questions the environment can reward), and the
share it keeps per source is the retriever's answer recall at ``k`` on that data.

A rollout shows passages cut to ``rollout.max_obs_tokens`` tokens; this test reads them whole, so a gold
answer late in the ``k``-th passage counts here and may be cut off there.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from sleuth.data.qa import raw_rows
from sleuth.errors import UserError
from sleuth.files import write_text_atomic
from sleuth.retrieval.base import Retriever
from sleuth.reward.tags import answer_in_texts
from sleuth.rollout.formats import normalize_question
from sleuth.types import Passage, Question


def passage_text(p: Passage) -> str:
    """The text the test reads: title and passage (as the rendered ``<information>`` block shows both)."""
    return f"{p.title}\n{p.text}" if p.title else p.text


def answer_found(questions: list[Question], retriever: Retriever, k: int, *, batch_size: int = 256) -> list[bool]:
    """For each question, whether a gold answer is in the top ``k`` passages retrieved with its text."""
    if k < 1:
        raise UserError(f"--topk must be >= 1, got {k}")
    found: list[bool] = []
    for start in range(0, len(questions), batch_size):
        batch = questions[start:start + batch_size]
        results = retriever.search([normalize_question(q.text) for q in batch], k)
        found += [answer_in_texts([passage_text(p) for p in passages[:k]], q.golden_answers)
                  for q, passages in zip(batch, results)]  # fmt: skip
    return found


def counts_by_source(questions: list[Question], found: list[bool]) -> dict[str, dict[str, int]]:
    """``{source: {"n": questions, "found": with a gold answer retrieved}}``, sources in file order."""
    n, hit = Counter(), Counter()
    for q, f in zip(questions, found):
        n[q.data_source] += 1
        hit[q.data_source] += int(f)
    return {s: {"n": n[s], "found": hit[s]} for s in n}


def check_new_file(out: str | Path, flag: str = "--out") -> Path:
    """``out`` as a new JSON-lines file: refused when it exists (a data file is never overwritten), does not
    end in ``.jsonl`` or its directory is missing."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{flag} {out} exists; give a new file (sleuth data filter never overwrites a file)")
    if out.suffix.lower() != ".jsonl":
        raise UserError(f"{flag} {out}: the rows are written as JSON lines; give a path ending in .jsonl")
    if not out.parent.is_dir():
        raise UserError(f"{flag} {out}: no directory {out.parent}; create it first")
    return out


def write_kept(path: str | Path, out: str | Path, questions: list[Question], keep: list[bool],
               flag: str = "--out") -> int:
    """Write the rows of ``path`` whose question is kept, as read (one JSON object a line), to the new
    file ``out``; refuses an existing ``out`` (a data file is never overwritten). Returns the rows written."""
    out = check_new_file(out, flag)
    wanted = {q.meta["source"] for q, k in zip(questions, keep) if k}
    lines = [json.dumps(row, ensure_ascii=False) for where, row in raw_rows(path) if where in wanted]
    if len(lines) != len(wanted):  # every kept question came from one row of the file: an invariant
        raise AssertionError(f"{len(wanted)} questions kept but {len(lines)} rows matched in {path}")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    write_text_atomic(tmp, "".join(line + "\n" for line in lines))
    try:
        os.link(tmp, out)  # fails where a file appeared at ``out`` meanwhile: never replaced
    except FileExistsError:
        raise UserError(f"{flag} {out} appeared while filtering; the rows are left in {tmp}") from None
    tmp.unlink()
    return len(lines)
