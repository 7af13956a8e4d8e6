"""Per-token logprobs / entropy: hand-computed values, gradients, and equivalence with log_softmax."""

from __future__ import annotations

import math

import pytest
import torch

from sleuth.algo.logprobs import (
    entropy_from_logits,
    logprobs_and_entropy,
    logprobs_from_logits,
    next_token_logprobs,
)

pytestmark = pytest.mark.unit

# softmax([0, ln 2, ln 3]) = [1, 2, 3] / 6
LOGITS_V = torch.tensor([0.0, math.log(2.0), math.log(3.0)], dtype=torch.float64)
# H = (1/6) ln 6 + (2/6) ln 3 + (3/6) ln 2 = 0.298627 + 0.366204 + 0.346574 = 1.011404
ENTROPY = math.log(6) / 6 + math.log(3) / 3 + math.log(2) / 2


def test_hand_computed_logprobs_and_entropy():
    logits_BTV = LOGITS_V.repeat(1, 2, 1)  # [1, 2, 3], same distribution at both positions
    tokens_BT = torch.tensor([[2, 0]])
    logprobs_BT, entropy_BT = logprobs_and_entropy(logits_BTV, tokens_BT)
    # token 2: ln(3/6) = -ln 2; token 0: ln(1/6) = -ln 6
    assert torch.allclose(logprobs_BT, torch.tensor([[-math.log(2), -math.log(6)]], dtype=torch.float64))
    assert torch.allclose(entropy_BT, torch.full((1, 2), ENTROPY, dtype=torch.float64))


def test_temperature_divides_logits_like_the_sampler():
    # logits [0, 2 ln 2, 2 ln 3] at temperature 2 are [0, ln 2, ln 3]: the same numbers as above
    logits_BTV = (2 * LOGITS_V).view(1, 1, 3)
    logprob = logprobs_from_logits(logits_BTV, torch.tensor([[2]]), temperature=2.0)
    assert logprob.item() == pytest.approx(-math.log(2))
    assert entropy_from_logits(logits_BTV, temperature=2.0).item() == pytest.approx(ENTROPY)
    # the sampler draws from softmax(logits / T): its log-probability of token 2 matches
    sampler_logp = torch.log_softmax(logits_BTV[0, 0] / 2.0, dim=-1)[2]
    assert logprob.item() == pytest.approx(sampler_logp.item())


def test_uniform_distribution():
    # V = 4 equal logits: logp = -ln 4 for every token, entropy = ln 4
    logits_BTV = torch.zeros(2, 1, 4)
    logprobs_BT, entropy_BT = logprobs_and_entropy(logits_BTV, torch.tensor([[0], [3]]))
    assert torch.allclose(logprobs_BT, torch.full((2, 1), -math.log(4)))
    assert torch.allclose(entropy_BT, torch.full((2, 1), math.log(4)))


def test_gradient_is_onehot_minus_softmax_over_temperature():
    logits_BTV = LOGITS_V.view(1, 1, 3).clone().requires_grad_()
    logprobs_from_logits(logits_BTV, torch.tensor([[2]])).sum().backward()
    # d ln p_2 / d z = onehot(2) - softmax = [0 - 1/6, 0 - 2/6, 1 - 3/6]
    assert torch.allclose(logits_BTV.grad.view(3), torch.tensor([-1 / 6, -2 / 6, 1 / 2], dtype=torch.float64))
    # temperature 2 on raw logits 2 * LOGITS_V: same distribution, gradient halved (z = raw / 2)
    raw_BTV = (2 * LOGITS_V).view(1, 1, 3).clone().requires_grad_()
    logprobs_from_logits(raw_BTV, torch.tensor([[2]]), temperature=2.0).sum().backward()
    assert torch.allclose(raw_BTV.grad.view(3), torch.tensor([-1 / 12, -2 / 12, 1 / 4], dtype=torch.float64))


