"""The typed per-turn history the rollout loop writes (``Trajectory.turns``) and the eval records read
from it: one Turn per sampled segment, executed searches with their passages, failed searches with
their error, searches the loop did not run, several queries in one turn."""

import pytest

from sleuth.config import RolloutConfig
from sleuth.records import turn_records
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.formats import get_format
from sleuth.rollout.loop import run_rollouts
from sleuth.types import ActionKind, Passage, Question, StopReason
from tests.helpers.tiny import ScriptedBackend, tiny_tokenizer

pytestmark = pytest.mark.component

PARIS = Passage("p1", "Paris", "Paris is the capital of France.")
ROME = Passage("p2", "Rome", "Rome is the capital of Italy.")
ZOO = Passage("p3", "Berlin", "Berlin hosts a zoo on the Spree.")
Q = Question("nq/1", "What is the capital of France", ("Paris",))
SEARCH = "<search> capital of France </search>"
ANSWER = "<answer> Paris </answer>"


def _roll(fmt, script, retriever=None, **kw):
    tok = tiny_tokenizer()
    base = dict(group_size=1, max_turns=2, max_tokens_per_turn=200, max_obs_tokens=400, max_context_tokens=4000,
                max_invalid=1, use_chat_template=False)
    cfg = RolloutConfig(**(base | kw))
    trajs, _ = run_rollouts([Q], ScriptedBackend(tok, script), tok, fmt,
                            retriever or InMemoryRetriever([PARIS, ROME, ZOO]), cfg, k=2)
    return trajs[0]


def test_one_turn_per_sampled_segment_with_what_the_loop_did():
    fmt = get_format("search_r1")
    t = _roll(fmt, ["bad turn</answer>", SEARCH, SEARCH, SEARCH])  # invalid, 2 searches, final-round search
    assert t.stop_reason is StopReason.MAX_TURNS and len(t.turns) == t.num_turns == 4
    assert [turn.text for turn in t.turns] == [s.text for s in t.segments if s.trained]
    assert [turn.action.kind for turn in t.turns] == [ActionKind.INVALID] + [ActionKind.SEARCH] * 3
    invalid, first, second, final = t.turns
    assert invalid.search is None and invalid.action.error
    assert first.executed and first.search.passage_ids == [["p1", "p2"]] and first.search.titles == [["Paris", "Rome"]]
    assert not first.search.failed and first.search.observation == t.retrieved_text[0]
    assert second.search.observation == t.retrieved_text[1]
    assert not final.executed  # the final round: the loop does not run a search
    assert [r.get("executed") for r in turn_records(t)] == [None, None, None, False]


def test_a_failed_search_keeps_its_error_and_empty_passage_lists():
    class Down:
        def search(self, queries, k):
            raise ConnectionError("refused")

    fmt = get_format("search_r1")
    t = _roll(fmt, [SEARCH, ANSWER], retriever=Down())
    first, answer = t.turns
    assert first.executed and first.search.failed and first.search.error == "ConnectionError: refused"
    assert first.search.passage_ids == [[]] and first.search.titles == [[]]
    assert first.search.observation == t.retrieved_text[0] == t.segments[2].text
    assert answer.action.answer == "Paris" and t.answer == "Paris"
    assert turn_records(t)[0] == {"text": first.text, "action": "search", "query": "capital of France",
                                  "passage_ids": [], "titles": [], "error": "ConnectionError: refused",
                                  "searches": [{"query": "capital of France", "passages": []}]}


def test_several_queries_in_one_turn_stay_paired_with_their_passages():
    """A tool call with two queries, then one with one: each turn holds its own queries' passages (a
    record matched by query string against the flat ``queries`` list lost the second turn's)."""
    fmt = get_format("tool_call")
    two = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["capital of France", "Italy"]}}\n</tool_call>'
    one = '<tool_call>\n{"name": "search", "arguments": {"query_list": ["zoo Spree"]}}\n</tool_call>'
    t = _roll(fmt, [two, one, ANSWER], max_turns=3, use_chat_template=True)
    assert t.stop_reason is StopReason.ANSWERED
    first, second, _ = t.turns
    assert first.action.queries == ["capital of France", "Italy"]
    assert first.search.passage_ids == [["p1", "p2"], ["p2", "p1"]] and t.passage_ids[:2] == first.search.passage_ids
    assert second.search.passage_ids == [["p3", "p1"]] == t.passage_ids[2:]
    records = turn_records(t)
    assert {k: v for k, v in records[1].items() if k != "searches"} == {
        "text": second.text, "action": "search", "query": "zoo Spree", "passage_ids": ["p3", "p1"],
        "titles": ["Berlin", "Paris"]}
    # every query of a turn with its own passages, their texts as the retriever returned them
    as_found = {p.id: p for p in (PARIS, ROME, ZOO)}
    assert [s["query"] for s in records[0]["searches"]] == ["capital of France", "Italy"]
    assert [[(p["id"], p["title"], p["text"]) for p in s["passages"]] for s in records[0]["searches"]] == [
        [(i, as_found[i].title, as_found[i].text) for i in ids] for ids in first.search.passage_ids]
