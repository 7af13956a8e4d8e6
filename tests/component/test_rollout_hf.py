"""The Hugging Face backend and the agent loop on a tiny real model (CPU; CUDA when present)."""

import pytest
import torch

from sleuth.config import RolloutConfig
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION, SearchR1Format, get_format
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.loop import run_rollouts
from sleuth.types import Passage, Question, StopReason
from tests.helpers.tiny import ScriptedBackend, teach, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component

PARIS = Passage("p1", "Paris", "Paris is the capital of France.")
ROME = Passage("p2", "Rome", "Rome is the capital of Italy.")
Q = Question("nq/1", "What is the capital of France", ("Paris",))
SEARCH = "<think> I should look it up. </think>\n<search> capital of France </search>"
ANSWER = "<answer> Paris </answer>"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok, seed=0)


@pytest.fixture(scope="module")
def taught(tok):
    """A tiny model cloned from the scripted policy: it searches, reads, answers (greedy)."""
    scripted, _ = run_rollouts([Q], ScriptedBackend(tok, [SEARCH, ANSWER]), tok, get_format("search_r1"),
                               InMemoryRetriever([PARIS, ROME]), cfg(), k=2)  # fmt: skip
    m = tiny_model(tok, seed=1)
    assert teach(m, tok, scripted, steps=80) < 0.1
    return m


def prompts_of(tok):
    return [tok(t)["input_ids"] for t in ("Who sang the song?", "The river", "Where does the roadrunner live?")]


