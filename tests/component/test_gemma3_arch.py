"""Gemma-3's architecture where Sleuth was built on Llama-shaped models, on a tiny Gemma3 built in-process:
sliding-window attention on most layers (a window shorter than the test contexts), query/key norms, tied
embeddings. Generation equals ``generate`` and its logprobs a full forward; packed rows and the chunked output
layer give the padded rows' logprobs and gradients; the shared-prefix layout, which its sliding-window cache
rules out, runs whole rows and says why."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from sleuth.config import TrainConfig
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.hf_cache import supports_reuse
from sleuth.train.chunked_head import supports_chunked_head
from sleuth.train.forward import supports_packing, token_logprobs
from sleuth.train.layout import RowLayout
from tests.component.test_train_update import _batch
from tests.helpers.tiny import tiny_tokenizer

pytestmark = pytest.mark.component

WINDOW = 4


def tiny_gemma3(tok, seed=0, softcap=None, attention="sdpa", sliding=3):
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=WINDOW, max_position_embeddings=1024,
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


def test_the_shared_prefix_layout_runs_whole_rows_and_says_why_once(tok, capsys):
    model = tiny_gemma3(tok)
    assert not supports_reuse(model)  # sliding-window layers: no plain full-attention cache to reuse
    layout = RowLayout.choose(TrainConfig(share_prefix=True), model)
    assert layout.kind == "padded"
    out = capsys.readouterr().out
    assert out.count("warning: train.share_prefix") == 1 and "not plain full attention" in out
