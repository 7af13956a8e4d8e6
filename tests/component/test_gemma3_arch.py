"""Gemma-3's architecture where Sleuth was built on Llama-shaped models, on a tiny Gemma3 built in-process:
sliding-window attention on most layers (a window shorter than the test contexts), query/key norms, tied
embeddings. Generation equals ``generate`` and its logprobs a full forward; prefix reuse and hf_static (slot
buffers with a mask per layer kind) equal whole prefills across rounds; packed rows and the chunked output
layer give the padded rows' logprobs and gradients; the training side's shared-prefix layout runs over sliding
windows under sdpa and eager attention (its values: tests/component/test_prefix_share.py), and whole rows, saying
why, where it is not tested."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from sleuth.config import TrainConfig
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.hf_cache import decode_window_masks, sliding_window, supports_reuse, window_masks
from sleuth.rollout.hf_static import StaticHFBackend
from sleuth.train.chunked_head import supports_chunked_head
from sleuth.train.forward import supports_packing, supports_shared_prefix, token_logprobs
from sleuth.train.layout import RowLayout
from tests.component.test_train_update import _batch
from tests.helpers.tiny import tiny_tokenizer

pytestmark = pytest.mark.component

WINDOW = 4


def tiny_gemma3(tok, seed=0, softcap=None, attention="sdpa", sliding=3, window=WINDOW):
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=window, max_position_embeddings=1024,
        layer_types=["sliding_attention"] * sliding + ["full_attention"] * (4 - sliding),
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None, tie_word_embeddings=True,
        final_logit_softcapping=softcap, attn_implementation=attention)
    model = Gemma3ForCausalLM(config).eval()
    for p in model.parameters():  # random init is tiny in Gemma (std 0.02): spread the logits so argmaxes differ
        torch.nn.init.normal_(p, std=0.2)
    return model


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_greedy_generation_equals_generate_past_the_window_and_logprobs_a_full_forward(tok):
    model = tiny_gemma3(tok)
    prompts = [tok(t)["input_ids"] for t in ("Who sang the song? The quick brown fox", "The river",
                                             "Where does the roadrunner live?")]
    assert max(map(len, prompts)) > WINDOW
    res = HFBackend(model, tok).generate(prompts, SamplingParams(max_new_tokens=16, greedy=True))
    for p, r in zip(prompts, res):
        ref = model.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0, len(p):]
        assert r.token_ids == ref.tolist()[: len(r.token_ids)] and len(r.token_ids) > WINDOW
        logits = model(input_ids=torch.tensor([p + r.token_ids])).logits[0, len(p) - 1 : -1]
        full = torch.log_softmax(logits, -1).gather(1, torch.tensor(r.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(r.logprobs), full, atol=1e-4, rtol=1e-4)


def test_sampled_tokens_carry_the_logprobs_of_a_full_forward_at_the_temperature(tok):
    model = tiny_gemma3(tok)
    prompt = tok("Who sang the song? The quick brown fox")["input_ids"]
    params = SamplingParams(max_new_tokens=12, temperature=0.7)
    a = HFBackend(model, tok).generate([prompt, prompt], params, [11, 12])
    b = HFBackend(model, tok).generate([prompt], params, [12])
    assert a[1].token_ids == b[0].token_ids  # seeded per row, whatever the batch
    for r in a:
        logits = model(input_ids=torch.tensor([prompt + r.token_ids])).logits[0, len(prompt) - 1 : -1]
        full = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(r.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(r.logprobs), full, atol=1e-4, rtol=1e-4)


def test_window_masks_count_the_window_in_positions_across_padding():
    # row 0: a 3-token prefix (slots 0-2), padding at slot 3, 2 new tokens (slots 4-5); row 1: 3 new tokens
    valid = torch.tensor([[1, 1, 1, 0, 1, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    m = window_masks(valid, torch.arange(3, 6), window=2)

    def seen(kind, row, q):
        return m[kind][row, 0, q].nonzero().squeeze(1).tolist()

    assert seen("full_attention", 0, 1) == [0, 1, 2, 4] and seen("sliding_attention", 0, 1) == [2, 4]
    assert seen("full_attention", 0, 2) == [0, 1, 2, 4, 5] and seen("sliding_attention", 0, 2) == [4, 5]
    assert seen("full_attention", 0, 0) == [0, 1, 2, 3] and seen("sliding_attention", 0, 0) == [1, 2, 3]  # padding
    assert seen("full_attention", 1, 0) == seen("sliding_attention", 1, 0) == [3]
    assert seen("full_attention", 1, 2) == [3, 4, 5] and seen("sliding_attention", 1, 2) == [4, 5]
    assert seen("sliding_attention", 1, 1) == [3, 4]
    grown = torch.cat([valid, torch.ones(2, 1, dtype=torch.bool)], 1)  # a decode step writes slot 6
    step = decode_window_masks(grown, window=2)
    for kind, mask in window_masks(grown, torch.tensor([6]), window=2).items():
        assert torch.equal(step[kind], mask), kind
    eager = window_masks(valid, torch.arange(3, 6), window=2, dtype=torch.float32)["sliding_attention"]
    assert torch.equal(eager == 0, m["sliding_attention"]) and eager.min() == torch.finfo(torch.float32).min


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_prefix_reuse_and_hf_static_over_sliding_windows_equal_whole_prefills_across_rounds(tok, attention):
    model = tiny_gemma3(tok, attention=attention)
    assert sliding_window(model) == WINDOW and not supports_reuse(model)
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    prompts = [tok(t)["input_ids"] for t in ("Who sang the song? The quick brown fox", "The river",
                                             "Where does the roadrunner live?")]
    whole = HFBackend(model, tok, reuse_prefix=False)  # transformers' sliding cache, every prompt prefilled whole
    first = whole.generate(prompts, greedy)
    again = [p + r.token_ids + tok(" and then the")["input_ids"] for p, r in zip(prompts, first)]
    second = whole.generate(again, greedy)
    unwindowed = HFBackend(tiny_gemma3(tok, attention=attention, sliding=0), tok, reuse_prefix=False)
    assert any(a.token_ids != b.token_ids for a, b in zip(unwindowed.generate(again, greedy), second))
    backends = {"hf": HFBackend(model, tok), "hf_static": StaticHFBackend(model, tok),
                "compiled": StaticHFBackend(model, tok, compile=True, compile_backend="eager", width_multiple=16)}
    for name, backend in backends.items():
        cached = []
        lookup = backend._cached_prefixes
        backend._cached_prefixes = lambda ps, lookup=lookup, cached=cached: cached.append(hits := lookup(ps)) or hits
        with backend.session():
            results = [backend.generate(prompts, greedy), backend.generate(again, greedy)]
        reused = [n for n, _ in cached[1]]
        assert all(n > WINDOW for n in reused), (name, reused)  # round 2 prefilled only what follows
        for got, want in zip(results, (first, second)):
            for g, w in zip(got, want):
                assert g.token_ids == w.token_ids, name
                torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_and_the_chunked_head_give_the_padded_rows_logprobs_and_gradients(tok, attention):
    ids, att, loss_mask = _batch(tok)
    assert int(att.sum(-1).max()) > WINDOW
    models = {packed: tiny_gemma3(tok, seed=1, attention=attention).train() for packed in (False, True)}
    assert supports_packing(models[True]) and supports_chunked_head(models[True])
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3)) * loss_mask
    results = {}
    for packed, model in models.items():
        lp, ent = token_logprobs(model, ids, att, temperature=0.7, with_entropy=True, needed_BT=loss_mask,
                                 packed=packed)
        ((lp * weights).sum() + (ent * loss_mask).sum()).backward()
        results[packed] = (lp.detach() * loss_mask, ent.detach() * loss_mask)
    # the reference: plain logits of the padded rows, no chunked head
    plain = tiny_gemma3(tok, seed=1, attention=attention)
    logits = plain(input_ids=ids, attention_mask=att).logits[:, :-1] / 0.7
    ref = torch.zeros(ids.shape)
    ref[:, 1:] = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(results[False][0], ref.detach() * loss_mask, atol=2e-5, rtol=1e-5)
    full = tiny_gemma3(tok, seed=1, attention=attention, sliding=0)  # the same weights, no window
    unwindowed = token_logprobs(full, ids, att, temperature=0.7, needed_BT=loss_mask)[0].detach() * loss_mask
    assert float((unwindowed - results[False][0]).abs().max()) > 1e-3  # the window is in effect here
    for a, b in zip(results[False], results[True]):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-5)
    for (name, p), q in zip(models[False].named_parameters(), models[True].parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_a_final_soft_cap_rules_out_the_chunked_head(tok):
    assert not supports_chunked_head(tiny_gemma3(tok, softcap=30.0))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_shared_prefix_layout_runs_over_sliding_windows(tok, attention, capsys):
    model = tiny_gemma3(tok, attention=attention)
    assert not supports_reuse(model) and supports_shared_prefix(model)  # full and sliding-window layers
    assert RowLayout.choose(TrainConfig(share_prefix=True), model).kind == "shared_prefix"
    assert "warning" not in capsys.readouterr().out


def test_the_shared_prefix_layout_runs_whole_rows_under_flash_attention_and_says_why_once(tok, capsys):
    model = tiny_gemma3(tok)
    model.config._attn_implementation = "flash_attention_2"  # sliding windows by kernel argument: not tested here
    assert not supports_shared_prefix(model)
    layout = RowLayout.choose(TrainConfig(share_prefix=True), model)
    assert layout.kind == "padded"
    out = capsys.readouterr().out
    assert out.count("warning: train.share_prefix") == 1 and "sliding-window layers under sdpa or eager" in out
