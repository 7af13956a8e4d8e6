"""The agent loop with a scripted policy and an in-memory retriever: exact tokens, masks, stops."""

import pytest

from sleuth.config import RolloutConfig
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.backends import derive_seed
from sleuth.rollout.batching import trajectories_to_batch
from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION, get_format
from sleuth.rollout.loop import run_rollouts
from sleuth.types import Passage, Question, SegmentKind, StopReason
from tests.helpers.tiny import ScriptedBackend, tiny_tokenizer

pytestmark = pytest.mark.component

PARIS = Passage("p1", "Paris", "Paris is the capital of France.")
ROME = Passage("p2", "Rome", "Rome is the capital of Italy.")
ZOO = Passage("p3", "Berlin", "Berlin hosts a zoo.")
Q1 = Question("nq/1", "What is the capital of France", ("Paris",))
Q2 = Question("nq/2", "What is the capital of Italy", ("Rome",))
SEARCH = "<think> I should look it up. </think>\n<search> capital of France </search>"
ANSWER = "<answer> Paris </answer>"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def fmt():
    return get_format("search_r1")


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def cfg(**kw):
    base = dict(group_size=1, max_turns=3, max_tokens_per_turn=200, max_obs_tokens=400,
                max_context_tokens=4000, max_invalid=1, use_chat_template=False)  # fmt: skip
    base.update(kw)
    return RolloutConfig(**base)


def roll(tok, fmt, turns, questions=(Q1,), retriever=None, k=2, **kw):
    backend = ScriptedBackend(tok, turns)
    retriever = retriever or InMemoryRetriever([PARIS, ROME, ZOO])
    trajs, metrics = run_rollouts(list(questions), backend, tok, fmt, retriever, cfg(**kw), k=k)
    return trajs, metrics, backend


def test_search_then_answer_exact_tokens_and_masks(tok, fmt):
    trajs, m, backend = roll(tok, fmt, [SEARCH + " trailing text", ANSWER + "<|eos|>"], questions=(Q1, Q2),
                             group_size=2)  # fmt: skip
    assert len(trajs) == 4 and backend.calls == [4, 4]  # one batched generate per round
    t = trajs[0]
    prompt = tok(SEARCH_R1_INSTRUCTION.format(question="What is the capital of France?"))["input_ids"]
    # "capital of France": Paris scores 3 (capital, of, france), Rome 2 (capital, of), Berlin 0
    obs = fmt.render_observation([("capital of France", [PARIS, ROME])])
    assert obs.startswith("\n\n<information>Doc 1(Title: \"Paris\") Paris is the capital")
    parts = [prompt, enc(tok, SEARCH), enc(tok, obs), enc(tok, ANSWER)]
    assert t.token_ids == [x for p in parts for x in p]  # nothing after </search>, no eos after </answer>
    assert t.loss_mask == [0] * len(parts[0]) + [1] * len(parts[1]) + [0] * len(parts[2]) + [1] * len(parts[3])
    assert [s.kind for s in t.segments] == [SegmentKind.INJECTED, SegmentKind.SAMPLED] * 2
    assert t.segments[1].logprobs == [-0.5] * len(parts[1])
    assert (t.stop_reason, t.answer, t.num_turns, t.num_searches) == (StopReason.ANSWERED, "Paris", 2, 1)
    assert t.queries == ["capital of France"] and t.passage_ids == [["p1", "p2"]]
    assert t.retrieved_text == [obs]
    assert [x.sample_index for x in trajs] == [0, 1, 0, 1]
    assert [x.group_id for x in trajs] == ["nq/1", "nq/1", "nq/2", "nq/2"]
    batch = trajectories_to_batch(trajs, pad_id=tok.pad_token_id)
    n = len(t.token_ids)
    assert batch.loss_mask_BT[0, :n].long().tolist() == t.loss_mask and batch.attention_mask_BT[0, n:].sum() == 0
    assert m["rollout/stop/answered"] == 4 and m["rollout/rounds"] == 2
    # 4 rows searched the same query: 4 queries, 1 distinct, 1 retrieval call
    assert (m["rollout/queries"], m["rollout/distinct_queries"], m["rollout/retrieval_calls"]) == (4, 1, 1)
    assert m["rollout/dedup_ratio"] == 0.25
    assert m["rollout/sampled_tokens"] == 4 * (len(parts[1]) + len(parts[3]))
    # rates and timings sit under perf/ (a rate is not a rollout count)
    assert "perf/sampled_tokens_per_s" in m and not any(k.endswith("_per_s") for k in m if k.startswith("rollout/"))


