"""The multi-turn agent loop: Q questions x G samples, generate <-> retrieve, round by round.

Read top to bottom, ``run_rollouts`` is the algorithm:

1. Every row starts with its prompt (an injected segment; never cut).
2. A round: every active row generates one turn (one batched ``backend.generate`` call) until a
   stop string of the format, eos, or its token cap ``min(max_tokens_per_turn, context left)``.
3. Each turn is parsed with ``fmt.parse_action``:
   answer -> ``answered``; search -> queue its queries; invalid -> the corrective message is
   injected (``num_invalid`` counted; the ``max_invalid + 1``-th invalid turn stops the row with
   ``invalid_action``); a turn that ended with eos and holds no action -> ``eos``; a turn cut by
   its cap -> ``context_full`` when the context is full, else ``max_tokens``.
4. All queries of the round, across the batch, are de-duplicated and retrieved in ONE
   ``retriever.search(unique_queries, k)`` call. Any exception (``RetrievalError`` or other)
   becomes ``fmt.render_error(...)`` for the rows that searched; the batch goes on.
5. Observations are truncated to ``max_obs_tokens`` (passage texts shortened, the format's closing
   tag kept; rendered once per distinct query list) and appended as injected segments. An
   injection that would leave no room to generate stops the row with ``context_full`` instead.
6. A row that has used ``max_turns`` searches (failed ones count) gets ``final_nudge`` (when set)
   and one final round in which a search is not executed: search or invalid there -> ``max_turns``.

The whole loop runs inside ``backend.session()`` when the backend has one: the HF backend then
keeps each row's keys/values from one round to the next and prefills only the new tokens. With
``rollout.max_concurrent_rows`` the rows go through the loop in shares of at most that many (the
first share's rounds to the end, then the next), so no more rows than that generate, or keep a KV
cache, at once; a row's tokens do not depend on its share (per-row seeds).

Seeds: a row's seed is ``derive_seed(seed, step, question.id, sample_index)`` and each turn draws
with ``derive_seed(row_seed, turn)``, so the same (seed, step) replays the same trajectories.

Trajectory fields: ``turns`` gets one :class:`~sleuth.types.Turn` per generated turn (its text, the
parsed action, the finish reason and, for a search the loop executed, a ``SearchOutcome``: passage
ids and titles per query, the injected observation, the error when it failed); ``queries`` lists
every query issued, ``passage_ids`` one list per issued query (empty when that search failed, so the
two stay aligned), ``retrieved_text`` the injected text of each search (observation or error,
template wrapping included for tool messages), ``answer`` the parsed answer of the answering turn.

EOS rule: no token is ever appended that the policy did not sample. Generation stops right after
``</answer>`` (a stop string), so Search-R1-style trajectories end there with no eos; when the
policy itself samples eos inside a turn, that eos is kept as a sampled (trained) token.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

from sleuth.config import RolloutConfig
from sleuth.errors import ConfigError, DataError
from sleuth.rollout.backends import SamplingParams, derive_seed
from sleuth.rollout.chat import ChatRenderer
from sleuth.rollout.observation import fit_observation
from sleuth.types import ActionKind, Question, SearchOutcome, Segment, StopReason, Trajectory, Turn


@dataclass
class _Row:
    traj: Trajectory
    context: list[int]
    seed: int
    search_attempts: int = 0
    final: bool = False
    pending: list[str] = field(default_factory=list)  # queries to run this round
    last_eos: int | None = None  # eos token that ended the last turn, if any

    @property
    def done(self) -> bool:
        return self.traj.stop_reason is not None


@dataclass
class _Stats:
    rounds: int = 0
    queries: int = 0
    distinct_queries: int = 0
    retrieval_calls: int = 0
    generate_s: float = 0.0
    retrieve_s: float = 0.0


def run_rollouts(
    questions: list[Question],
    backend,
    tokenizer,
    fmt,
    retriever,
    cfg: RolloutConfig,
    *,
    seed: int = 0,
    step: int = 0,
    k: int = 3,
    greedy: bool = False,
    group_size: int | None = None,
    keep: range | None = None,
) -> tuple[list[Trajectory], dict[str, float]]:
    """Roll out ``group_size`` (default ``cfg.group_size``) samples per question.

    Returns the trajectories (question-major: all samples of question 0, then question 1, …) and
    a metrics dict with ``rollout/``-namespaced keys. ``keep`` (question indices) returns only
    those questions' trajectories, and their metrics; the others are generated alongside (the
    ranks of a tensor-parallel vLLM engine must all submit the same prompts). The work counts
    (rounds, queries, retrieval calls, times) stay those of the whole call.
    """
    t_start = time.perf_counter()
    G = cfg.group_size if group_size is None else group_size
    _check_inputs(questions, G, k, cfg)
    render = ChatRenderer(tokenizer, fmt, cfg.use_chat_template)
    params = SamplingParams(
        max_new_tokens=cfg.max_tokens_per_turn, temperature=cfg.temperature, top_p=cfg.top_p,
        top_k=cfg.top_k, greedy=greedy, stop=tuple(fmt.stop_sequences),
    )  # fmt: skip
    rows = []
    for q in questions:
        ids, text = render.prompt(q)
        for g in range(G):
            traj = Trajectory(question=q, sample_index=g, segments=[Segment.injected(ids, text)])
            rows.append(_Row(traj, list(ids), derive_seed(seed, step, q.id, g)))
    stats = _Stats()
    for row in rows:
        if cfg.max_turns <= 0:
            _enter_final_round(row, render, cfg)
    cap = cfg.max_concurrent_rows or len(rows)  # rows generating at once (their KV cache), one share at a time
    for start in range(0, len(rows), cap):
        share, rounds = rows[start : start + cap], 0
        with _session(backend):
            while active := [r for r in share if not r.done]:
                rounds += 1
                _generate_round(active, backend, params, render, tokenizer, fmt, cfg, stats)
                searching = [r for r in active if r.pending and not r.done]
                if searching:
                    _retrieve_round(searching, retriever, k, render, fmt, cfg, stats)
        stats.rounds = max(stats.rounds, rounds)
    kept = [r.traj for i, r in enumerate(rows) if keep is None or i // G in keep]
    return kept, rollout_metrics(kept, stats, time.perf_counter() - t_start)


def _session(backend):
    """The backend's ``session()`` when it has one (the HF backend then reuses each row's KV
    cache from one round to the next), else a no-op context."""
    open_session = getattr(backend, "session", None)
    return open_session() if callable(open_session) else contextlib.nullcontext()


def _check_inputs(questions: list[Question], G: int, k: int, cfg: RolloutConfig) -> None:
    if G < 1:
        raise ConfigError(f"rollout.group_size must be >= 1, got {G}")
    if k < 1:
        raise ConfigError(f"retrieval topk must be >= 1, got {k}")
    for name in ("max_tokens_per_turn", "max_obs_tokens", "max_context_tokens"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"rollout.{name} must be >= 1, got {getattr(cfg, name)}")
    seen: set[str] = set()
    for i, q in enumerate(questions):
        if q.id in seen:
            raise DataError(f"question {i} repeats id {q.id!r}; GRPO groups need unique question ids")
        seen.add(q.id)


def _generate_round(active, backend, params, render, tokenizer, fmt, cfg, stats) -> None:
    """One turn for every active row: one batched generate call, then parse and react."""
    caps = [min(cfg.max_tokens_per_turn, cfg.max_context_tokens - len(r.context)) for r in active]
    for r, cap in zip(active, caps):
        if cap <= 0:  # only a prompt at/over budget gets here; it is never cut
            _finish(r, StopReason.CONTEXT_FULL)
    go = [(r, c) for r, c in zip(active, caps) if c > 0]
    if not go:
        return
    t0 = time.perf_counter()
    seeds = [derive_seed(r.seed, r.traj.num_turns) for r, _ in go]
    results = backend.generate([r.context for r, _ in go], params, seeds, [c for _, c in go])
    stats.generate_s += time.perf_counter() - t0
    if len(results) != len(go):
        raise RuntimeError(f"backend returned {len(results)} results for {len(go)} prompts")
    for (row, _), res in zip(go, results):
        text = tokenizer.decode(res.token_ids, skip_special_tokens=False)
        row.traj.segments.append(Segment.sampled(res.token_ids, res.logprobs, text))
        row.context += res.token_ids
        row.traj.num_turns += 1
        row.last_eos = res.token_ids[-1] if res.finish_reason == "eos" and res.token_ids else None
        action = fmt.parse_action(text)
        row.traj.turns.append(Turn(text, action, res.finish_reason))
        _react(row, res.finish_reason, action, render, fmt, cfg)


def _react(row: _Row, finish_reason: str, action, render, fmt, cfg) -> None:
    """Decide what follows a parsed turn (see the module docstring, step 3)."""
    traj = row.traj
    if finish_reason == "length":
        full = len(row.context) >= cfg.max_context_tokens
        return _finish(row, StopReason.CONTEXT_FULL if full else StopReason.MAX_TOKENS)
    if action.kind is ActionKind.ANSWER:
        traj.answer = action.answer
        return _finish(row, StopReason.ANSWERED)
    if action.kind is ActionKind.SEARCH and action.queries:  # a search without queries is invalid
        if row.final:
            return _finish(row, StopReason.MAX_TURNS)
        row.pending = list(action.queries)
        return None
    if finish_reason == "eos":
        return _finish(row, StopReason.EOS)
    traj.num_invalid += 1
    if traj.num_invalid > cfg.max_invalid:
        return _finish(row, StopReason.INVALID_ACTION)
    if row.final:
        return _finish(row, StopReason.MAX_TURNS)
    ids, text = render.text_ids(fmt.render_invalid())
    return _inject(row, ids, text, cfg)


def _retrieve_round(searching, retriever, k, render, fmt, cfg, stats) -> None:
    """One batched, de-duplicated search for the whole round; observations injected per row."""
    all_queries = [q for r in searching for q in r.pending]
    unique = list(dict.fromkeys(all_queries))
    stats.queries += len(all_queries)
    stats.distinct_queries += len(unique)
    stats.retrieval_calls += 1
    t0 = time.perf_counter()
    error, by_query = None, {}
    try:
        found = retriever.search(unique, k)
        if not isinstance(found, list) or len(found) != len(unique):
            raise ValueError(f"retriever returned {len(found) if isinstance(found, list) else found!r} "
                             f"result lists for {len(unique)} queries")  # fmt: skip
        by_query = dict(zip(unique, found))
    except Exception as e:  # RetrievalError or anything else: an observation, not a crash
        error = f"{type(e).__name__}: {e}"
    stats.retrieve_s += time.perf_counter() - t0
    observations: dict[tuple, tuple[list[int], str]] = {}  # rows that searched alike read alike
    reasks = getattr(fmt, "reasks", False)
    for row in searching:
        traj, queries = row.traj, row.pending  # the queries of the row's last turn (this round's)
        row.pending = []
        traj.queries += queries
        row.search_attempts += 1
        if error is None:
            results = [(q, list(by_query[q])) for q in queries]
            traj.passage_ids += [[p.id for p in ps] for _, ps in results]
            traj.num_searches += 1
            asked = traj.question.text if reasks else None  # a re-asking format's observation holds the question
            key = (tuple(queries), row.last_eos, asked)
            if key not in observations:
                observations[key] = fit_observation(results, render, cfg.max_obs_tokens, row.last_eos,
                                                    question=asked)
            ids, text = observations[key]
            traj.turns[-1].search = SearchOutcome([[p.id for p in ps] for _, ps in results],
                                                  [[p.title for p in ps] for _, ps in results], text,
                                                  texts=[[p.text for p in ps] for _, ps in results])
        else:
            traj.passage_ids += [[] for _ in queries]
            traj.num_retrieval_errors += 1
            ids, text = fit_observation(None, render, cfg.max_obs_tokens, row.last_eos, fmt.render_error(error))
            traj.turns[-1].search = SearchOutcome([[] for _ in queries], [[] for _ in queries], text, error)
        traj.retrieved_text.append(text)
        if _inject(row, ids, text, cfg) and row.search_attempts >= cfg.max_turns:
            _enter_final_round(row, render, cfg)


def _enter_final_round(row: _Row, render, cfg) -> None:
    row.final = True
    if cfg.final_nudge:
        ids, text = render.text_ids(cfg.final_nudge)
        _inject(row, ids, text, cfg)


def _inject(row: _Row, ids: list[int], text: str, cfg) -> bool:
    """Append an injected segment, or stop with ``context_full`` when no room to generate would be left."""
    if len(row.context) + len(ids) >= cfg.max_context_tokens:
        _finish(row, StopReason.CONTEXT_FULL)
        return False
    row.traj.segments.append(Segment.injected(ids, text))
    row.context += ids
    return True


def _finish(row: _Row, reason: StopReason) -> None:
    row.traj.stop_reason = reason
    row.pending = []


def rollout_metrics(trajs: list[Trajectory], stats: _Stats, total_s: float) -> dict[str, float]:
    """``rollout/``-namespaced metrics: turns, searches, queries, dedup, stops, tokens, time split."""
    n = max(len(trajs), 1)
    stops = Counter(t.stop_reason.value for t in trajs if t.stop_reason is not None)
    sampled = sum(t.num_sampled_tokens for t in trajs)
    response = sum(len(t.token_ids) - t.prompt_len for t in trajs)
    m = {
        "rollout/trajectories": float(len(trajs)),
        "rollout/rounds": float(stats.rounds),
        "rollout/turns_mean": sum(t.num_turns for t in trajs) / n,
        "rollout/searches_mean": sum(t.num_searches for t in trajs) / n,
        "rollout/queries": float(stats.queries),
        "rollout/distinct_queries": float(stats.distinct_queries),
        "rollout/retrieval_calls": float(stats.retrieval_calls),
        "rollout/dedup_ratio": stats.distinct_queries / stats.queries if stats.queries else 1.0,
        "rollout/invalid": float(sum(t.num_invalid for t in trajs)),
        "rollout/retrieval_errors": float(sum(t.num_retrieval_errors for t in trajs)),
        "rollout/answered_frac": stops.get(StopReason.ANSWERED.value, 0) / n,
        "rollout/prompt_tokens_mean": sum(t.prompt_len for t in trajs) / n,
        "rollout/response_tokens_mean": response / n,
        "rollout/sampled_tokens": float(sampled),
        "rollout/injected_tokens": float(response - sampled),
        "rollout/time_generate_s": stats.generate_s,
        "rollout/time_retrieve_s": stats.retrieve_s,
        "rollout/time_total_s": total_s,
        "perf/sampled_tokens_per_s": sampled / stats.generate_s if stats.generate_s > 0 else 0.0,
    }
    for reason in StopReason:
        m[f"rollout/stop/{reason.value}"] = float(stops.get(reason.value, 0))
    return m