@pytest.mark.parametrize("chunk_tokens", [1, 4, 5, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equivalent_to_full_log_softmax(chunk_tokens, temperature):
    gen = torch.Generator().manual_seed(0)
    logits_BTV = torch.randn(3, 7, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens_BT = torch.randint(0, 11, (3, 7), generator=gen)
    logprobs_BT, entropy_BT = logprobs_and_entropy(
        logits_BTV, tokens_BT, temperature=temperature, chunk_tokens=chunk_tokens
    )
    ref_logp_BTV = torch.log_softmax(logits_BTV / temperature, dim=-1)  # the naive reference
    ref_logprobs_BT = ref_logp_BTV.gather(-1, tokens_BT[..., None]).squeeze(-1)
    ref_entropy_BT = -(ref_logp_BTV.exp() * ref_logp_BTV).sum(-1)
    assert torch.allclose(logprobs_BT, ref_logprobs_BT, atol=1e-12)
    assert torch.allclose(entropy_BT, ref_entropy_BT, atol=1e-12)
    # gradients of a mixed objective agree too
    (grad,) = torch.autograd.grad((logprobs_BT * 0.3 + entropy_BT).sum(), logits_BTV)
    (ref_grad,) = torch.autograd.grad((ref_logprobs_BT * 0.3 + ref_entropy_BT).sum(), logits_BTV)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_gradcheck_entropy():
    # finite differences vs autograd through the chunked matmul form of the entropy
    logits_BTV = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    fn = lambda x: entropy_from_logits(x, temperature=1.3, chunk_tokens=2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (logits_BTV,), fast_mode=True)


def test_bf16_logits_are_upcast():
    gen = torch.Generator().manual_seed(1)
    logits64_BTV = torch.randn(2, 3, 50, generator=gen, dtype=torch.float64) * 4
    tokens_BT = torch.randint(0, 50, (2, 3), generator=gen)
    logits_bf16 = logits64_BTV.to(torch.bfloat16)
    logprobs_BT = logprobs_from_logits(logits_bf16, tokens_BT)
    assert logprobs_BT.dtype == torch.float32
    # the reference on the same (rounded) bf16 values, computed in float64
    ref_BT = torch.log_softmax(logits_bf16.double(), -1).gather(-1, tokens_BT[..., None]).squeeze(-1)
    assert torch.allclose(logprobs_BT.double(), ref_BT, atol=1e-5)


def test_next_token_logprobs_shifts_by_one():
    logits_BTV = torch.randn(2, 4, 6, dtype=torch.float64)
    ids_BT = torch.randint(0, 6, (2, 4))
    out_BT = next_token_logprobs(logits_BTV, ids_BT)
    assert out_BT.shape == (2, 3)
    # position t scores token t+1 under the logits at t
    expected = torch.log_softmax(logits_BTV[1, 2], -1)[ids_BT[1, 3]]
    assert out_BT[1, 2].item() == pytest.approx(expected.item())


def test_empty_time_axis():
    logprobs_BT, entropy_BT = logprobs_and_entropy(torch.zeros(2, 0, 5), torch.zeros(2, 0, dtype=torch.long))
    assert logprobs_BT.shape == (2, 0) and entropy_BT.shape == (2, 0)


def test_bad_inputs():
    logits_BTV = torch.zeros(1, 2, 3)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        logprobs_from_logits(logits_BTV, torch.zeros(1, 2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match=r"ids in \[-100, 0\].*V=3"):
        logprobs_from_logits(logits_BTV, torch.tensor([[0, -100]]))
    with pytest.raises(ValueError, match="does not match logits_BTV"):
        logprobs_from_logits(logits_BTV, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="integer token ids"):
        logprobs_from_logits(logits_BTV, torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        entropy_from_logits(torch.zeros(2, 3))


def test_entropy_under_bf16_autocast_stays_in_float32():
    """Under autocast (model.dtype bfloat16) the entropy's dot product of probabilities and logits ran
    in bf16 (a matmul), off by up to ~0.05 nats; it now runs in the logits' float32."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 10, 40, generator=g) * 3
    tokens = torch.randint(0, 40, (2, 10), generator=g)
    plain = entropy_from_logits(logits)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = entropy_from_logits(logits)
        _, cast_joint = logprobs_and_entropy(logits, tokens)
    torch.testing.assert_close(cast, plain, rtol=0, atol=1e-6)
    torch.testing.assert_close(cast_joint, plain, rtol=0, atol=1e-6)
