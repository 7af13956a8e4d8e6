"""Clipped policy loss, TIS, value loss, entropy bonus: hand-computed values, gradients, and a
naive Python-loop reference for the vectorised clipped loss."""

from __future__ import annotations

import math

import pytest
import torch

from sleuth.algo.losses import (
    clipped_policy_loss,
    entropy_bonus,
    policy_loss_per_token,
    tis_weights,
    value_loss,
)

pytestmark = pytest.mark.unit

# ratios r = [1.5, 0.5, 1.1, 0.7] against old logprobs 0, advantages [1, 1, -1, -2]
RATIOS = [1.5, 0.5, 1.1, 0.7]
OLD_BT = torch.zeros(1, 4, dtype=torch.float64)
ADV_BT = torch.tensor([[1.0, 1.0, -1.0, -2.0]], dtype=torch.float64)
MASK_BT = torch.ones(1, 4, dtype=torch.bool)


def _logp(ratios, requires_grad=True):
    return torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(requires_grad)


def test_clip_higher_hand_computed_with_gradient():
    logp_BT = _logp(RATIOS)
    loss, stats = clipped_policy_loss(logp_BT, OLD_BT, ADV_BT, MASK_BT, clip_low=0.2, clip_high=0.28)
    # clip range [0.8, 1.28]; per token max(-A r, -A clip(r)):
    #   t0 A=1,  r=1.5: max(-1.5, -1.28) = -1.28  clipped
    #   t1 A=1,  r=0.5: max(-0.5, -0.8)  = -0.5   (not clipped: a low ratio with A > 0 still learns)
    #   t2 A=-1, r=1.1: max(1.1, 1.1)    = 1.1
    #   t3 A=-2, r=0.7: max(1.4, 1.6)    = 1.6    clipped
    # token_mean = (-1.28 - 0.5 + 1.1 + 1.6) / 4 = 0.92 / 4 = 0.23; clipfrac = 2 / 4
    assert loss.item() == pytest.approx(0.23)
    assert stats.clipfrac.item() == pytest.approx(0.5) and stats.clipfrac_dual.item() == 0.0
    # ratio mean (1.5 + 0.5 + 1.1 + 0.7) / 4 = 0.95, max 1.5
    assert stats.ratio_mean.item() == pytest.approx(0.95) and stats.ratio_max.item() == pytest.approx(1.5)
    # approx_kl = mean(r - ln r - 1) = (0.094535 + 0.193147 + 0.004690 + 0.056675) / 4 = 0.087262
    assert stats.approx_kl.item() == pytest.approx(sum(r - math.log(r) - 1 for r in RATIOS) / 4)
    loss.backward()
    # d(-A r)/d logp = -A r on unclipped tokens, 0 on clipped ones; / 4 tokens:
    #   [0, -0.5 / 4, 1.1 / 4, 0] = [0, -0.125, 0.275, 0]
    assert torch.allclose(logp_BT.grad, torch.tensor([[0.0, -0.125, 0.275, 0.0]], dtype=torch.float64))


def test_symmetric_clip_changes_the_upper_bound():
    # clip_high 0.2: t0 becomes max(-1.5, -1.2) = -1.2: (-1.2 - 0.5 + 1.1 + 1.6) / 4 = 0.25
    loss, _ = clipped_policy_loss(_logp(RATIOS, False), OLD_BT, ADV_BT, MASK_BT)
    assert loss.item() == pytest.approx(0.25)


def test_dual_clip_bounds_negative_advantages():
    logp_BT = _logp([5.0, 5.0])
    adv_BT = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)
    old_BT = torch.zeros(1, 2, dtype=torch.float64)
    mask_BT = torch.ones(1, 2)
    # t0 A=-1, r=5: PPO max(5, 1.2) = 5; dual clip c=3: min(5, 3) = 3 (gradient 0)
    # t1 A=+1, r=5: max(-5, -1.2) = -1.2; dual clip does not apply to A > 0
    loss_BT, _, clipped_BT, dual_BT = policy_loss_per_token(logp_BT, old_BT, adv_BT, dual_clip=3.0)
    assert torch.allclose(loss_BT, torch.tensor([[3.0, -1.2]], dtype=torch.float64))
    assert dual_BT.tolist() == [[True, False]] and clipped_BT.tolist() == [[False, True]]
    loss, stats = clipped_policy_loss(logp_BT, old_BT, adv_BT, mask_BT, dual_clip=3.0)
    assert loss.item() == pytest.approx(0.9)  # (3 - 1.2) / 2
    assert stats.clipfrac_dual.item() == pytest.approx(0.5)
    loss.backward()
    assert torch.equal(logp_BT.grad, torch.zeros(1, 2, dtype=torch.float64))
    # without dual clip t0 keeps its gradient -A r / 2 = 5 / 2
    logp2_BT = _logp([5.0, 5.0])
    clipped_policy_loss(logp2_BT, old_BT, adv_BT, mask_BT)[0].backward()
    assert torch.allclose(logp2_BT.grad, torch.tensor([[2.5, 0.0]], dtype=torch.float64))


