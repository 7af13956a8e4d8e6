"""KV-cache reuse in the HF backend (``sleuth.rollout.hf_cache``): the optimised path against the
plain one (``reuse_prefix=False``, one question at a time) on a tiny taught model, and what it
actually feeds the model."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from sleuth.config import RolloutConfig
from sleuth.eval.evaluate import evaluate
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.formats import get_format
from sleuth.rollout.hf_backend import MIN_SHARED_PREFIX, HFBackend
from sleuth.rollout.loop import run_rollouts
from sleuth.types import Passage, Question
from tests.helpers.tiny import ScriptedBackend, teach, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component

CORPUS = [
    Passage("p1", "Paris", "Paris is the capital of France."),
    Passage("p2", "Rome", "Rome is the capital of Italy."),
    Passage("p3", "Berlin", "Berlin is a city on the Spree river in Germany."),
]
QUESTIONS = [
    Question("q/1", "What is the capital of France", ("Paris",)),
    Question("q/2", "Where does the roadrunner live", ("desert",)),
    Question("q/3", "Who wrote Hamlet, the tragedy about a prince of Denmark and his uncle", ("Shakespeare",)),
    Question("q/4", "river", ("Spree",)),
    Question("q/5", "Which king sang the song about the lazy dog and the quick brown fox", ("none",)),
]
SCRIPT = ["<think> I should look it up. </think>\n<search> capital of France </search>",
          "<answer> Paris </answer>"]


def cfg(**kw):
    base = dict(group_size=1, max_turns=2, max_tokens_per_turn=40, max_obs_tokens=120,
                max_context_tokens=1024, use_chat_template=False)  # fmt: skip
    base.update(kw)
    return RolloutConfig(**base)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def taught(tok):
    """Cloned from a scripted search-then-answer policy on two questions only, so that on the
    others it also wanders (invalid turns, caps): several rounds, rows of different lengths."""
    scripted, _ = run_rollouts(QUESTIONS[:2], ScriptedBackend(tok, SCRIPT), tok, get_format("search_r1"),
                               InMemoryRetriever(CORPUS), cfg(), k=2)  # fmt: skip
    m = tiny_model(tok, seed=3)
    teach(m, tok, scripted, steps=60)
    return m


def rollout(tok, model, questions, reuse, **kw):
    greedy = kw.pop("greedy", True)
    backend = HFBackend(model, tok, reuse_prefix=reuse)
    return run_rollouts(questions, backend, tok, get_format("search_r1"), InMemoryRetriever(CORPUS), cfg(**kw),
                        k=2, greedy=greedy, seed=7)[0]  # fmt: skip


def feeds(model):
    """Record the input_ids shape of every forward call (a list filled while the hook lives)."""
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)  # fmt: skip
    return shapes, hook


def assert_same(a, b):
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert [t.loss_mask for t in a] == [t.loss_mask for t in b]
    assert [t.stop_reason for t in a] == [t.stop_reason for t in b]
    for x, y in zip(a, b):
        lp_x = [lp for seg in x.segments if seg.trained for lp in seg.logprobs]
        lp_y = [lp for seg in y.segments if seg.trained for lp in seg.logprobs]
        assert torch.allclose(torch.tensor(lp_x), torch.tensor(lp_y), atol=1e-5)


def test_batched_reuse_equals_plain_one_question_at_a_time(tok, taught):
    fast = rollout(tok, taught, QUESTIONS, reuse=True)
    plain = [t for q in QUESTIONS for t in rollout(tok, taught, [q], reuse=False)]
    assert_same(fast, plain)
    assert max(t.num_turns for t in fast) >= 2  # the second round (reused KV) was exercised
    assert len({len(t.token_ids) for t in fast}) == len(QUESTIONS)  # rows of different lengths


def test_evaluate_batched_equals_plain_one_question_at_a_time(tok, taught):
    """What ``bench/eval.py`` compares, on a tiny scale: the eval rows (answers, queries, scores,
    turns) of one batch with reuse equal those of the plain backend one question at a time."""
    fmt, retriever = get_format("search_r1"), InMemoryRetriever(CORPUS)
    _, fast = evaluate(taught, tok, QUESTIONS, fmt, retriever, cfg(), topk=2, batch_size=len(QUESTIONS))
    plain = []
    for q in QUESTIONS:
        backend = HFBackend(taught, tok, reuse_prefix=False)
        plain += evaluate(taught, tok, [q], fmt, retriever, cfg(), topk=2, batch_size=1, backend=backend)[1]
    assert fast == plain


def test_sampled_rollouts_do_not_depend_on_reuse(tok, taught):
    kw = dict(greedy=False, group_size=3, temperature=1.0, max_tokens_per_turn=16)
    fast, plain = (rollout(tok, taught, QUESTIONS[:3], reuse=reuse, **kw) for reuse in (True, False))
    assert_same(fast, plain)


def test_second_round_prefills_only_the_new_tokens(tok, taught):
    for reuse in (True, False):
        shapes, hook = feeds(taught)
        try:
            (t,) = rollout(tok, taught, QUESTIONS[:1], reuse=reuse)
        finally:
            hook.remove()
        assert t.num_turns == 2 and not t.segments[2].trained  # prompt, search turn, observation, answer
        prefills = [s for s in shapes if s[1] > 1]
        turn1, obs = t.segments[1].token_ids, t.segments[2].token_ids
        if reuse:  # the last sampled token of turn 1 (never fed) and the observation
            assert prefills == [(1, t.prompt_len), (1, 1 + len(obs))]
        else:  # the whole context again
            assert prefills == [(1, t.prompt_len), (1, t.prompt_len + len(turn1) + len(obs))]


def test_common_prompt_prefix_is_prefilled_once(tok, taught):
    head = tok("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]
    assert len(head) >= MIN_SHARED_PREFIX
    prompts = [head + tok(s)["input_ids"] for s in ("Who sang the song?", "Rome", "Where does it live? Berlin")]
    params = SamplingParams(max_new_tokens=12, greedy=True, stop=("</search>",))
    shapes, hook = feeds(taught)
    try:
        fast = HFBackend(taught, tok).generate(prompts, params)
    finally:
        hook.remove()
    tails = [len(p) - len(head) for p in prompts]
    assert shapes[:2] == [(1, len(head)), (3, max(tails))]
    plain = HFBackend(taught, tok, reuse_prefix=False).generate(prompts, params)
    assert [r.token_ids for r in fast] == [r.token_ids for r in plain]
    assert [r.finish_reason for r in fast] == [r.finish_reason for r in plain]
    for x, y in zip(fast, plain):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_shared_prefix_generation_runs_under_bf16_autocast(tok, taught):
    """``model.dtype: bfloat16`` keeps float32 weights and generates under autocast: a common prompt
    prefix (a GRPO group) is prefilled once and reused (it crashed on the cache's mixed dtypes);
    greedy tokens agree with the run without reuse on these prompts."""
    head = tok("The quick brown fox jumps over the lazy dog. " * 3)["input_ids"]
    prompts = [head + tok(s)["input_ids"] for s in ("Who sang the song?", "Who sang the song?", "Rome")]
    params = SamplingParams(max_new_tokens=8, greedy=True, stop=("</search>",))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = HFBackend(taught, tok).generate(prompts, params)
        plain = HFBackend(taught, tok, reuse_prefix=False).generate(prompts, params)
    assert [len(r.token_ids) for r in fast] == [len(r.token_ids) for r in plain]
    assert all(r.token_ids for r in fast)


def test_under_bf16_autocast_the_rollout_cache_holds_bf16_keys_and_gives_the_same_tokens(tok, taught):
    """The training rollout's configuration (float32 weights, bf16 autocast): the slot cache and the
    session's stored prefixes hold keys in bf16 like the values, and the tokens and logprobs equal
    those of plain DynamicCache decoding (float32 keys, cast to bf16 by attention)."""
    from sleuth.rollout import hf_cache

    made = []
    real = hf_cache.SlotLayer._allocate
    prompts = [tok(s)["input_ids"] for s in ("Who sang the song?", "The river", "Where does the roadrunner live?")]
    params = SamplingParams(max_new_tokens=12, greedy=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        backend = HFBackend(taught, tok)
        def allocate(self, like, dtype=None):
            real(self, like, dtype)
            made.append((self.k_buf.dtype, self.v_buf.dtype))

        hf_cache.SlotLayer._allocate = allocate
        try:
            with backend.session():
                fast = backend.generate(prompts, params)
                stored = [kv for d in backend._store._by_len.values() for kv in d.values()]
        finally:
            hf_cache.SlotLayer._allocate = real
        plain = HFBackend(taught, tok, reuse_prefix=False).generate(prompts, params)
    assert made and set(made) == {(torch.bfloat16, torch.bfloat16)}
    assert stored and {k.dtype for kv in stored for k, _ in kv} == {torch.bfloat16}
    assert [r.token_ids for r in fast] == [r.token_ids for r in plain]
    for x, y in zip(fast, plain):
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-2)


def test_session_keeps_rows_only_inside_and_only_until_the_next_call(tok, taught):
    backend, params = HFBackend(taught, tok), SamplingParams(max_new_tokens=3, greedy=True)
    prompt = tok("Who sang the song?")["input_ids"]
    with backend.session():
        first = backend.generate([prompt], params)[0]
        assert len(backend._store) == 1
        with backend.session():  # nested: the same store
            assert len(backend._store) == 1
        shapes, hook = feeds(taught)
        try:
            backend.generate([prompt + first.token_ids + prompt], params)
        finally:
            hook.remove()
        assert shapes[0] == (1, 1 + len(prompt))  # reused: last sampled token + the new text
        assert len(backend._store) == 1  # only the row of the latest call
    assert backend._store is None
    backend.generate([prompt], params)
    assert backend._store is None  # outside a session nothing is kept


def test_sliding_window_model_runs_the_plain_path(tok):
    config = MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                           max_position_embeddings=256, pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = MistralForCausalLM(config).eval()
    backend = HFBackend(model, tok)
    assert not backend.reuse_prefix  # DynamicCache(config) holds sliding-window layers
    prompt = tok("The river Spree")["input_ids"]
    with backend.session():
        res = backend.generate([prompt], SamplingParams(max_new_tokens=5, greedy=True))[0]
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert res.token_ids == ref[0, len(prompt) :].tolist()[: len(res.token_ids)]
