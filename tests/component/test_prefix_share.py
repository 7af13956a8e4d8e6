"""Shared prefixes (train.share_prefix): a micro-batch's common leading tokens run once, and every value
and gradient equals that of the rows run whole (float rounding apart), on Llama, Qwen2 and Gemma-3 (sliding
windows shorter than the rows and than the shared prefix)."""

import copy

import pytest
import torch

import sleuth.train.forward as fwd
from sleuth.config import AlgoConfig
from sleuth.train.forward import batched_logprobs, token_logprobs
from sleuth.train.prefix_share import (
    common_prefix_len,
    computed_share,
    computed_slots,
    prefix_buckets,
    shared_split,
)
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update
from sleuth.train.layout import RowLayout
from tests.component.test_gemma3_arch import tiny_gemma3
from tests.component.test_packing import _qwen2
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


def _rows(rows, pad=0):
    """Right-padded [B, T] ids and mask from lists of token ids."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad)
    att = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        att[b, : len(r)] = 1
    return ids, att


def test_common_prefix_and_split_by_hand():
    ids, att = _rows([[5, 6, 7, 8, 9], [5, 6, 7, 1], [5, 6, 7, 8]])
    assert common_prefix_len(ids, att.sum(-1)) == 3 and shared_split(ids, att) == 2
    ids, att = _rows([[5, 6, 7], [5, 6, 7, 8, 9]])  # one row is a prefix of the other: the shorter's length
    assert common_prefix_len(ids, att.sum(-1)) == 3 and shared_split(ids, att) == 2
    ids, att = _rows([[4, 6], [5, 6]])
    assert shared_split(ids, att) == 0  # no common first token
    ids, att = _rows([[5, 6, 7]])
    assert shared_split(ids, att) == 0  # one row: nothing to share
    # the padding never counts as common: rows [5, 6] and [5, 6, 0] (0 a real token) share 2
    ids, att = _rows([[5, 6], [5, 6, 0]], pad=0)
    assert common_prefix_len(ids, att.sum(-1)) == 2


def test_computed_slots_by_hand():
    assert computed_slots(1, 7, 10) == 10  # alone: the row itself
    assert computed_slots(3, 6, 10) == 5 + 3 * 5  # 5 tokens once, then 3 rows of 10 - 5
    assert computed_slots(2, 0, 4) == 8 and computed_slots(2, 1, 4) == 8  # nothing to share


def test_prefix_buckets_put_rows_with_a_common_prefix_together():
    p, q = list(range(10, 30)), list(range(40, 60))  # two prompts of 20 tokens
    rows = [p + [1, 2], q + [3], p + [1, 3, 4], q + [4, 4], p + [2], [7, 7, 7]]
    ids, att = _rows(rows)
    # in token order: [7,7,7] | p+[1,2], p+[1,3,4], p+[2] | q+[3], q+[4,4]; the short row joins nothing (its
    # 3 tokens alone are cheaper than padding a shared micro-batch)
    assert prefix_buckets(ids, att, 8) == [[5], [0, 2, 4], [1, 3]]
    assert prefix_buckets(ids, att, 2) == [[5], [0, 2], [4], [1, 3]]  # the row cap holds
    # budget 30: p's three rows would compute 19 + 3 * 4 = 31 slots; p+[1,2] with p+[1,3,4] share 21 tokens:
    # 20 + 2 * 3 = 26, and p+[2] alone 21 (the other cut, 22 + (19 + 2 * 4), costs 49); q's two rows 19 + 2 * 3
    assert computed_slots(3, 20, 23) == 31 and computed_slots(2, 21, 23) == 26 and computed_slots(2, 20, 22) == 25
    assert prefix_buckets(ids, att, 8, max_tokens=30) == [[5], [0, 2], [4], [1, 3]]
    for mbs in (1, 3, 8):
        for budget in (None, 1, 25, 100):
            buckets = prefix_buckets(ids, att, mbs, max_tokens=budget)
            assert sorted(i for b in buckets for i in b) == list(range(len(rows)))
            assert all(len(b) <= mbs for b in buckets)
    # 3 + (19 + 3 * 4) + (19 + 2 * 3) = 59 slots computed for 112 real tokens
    assert computed_share(ids, att, prefix_buckets(ids, att, 8)) == pytest.approx(59 / 112)
    assert computed_share(ids, att, [[i] for i in range(len(rows))]) == 1.0


def test_an_odd_row_sorted_first_does_not_take_the_group_with_it():
    prompt, turn = list(range(10, 30)), list(range(50, 80))
    rows = [prompt + [1] + list(range(90, 120)) + [5]] + [prompt + turn + [k] for k in range(2, 9)]
    ids, att = _rows(rows)
    # a greedy cut would join row 1 to row 0 (sharing the prompt is cheaper than either alone), then the rest
    assert prefix_buckets(ids, att, 8) == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert computed_share(ids, att, prefix_buckets(ids, att, 8)) < 0.3


def test_prefix_buckets_are_the_cheapest_cut_of_the_sorted_rows():
    """Against every way of cutting the rows, in token order, into runs (2^(n-1) of them)."""
    g = torch.Generator().manual_seed(3)
    for trial in range(30):
        n = 2 + trial % 6
        base = torch.randint(5, 9, (12,), generator=g).tolist()
        rows = [base[: int(torch.randint(2, 12, (1,), generator=g))] + torch.randint(5, 7, (3,), generator=g).tolist()
                for _ in range(n)]
        ids, att = _rows(rows)
        mbs, budget = 1 + trial % 4, (None, 20, 40)[trial % 3]
        order = sorted(range(n), key=lambda i: (rows[i], i))

        def cost(run, ids=ids, att=att):
            idx = torch.tensor(run)
            lengths = att[idx].sum(-1)
            return computed_slots(len(run), common_prefix_len(ids[idx], lengths), int(lengths.max()))

        def allowed(run, mbs=mbs, budget=budget):
            return len(run) <= mbs and (budget is None or len(run) == 1 or cost(run) <= budget)

        best = None
        for mask in range(2 ** (n - 1)):
            runs, start = [], 0
            for k in range(1, n):
                if mask >> (k - 1) & 1:
                    runs.append(order[start:k])
                    start = k
            runs.append(order[start:])
            if all(allowed(r) for r in runs):
                key = (sum(cost(r) for r in runs), len(runs))
                best = key if best is None else min(best, key)
        got = prefix_buckets(ids, att, mbs, max_tokens=budget)
        assert all(allowed(r) for r in got) and sorted(i for r in got for i in r) == list(range(n))
        assert (sum(cost(r) for r in got), len(got)) == best, trial


def _group_batch(tok, seed=0):
    """Rows as a GRPO step gives them: two questions' groups, each sharing a prompt, some rows also a
    first turn; right-padded; the 'sampled' tokens in the loss mask, one row left out of the loss."""
    g = torch.Generator().manual_seed(seed)

    def rand(n):
        return torch.randint(5, len(tok), (n,), generator=g).tolist()

    rows, masks = [], []
    for _ in range(2):
        prompt, turn, info = rand(12), rand(4), rand(6)
        for k in range(4):
            first = turn if k < 3 else rand(5)
            answer = rand(2 + k)
            rows.append(prompt + first + info + answer)
            masks.append([0] * 12 + [1] * len(first) + [0] * 6 + [1] * len(answer))
    ids, att = _rows(rows, pad=tok.pad_token_id)
    mask = torch.zeros_like(att)
    for b, m in enumerate(masks):
        mask[b, : len(m)] = torch.tensor(m)
    mask[5] = 0  # a row left out of the loss (a failed search)
    return ids, att, mask


def _model(kind, tok, seed=1):
    """A tiny model: Llama (sdpa or eager), Qwen2, or Gemma-3 with sliding-window layers
    (``gemma3[-eager]-wN``: window N, shorter than the rows; 4 also shorter than the shared prefix)."""
    if kind == "qwen2":
        return _qwen2(tok)
    if kind.startswith("gemma3"):
        attention = "eager" if "-eager" in kind else "sdpa"
        return tiny_gemma3(tok, seed=seed, attention=attention, window=int(kind.rsplit("-w", 1)[1]))
    model = tiny_model(tok, seed=seed)
    model.config._attn_implementation = "sdpa" if kind == "llama" else "eager"
    return model


GEMMA3 = ["gemma3-w4", "gemma3-w16", "gemma3-eager-w4"]
# the tiny Gemma-3's weights are spread (std 0.2) and normalised four times a layer: looser rounding, as in
# tests/component/test_gemma3_arch.py
TOLERANCE = {"values": {"atol": 2e-6, "rtol": 1e-5}, "grads": {"atol": 1e-5, "rtol": 1e-4}}
GEMMA3_TOLERANCE = {"values": {"atol": 2e-5, "rtol": 1e-5}, "grads": {"atol": 1e-5, "rtol": 1e-4}}


def _tol(kind):
    return GEMMA3_TOLERANCE if kind in GEMMA3 else TOLERANCE


@pytest.mark.parametrize("kind", ["llama", "llama-eager", "qwen2", *GEMMA3])
@pytest.mark.parametrize("chunked", [True, False])
def test_shared_logprobs_and_gradients_equal_the_whole_rows(kind, chunked, monkeypatch):
    if not chunked:  # the plain output layer path (full logits at the kept positions)
        monkeypatch.setattr(fwd, "supports_chunked_head", lambda model: False)
    tok = tiny_tokenizer()
    ids, att, mask = _group_batch(tok)
    model = _model(kind, tok).train()
    if kind in GEMMA3:  # the window is in effect on these rows: the same weights without it differ
        window = model.config.sliding_window
        assert int(att.sum(-1).max()) > window
        unwindowed = tiny_gemma3(tok, seed=1, attention=model.config._attn_implementation, sliding=0, window=window)
        with torch.no_grad():
            a, b = (token_logprobs(m, ids, att, needed_BT=mask)[0] for m in (model, unwindowed))
        assert float((a - b).abs().max()) > 1e-3
    cases = [(slice(0, 4), mask), (slice(4, 8), mask), (slice(0, 3), None), (slice(0, 2), torch.zeros_like(mask))]
    for rows, needed in cases:  # a group; a group with a row out of the loss; no mask; nothing to score
        r_ids, r_att = ids[rows], att[rows]
        L = int(r_att.sum(-1).max())
        r_ids, r_att = r_ids[:, :L], r_att[:, :L]
        r_need = None if needed is None else needed[rows, :L]
        assert shared_split(r_ids, r_att) > 0
        w = torch.randn(r_ids.shape, generator=torch.Generator().manual_seed(1)) * r_att  # real tokens only
        results = []
        for shared in (False, True):
            for entropy_grad in (True, False):
                model.zero_grad(set_to_none=True)
                lp, ent = token_logprobs(model, r_ids, r_att, with_entropy=True, entropy_grad=entropy_grad,
                                         needed_BT=r_need, shared_prefix=shared)
                loss = (lp * w).sum() + ((ent * w).sum() if entropy_grad else 0.0)
                loss.backward()
                grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
                results.append((lp.detach(), ent.detach(), grads))
        real = r_att.bool()  # without a mask the whole rows' pass also scores the padding: compare real tokens
        tol = _tol(kind)
        for whole, shared in zip(results[:2], results[2:]):
            torch.testing.assert_close(shared[0][real], whole[0][real], **tol["values"])
            torch.testing.assert_close(shared[1][real], whole[1][real], **tol["values"])
            for g_whole, g_shared in zip(whole[2], shared[2]):
                torch.testing.assert_close(g_shared, g_whole, **tol["grads"])
        if needed is not None and not needed[rows].any():
            assert all(float(g.abs().sum()) == 0 for g in results[0][2])  # the anchor: a graph, zero gradient
        else:
            assert any(float(g.abs().sum()) > 0 for g in results[2][2])
        if r_need is not None:  # columns outside the mask hold 0, as in the whole-row pass
            assert not results[2][0][~r_need.bool()].any()


def test_shared_and_packed_together_are_refused():
    tok = tiny_tokenizer()
    ids, att, mask = _group_batch(tok)
    with pytest.raises(ValueError, match="shared_prefix and packed cannot both be set"):
        token_logprobs(_model("llama", tok), ids[:4], att[:4], needed_BT=mask[:4], packed=True, shared_prefix=True)


@pytest.mark.parametrize("kind", ["llama", "gemma3-w4"])
def test_identical_rows_share_all_but_their_last_token(kind):
    tok = tiny_tokenizer()
    ids, att, mask = _group_batch(tok)
    same_ids, same_att, same_mask = ids[:1, :24].repeat(3, 1), att[:1, :24].repeat(3, 1), mask[:1, :24].repeat(3, 1)
    assert shared_split(same_ids, same_att) == 23
    model = _model(kind, tok)
    with torch.no_grad():
        whole, _ = token_logprobs(model, same_ids, same_att, needed_BT=same_mask)
        shared, _ = token_logprobs(model, same_ids, same_att, needed_BT=same_mask, shared_prefix=True)
    torch.testing.assert_close(shared, whole, **_tol(kind)["values"])


@pytest.mark.parametrize("kind", ["llama", "gemma3-w4"])
def test_batched_logprobs_shared_equal_whole_for_any_micro_batch(kind):
    tok = tiny_tokenizer()
    ids, att, mask = _group_batch(tok)
    model = _model(kind, tok)
    whole = batched_logprobs(model, ids, att, micro_batch_size=8, needed_BT=mask)
    for mbs, budget in ((8, None), (3, None), (4, 60), (1, None)):
        shared = batched_logprobs(model, ids, att, micro_batch_size=mbs, max_tokens=budget, needed_BT=mask,
                                  shared_prefix=True)
        torch.testing.assert_close(shared, whole, **_tol(kind)["values"])
    buckets = prefix_buckets(ids, att, 8)
    assert sorted(len(b) for b in buckets) == [1, 1, 3, 3]  # each group's three alike rows; the odd ones alone
    assert computed_share(ids, att, buckets) < 0.75


@pytest.mark.parametrize("kind", ["llama", "gemma3-w4"])
def test_a_shared_update_equals_the_whole_rows_update(kind):
    tok = tiny_tokenizer()
    ids, att, mask = _group_batch(tok)
    algo = AlgoConfig(advantage="grpo", clip_low=0.2, clip_high=0.28, kl_coef=0.01, kl_mode="loss", entropy_coef=0.01)
    base = _model(kind, tok, seed=1).train()
    ref = _model(kind, tok, seed=2).eval()
    old = batched_logprobs(base, ids, att, micro_batch_size=4, needed_BT=mask)
    old = old + 0.2 * mask * torch.tensor([[(-1) ** (b + t) for t in range(ids.shape[1])] for b in range(8)])
    ref_lp = batched_logprobs(ref, ids, att, micro_batch_size=4, needed_BT=mask, shared_prefix=True)
    torch.testing.assert_close(ref_lp, batched_logprobs(ref, ids, att, micro_batch_size=4, needed_BT=mask),
                               **_tol(kind)["values"])
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    adv, _ = compute_advantages(algo, scores, ["a"] * 4 + ["b"] * 4, mask)
    batch = UpdateBatch(ids, att, mask, adv, old, ref_logprobs_BT=ref_lp)
    out = {}
    for shared in (False, True):
        pol = copy.deepcopy(base)
        opt = torch.optim.SGD(pol.parameters(), lr=0.1)
        metrics = policy_update(pol, opt, batch, algo, RowLayout("shared_prefix" if shared else "padded", 4),
                                grad_clip=None)
        out[shared] = (pol, metrics)
    for key in ("algo/loss", "algo/kl", "algo/entropy", "algo/clipfrac", "algo/grad_norm"):
        assert out[True][1][key] == pytest.approx(out[False][1][key], rel=1e-5, abs=1e-6), key
    for p, q in zip(out[False][0].parameters(), out[True][0].parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), out[True][0].parameters()))