def test_on_policy_gradient_is_minus_advantage():
    # r = 1 everywhere (logp == old): loss = -A, d loss / d logp = -A / n over masked tokens
    logp_BT = torch.tensor([[-0.3, -1.2, -0.7]], requires_grad=True)
    mask_BT = torch.tensor([[1, 1, 0]])
    loss, stats = clipped_policy_loss(logp_BT, logp_BT.detach(), torch.tensor([[2.0, -1.0, 9.0]]), mask_BT)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5)  # (-2 + 1) / 2
    assert torch.allclose(logp_BT.grad, torch.tensor([[-1.0, 0.5, 0.0]]))
    assert stats.clipfrac.item() == 0.0 and stats.approx_kl.item() == 0.0
    assert set(stats.to_metrics()) == {
        "algo/clipfrac", "algo/clipfrac_dual", "algo/approx_kl", "algo/ratio_mean", "algo/ratio_max"
    }


def test_all_masked_row_and_all_masked_batch():
    logp_BT = torch.log(torch.tensor([[1.0, 1.0], [2.0, 2.0]], dtype=torch.float64))  # ratios vs old = 0
    adv_BT = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    mask_BT = torch.tensor([[1, 1], [0, 0]])
    # row 0: r = 1, loss -1 per token; row 1 masked (r = 2 would be clipped): token_mean = -1
    loss, stats = clipped_policy_loss(logp_BT, torch.zeros(2, 2, dtype=torch.float64), adv_BT, mask_BT)
    assert loss.item() == pytest.approx(-1.0) and stats.clipfrac.item() == 0.0 and stats.ratio_max.item() == 1.0
    loss, stats = clipped_policy_loss(logp_BT, torch.zeros(2, 2, dtype=torch.float64), adv_BT, torch.zeros(2, 2))
    assert loss.item() == 0.0 and stats.ratio_mean.item() == 0.0


