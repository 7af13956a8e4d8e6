"""Token log-probabilities and entropy through the output layer, chunk by chunk, recomputed in backward.

The plain way (``lm_head``, then log-softmax and entropy under autograd) keeps, per micro-batch, the
[N, V] logits, their float32 copy and the softmax for the backward pass: about 20 bytes per token
per vocabulary entry, 3 MB per token for Qwen's 152k vocabulary. Here one autograd Function runs
the output layer, the log-softmax and the entropy over ``chunk`` positions at a time and saves only
the hidden states [N, H] and two numbers per position (log-sum-exp, entropy); its backward
recomputes each chunk's logits and forms the gradients of the hidden states and of the weight
directly. At most a couple of [C, V] blocks live at once, forward or backward.

With ``z = (h W^T + b) / T``, ``log p = z - lse(z)`` and ``H = -sum_v p_v log p_v``:

    d log p[y] / dz = onehot(y) - p          dH / dz = -p * (log p + H)

so the gradient of the logits is ``g_lp * onehot(y) - p * (g_lp + g_H * (log p + H))``, divided by
``T`` for the raw logits, then ``dh = dz W`` and ``dW = dz^T h``.

The model computes it through its own forward, so DDP, FSDP2 (which unshards the output layer for
its forward) and peft see an ordinary call: :func:`scoring_head` replaces, for one call, the
forward of the model's output layer, and the model returns ``[N, 2]`` (logprob, entropy) where it
would return logits. Only for model families whose forward applies the output layer plainly (no
soft-capping or scaling after it: ``PLAIN_HEAD_MODELS``, and Gemma-3 without its optional final soft-cap) with a
plain ``nn.Linear`` head;
:func:`supports_chunked_head` says which. Precision: each chunk's matmul runs in the autocast dtype
(as ``lm_head`` would under autocast), the softmax in float32.
"""

from __future__ import annotations

import contextlib

import torch

from sleuth.models import unwrap

# model types whose causal-LM forward is ``lm_head(slice_logits_to_keep(hidden, logits_to_keep))`` and
# nothing after it (read in transformers' modeling files); others compute full logits
PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2"})
# model types whose forward soft-caps the logits after ``lm_head`` only when ``config.final_logit_softcapping`` is
# set (Gemma-3 leaves it None): plain when it is None
SOFTCAP_HEAD_MODELS = frozenset({"gemma3_text"})
CHUNK_ELEMENTS = 1 << 23  # C * V logits per chunk on a CPU (32 MB in float32): C = 170 for a 49k vocabulary
# on a GPU a [C, V] block of 512 MB (C = 2,730 at a 49k vocabulary, 883 at 152k): the chunk's GEMMs
# (K = C for the weight's gradient) fill the tensor cores, and the few blocks alive at once (about 3
# in backward) stay small beside a GPU's memory
CUDA_CHUNK_ELEMENTS = 1 << 27