def test_one_deduplicated_retrieval_call_per_round(tok, fmt):
    class Recording(InMemoryRetriever):
        calls: list = []

        def search(self, queries, k):
            self.calls.append(list(queries))
            return super().search(queries, k)

    def script(context, turn):
        country = "France" if "capital of France?" in context else "Italy"  # from the question
        return f"<search> capital of {country} </search>" if turn < 2 else ANSWER

    ret = Recording([PARIS, ROME, ZOO])
    trajs, m, _ = roll(tok, fmt, script, questions=(Q1, Q2), retriever=ret, group_size=3)
    assert ret.calls == [["capital of France", "capital of Italy"]] * 2
    assert m["rollout/retrieval_calls"] == 2  # one call per round (the constant calls-per-round metric is gone)
    assert m["rollout/queries"] == 12 and m["rollout/distinct_queries"] == 4
    assert trajs[3].passage_ids == [["p2", "p1"]] * 2  # Italy: Rome first


def test_max_turns_final_nudge_and_unexecuted_search(tok, fmt):
    nudge = "\nI have searched enough; now I answer.\n"
    trajs, m, _ = roll(tok, fmt, [SEARCH], max_turns=2, final_nudge=nudge)
    t = trajs[0]
    assert (t.stop_reason, t.num_searches, t.num_turns) == (StopReason.MAX_TURNS, 2, 3)
    kinds = "".join(s.kind.value[0] for s in t.segments)
    assert kinds == "isisiis"  # prompt, turn, obs, turn, obs, nudge, final turn
    assert t.segments[5].text == nudge and t.segments[5].token_ids == enc(tok, nudge)
    assert len(t.queries) == 2 and m["rollout/stop/max_turns"] == 1


def test_zero_max_turns_means_no_search_at_all(tok, fmt):
    trajs, m, _ = roll(tok, fmt, [SEARCH], max_turns=0)
    assert trajs[0].stop_reason is StopReason.MAX_TURNS and trajs[0].num_searches == 0
    assert m["rollout/retrieval_calls"] == 0


def test_invalid_turns_get_the_corrective_message_then_stop(tok, fmt):
    bad = "I am not sure </search>"  # a stop string without an action
    trajs, m, _ = roll(tok, fmt, [bad], max_invalid=1)
    t = trajs[0]
    assert t.stop_reason is StopReason.INVALID_ACTION and t.num_invalid == 2
    assert [s.kind.value for s in t.segments] == ["injected", "sampled", "injected", "sampled"]
    assert t.segments[2].text == fmt.render_invalid()
    assert m["rollout/invalid"] == 2


def test_the_reward_reads_the_corrective_message_unless_told_not_to(tok, fmt):
    """Search-R1's invalid-action message holds `<answer> and </answer>`: read with the response (Search-R1, the
    default), invalid actions "answer" `and`, a wrong answer in an invalid format (final_format_score 0.1 under the
    v0.3 reward); with reward.read_corrective false they earn nothing."""
    from sleuth.reward.search_r1 import format_reward
    from sleuth.reward.trajectory import assign_rewards, reward_text

    trajs, _, _ = roll(tok, fmt, ["Answer </answer>"], max_invalid=1)
    t = trajs[0]
    assert t.stop_reason is StopReason.INVALID_ACTION and "<answer> and </answer>" in fmt.render_invalid()

    def v03(response, golds):
        return format_reward(response, golds, structure_format_score=0.2, final_format_score=0.1)

    assert assign_rewards(trajs, v03) == [pytest.approx(0.1)]
    assert assign_rewards(trajs, v03, read_corrective=False) == [0.0] and t.reward == 0.0
    assert reward_text(t, read_corrective=False) == "Answer </answer>" * 2  # the two turns, no message


def test_invalid_then_recovery(tok, fmt):
    trajs, _, _ = roll(tok, fmt, ["oops </answer>", ANSWER], max_invalid=1)
    assert trajs[0].stop_reason is StopReason.ANSWERED and trajs[0].num_invalid == 1


def test_eos_without_answer_keeps_the_sampled_eos(tok, fmt):
    trajs, _, _ = roll(tok, fmt, ["I do not know.<|eos|>"])
    t = trajs[0]
    assert t.stop_reason is StopReason.EOS
    assert t.token_ids[-1] == tok.eos_token_id and t.loss_mask[-1] == 1


def test_max_tokens_per_turn(tok, fmt):
    trajs, _, _ = roll(tok, fmt, ["a very long thought that never ends " * 5], max_tokens_per_turn=6)
    t = trajs[0]
    assert t.stop_reason is StopReason.MAX_TOKENS and len(t.segments[1].token_ids) == 6


