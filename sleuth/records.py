"""Trajectories as JSON records: the policy turns and segments that a run's ``samples.jsonl`` and an
eval's ``trajectories.jsonl`` hold for each trajectory, and that ``sleuth view`` shows.

* :func:`turn_records`: one record per policy turn: its text and action; for a search its query,
  and when the search ran, every query of the turn with the passages it returned (id, title, text
  as retrieved, before the observation cut them) or the retriever's error.
* :func:`segment_records`: one record per segment after the prompt: ``kind`` (``sampled``: trained;
  ``injected``: never trained), ``role``, token count and text. ``role`` says what an injected segment
  is, read from the turn before it (never from its text): ``information`` (the observation of an
  executed search, ``search_error`` when it failed), ``corrective`` (the message after an invalid
  turn), ``nudge`` (anything else injected, e.g. the final-round nudge); a sampled one is ``sampled``.
"""

from __future__ import annotations

from sleuth.types import ActionKind, SegmentKind, Trajectory, Turn

PASSAGE_TEXT_LIMIT = 1500  # characters of each passage's text kept in a record
SEGMENT_TEXT_LIMIT = 4000  # characters of a segment's (or the prompt's) text kept in a record


def turn_record(turn: Turn) -> dict:
    """One policy turn: its text and action; the answer; for a search its (first) query and, when it
    was executed, that query's passage ids and titles (both empty when the search failed) and
    ``searches`` (every query of the turn with its passages, and ``error`` when it failed), else
    ``executed: False`` (final round, or cut by its cap)."""
    action = turn.action
    record: dict = {"text": turn.text, "action": action.kind.value}
    if action.kind is ActionKind.ANSWER:
        record["answer"] = action.answer
    elif action.kind is ActionKind.SEARCH:
        record["query"] = action.queries[0] if action.queries else None  # none: the loop made it invalid
        if turn.search is None:
            record["executed"] = False
        else:
            found = turn.search
            record["passage_ids"] = list(found.passage_ids[0])
            record["titles"] = list(found.titles[0])
            record["searches"] = [
                {"query": query, "passages": [
                    {"id": pid, "title": title,
                     "text": found.texts[i][j][:PASSAGE_TEXT_LIMIT] if i < len(found.texts) else None}
                    for j, (pid, title) in enumerate(zip(found.passage_ids[i], found.titles[i]))]}
                for i, query in enumerate(action.queries)]
            if found.error is not None:
                record["error"] = found.error
    return record


def turn_records(traj: Trajectory) -> list[dict]:
    """:func:`turn_record` of each policy turn, in order."""
    return [turn_record(t) for t in traj.turns]


def segment_roles(traj: Trajectory) -> list[str]:
    """The role of each segment after the prompt (see the module docstring)."""
    roles, turn, after_turn = [], -1, False
    for seg in traj.segments[1:]:
        if seg.kind is SegmentKind.SAMPLED:
            turn += 1
            roles.append("sampled")
            after_turn = True
            continue
        role = "nudge"
        if after_turn and 0 <= turn < len(traj.turns):
            t = traj.turns[turn]
            if t.search is not None:
                role = "search_error" if t.search.failed else "information"
            elif t.action.kind is ActionKind.INVALID:
                role = "corrective"
        roles.append(role)
        after_turn = False
    return roles


def segment_records(traj: Trajectory, max_chars: int) -> list[dict]:
    """Each segment after the prompt: kind, role, token count, and its text cut at ``max_chars``."""
    return [{"kind": s.kind.value, "role": role, "n_tokens": len(s.token_ids), "text": s.text[:max_chars]}
            for s, role in zip(traj.segments[1:], segment_roles(traj))]


def prompt_record(traj: Trajectory, max_chars: int) -> dict:
    """The injected prompt: its token count and text cut at ``max_chars``."""
    first = traj.segments[0] if traj.segments else None
    return {"n_tokens": len(first.token_ids) if first else 0, "text": first.text[:max_chars] if first else ""}
