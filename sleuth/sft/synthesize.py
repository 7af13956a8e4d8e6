"""Transcripts written from QA data and a retriever (``sft.source: synthesize``).

For each question: search with the question itself (top ``retrieval.topk``, the observation fitted
to ``rollout.max_obs_tokens`` exactly as a rollout fits it). If a gold answer is in that
observation (as a whole word, case-insensitive), the transcript is: a turn that searches, the
observation, a turn that quotes the passage holding the answer and answers. Otherwise, with
``sft.follow_up``, a follow-up query is looked for among the question's top 20 passages: the title
of one whose text holds the answer, that the first observation mentions (the bridge entity a second
hop looks up) and that does not itself name the answer; if that search's observation holds the
answer, the transcript has two searches. Everything else is dropped, counted by reason.

Yes/no questions (HotpotQA's comparisons) cannot be quoted from a passage: their transcript searches
with the question, then compares what its first two passages are about and answers (kept without an
evidence check, counted apart; fewer than two passages: dropped). Other answers are written as the
passage spells them, so the policy learns to copy them from the evidence.
"""

from __future__ import annotations

import re
from collections import Counter

from sleuth.config import Config
from sleuth.errors import ConfigError
from sleuth.rollout.chat import ChatRenderer
from sleuth.rollout.observation import fit_observation
from sleuth.data.transcripts import Transcript, encode
from sleuth.types import Passage, Question

DEEP_K = 20  # passages a missed question's follow-up is looked for in
BATCH = 64  # queries per retriever call
SNIPPET_WORDS = 12  # words of evidence quoted on each side of the answer
YES_NO = {"yes", "no"}


def _window(text: str, start: int, end: int) -> str:
    """The words of ``text`` around ``text[start:end]``: ``SNIPPET_WORDS`` on each side, as written."""
    words = list(re.finditer(r"\S+", text))
    first = next((i for i, w in enumerate(words) if w.end() > start), 0)
    last = next((i for i, w in enumerate(words) if w.end() >= end), len(words) - 1)
    lo, hi = words[max(0, first - SNIPPET_WORDS)].start(), words[min(len(words) - 1, last + SNIPPET_WORDS)].end()
    return text[lo:hi].replace("</information>", "").strip()


def _word_patterns(words) -> list[re.Pattern]:
    """Case-insensitive whole-word patterns of ``words`` (empty ones left out)."""
    return [re.compile(r"(?<!\w)" + re.escape(w.strip()) + r"(?!\w)", re.IGNORECASE) for w in words if w.strip()]


def _mentions(text: str, patterns: list[re.Pattern]) -> bool:
    return any(p.search(text) for p in patterns)


def _evidence(observation: str, golds: tuple[str, ...]) -> tuple[int, str, str] | None:
    """``(doc number, snippet, answer as written)`` of the first ``Doc i(Title: …) text`` line of the
    observation holding a gold answer as a whole word (case-insensitive; the text before the title),
    or None."""
    patterns = _word_patterns(golds)
    for doc in re.split(r"(?=Doc \d+\()", observation):
        doc = re.split(r"\n|\\n", doc, maxsplit=1)[0]  # one passage a line (JSON tool results: an escaped \n)
        head = re.match(r"Doc (\d+)\((Title: .*?)\) ", doc) or re.match(r"Doc (\d+)\(()", doc)
        if head is None:
            continue
        body = doc[head.end():]
        for where in (body, head.group(2)):
            for pattern in patterns:
                m = pattern.search(where)
                if m is not None:
                    return int(head.group(1)), _window(where, m.start(), m.end()), m.group(0)
    return None


def _search(retriever, queries: list[str], k: int) -> list[list[Passage]]:
    out: list[list[Passage]] = []
    for i in range(0, len(queries), BATCH):
        out += [list(ps) for ps in retriever.search(queries[i:i + BATCH], k)]
    return out


def _bridge(deeper: list[Passage], observation: str, golds: tuple[str, ...]) -> tuple[str, int] | None:
    """``(title, doc number)`` for a follow-up search: the first deeper passage whose text holds the
    answer, whose title names no gold answer (a query must not give the answer away) and is
    mentioned in the first observation (``Doc i``'s text), so the second hop follows what was read."""
    docs = {int(m.group(1)): m.group(2) for m in re.finditer(r"Doc (\d+)\((.*?)(?=Doc \d+\(|$)", observation,
                                                             re.DOTALL)}
    answers = _word_patterns(golds)
    for p in deeper:
        title = p.title.strip()
        if not title or _mentions(title, answers) or not _mentions(p.text, answers):
            continue
        named = _word_patterns([title])
        doc = next((i for i, text in sorted(docs.items()) if _mentions(text, named)), None)
        if doc is not None:
            return title, doc
    return None