def reference_greedy(model, ids, n):
    """Unbatched ``model.generate`` greedy continuation (the reference implementation)."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def full_logprobs(model, prompt, gen, temperature=1.0):
    """log_softmax(logits / T) of each generated token from ONE forward pass over prompt + gen."""
    ids = torch.tensor([prompt + gen])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(gen)[:, None]).squeeze(1)


def test_batched_greedy_equals_unbatched_generate(tok, model):
    prompts = prompts_of(tok)  # different lengths: exercises left padding and position ids
    res = HFBackend(model, tok).generate(prompts, SamplingParams(max_new_tokens=24, greedy=True))
    for p, r in zip(prompts, res):
        ref = reference_greedy(model, p, 24)
        assert r.token_ids == ref[: len(r.token_ids)]
        assert r.finish_reason == ("eos" if r.token_ids[-1] == tok.eos_token_id else "length")
        assert torch.allclose(torch.tensor(r.logprobs), full_logprobs(model, p, r.token_ids), atol=1e-4)


def test_stop_string_keeps_exactly_the_tokens_up_to_the_completing_one(tok, model):
    prompts = prompts_of(tok)
    ref = reference_greedy(model, prompts[0], 40)
    full = tok.decode(ref)
    # a stop string from the middle of the output, avoiding replacement characters
    start = next(i for i in range(len(full) // 3, len(full)) if "\ufffd" not in full[i : i + 3])
    stop = full[start : start + 3]
    expected_n = next(n for n in range(1, len(ref) + 1) if stop in tok.decode(ref[:n]))
    res = HFBackend(model, tok).generate(prompts, SamplingParams(max_new_tokens=40, greedy=True, stop=(stop,)))
    r = res[0]
    assert (r.finish_reason, r.stop_string) == ("stop", stop)
    assert r.token_ids == ref[:expected_n]
    assert stop in tok.decode(r.token_ids) and stop not in tok.decode(r.token_ids[:-1])


def test_sampling_is_seeded_per_row_and_logprobs_are_after_temperature(tok, model):
    backend, prompts = HFBackend(model, tok), prompts_of(tok)
    params = SamplingParams(max_new_tokens=16, temperature=0.7)
    a = backend.generate(prompts, params, seeds=[1, 2, 3])
    b = backend.generate(prompts, params, seeds=[1, 2, 3])
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    alone = backend.generate(prompts[1:2], params, seeds=[2])  # the row's sample ignores its batch
    assert alone[0].token_ids == a[1].token_ids
    other = backend.generate(prompts, params, seeds=[4, 5, 6])
    assert [r.token_ids for r in other] != [r.token_ids for r in a]
    for p, r in zip(prompts, a):
        assert torch.allclose(torch.tensor(r.logprobs), full_logprobs(model, p, r.token_ids, 0.7), atol=1e-4)


def test_finished_rows_leave_the_batch(tok, model):
    sizes = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        res = HFBackend(model, tok).generate(
            prompts_of(tok)[:2], SamplingParams(greedy=True, max_new_tokens=9), max_new_tokens=[2, 5]
        )
    finally:
        hook.remove()
    assert [len(r.token_ids) for r in res] == [2, 5]
    # prefill (2 rows), one step with both, then row 0 (cap 2) is dropped for the last 3 steps
    assert sizes == [2, 2, 1, 1, 1]


def test_zero_cap_and_bad_prompts(tok, model):
    backend = HFBackend(model, tok)
    res = backend.generate([[5, 6], [7]], SamplingParams(max_new_tokens=3), max_new_tokens=[0, 2])
    assert res[0].token_ids == [] and res[0].finish_reason == "length" and len(res[1].token_ids) == 2
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        backend.generate([[5], []], SamplingParams())
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        backend.generate([[5]], SamplingParams(), seeds=[1, 2])


def cfg(**kw):
    base = dict(group_size=1, max_turns=2, max_tokens_per_turn=40, max_obs_tokens=200,
                max_context_tokens=1024, max_invalid=1, use_chat_template=False)  # fmt: skip
    base.update(kw)
    return RolloutConfig(**base)


def run(tok, model, retriever=None, fmt=None, greedy=True, **kw):
    retriever = retriever or InMemoryRetriever([PARIS, ROME])
    return run_rollouts([Q], HFBackend(model, tok), tok, fmt or get_format("search_r1"), retriever, cfg(**kw),
                        k=2, greedy=greedy)  # fmt: skip


def test_taught_model_searches_then_answers_like_the_script(tok, taught):
    trajs, m = run(tok, taught)
    t = trajs[0]
    assert (t.stop_reason, t.answer, t.num_searches) == (StopReason.ANSWERED, "Paris", 1)
    assert t.queries == ["capital of France"]
    scripted, _ = run_rollouts([Q], ScriptedBackend(tok, [SEARCH, ANSWER]), tok, get_format("search_r1"),
                               InMemoryRetriever([PARIS, ROME]), cfg(), k=2)  # fmt: skip
    assert t.token_ids == scripted[0].token_ids and t.loss_mask == scripted[0].loss_mask
    assert m["rollout/retrieval_calls"] == 1


def test_real_model_budgets(tok, taught):
    (t,), _ = run(tok, taught, max_turns=0)  # the first round is final: its search is not executed
    assert t.stop_reason is StopReason.MAX_TURNS and t.num_searches == 0 and t.segments[-1].text.endswith("</search>")
    (t,), _ = run(tok, taught, max_tokens_per_turn=5)
    assert t.stop_reason is StopReason.MAX_TOKENS and len(t.segments[1].token_ids) == 5
    prompt_len = len(tok(SEARCH_R1_INSTRUCTION.format(question="What is the capital of France?"))["input_ids"])
    (t,), _ = run(tok, taught, max_context_tokens=prompt_len + 7)
    assert t.stop_reason is StopReason.CONTEXT_FULL and len(t.token_ids) == prompt_len + 7


def test_real_model_invalid_turn_stops_at_its_stop_string(tok, taught):
    class ThinkStops(SearchR1Format):
        stop_sequences = ["</think>", "</search>", "</answer>"]

    (t,), m = run(tok, taught, fmt=ThinkStops(), max_invalid=0)
    assert t.stop_reason is StopReason.INVALID_ACTION and t.num_invalid == 1
    assert tok.decode(t.segments[1].token_ids) == "<think> I should look it up. </think>"
    assert m["rollout/stop/invalid_action"] == 1


def test_real_model_retrieval_failure_observation(tok, taught):
    class Down:
        def search(self, queries, k):
            raise RetrievalError("connection refused")

    (t,), m = run(tok, taught, retriever=Down(), max_turns=1)
    assert t.num_retrieval_errors == 1 and t.passage_ids == [[]]
    assert t.segments[2].text == get_format("search_r1").render_error("RetrievalError: connection refused")
    assert t.num_turns == 2 and t.stop_reason is not None  # the loop went on after the failure


def test_sampled_rollouts_replay_with_the_same_seed(tok, taught):
    def go(step):
        c = cfg(group_size=3, temperature=1.5, max_tokens_per_turn=16)
        backend, retriever = HFBackend(taught, tok), InMemoryRetriever([PARIS])
        trajs, _ = run_rollouts([Q], backend, tok, get_format("search_r1"), retriever, c, seed=5, step=step)
        return [t.token_ids for t in trajs]

    first = go(0)
    assert go(0) == first
    assert go(1) != first


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_greedy_matches_cpu(tok, model):
    prompts = prompts_of(tok)
    params = SamplingParams(max_new_tokens=16, greedy=True)
    gpu_model = tiny_model(tok, seed=0).cuda()
    gpu = HFBackend(gpu_model, tok).generate(prompts, params)
    # float32 on two devices rounds differently: where CPU's top two tokens nearly tie, the GPU may take
    # the other. Every GPU token must be a CPU argmax to rounding, given the GPU's own earlier tokens.
    for prompt, g in zip(prompts, gpu):
        assert len(g.token_ids) > 0
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        for j, token in enumerate(g.token_ids):
            row = logp[len(prompt) + j - 1]
            assert float(row[token]) >= float(row.max()) - 1e-3, (j, token, int(row.argmax()))
    sampled = HFBackend(gpu_model, tok).generate(prompts, SamplingParams(max_new_tokens=8), seeds=[1, 2, 3])
    assert all(len(r.token_ids) > 0 for r in sampled)


def test_the_cache_goes_under_the_name_this_transformers_takes(model, tok):
    """transformers >= 5.20 takes ``cache`` (``past_key_values`` is deprecated, removed in 5.40);
    5.16-5.19 (vLLM 0.32's range) take ``past_key_values``. Generation warns about neither."""
    import inspect
    import warnings

    from sleuth.rollout.hf_backend import cache_kwarg

    takes = inspect.signature(model.forward).parameters
    assert cache_kwarg(model) == ("cache" if "cache" in takes else "past_key_values")

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None

    assert cache_kwarg(Old()) == "past_key_values"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        HFBackend(model, tok).generate([[5, 6, 7]], SamplingParams(max_new_tokens=3, greedy=True))
