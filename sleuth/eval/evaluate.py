"""Evaluate a policy on QA sets: greedy, batched, through the same rollout code as training.

``evaluate(model, tokenizer, questions, fmt, retriever, rollout_cfg, topk=, batch_size=)`` runs
``run_rollouts(..., greedy=True, group_size=1)`` over batches of questions and returns
``(summary, rows)``: one row per question (``score_trajectory`` plus the turns, queries and
retrieved titles, read from the trajectory's ``turns``, for ``trajectories.jsonl``) and their
:class:`~sleuth.eval.metrics.EvalSummary`.

The no-retrieval baseline (``no_search=True``) changes exactly two things:

* the prompt is :data:`DIRECT_INSTRUCTION` (asks for a direct ``<answer>``; no search tool is
  described; a format's worked example shown answered directly), built by :class:`NoSearchFormat` around the
  chosen format, so stop strings, answer parsing and chat template stay the same;
* ``max_turns=0``: the rollout loop starts every row in its final round, where a ``<search>`` is
  *not executed* and ends the row with stop reason ``max_turns`` (no answer, score 0). The
  retriever is never called (a :class:`NoRetriever` raises if it were).

Retrieval results can be cached on disk across evaluations of several checkpoints:
:class:`DiskCachedRetriever` keys ``(index fingerprint, k, query)`` in a SQLite file.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sleuth.config import RolloutConfig
from sleuth.eval.metrics import EvalPerf, EvalSummary, score_trajectory, summarize
from sleuth.eval.rag import RagFormat, rag_passages
from sleuth.records import SEGMENT_TEXT_LIMIT, prompt_record, segment_records, turn_records
from sleuth.rollout.formats import normalize_question, worked_examples
from sleuth.rollout.loop import run_rollouts
from sleuth.types import Passage, Question, Trajectory

DIRECT_INSTRUCTION = (
    "Answer the given question directly, from your own knowledge; no search engine is available. "
    "You may reason inside <think> and </think> first, then give the final answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)


class NoSearchFormat:
    """Wraps a protocol format for the no-retrieval baseline: only the prompt changes (the user
    message; no system prompt or tool schemas, which would describe the search tool); every other
    attribute (stop strings, parsing, rendering) is the wrapped format's."""

    def __init__(self, base):
        self.base = base
        self.name = f"{base.name}+no_search"
        self.system_prompt = None  # a system prompt would describe the search tool
        self.tools = None  # and so would the tool schemas of the tool_call format

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def user_content(self, question: Question) -> str:
        """:data:`DIRECT_INSTRUCTION`; with a format that shows a worked example (``search_r1_fewshot``), its
        question answered directly (no search, no passage) goes before the question, as the search prompt's does."""
        examples = worked_examples(self.base)
        if not examples:
            return DIRECT_INSTRUCTION.format(question=normalize_question(question.text))
        head = DIRECT_INSTRUCTION[:DIRECT_INSTRUCTION.index("Question: {question}")]
        shots = "\n\n".join(f"Question: {ex.question}\n{self.base.answer_turn(ex.answer, ex.direct_thought)}"
                              for ex in examples)
        return f"{head}{shots}\n\nQuestion: {normalize_question(question.text)}\n"