def test_context_budget_caps_the_turn_and_never_cuts_the_prompt(tok, fmt):
    prompt_len = len(tok(SEARCH_R1_INSTRUCTION.format(question="What is the capital of France?"))["input_ids"])
    trajs, _, backend = roll(tok, fmt, ["a long thought " * 20], max_context_tokens=prompt_len + 5)
    t = trajs[0]
    assert t.stop_reason is StopReason.CONTEXT_FULL
    assert len(t.token_ids) == prompt_len + 5 and t.prompt_len == prompt_len
    # prompt longer than the budget: kept whole, no turn generated
    trajs, _, backend = roll(tok, fmt, [SEARCH], max_context_tokens=prompt_len - 10)
    assert trajs[0].stop_reason is StopReason.CONTEXT_FULL and trajs[0].num_turns == 0
    assert len(trajs[0].token_ids) == prompt_len and backend.calls == []


def test_observation_that_does_not_fit_stops_with_context_full(tok, fmt):
    prompt_len = len(tok(SEARCH_R1_INSTRUCTION.format(question="What is the capital of France?"))["input_ids"])
    budget = prompt_len + len(enc(tok, SEARCH)) + 5  # the observation needs far more than 5 tokens
    trajs, _, _ = roll(tok, fmt, [SEARCH, ANSWER], max_context_tokens=budget)
    t = trajs[0]
    assert t.stop_reason is StopReason.CONTEXT_FULL and len(t.segments) == 2  # no partial observation
    assert len(t.token_ids) < budget


def test_observation_is_truncated_to_its_budget_keeping_the_closing_tag(tok, fmt):
    long = Passage("p9", "France", "France capital " + "word " * 300)
    trajs, _, _ = roll(tok, fmt, [SEARCH, ANSWER], retriever=InMemoryRetriever([long, PARIS]), max_obs_tokens=60)
    obs = trajs[0].segments[2]
    assert len(obs.token_ids) <= 60 and obs.text.endswith("</information>\n\n")
    assert 'Doc 1(Title: "France")' in obs.text and 'Doc 2(Title: "Paris")' in obs.text


class _Flaky:
    """Fails on the calls listed in ``fail_on`` (0-based), with ``exc``; otherwise in-memory search."""

    def __init__(self, fail_on, exc):
        self.inner, self.fail_on, self.exc, self.n = InMemoryRetriever([PARIS, ROME]), set(fail_on), exc, 0

    def search(self, queries, k):
        self.n += 1
        if self.n - 1 in self.fail_on:
            raise self.exc
        return self.inner.search(queries, k)


@pytest.mark.parametrize("exc", [RetrievalError("server down"), ConnectionError("refused")])
def test_retrieval_failure_becomes_an_observation_and_the_batch_goes_on(tok, fmt, exc):
    trajs, m, _ = roll(tok, fmt, [SEARCH, SEARCH, ANSWER], retriever=_Flaky({0}, exc), group_size=2)
    for t in trajs:
        assert t.stop_reason is StopReason.ANSWERED
        assert t.segments[2].text == fmt.render_error(f"{type(exc).__name__}: {exc}")
        assert t.num_retrieval_errors == 1 and t.num_searches == 1
        assert t.passage_ids == [[], ["p1", "p2"]] and len(t.queries) == 2
    assert m["rollout/retrieval_errors"] == 2


def test_retriever_returning_the_wrong_shape_is_a_retrieval_error(tok, fmt):
    class Short:
        def search(self, queries, k):
            return []

    trajs, _, _ = roll(tok, fmt, [SEARCH, ANSWER], retriever=Short())
    assert trajs[0].num_retrieval_errors == 1 and "result lists for 1 queries" in trajs[0].segments[2].text


def test_failed_searches_use_the_search_budget(tok, fmt):
    trajs, _, _ = roll(tok, fmt, [SEARCH], retriever=_Flaky(range(10), RetrievalError("down")), max_turns=2)
    t = trajs[0]
    assert t.stop_reason is StopReason.MAX_TURNS and t.num_retrieval_errors == 2 and t.num_searches == 0


def test_seeds_derive_from_step_question_and_sample(tok, fmt):
    seen = []

    class Spy(ScriptedBackend):
        def generate(self, prompts, params, seeds=None, max_new_tokens=None):
            seen.append(list(seeds))
            return super().generate(prompts, params, seeds, max_new_tokens)

    for step in (3, 3, 4):
        run_rollouts([Q1], Spy(tok, [SEARCH, ANSWER]), tok, fmt, InMemoryRetriever([PARIS]),
                     cfg(group_size=2), seed=11, step=step)  # fmt: skip
    row = [derive_seed(11, 3, "nq/1", g) for g in (0, 1)]
    assert seen[0] == [derive_seed(r, 0) for r in row] and seen[1] == [derive_seed(r, 1) for r in row]
    assert seen[2:4] == seen[0:2]  # same step, same seeds
    assert seen[4] != seen[0]  # another step, other seeds


