"""Packed rows (train.remove_padding): a micro-batch's rows run as one row without padding and give
what the padded rows give (logprobs, entropies, critic values, gradients, the update itself)."""

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sleuth.config import AlgoConfig
from sleuth.models import ValueHead
from sleuth.train.forward import (
    batched_logprobs,
    batched_values,
    length_buckets,
    pack,
    padding_share,
    supports_packing,
    token_logprobs,
    unpack,
)
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update
from sleuth.train.layout import RowLayout
from tests.component.test_train_update import _batch
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


def _qwen2(tok, seed=1):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=tok.pad_token_id)
    return Qwen2ForCausalLM(config).eval()


def _model(kind, tok, attention):
    model = tiny_model(tok, seed=1) if kind == "llama" else _qwen2(tok)
    model.config._attn_implementation = attention
    return model


def test_packed_buckets_count_real_tokens():
    lengths = [9, 6, 12, 7, 3, 3]
    # longest first (12, 9, 7, 6, 3, 3), real tokens summed <= 20: 12 | 9+7 (16; +6 = 22) | 6+3+3 (12)
    assert length_buckets(lengths, 8, max_tokens=20, packed=True) == [[2], [0, 3], [1, 4, 5]]
    # <= 25: 12+9 (21; +7 = 28) | 7+6+3+3 (19); padded, 7+6+3+3 would be 4 x 7 = 28 slots
    assert length_buckets(lengths, 8, max_tokens=25, packed=True) == [[2, 0], [3, 1, 4, 5]]
    assert length_buckets(lengths, 8, max_tokens=25) == [[2, 0], [3, 1, 4], [5]]
    assert length_buckets(lengths, 2, max_tokens=25, packed=True) == [[2, 0], [3, 1], [4, 5]]  # the row cap holds
    for budget in (1, 7, 13, 24, 100):
        buckets = length_buckets(lengths, 8, max_tokens=budget, packed=True)
        assert sorted(i for b in buckets for i in b) == list(range(6))
        assert all(len(b) == 1 or sum(lengths[i] for i in b) <= budget for b in buckets)
    assert padding_share(lengths, [[0, 1, 2, 3, 4, 5]], packed=True) == 0.0


