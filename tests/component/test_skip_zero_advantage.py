"""``train.skip_zero_advantage``: rows that add nothing to the gradient run no pass, and the update is the same."""

import copy

import pytest
import torch

from sleuth.config import AlgoConfig
from sleuth.train.forward import batched_logprobs
from sleuth.train.layout import RowLayout
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component

GROUPS = ["q1"] * 3 + ["q2"] * 3 + ["q3"] * 2


def _batch(tok, scores, seed=0, masked_row=None):
    """8 right-padded rows in three groups; the last 3-5 tokens of each are 'sampled'; ``masked_row`` has no
    trained token (as ``train.overlong: mask`` leaves a cut row)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 6, 12, 7, 10, 8, 11, 5]
    B, T = len(lengths), max(lengths)
    ids = torch.full((B, T), tok.pad_token_id)
    att = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, L in enumerate(lengths):
        ids[b, :L] = torch.randint(5, len(tok), (L,), generator=g)
        att[b, :L] = 1
        mask[b, L - 3 - b % 3: L] = 1
    if masked_row is not None:
        mask[masked_row] = 0
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    adv, _ = compute_advantages(algo, torch.tensor(scores), GROUPS, mask)
    return ids, att, mask, adv


def _counting(model):
    """Counts the rows every forward of ``model`` receives."""
    seen = []
    model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(int(kwargs["input_ids"].shape[0])
                                                                        if "input_ids" in kwargs else -1),
                                    with_kwargs=True)
    return seen


def _run(base, batches, algo, layout, skip, adam):
    """Two updates in a row, with SGD (the weights move by the gradient) or AdamW (weight decay on)."""
    pol = copy.deepcopy(base).train()
    opt = (torch.optim.AdamW(pol.parameters(), lr=1e-2, weight_decay=0.1) if adam
           else torch.optim.SGD(pol.parameters(), lr=0.5))
    old = batched_logprobs(base, batches[0][0], batches[0][1], micro_batch_size=8)
    out = []
    for ids, att, mask, adv in batches:
        batch = UpdateBatch(ids, att, mask, adv, old + 0.1 * mask)  # ratios off 1: some clip
        out.append(policy_update(pol, opt, batch, algo, layout, grad_clip=1.0, skip_zero_advantage=skip))
    return pol, opt, out


@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adamw"])
@pytest.mark.parametrize("layout", [RowLayout("padded", 3, None), RowLayout("packed", 4, 24)], ids=["padded", "packed"])
def test_skipping_rows_without_signal_gives_the_same_update(layout, adam):
    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=1)
    # q1 has a spread, q2's rewards are all equal (advantage 0), q3 has a spread; row 7 has no trained token
    first = _batch(tok, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], masked_row=7)
    # every group's rewards equal: no row has a gradient, yet AdamW's moments and weight decay move the weights
    second = _batch(tok, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0], seed=1)
    assert float(second[3].abs().max()) == 0.0
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    full, full_opt, full_m = _run(base, [first, second], algo, layout, False, adam)
    skip, skip_opt, skip_m = _run(base, [first, second], algo, layout, True, adam)
    assert [m["algo/rows_skipped"] for m in full_m] == [0.0, 0.0]
    assert [m["algo/rows_skipped"] for m in skip_m] == [4.0, 8.0]  # q2's 3 rows and row 7; then all 8
    for a, b in zip(full_m, skip_m):
        assert b["algo/loss"] == pytest.approx(a["algo/loss"], abs=1e-6)
        assert b["algo/optimizer_steps"] == a["algo/optimizer_steps"] == 1
        assert b["algo/grad_norm"] == pytest.approx(a["algo/grad_norm"], rel=1e-5, abs=1e-7)
    # SGD: the weights are the gradient's image, equal to float rounding. AdamW divides each coordinate's moment by
    # its own scale, so a coordinate whose gradient is float-rounding small moves by up to lr either way: its
    # moments are compared tightly, the weights within a hundredth of lr
    atol = 1e-4 if adam else 1e-6
    for p, q in zip(full.parameters(), skip.parameters()):
        torch.testing.assert_close(q, p, atol=atol, rtol=1e-5)
    if adam:
        for p, q in zip(full.parameters(), skip.parameters()):
            assert float(skip_opt.state[q]["step"]) == float(full_opt.state[p]["step"]) == 2.0
            torch.testing.assert_close(skip_opt.state[q]["exp_avg"], full_opt.state[p]["exp_avg"], atol=1e-8, rtol=1e-5)
            torch.testing.assert_close(skip_opt.state[q]["exp_avg_sq"], full_opt.state[p]["exp_avg_sq"], atol=1e-12,
                                       rtol=1e-5)
        # the all-zero step moved every weight, as AdamW does on a zero gradient (momentum, weight decay)
        assert all(not torch.equal(p, q) for p, q in zip(base.parameters(), skip.parameters()))
    else:
        assert any(not torch.equal(p, q) for p, q in zip(base.parameters(), skip.parameters()))


def test_skipped_rows_run_no_forward_and_a_loss_reading_every_row_keeps_them():
    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=1)
    ids, att, mask, adv = _batch(tok, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], masked_row=7)
    batch = UpdateBatch(ids, att, mask, adv, None)
    for algo, rows, skipped in ((AlgoConfig(kl_coef=0.0), 4, 4.0),
                                (AlgoConfig(kl_coef=0.0, entropy_coef=0.01), 8, 0.0)):
        pol = copy.deepcopy(base).train()
        seen = _counting(pol)
        m = policy_update(pol, torch.optim.SGD(pol.parameters(), lr=0.1), batch, algo, RowLayout("padded", 8, None),
                          skip_zero_advantage=True)
        assert seen == [rows] and m["algo/rows_skipped"] == skipped
    ref = batched_logprobs(tiny_model(tok, seed=2), ids, att, micro_batch_size=8)
    with_kl = UpdateBatch(ids, att, mask, adv, None, ref_logprobs_BT=ref)  # a KL loss reads every row's logprobs
    pol = copy.deepcopy(base).train()
    seen = _counting(pol)
    m = policy_update(pol, torch.optim.SGD(pol.parameters(), lr=0.1), with_kl, AlgoConfig(kl_coef=0.1),
                      RowLayout("padded", 8, None), skip_zero_advantage=True)
    assert seen == [8] and m["algo/rows_skipped"] == 0.0