class NoRetriever:
    """The retriever of a ``--no-search`` eval: never called (``max_turns=0``); raises if it is."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        raise RuntimeError("no retriever in a --no-search evaluation")


class DiskCachedRetriever:
    """An on-disk ``(fingerprint, k, query) -> passages`` cache in front of a retriever.

    ``fingerprint`` must identify the index exactly (see ``retriever_fingerprint`` in the eval CLI):
    a rebuilt index gets a new fingerprint, so stale entries are never served. Failed searches are
    not cached. SQLite makes the file safe to share between processes evaluating in parallel.
    """

    def __init__(self, inner, path: str | Path, fingerprint: str):
        self.inner, self.fingerprint = inner, fingerprint
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS results (fingerprint TEXT, k INTEGER, query TEXT, "
                         "passages TEXT, PRIMARY KEY (fingerprint, k, query))")
        self._db.commit()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def _lookup(self, queries: list[str], k: int) -> dict[str, list[Passage]]:
        found: dict[str, list[Passage]] = {}
        unique = list(dict.fromkeys(queries))
        for i in range(0, len(unique), 500):  # stay under SQLite's bound-variable limit
            chunk = unique[i : i + 500]
            marks = ",".join("?" * len(chunk))
            cur = self._db.execute(f"SELECT query, passages FROM results WHERE fingerprint=? AND k=? "
                                   f"AND query IN ({marks})", [self.fingerprint, k, *chunk])
            for query, blob in cur:
                found[query] = [Passage(**d) for d in json.loads(blob)]
        return found

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._lock:
            found = self._lookup(queries, k)
        misses = [q for q in dict.fromkeys(queries) if q not in found]
        self.hits += len(queries) - sum(q in misses for q in queries)
        self.misses += len(misses)
        if misses:
            fresh = self.inner.search(misses, k)
            rows = [(self.fingerprint, k, q, json.dumps([dataclasses.asdict(p) for p in ps]))
                    for q, ps in zip(misses, fresh)]  # fmt: skip
            with self._lock:
                self._db.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", rows)
                self._db.commit()
            found.update(zip(misses, fresh))
        return [list(found[q]) for q in queries]

    def close(self) -> None:
        self._db.close()


def trajectory_row(traj: Trajectory) -> dict:
    """One ``trajectories.jsonl`` row: the scores of ``score_trajectory``, every turn (with its
    searches' passages), the response, the prompt and the segments (``sleuth.records``)."""
    row = score_trajectory(traj)
    row["retrieval_errors"] = traj.num_retrieval_errors
    row["turns_detail"] = turn_records(traj)
    row["response"] = traj.response_text
    row["prompt"] = prompt_record(traj, SEGMENT_TEXT_LIMIT)
    row["segments"] = segment_records(traj, SEGMENT_TEXT_LIMIT)
    return row


def evaluate(
    model,
    tokenizer,
    questions: list[Question],
    fmt,
    retriever,
    rollout_cfg: RolloutConfig,
    *,
    topk: int = 3,
    batch_size: int = 64,
    no_search: bool = False,
    rag: bool = False,
    seed: int = 0,
    backend=None,
    judge=None,
    on_batch: Callable[[list[dict]], None] | None = None,
    progress: bool = False,
    samples: int = 1,
    temperature: float | None = None,
) -> tuple[EvalSummary, list[dict]]:
    """Greedy, one sample per question, ``batch_size`` questions per ``run_rollouts`` call; or, with
    ``samples`` > 1 or a ``temperature``, that many samples a question at that temperature (1.0 by default),
    each row with its ``sample`` index and its ``reward`` (its exact match; ``sleuth.eval.sampled``).
    ``batch_size`` counts rollouts, so ``batch_size // samples`` questions go in a call (at least one): the
    memory a batch takes (its KV cache) stays that of a greedy batch (64 questions x 8 samples of SmolLM2-135M
    at a 1,024-token context took 20-24 GiB on a CPU, until the kernel's OOM killer ended it; 256 rollouts: ~10).

    ``rag``: the retrieval-augmented baseline (``sleuth.eval.rag``): the question's top-``topk`` passages in
    the prompt, one answer, no search turns. ``backend`` defaults to ``HFBackend(model, tokenizer)``. ``judge`` (an ``LLMJudge``) adds a
    ``judge`` verdict per row. ``on_batch(rows)`` is called after each batch (the CLI appends them
    to ``trajectories.jsonl`` so an interrupted eval resumes). Returns ``(summary, rows)``;
    ``summary.perf`` holds wall time, questions/s and the generate/retrieve split.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if backend is None:
        # lazy: torch + transformers (~1.6 s), needed only when the caller brings no backend
        from sleuth.rollout.hf_backend import HFBackend

        model.eval()
        backend = HFBackend(model, tokenizer)
    if no_search and rag:
        raise ValueError("no_search and rag are two baselines: ask for one")
    if no_search:
        fmt = fmt if isinstance(fmt, NoSearchFormat) else NoSearchFormat(fmt)
        rollout_cfg = dataclasses.replace(rollout_cfg, max_turns=0)
        retriever = NoRetriever()
    if rag:
        rollout_cfg = dataclasses.replace(rollout_cfg, max_turns=0)
    sampled = samples > 1 or temperature is not None
    if sampled:
        rollout_cfg = dataclasses.replace(rollout_cfg, temperature=1.0 if temperature is None else temperature)
    rows: list[dict] = []
    perf = EvalPerf()
    t0 = time.perf_counter()
    per_call = max(1, batch_size // max(samples, 1))  # questions a call: batch_size rollouts
    for start in range(0, len(questions), per_call):
        batch = questions[start : start + per_call]
        batch_fmt, batch_retriever = fmt, retriever
        if rag:  # the passages up front, then a rollout that cannot search
            t_r = time.perf_counter()
            passages = rag_passages(batch, retriever, fmt, tokenizer, k=topk, max_tokens=rollout_cfg.max_obs_tokens)
            perf.retrieve_s += time.perf_counter() - t_r
            batch_fmt, batch_retriever = RagFormat(fmt, passages), NoRetriever()
        trajs, metrics = run_rollouts(batch, backend, tokenizer, batch_fmt, batch_retriever, rollout_cfg, seed=seed,
                                      step=0, k=topk, greedy=not sampled, group_size=samples)  # fmt: skip
        perf.generate_s += metrics["rollout/time_generate_s"]
        perf.retrieve_s += metrics["rollout/time_retrieve_s"]
        new = [trajectory_row(t) for t in trajs]
        if sampled:
            for t, row in zip(trajs, new):
                row["sample"], row["reward"] = t.sample_index, row["em"]
        if judge is not None:
            judge.judge_rows(new)
        rows += new
        if on_batch is not None:
            on_batch(new)
        if progress:
            em = sum(r["em"] for r in rows) / len(rows)
            done = len(rows) // max(samples, 1)
            rate = done / (time.perf_counter() - t0)
            print(f"eval: {done}/{len(questions)} questions, EM {em:.3f}, {rate:.2f} q/s",
                  file=sys.stderr, flush=True)  # fmt: skip
    perf.seconds = time.perf_counter() - t0
    perf.questions_per_s = len(rows) / max(samples, 1) / perf.seconds if perf.seconds > 0 else 0.0
    summary = summarize(rows)
    summary.perf = perf
    return summary, rows