def test_pack_and_unpack_by_hand():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [4, 0, 0, 0]])
    att = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    ids_1N, pos_1N, keep = pack(ids, att)
    assert ids_1N.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert pos_1N.tolist() == [[0, 1, 2, 0, 1, 0]]
    back = unpack(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]), keep)
    assert back.tolist() == [[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0], [6.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("kind,attention", [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa")])
@pytest.mark.parametrize("needed", [False, True])
def test_packed_logprobs_and_gradients_equal_the_padded_rows(kind, attention, needed):
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    shapes = []
    models = {packed: _model(kind, tok, attention).train() for packed in (False, True)}
    assert supports_packing(models[True])
    hook = models[True].model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    results = {}
    mask = (loss_mask if needed else att).float()
    mask[:, 0] = 0  # column 0 has no prefix: 0 either way
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3)) * mask  # padded rows score padding
    for packed, model in models.items():
        lp, ent = token_logprobs(model, ids, att, temperature=0.7, with_entropy=True,
                                 needed_BT=loss_mask if needed else None, packed=packed)
        ((lp * weights).sum() + (ent * mask).sum()).backward()
        results[packed] = (lp.detach(), ent.detach())
    hook.remove()
    assert shapes == [(1, int(att.sum()))]  # one row, no padding
    for a, b in zip(results[False], results[True]):
        torch.testing.assert_close(b * mask, a * mask, atol=2e-6, rtol=1e-5)
        assert float(b[mask == 0].abs().max()) == 0.0  # packed: padding, column 0 and unneeded columns hold 0
    for (name, p), q in zip(models[False].named_parameters(), models[True].parameters()):
        if p.grad is None:
            assert q.grad is None or float(q.grad.abs().max()) == 0.0, name
        else:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_without_a_block_mask_packed_rows_would_differ():
    """The check above can fail: a forward that ignores the row boundaries (as when a KV cache is in
    use: transformers then builds no block mask) gives other logprobs from the second row on."""
    tok = tiny_tokenizer()
    ids, att, _ = _batch(tok)
    model = tiny_model(tok, seed=1)
    ids_1N, pos_1N, keep = pack(ids, att)
    padded = model(input_ids=ids, attention_mask=att, use_cache=False).logits[keep]
    packed = model(input_ids=ids_1N, position_ids=pos_1N, use_cache=False).logits[0]
    across = model(input_ids=ids_1N, position_ids=pos_1N, use_cache=True).logits[0].detach()
    first = int(att[0].sum())
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    assert float((across[first:] - padded[first:]).abs().max()) > 1e-2


def test_packed_critic_values_and_batched_passes_equal_the_padded_ones():
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    critic = ValueHead(tiny_model(tok, seed=2), 64)
    torch.nn.init.normal_(critic.head.weight, std=0.5)
    for mbs, budget in ((4, None), (2, 16), (3, 30)):
        padded = batched_values(critic, ids, att, micro_batch_size=mbs, max_tokens=budget)
        packed = batched_values(critic, ids, att, micro_batch_size=mbs, max_tokens=budget, packed=True)
        torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-5)
        assert float(padded[:, 0].abs().max()) == 0.0 and float(padded[att == 0].abs().max()) == 0.0
        policy = tiny_model(tok, seed=3)
        lp = batched_logprobs(policy, ids, att, micro_batch_size=mbs, max_tokens=budget, needed_BT=loss_mask)
        lp_packed = batched_logprobs(policy, ids, att, micro_batch_size=mbs, max_tokens=budget, needed_BT=loss_mask,
                                     packed=True)
        torch.testing.assert_close(lp_packed, lp, atol=2e-6, rtol=1e-5)


def test_a_packed_update_with_a_critic_equals_the_padded_update():
    tok = tiny_tokenizer()
    ids, att, loss_mask = _batch(tok)
    algo = AlgoConfig(advantage="gae", clip_low=0.2, clip_high=0.28, kl_coef=0.0, kl_mode="none", entropy_coef=0.01)
    base = tiny_model(tok, seed=1).train()
    base_critic = ValueHead(tiny_model(tok, seed=2), 64).train()
    torch.nn.init.normal_(base_critic.head.weight, std=0.5)
    old = batched_logprobs(base, ids, att, micro_batch_size=4, needed_BT=loss_mask)
    old = old + 0.2 * loss_mask * torch.tensor([[(-1) ** (b + t) for t in range(ids.shape[1])] for b in range(4)])
    values = batched_values(base_critic, ids, att, micro_batch_size=4)
    adv, returns = compute_advantages(algo, torch.tensor([1.0, 0.0, 0.0, 1.0]), ["q1", "q1", "q2", "q2"], loss_mask,
                                      old_logprobs_BT=old, values_BT=values)
    batch = UpdateBatch(ids, att, loss_mask, adv, old, returns_BT=returns, old_values_BT=values)
    out = {}
    for packed in (False, True):
        pol, critic = copy.deepcopy(base), copy.deepcopy(base_critic)
        opt, copt = torch.optim.SGD(pol.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)
        metrics = policy_update(pol, opt, batch, algo, RowLayout("packed" if packed else "padded", 2, 20),
                                grad_clip=None, critic=critic, critic_optimizer=copt)
        out[packed] = (pol, critic, metrics)
    for key in ("algo/loss", "algo/value_loss", "algo/entropy", "algo/clipfrac"):
        assert out[True][2][key] == pytest.approx(out[False][2][key], abs=1e-6), key
    for a, b in ((out[False][0], out[True][0]), (out[False][1], out[True][1])):
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)
    moved = any(not torch.equal(p, q) for p, q in zip(base.parameters(), out[True][0].parameters()))
    assert moved  # the update did something


def test_only_known_families_and_attention_implementations_pack():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1)
    assert supports_packing(model) and supports_packing(ValueHead(model, 64))
    model.config._attn_implementation = "some_custom_kernel"
    assert not supports_packing(model)
    model.config._attn_implementation = "sdpa"
    model.config.model_type = "gpt2"  # builds its mask another way
    assert not supports_packing(model)
