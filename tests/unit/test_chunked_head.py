"""The chunked output layer (sleuth.train.chunked_head): the same logprobs, entropies and gradients
as the plain linear + log-softmax under autograd, without ever saving a [N, V] tensor."""

import math

import pytest
import torch

from sleuth.train.chunked_head import chunked_head_logprobs, chunk_positions


def _plain(h, W, b, tokens, T):
    z = (h @ W.T + (b if b is not None else 0)) / T
    logp = torch.log_softmax(z, -1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def _inputs(N=11, H=6, V=13, bias=True, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g, dtype=dtype, requires_grad=True)
    W = torch.randn(V, H, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    return h, W, b, torch.randint(0, V, (N,), generator=g)


def test_a_two_token_vocabulary_by_hand():
    """h = [1], W = [[2], [0]]: logits (2, 0); log p(0) = -log(1 + e^-2), H by its definition."""
    h, W = torch.tensor([[1.0]], dtype=torch.float64), torch.tensor([[2.0], [0.0]], dtype=torch.float64)
    lp, ent = chunked_head_logprobs(h, W, None, torch.tensor([0]))
    p0 = 1 / (1 + math.exp(-2))
    assert lp.item() == pytest.approx(-math.log(1 + math.exp(-2)), abs=1e-12)
    assert ent.item() == pytest.approx(-(p0 * math.log(p0) + (1 - p0) * math.log(1 - p0)), abs=1e-12)


@pytest.mark.parametrize("chunk", [1, 4, 11, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_equal_the_plain_computation(chunk, temperature, bias):
    h, W, b, tokens = _inputs(bias=bias)
    g = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(11, generator=g, dtype=torch.float64), torch.randn(11, generator=g, dtype=torch.float64)
    lp, ent = chunked_head_logprobs(h, W, b, tokens, temperature=temperature, chunk=chunk)
    grads = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), [h, W] + ([b] if bias else []))
    ref_lp, ref_ent = _plain(h, W, b, tokens, temperature)
    ref = torch.autograd.grad((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum(), [h, W] + ([b] if bias else []))
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
    for got, want in zip(grads, ref):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_a_metric_only_entropy_and_no_entropy_give_the_logprob_gradient_alone():
    h, W, b, tokens = _inputs()
    ref_lp, _ = _plain(h, W, b, tokens, 1.0)
    want = torch.autograd.grad(ref_lp.sum(), [h, W, b])
    for with_entropy in (True, False):
        lp, ent = chunked_head_logprobs(h, W, b, tokens, with_entropy=with_entropy, chunk=3)
        got = torch.autograd.grad(lp.sum() + ent.detach().sum(), [h, W, b])
        for a, c in zip(got, want):
            torch.testing.assert_close(a, c, rtol=0, atol=1e-10)
        assert with_entropy or not ent.any()


def test_no_vocabulary_sized_tensor_is_saved_for_backward():
    N, V = 64, 500
    h, W, b, tokens = _inputs(N=N, V=V, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        lp, ent = chunked_head_logprobs(h, W, b, tokens, chunk=8)
        plain_saved = len(saved)
        assert max(saved) <= max(V * 6, N * 6)  # the hidden states, the weight: nothing [N, V]
        saved.clear()
        _plain(h, W, b, tokens, 1.0)
    assert plain_saved and max(saved) >= N * V  # the plain computation saves its logits


def test_bf16_autocast_matches_the_plain_head_under_autocast():
    """Under autocast the chunk's matmul runs in bf16 as lm_head's would; softmax in float32."""
    h, W, b, tokens = _inputs(N=20, H=16, V=40, bias=False, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = chunked_head_logprobs(h, W, None, tokens, chunk=7)
        z = torch.nn.functional.linear(h, W)
    assert z.dtype == torch.bfloat16 and lp.dtype == torch.float32
    logp = torch.log_softmax(z.float(), -1)
    torch.testing.assert_close(lp, logp.gather(-1, tokens[:, None]).squeeze(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), rtol=0, atol=1e-5)
    gh, gW = torch.autograd.grad(lp.sum() + ent.sum(), [h, W])
    assert gh.dtype == torch.float32 and gW.dtype == torch.float32
    ref = torch.autograd.grad(sum(_plain(h, W, None, tokens, 1.0)[i].sum() for i in (0, 1)), [h, W])
    assert float((gW - ref[1]).abs().max()) < 0.05 * float(ref[1].abs().max())  # bf16 rounding only


def test_bad_shapes_and_temperature_are_named():
    h, W, b, tokens = _inputs()
    with pytest.raises(ValueError, match="tokens"):
        chunked_head_logprobs(h, W, b, tokens[:-1])
    with pytest.raises(ValueError, match="temperature"):
        chunked_head_logprobs(h, W, b, tokens, temperature=0.0)
    assert chunk_positions(49152) == 170 and chunk_positions(10**9) == 1


def test_on_a_gpu_chunks_are_sized_by_bytes_for_its_tensor_cores():
    """512 MB float32 blocks on CUDA: 2,730 positions at SmolLM2's 49k vocabulary, 883 at Qwen's 152k
    (55 at the CPU's 32 MB)."""
    assert chunk_positions(49152, device="cuda") == (1 << 27) // 49152 == 2730
    assert chunk_positions(151936, device=torch.device("cuda", 0)) == 883
    assert chunk_positions(151936) == chunk_positions(151936, device="cpu") == 55


def test_the_weight_is_cast_to_the_compute_dtype_once_per_pass_not_per_chunk():
    """Under bf16 autocast with a float32 weight, forward casts the [V, H] weight once and backward
    once, whatever the number of chunks (it was three casts per chunk: HBM traffic of ~6 V H bytes per
    chunk on a GPU). Each chunk's bf16 weight gradient still goes into the float32 accumulator (CPUs
    have no bf16 x bf16 -> float32 addmm); on a GPU the larger chunks make those few."""
    from torch.utils._python_dispatch import TorchDispatchMode

    h, W, b, tokens = _inputs(N=40, H=6, V=13, bias=False, dtype=torch.float32)
    casts = []

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (func is torch.ops.aten._to_copy.default and tuple(args[0].shape) == tuple(W.shape)
                    and args[0].dtype == torch.float32):  # the weight to bf16 (not a gradient block to float32)
                casts.append(kwargs.get("dtype"))
            return func(*args, **kwargs)

    with torch.autocast("cpu", dtype=torch.bfloat16), Casts():
        lp, ent = chunked_head_logprobs(h, W, None, tokens, chunk=4)  # 10 chunks
        (lp.sum() + ent.sum()).backward()
    assert casts == [torch.bfloat16, torch.bfloat16]
    assert W.grad is not None and W.grad.dtype == torch.float32 and bool(W.grad.abs().sum() > 0)


def test_scoring_head_swaps_the_output_layer_for_one_call_and_puts_back_what_was_there():
    from sleuth.train.chunked_head import scoring_head

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(4, 7, bias=False)

        def get_output_embeddings(self):
            return self.lm_head

    model, h = Model(), torch.randn(3, 4)
    tokens = torch.tensor([1, 2, 6])
    with scoring_head(model, tokens, temperature=1.0, with_entropy=True):
        out = model.lm_head(h)
    lp, ent = chunked_head_logprobs(h, model.lm_head.weight, None, tokens)
    assert out.shape == (3, 2) and torch.equal(out[:, 0], lp) and torch.equal(out[:, 1], ent)
    assert "forward" not in vars(model.lm_head) and model.lm_head(h).shape == (3, 7)
    marker = model.lm_head.forward = lambda x: "hooked"
    with scoring_head(model, tokens, temperature=1.0, with_entropy=False):
        assert model.lm_head(h).shape == (3, 2)
    assert model.lm_head.forward is marker