class _Writer:
    """Builds one transcript's segments as the rollout would inject them."""

    def __init__(self, fmt, render: ChatRenderer, cfg: Config):
        self.fmt, self.render, self.cfg = fmt, render, cfg

    def observation(self, query: str, passages: list[Passage], question: str) -> str | None:
        """The fitted observation text (``question`` asked again in it where the format re-asks), or None when its
        ids are not its text's own tokens (cut mid-way because even empty passages overflow the budget: a
        transcript could not replay it)."""
        ids, text = fit_observation([(query, passages)], self.render, self.cfg.rollout.max_obs_tokens,
                                    question=question)
        return text if self.render.encode(text) == ids else None

    def finish(self, q: Question, turns: list[tuple[str, bool]], observation: str) -> tuple[Transcript | None, str]:
        found = _evidence(observation, q.golden_answers)
        if found is None:
            return None, "answer not in the observation"
        doc, snippet, answer = found
        return self.complete(q, turns, answer, f"Doc {doc} says: {snippet}")

    def finish_yes_no(self, q: Question, turns: list[tuple[str, bool]], observation: str) -> tuple[Transcript | None, str]:
        """A yes/no question's answer turn: a short comparison of what the passages are about, then the
        answer (no span to quote: the comparison is the evidence)."""
        titles = [t.strip().strip('"') for t in re.findall(r"Doc \d+\(Title: (.*?)\)", observation)][:2]
        if len(titles) < 2:
            return None, "fewer than two passages to compare"
        answer = q.golden_answers[0].strip().lower()
        thought = f"Doc 1 is about {titles[0]} and Doc 2 about {titles[1]}. Comparing them, the answer is {answer}."
        return self.complete(q, turns, answer, thought)

    def complete(self, q: Question, turns: list[tuple[str, bool]], answer: str,
                 thought: str) -> tuple[Transcript | None, str]:
        """The transcript with its answer turn, or None and why (over a budget)."""
        rc = self.cfg.rollout
        searches = sum(1 for _, trained in turns if trained)
        if searches > rc.max_turns:
            return None, "more searches than rollout.max_turns"
        if searches == rc.max_turns and rc.final_nudge:  # the rollout injects it before the final round
            turns = turns + [(rc.final_nudge, False)]
        turns = turns + [(self.fmt.answer_turn(answer, thought), True)]
        t = Transcript(q, turns)
        if any(len(self.render.encode(text)) > rc.max_tokens_per_turn for text, trained in turns if trained):
            return None, "a turn longer than rollout.max_tokens_per_turn"
        if len(encode(t, self.render)[0]) >= rc.max_context_tokens:
            return None, "longer than rollout.max_context_tokens"
        return t, ""


def synthesize(questions: list[Question], retriever, fmt, render: ChatRenderer,
               cfg: Config) -> tuple[list[Transcript], Counter]:
    """Transcripts for ``questions`` (see the module docstring) and the counts kept and dropped per
    reason."""
    if not (hasattr(fmt, "search_turn") and hasattr(fmt, "answer_turn")):
        raise ConfigError(f"sft.source=synthesize writes search_r1, search_r1_tiny and tool_call transcripts; "
                          f"rollout.format={fmt.name} has no search_turn/answer_turn (use sft.source=trajectories)")
    k, counts, out = cfg.retrieval.topk, Counter(), []
    writer = _Writer(fmt, render, cfg)
    yes_no = {q.id for q in questions if set(a.strip().lower() for a in q.golden_answers) <= YES_NO}
    asked = list(questions)
    queries = [q.text.strip() for q in asked]
    first = _search(retriever, queries, k)
    missed: list[tuple[Question, list, str]] = []  # (question, its turns so far, the first query)
    for q, query, passages in zip(asked, queries, first):
        obs = writer.observation(query, passages, q.text)
        if obs is None:
            counts["dropped: observation cut mid-token"] += 1
            continue
        turns = [(fmt.search_turn(query, "I need to search for this."), True), (obs, False)]
        if q.id in yes_no:
            t, why = writer.finish_yes_no(q, turns, obs)
            counts["kept: yes/no, one search" if t is not None else f"dropped: yes/no, {why}"] += 1
            out += [t] if t is not None else []
            continue
        t, why = writer.finish(q, turns, obs)
        if t is not None:
            counts["kept: one search"] += 1
            out.append(t)
        elif why == "answer not in the observation" and cfg.sft.follow_up:
            missed.append((q, turns, query))
        else:
            counts[f"dropped: {why}"] += 1
    if missed:
        deep = _search(retriever, [query for _, _, query in missed], max(DEEP_K, k))
        follow: list[tuple[Question, list, str, int]] = []
        for (q, turns, _), passages in zip(missed, deep):
            bridge = _bridge(passages[k:], turns[-1][0], q.golden_answers)
            if bridge is None:
                counts["dropped: answer not retrieved"] += 1
            else:
                follow.append((q, turns, *bridge))
        second = _search(retriever, [title for _, _, title, _ in follow], k)
        for (q, turns, title, doc), passages in zip(follow, second):
            obs = writer.observation(title, passages, q.text)
            if obs is None:
                counts["dropped: observation cut mid-token"] += 1
                continue
            thought = f"Doc {doc} mentions {title}. I should look up {title}."
            turns = turns + [(fmt.search_turn(title, thought), True), (obs, False)]
            t, why = writer.finish(q, turns, obs)
            if t is None:
                counts[f"dropped: {why if why != 'answer not in the observation' else 'follow-up search missed'}"] += 1
            else:
                counts["kept: two searches"] += 1
                out.append(t)
    order = {q.id: i for i, q in enumerate(questions)}
    out.sort(key=lambda t: order[t.question.id])  # question order, whatever the number of searches
    return out, +counts