def chunk_positions(vocab: int, elements: int | None = None, device: str | torch.device = "cpu") -> int:
    """Positions per chunk so that a [C, V] float32 block holds about ``elements`` values (by default
    :data:`CHUNK_ELEMENTS`, or :data:`CUDA_CHUNK_ELEMENTS` on a CUDA ``device``)."""
    if elements is None:
        elements = CUDA_CHUNK_ELEMENTS if torch.device(device).type == "cuda" else CHUNK_ELEMENTS
    return max(1, elements // max(vocab, 1))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype ``F.linear`` would use here: the autocast dtype when autocast is on."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(h_CH, weight_VH, bias_V, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """``(h W^T + b) / T`` of one chunk, the matmul in ``dtype`` (``weight_VH`` already cast to it:
    once per call, not per chunk), the result in >= float32 [C, V] (called with autocast off)."""
    z_CV = h_CH.to(dtype) @ weight_VH.T
    if bias_V is not None:
        z_CV = z_CV + bias_V.to(dtype)
    z_CV = z_CV.to(torch.promote_types(dtype, torch.float32))
    return z_CV if temperature == 1.0 else z_CV.div_(temperature)


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, tokens_N, temperature, chunk, with_entropy):
        dtype = _compute_dtype(hidden_NH, weight_VH)
        out_dtype = torch.promote_types(dtype, torch.float32)
        N = hidden_NH.shape[0]
        lp_N = hidden_NH.new_zeros(N, dtype=out_dtype)
        lse_N = hidden_NH.new_zeros(N, dtype=out_dtype)
        ent_N = hidden_NH.new_zeros(N, dtype=out_dtype)
        with torch.autocast(hidden_NH.device.type, enabled=False):  # the matmul in `dtype`, the rest float32
            w_VH = weight_VH.to(dtype)  # one cast per call (not kept for backward, which casts once again)
            for s in range(0, N, chunk):
                e = min(s + chunk, N)
                z_CV = _chunk_logits(hidden_NH[s:e], w_VH, bias_V, temperature, dtype)
                lse_N[s:e] = torch.logsumexp(z_CV, dim=-1)
                lp_N[s:e] = z_CV.gather(-1, tokens_N[s:e, None]).squeeze(-1) - lse_N[s:e]
                if with_entropy:
                    p_CV = torch.softmax(z_CV, dim=-1)
                    ent_N[s:e] = lse_N[s:e] - (p_CV.unsqueeze(-2) @ z_CV.unsqueeze(-1)).view(-1)
                    del p_CV
                del z_CV
            del w_VH
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, tokens_N, lse_N, ent_N)
        ctx.set_materialize_grads(False)  # an output not used by the loss (a metric-only entropy): None
        ctx.temperature, ctx.chunk, ctx.with_entropy, ctx.dtype = temperature, chunk, with_entropy, dtype
        if not with_entropy:
            ctx.mark_non_differentiable(ent_N)
        return lp_N, ent_N

    @staticmethod
    def backward(ctx, g_lp_N, g_ent_N):
        hidden_NH, weight_VH, bias_V, tokens_N, lse_N, ent_N = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        use_ent = ctx.with_entropy and g_ent_N is not None
        N, dtype = hidden_NH.shape[0], ctx.dtype
        grad_h = torch.empty_like(hidden_NH) if need_h else None
        acc = torch.promote_types(weight_VH.dtype, torch.float32)  # float32 (float64 for float64) accumulators
        grad_w = torch.zeros(weight_VH.shape, dtype=acc, device=weight_VH.device) if need_w else None
        grad_b = torch.zeros(weight_VH.shape[0], dtype=acc, device=weight_VH.device) if need_b else None
        if g_lp_N is None:
            g_lp_N = torch.zeros_like(lse_N)
        with torch.autocast(hidden_NH.device.type, enabled=False):
            w_VH = weight_VH.to(dtype)  # once for every chunk's two matmuls
            for s in range(0, N, ctx.chunk):
                e = min(s + ctx.chunk, N)
                g_lp_C1 = g_lp_N[s:e, None].to(lse_N.dtype)
                logp_CV = _chunk_logits(hidden_NH[s:e], w_VH, bias_V, ctx.temperature, dtype)
                logp_CV.sub_(lse_N[s:e, None])  # log p, in place of z
                p_CV = logp_CV.exp()
                if use_ent:  # g_lp + g_H * (log p + H), in place of log p
                    coef_CV = logp_CV.add_(ent_N[s:e, None]).mul_(g_ent_N[s:e, None].to(lse_N.dtype)).add_(g_lp_C1)
                    g_CV = p_CV.mul_(coef_CV).neg_()
                    del coef_CV
                else:
                    g_CV = p_CV.mul_(-g_lp_C1)
                del logp_CV
                g_CV.scatter_add_(-1, tokens_N[s:e, None], g_lp_C1)
                if ctx.temperature != 1.0:
                    g_CV.div_(ctx.temperature)
                if grad_b is not None:
                    grad_b += g_CV.sum(0).to(acc)
                g_CV = g_CV.to(dtype)
                if grad_h is not None:
                    grad_h[s:e] = (g_CV @ w_VH).to(hidden_NH.dtype)
                if grad_w is not None:
                    h_CH = hidden_NH[s:e].to(dtype)
                    if dtype == acc:
                        grad_w.addmm_(g_CV.T, h_CH)
                    else:
                        grad_w += (g_CV.T @ h_CH).to(acc)
                del g_CV
        return (grad_h, None if grad_w is None else grad_w.to(weight_VH.dtype),
                None if grad_b is None else grad_b.to(bias_V.dtype), None, None, None, None)


def chunked_head_logprobs(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                          tokens_N: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = True,
                          chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprob_N, entropy_N)`` of ``softmax((h W^T + b) / T)`` at ``tokens_N`` (entropy zeros, without
    a gradient, when ``with_entropy`` is False); differentiable in the hidden states, weight and bias."""
    if hidden_NH.dim() != 2 or tokens_N.shape != hidden_NH.shape[:1]:
        raise ValueError(f"hidden states [N, H] and tokens [N] expected, got {list(hidden_NH.shape)} and "
                         f"{list(tokens_N.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    chunk = chunk or chunk_positions(weight_VH.shape[0], device=hidden_NH.device)
    return _HeadLogprobs.apply(hidden_NH, weight_VH, bias_V, tokens_N.long(), float(temperature), int(chunk),
                               bool(with_entropy))


def plain_head(config) -> bool:
    """Whether a model of this config applies its output layer plainly (nothing after ``lm_head``)."""
    kind = getattr(config, "model_type", None)
    return kind in PLAIN_HEAD_MODELS or (kind in SOFTCAP_HEAD_MODELS
                                         and getattr(config, "final_logit_softcapping", None) is None)


def supports_chunked_head(model) -> bool:
    """Whether :func:`scoring_head` applies: a plain-head model family with an ``nn.Linear`` output layer."""
    inner = unwrap(model)
    if not plain_head(getattr(inner, "config", None)) or not hasattr(inner, "get_output_embeddings"):
        return False
    head = inner.get_output_embeddings()
    return type(head) is torch.nn.Linear


@contextlib.contextmanager
def scoring_head(model, tokens_N: torch.Tensor, *, temperature: float, with_entropy: bool, chunk: int | None = None,
                 keep_BT: torch.Tensor | None = None):
    """Within, the model's output layer returns ``[N, 2]`` (logprob of ``tokens_N``, entropy) for the
    [N, H] hidden states the model's forward gives it (``logits_to_keep`` as a boolean mask of N
    positions), computed by :func:`chunked_head_logprobs`. With ``keep_BT`` (transformers before 5.20
    take no boolean ``logits_to_keep``; the model then gives its output layer every position) the
    layer takes the [B, T, H] hidden states and keeps the True positions of ``keep_BT`` itself. The
    weight is read at call time (FSDP2 unshards it for the forward)."""
    head = unwrap(model).get_output_embeddings()

    def forward(hidden_NH: torch.Tensor) -> torch.Tensor:
        if keep_BT is not None and hidden_NH.shape[:-1] == keep_BT.shape:
            hidden_NH = hidden_NH[keep_BT]  # [B, T, H] -> [N, H], before any vocabulary-sized tensor
        if hidden_NH.dim() != 2:
            raise RuntimeError("scoring_head: the model gave its output layer "
                               f"{list(hidden_NH.shape)} hidden states, expected [N, H] (a boolean logits_to_keep)")
        lp_N, ent_N = chunked_head_logprobs(hidden_NH, head.weight, head.bias, tokens_N, temperature=temperature,
                                            with_entropy=with_entropy, chunk=chunk)
        return torch.stack([lp_N, ent_N], dim=-1)  # [N, 2]

    had_own = "forward" in vars(head)  # a forward set on the instance (e.g. by a hook library) is put back
    previous = vars(head).get("forward")
    head.forward = forward
    try:
        yield
    finally:
        if had_own:
            head.forward = previous
        else:
            del head.forward