def _naive_clipped_loss(logp, old, adv, mask, clip_low, clip_high, dual_clip, tis):
    """Reference: an explicit loop over tokens with Python floats, token_mean aggregation."""
    total, count = 0.0, 0
    for b in range(len(logp)):
        for t in range(len(logp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            a = adv[b][t]
            surrogate = -a * ratio
            clipped = -a * min(max(ratio, 1 - clip_low), 1 + clip_high)
            loss = max(surrogate, clipped)
            if dual_clip is not None and a < 0:
                loss = min(loss, -a * dual_clip)
            weight = min(math.exp(old[b][t] - tis[b][t]), 2.0)
            total += weight * loss
            count += 1
    return total / max(count, 1)


@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_vectorised_equals_naive_loop(dual_clip):
    gen = torch.Generator().manual_seed(3)
    logp_BT = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    old_BT = logp_BT + 0.6 * torch.randn(3, 5, generator=gen, dtype=torch.float64)  # ratios far from 1
    sampler_BT = old_BT + 0.5 * torch.randn(3, 5, generator=gen, dtype=torch.float64)
    adv_BT = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask_BT = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 1]], dtype=torch.bool)
    weights_BT = tis_weights(old_BT, sampler_BT, mask_BT, cap=2.0)
    loss, _ = clipped_policy_loss(
        logp_BT, old_BT, adv_BT, mask_BT, clip_low=0.2, clip_high=0.3, dual_clip=dual_clip, tis_weights_BT=weights_BT
    )
    expected = _naive_clipped_loss(
        logp_BT.tolist(), old_BT.tolist(), adv_BT.tolist(), mask_BT.tolist(), 0.2, 0.3, dual_clip,
        sampler_BT.tolist(),
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_tis_weights_truncated_detached_and_zero_off_mask():
    old_BT = torch.tensor([[math.log(2.0), math.log(0.5), 0.0]], requires_grad=True)
    sampler_BT = torch.tensor([[0.0, 0.0, float("nan")]])  # no sampler logprob on the injected token
    mask_BT = torch.tensor([[1, 1, 0]])
    # exp(ln 2 - 0) = 2 -> min(2, 1.5) = 1.5; exp(ln 0.5) = 0.5 stays; off-mask -> 0 (not NaN)
    w_BT = tis_weights(old_BT, sampler_BT, mask_BT, cap=1.5)
    assert torch.allclose(w_BT, torch.tensor([[1.5, 0.5, 0.0]])) and not w_BT.requires_grad
    # applied per token: on-policy loss -A = [-1, -1, x] weighted: (-1.5 - 0.5) / 2 = -1
    logp_BT = torch.zeros(1, 3, requires_grad=True)
    loss, _ = clipped_policy_loss(logp_BT, torch.zeros(1, 3), torch.ones(1, 3), mask_BT, tis_weights_BT=w_BT)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    # gradient -A r w / 2 = [-0.75, -0.25, 0], finite despite the NaN sampler logprob
    assert torch.allclose(logp_BT.grad, torch.tensor([[-0.75, -0.25, 0.0]]))
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(old_BT, sampler_BT, mask_BT, cap=0.0)


def test_value_loss_clipped_hand_computed():
    values_BT = torch.tensor([[1.0, 0.0, 7.0]], requires_grad=True)
    old_BT = torch.tensor([[0.5, 0.5, 0.0]])
    returns_BT = torch.tensor([[1.2, 1.0, 0.0]])
    mask_BT = torch.tensor([[1, 1, 0]])
    # t0: V_clip = 0.5 + clip(0.5, +-0.2) = 0.7; max((1 - 1.2)^2, (0.7 - 1.2)^2) = max(0.04, 0.25) = 0.25
    # t1: V_clip = 0.5 - 0.2 = 0.3; max((0 - 1)^2, (0.3 - 1)^2) = max(1, 0.49) = 1
    # loss = 0.5 * (0.25 + 1) / 2 = 0.3125; clipfrac = 1 / 2 (only t0 uses the clipped term)
    loss, clipfrac = value_loss(values_BT, old_BT, returns_BT, mask_BT, clip=0.2)
    assert loss.item() == pytest.approx(0.3125) and clipfrac.item() == pytest.approx(0.5)
    loss.backward()
    # t0 is clipped -> gradient 0; t1: d/dV 0.5 (V - R)^2 / 2 = (0 - 1) / 2 = -0.5
    assert torch.allclose(values_BT.grad, torch.tensor([[0.0, -0.5, 0.0]]))
    # unclipped: 0.5 * (0.04 + 1) / 2 = 0.26
    loss, clipfrac = value_loss(values_BT, old_BT, returns_BT, mask_BT, clip=None)
    assert loss.item() == pytest.approx(0.26) and clipfrac.item() == 0.0


def test_entropy_bonus():
    entropy_BT = torch.tensor([[1.0, 3.0, 100.0]], requires_grad=True)
    mask_BT = torch.tensor([[1, 1, 0]])
    # mean entropy over masked tokens = 2; term = -0.01 * 2 = -0.02; gradient -0.01 / 2 each
    term, mean_entropy = entropy_bonus(entropy_BT, mask_BT, coef=0.01)
    assert term.item() == pytest.approx(-0.02) and mean_entropy.item() == pytest.approx(2.0)
    term.backward()
    assert torch.allclose(entropy_BT.grad, torch.tensor([[-0.005, -0.005, 0.0]]))


def test_bad_clip_settings():
    logp_BT = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        clipped_policy_loss(logp_BT, logp_BT, logp_BT, torch.ones(1, 2), dual_clip=0.5)
    with pytest.raises(ValueError, match=r"clip_low must be in \[0, 1\)"):
        clipped_policy_loss(logp_BT, logp_BT, logp_BT, torch.ones(1, 2), clip_low=1.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        clipped_policy_loss(logp_BT, logp_BT, torch.zeros(1, 3), torch.ones(1, 2))


def test_off_policy_correction_clips_against_the_proximal_policy_and_weighs_by_the_behaviours():
    """Asynchronous rollouts: mu sampled, pi_old is the trainer's weights at arrival, pi_theta moves.
    Token 1 (A = +1): mu 0.5, pi_old 0.6, pi_theta 0.9 -> r = 1.5 clipped to 1.28 (against mu it would be 1.8),
    w = min(0.6 / 0.5, 2) = 1.2, loss -1.2 * 1.28 = -1.536. Token 2 (A = -1): mu 0.4, pi_old 0.2, pi_theta 0.1 ->
    r = 0.5, max(0.5, clip(0.5, 0.8, 1.28) = 0.8) = 0.8, w = 0.5, loss 0.4. Token mean: (-1.536 + 0.4) / 2."""
    mu_BT = torch.tensor([[0.5, 0.4]], dtype=torch.float64).log()
    old_BT = torch.tensor([[0.6, 0.2]], dtype=torch.float64).log()
    logp_BT = torch.tensor([[0.9, 0.1]], dtype=torch.float64).log().requires_grad_()
    adv_BT, mask_BT = torch.tensor([[1.0, -1.0]], dtype=torch.float64), torch.ones(1, 2)
    w_BT = tis_weights(old_BT, mu_BT, mask_BT, cap=2.0)
    assert torch.allclose(w_BT, torch.tensor([[1.2, 0.5]], dtype=torch.float64))
    loss, stats = clipped_policy_loss(logp_BT, old_BT, adv_BT, mask_BT, clip_low=0.2, clip_high=0.28,
                                      tis_weights_BT=w_BT)
    assert loss.item() == pytest.approx((-1.536 + 0.4) / 2)
    assert stats.clipfrac.item() == 1.0  # both tokens clipped: neither moves the loss
    loss.backward()
    assert torch.equal(logp_BT.grad, torch.zeros(1, 2, dtype=torch.float64))