def test_bad_inputs_are_named(tok, fmt):
    with pytest.raises(ValueError, match="nq/1"):
        roll(tok, fmt, [ANSWER], questions=(Q1, Q1))
    with pytest.raises(ValueError, match="group_size"):
        roll(tok, fmt, [ANSWER], group_size=0)
    with pytest.raises(ValueError, match="max_obs_tokens"):
        roll(tok, fmt, [ANSWER], max_obs_tokens=0)


def test_search_r1_transcript_is_split_at_the_stop_tags(tok, fmt):
    # what a Search-R1 checkpoint writes when nobody stops it: a search, a made-up <information>
    # block, more thinking, an answer (question from NQ-open dev)
    search = ("<think> I need to find who sang You've Got a Friend in Me. </think>\n"
              "<search> who sang you got a friend in me </search>")  # fmt: skip
    fake = '\n\n<information>Doc 1(Title: "Made up") hallucinated text</information>\n\n'
    rest = "<think> Randy Newman wrote and sang it for Toy Story. </think>\n<answer> Randy Newman </answer>"
    q = Question("nq/dev/litm_242", "who sang the song you got a friend in me", ("Lyle Lovett", "Randy Newman"))
    song = Passage("s1", "You've Got a Friend in Me", "A song written and sung by Randy Newman for Toy Story.")
    trajs, _, _ = roll(tok, fmt, [search + fake + rest, rest + "\n"], questions=(q,),
                       retriever=InMemoryRetriever([song, ROME]), k=1)  # fmt: skip
    t = trajs[0]
    assert [s.text for s in t.segments[1:]] == [search, fmt.render_observation([(t.queries[0], [song])]), rest]
    assert t.queries == ["who sang you got a friend in me"] and t.passage_ids == [["s1"]]
    assert t.answer == "Randy Newman" == fmt.extract_answer(t.response_text)
    assert "hallucinated" not in t.response_text and t.stop_reason is StopReason.ANSWERED


def test_max_concurrent_rows_goes_through_the_loop_in_shares(tok, fmt):
    """rollout.max_concurrent_rows=3 over 2 questions x 2 samples + a third question's 2 (6 rows):
    no generate call sees more than 3 rows, the first share's rounds finish before the next share
    starts, and the trajectories are those of the unbounded run."""
    q3 = Question("nq/3", "Where is the zoo", ("Berlin",))

    def script(context, turn):  # Q2's rows answer at once, the others search first
        return ANSWER if "Italy" in context or turn > 0 else SEARCH

    runs = {}
    for cap in (None, 3, 1):
        backend = ScriptedBackend(tok, script)
        trajs, metrics = run_rollouts([Q1, Q2, q3], backend, tok, fmt, InMemoryRetriever([PARIS, ROME, ZOO]),
                                      cfg(group_size=2, max_concurrent_rows=cap), k=2)
        runs[cap] = ([t.token_ids for t in trajs], [t.loss_mask for t in trajs], backend.calls, metrics)
    assert runs[None][2] == [6, 4]  # one round of 6 rows, then the 4 searching rows
    assert runs[3][2] == [3, 2, 3, 2]  # rows 0-2 (Q1, Q1, Q2): 3 then the 2 searchers; rows 3-5 likewise
    assert runs[1][2] == [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    for cap in (3, 1):
        assert runs[cap][0] == runs[None][0] and runs[cap][1] == runs[None][1]
        assert runs[cap][3]["rollout/rounds"] == runs[None][3]["rollout/rounds"] == 2
        assert runs[cap][3]["rollout/queries"] == runs[None][3]["rollout/queries"] == 4


def test_a_reasking_format_injects_each_rows_own_question_after_its_passages(tok):
    """``search_r1_fewshot3_reask``: rows of two questions that searched the same query read the same passages,
    each followed by its own question; the rendered text is what was injected, token for token; cut to the
    observation budget, the passages shrink and the question stays whole."""
    reask = get_format("search_r1_fewshot3_reask")
    trajs, m, _ = roll(tok, reask, [SEARCH, ANSWER], questions=(Q1, Q2))
    for t, q in zip(trajs, (Q1, Q2)):
        obs = reask.render_observation([("capital of France", [PARIS, ROME])], q.text)
        assert t.retrieved_text == [obs] and obs.endswith(f"\n\nQuestion: {q.text}?</information>\n\n")
        prompt = tok(reask.user_content(q))["input_ids"]
        assert t.token_ids == prompt + enc(tok, SEARCH) + enc(tok, obs) + enc(tok, ANSWER)
    assert m["rollout/retrieval_calls"] == 1
    budget = len(enc(tok, trajs[0].retrieved_text[0])) - 8
    short, _, _ = roll(tok, reask, [SEARCH, ANSWER], max_obs_tokens=budget)
    text = short[0].retrieved_text[0]
    assert len(enc(tok, text)) <= budget and text.endswith(f"\n\nQuestion: {Q1.text}?</information>\n\n")
    assert "Paris is the capital of France." not in text  # the passages were cut to fit
