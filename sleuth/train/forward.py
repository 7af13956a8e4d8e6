"""Forward passes over rollout batches: per-token logprobs (and entropy) in length-bucketed
micro-batches, so little compute goes to padding.

Alignment convention (the same as ``sleuth.rollout.batching``): rows are right-padded, and column
``t`` of every ``_BT`` tensor refers to token ``input_ids[:, t]``; its logprob comes from the logits
at position ``t - 1``. Column 0 (always a prompt token) gets logprob 0.

The output layer only where a logprob is needed: given ``needed_BT`` (the loss mask), the model is
asked for the logits at positions ``t - 1`` of the needed columns only (transformers'
``logits_to_keep`` as a boolean [B, T] mask, through the model's own forward, so DDP, FSDP2 and
peft wrappers see an ordinary call). The prompt, the ``<information>`` blocks and the padding cost
no vocabulary projection, no log-softmax and no entropy; their columns hold 0. For model families
whose output layer is a plain linear map (``sleuth.train.chunked_head``), the output layer, the
log-softmax and the entropy run chunk by chunk inside one autograd Function that recomputes them in
backward, so a micro-batch's [N, V] logits are never held with their graph. (transformers before
5.20 take no boolean ``logits_to_keep``: the model then computes every position's logits and they
are selected after, except in the chunked output layer, which selects the hidden states itself.)

Packing (``packed=True``, ``train.remove_padding``; verl's ``use_remove_padding``): a micro-batch's
rows are concatenated, padding removed, into one row of ``sum(lengths)`` tokens whose position ids
restart at 0 at each row, with no attention mask; transformers then builds a block-diagonal causal
mask from the position ids, so no token attends across rows and the layers outside attention
compute no padding. Attention itself: flash-attention kernels run each row on its own; eager and
SDPA compute the whole packed row against the [N, N] mask. The results are scattered back to the
[B, T] layout. For the model families in ``PACKING_MODELS`` (:func:`supports_packing`).

Shared prefixes (``shared_prefix=True``, ``train.share_prefix``): the leading tokens all of a
micro-batch's rows have in common run once, as one row whose KV cache is kept, repeated over the rows,
and read by each row's own tokens (``sleuth.train.prefix_share`` says which rows and how many tokens).
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache

from sleuth.algo.logprobs import entropy_from_logits, logprobs_and_entropy
from sleuth.models import unwrap
from sleuth.rollout.hf_backend import cache_kwarg
from sleuth.rollout.hf_cache import sliding_window, supports_reuse
from sleuth.train.chunked_head import scoring_head, supports_chunked_head
from sleuth.train.prefix_share import prefix_buckets, shared_split

# model types whose decoder builds its attention mask with transformers' masking utilities from the
# position ids when no attention mask is given (packed rows: a block-diagonal causal mask) and applies
# rotary embeddings at those position ids (read in transformers' modeling files)
PACKING_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo2", "gemma3_text"})
PACKING_ATTENTION = frozenset({"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"})


def length_buckets(lengths_B: list[int], micro_batch_size: int, max_tokens: int | None = None, *,
                   packed: bool = False) -> list[list[int]]:
    """Row indices grouped into micro-batches of similar length (longest first).

    Sorting by length before cutting into micro-batches means each micro-batch is trimmed to its
    own longest row, so short rows do not pay for the batch's longest one. A micro-batch holds at
    most ``micro_batch_size`` rows and, with ``max_tokens``, at most that many token slots: its
    rows times its longest row (the first one), or with ``packed`` (rows concatenated, no padding)
    the sum of its rows' lengths. A row longer than ``max_tokens`` goes alone.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (or None), got {max_tokens}")
    order = sorted(range(len(lengths_B)), key=lambda i: (-lengths_B[i], i))
    buckets: list[list[int]] = []
    used = 0  # token slots of the last bucket
    for i in order:
        b = buckets[-1] if buckets else None
        slots = used + lengths_B[i] if packed else (len(b) + 1) * lengths_B[b[0]] if b else 0
        if b is not None and len(b) < micro_batch_size and (max_tokens is None or slots <= max_tokens):
            b.append(i)
            used = slots
        else:
            buckets.append([i])
            used = lengths_B[i]
    return buckets


def padding_share(lengths_B: list[int], buckets: list[list[int]], *, packed: bool = False) -> float:
    """Share of the computed token slots that are padding under ``buckets`` (0 when ``packed``)."""
    if packed:
        return 0.0
    real = sum(lengths_B)
    computed = sum(len(b) * max(lengths_B[i] for i in b) for b in buckets if b)
    return 0.0 if computed == 0 else 1.0 - real / computed


def supports_packing(model) -> bool:
    """Whether ``model`` (or the decoder of a critic, under DDP / peft wrappers) can run packed rows:
    a ``PACKING_MODELS`` family, an attention implementation in ``PACKING_ATTENTION``, and a
    transformers whose masking utilities detect packed position ids."""
    import transformers.masking_utils as masking  # lazy: read once per call site, after transformers is loaded

    inner = unwrap(model)
    inner = getattr(inner, "body", inner)  # sleuth.models.ValueHead: its decoder
    config = getattr(inner, "config", None)
    return (getattr(config, "model_type", None) in PACKING_MODELS
            and getattr(config, "_attn_implementation", None) in PACKING_ATTENTION
            and hasattr(masking, "find_packed_sequence_indices"))


def supports_shared_prefix(model) -> bool:
    """Whether ``model`` can run a micro-batch's common tokens once (``shared_prefix``) with the whole rows'
    values: a ``DynamicCache`` of plain full-attention layers (``sleuth.rollout.hf_cache.supports_reuse``),
    or of full and sliding-window layers under sdpa or eager attention (Gemma-3;
    ``sleuth.rollout.hf_cache.sliding_window``). For the latter, the rows' own pass reads a sliding layer's
    last ``window - 1`` cached keys, and transformers' masks place them by the cache's absolute positions."""
    inner = unwrap(model)
    return supports_reuse(inner) or sliding_window(inner) is not None


def pack(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor):
    """Right-padded rows -> one row without padding: ``(ids_1N, positions_1N, keep_BT)`` where
    ``positions_1N`` restart at 0 at each row and ``keep_BT`` marks the real tokens (row-major,
    the order of the packed row)."""
    keep_BT = attention_mask_BT.bool()
    positions_BT = attention_mask_BT.long().cumsum(-1) - 1
    return input_ids_BT[keep_BT][None], positions_BT[keep_BT][None], keep_BT


def unpack(values_1N: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack` for per-token values: [1, N] -> [B, T] with 0 at the padding
    (differentiable in ``values_1N``)."""
    zeros_BT = torch.zeros(keep_BT.shape, dtype=values_1N.dtype, device=values_1N.device)
    return zeros_BT.masked_scatter(keep_BT, values_1N[0])


@functools.cache
def _keeps_masked_logits() -> bool:
    """Whether this transformers takes a boolean [B, T] ``logits_to_keep`` (and returns [N, V])."""
    import transformers.modeling_utils as mu

    return hasattr(mu, "slice_logits_to_keep")


def selected_logits(model, input_ids_BT, attention_mask_BT, position_ids_BT, keep_BT, *, cache=None) -> torch.Tensor:
    """Logits [N, V] at the True positions of ``keep_BT`` (row-major order), through the model's own
    forward (``position_ids_BT`` None: the model's default positions). ``cache``: a KV cache the forward
    reads (its columns come before these) and extends."""
    inner = unwrap(model)
    takes_mask = _keeps_masked_logits() and hasattr(inner, "get_output_embeddings")
    kwargs = {"logits_to_keep": keep_BT} if takes_mask else {}
    if cache is not None:
        kwargs[cache_kwarg(inner)] = cache
    # use_cache=False without one: no KV cache to fill (and transformers detects packed rows only without one)
    logits = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, position_ids=position_ids_BT,
                   use_cache=cache is not None, **kwargs).logits
    if logits.dim() == 3:  # a model that computed every position: select afterwards (same values)
        logits = logits[keep_BT]
    return logits  # [N, V]


def token_logprobs(
    model,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    needed_BT: torch.Tensor | None = None,
    packed: bool = False,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token given its prefix (and the entropy of that prediction), shape [B, T].

    Runs one forward; gradients flow when called with grad enabled. ``entropy_grad=False`` computes
    the entropy outside the graph (a metric only, e.g. ``algo.entropy_coef == 0``): its softmax is
    then not kept for the backward pass (a [B, T, V] tensor per micro-batch). ``needed_BT`` (e.g.
    the loss mask): only those columns are computed (the output layer runs at their positions
    only); the others hold 0. ``packed``: the rows run as one row without padding (:func:`pack`;
    the same values, to float rounding, for a model :func:`supports_packing` accepts). ``shared_prefix``:
    the leading tokens common to all rows run once (``sleuth.train.prefix_share``; the same values, to
    float rounding, for a model :func:`supports_shared_prefix` accepts).
    """
    if shared_prefix and packed:
        raise ValueError("token_logprobs: shared_prefix and packed cannot both be set (train.share_prefix and "
                         "train.remove_padding): choose one")
    if shared_prefix:
        return _shared_logprobs(model, input_ids_BT, attention_mask_BT, needed_BT, temperature=temperature,
                                with_entropy=with_entropy, entropy_grad=entropy_grad)
    if packed:
        return _packed_logprobs(model, input_ids_BT, attention_mask_BT, temperature=temperature,
                                with_entropy=with_entropy, entropy_grad=entropy_grad, needed_BT=needed_BT)
    positions_BT = (attention_mask_BT.long().cumsum(-1) - 1).clamp(min=0)  # right padding: 0..len-1
    if needed_BT is not None:
        return _needed_logprobs(model, input_ids_BT, attention_mask_BT, positions_BT, needed_BT.bool(),
                                temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, position_ids=positions_BT,
                       use_cache=False).logits
    lp_Bt, ent_Bt = logprobs_and_entropy(
        logits_BTV[:, :-1], input_ids_BT[:, 1:], temperature=temperature, with_entropy=with_entropy and entropy_grad
    )  # [B, T-1] each
    if with_entropy and not entropy_grad:
        with torch.no_grad():
            ent_Bt = entropy_from_logits(logits_BTV[:, :-1], temperature=temperature)  # [B, T-1]
    return _with_first_column(lp_Bt, ent_Bt)


def _packed_logprobs(model, input_ids_BT, attention_mask_BT, *, temperature, with_entropy, entropy_grad, needed_BT):
    """``token_logprobs`` of the rows packed into one (no attention mask: transformers masks by the
    position ids). A row's first token has no prefix: never scored (its column holds 0)."""
    ids_1N, positions_1N, keep_BT = pack(input_ids_BT, attention_mask_BT)
    first_1N = positions_1N == 0  # row starts: the packed row's previous token belongs to another row
    if needed_BT is None:
        needed_1N = ~first_1N
    else:
        needed_1N = needed_BT.bool()[keep_BT][None] & ~first_1N
    lp_1N, ent_1N = _needed_logprobs(model, ids_1N, None, positions_1N, needed_1N, temperature=temperature,
                                     with_entropy=with_entropy, entropy_grad=entropy_grad)
    return unpack(lp_1N, keep_BT), unpack(ent_1N, keep_BT) if ent_1N is not None else None


def _needed_logprobs(model, input_ids_BT, attention_mask_BT, positions_BT, needed_BT, *, temperature,
                     with_entropy, entropy_grad):
    """``token_logprobs`` at the columns of ``needed_BT`` only: logits at their positions ``t - 1``."""
    keep_BT = torch.zeros_like(needed_BT)
    keep_BT[:, :-1] = needed_BT[:, 1:]  # the logits at t - 1 score token t
    lp_N, ent_N, anchor = _score_positions(model, input_ids_BT, attention_mask_BT, positions_BT, keep_BT,
                                           input_ids_BT[:, 1:][needed_BT[:, 1:]], temperature=temperature,
                                           with_entropy=with_entropy, entropy_grad=entropy_grad)
    B, T = input_ids_BT.shape
    zeros_Bt = torch.zeros(B, T - 1, dtype=lp_N.dtype, device=lp_N.device)
    lp_Bt = zeros_Bt.masked_scatter(needed_BT[:, 1:], lp_N)  # [B, T-1], differentiable in lp_N
    ent_Bt = zeros_Bt.masked_scatter(needed_BT[:, 1:], ent_N) if ent_N is not None else None
    return _with_first_column(*_anchored(lp_Bt, ent_Bt, anchor))


def _anchored(lp, ent, anchor):
    if anchor is None:
        return lp, ent
    return lp + anchor, ent + anchor if ent is not None else None


def _score_positions(model, input_ids_BT, attention_mask_BT, positions_BT, keep_BT, tokens_N, *, temperature,
                     with_entropy, entropy_grad, cache=None):
    """Logprob (and entropy) of ``tokens_N`` under the logits at the True positions of ``keep_BT`` (row-major):
    ``(lp_N, ent_N or None, anchor or None)``. With no True position one position runs anyway (every DDP rank
    runs a backward) and ``anchor`` is a zero with a gradient path, to add to the results. ``cache``: a KV
    cache the forward reads and extends (``sleuth.train.prefix_share``)."""
    empty = not bool(keep_BT.any())  # e.g. a micro-batch of rows left out of the loss (failed searches)
    if empty:
        keep_BT = keep_BT.clone()
        keep_BT[0, 0] = True
    if supports_chunked_head(model):  # never the [N, V] logits with their graph
        scored_tokens_N = input_ids_BT[0, :1] if empty else tokens_N  # any valid id for the anchor
        select = None if _keeps_masked_logits() else keep_BT  # older transformers: the head selects
        with scoring_head(model, scored_tokens_N, temperature=temperature, with_entropy=with_entropy, keep_BT=select):
            scored_N2 = selected_logits(model, input_ids_BT, attention_mask_BT, positions_BT, keep_BT, cache=cache)
        anchor = 0.0 * scored_N2.sum() if empty else None
        scored_N2 = scored_N2[:0] if empty else scored_N2
        lp_N = scored_N2[:, 0]
        ent_N = None if not with_entropy else scored_N2[:, 1] if entropy_grad else scored_N2[:, 1].detach()
        return lp_N, ent_N, anchor
    logits_NV = selected_logits(model, input_ids_BT, attention_mask_BT, positions_BT, keep_BT, cache=cache)
    anchor = 0.0 * logits_NV.float().sum() if empty else None  # zero, with a gradient path
    logits_1NV = (logits_NV[:0] if empty else logits_NV)[None]
    lp_1N, ent_1N = logprobs_and_entropy(logits_1NV, tokens_N[None], temperature=temperature,
                                         with_entropy=with_entropy and entropy_grad)
    if with_entropy and not entropy_grad:
        with torch.no_grad():
            ent_1N = entropy_from_logits(logits_1NV, temperature=temperature)
    return lp_1N[0], ent_1N[0] if ent_1N is not None else None, anchor


def _shared_logprobs(model, input_ids_BT, attention_mask_BT, needed_BT, *, temperature, with_entropy,
                     entropy_grad):
    """``token_logprobs`` with the rows' common leading tokens run once (``sleuth.train.prefix_share``):
    the first ``Q`` tokens as one row, its KV cache kept, then every row's tokens from ``Q`` on against
    that cache repeated over the rows."""
    B, T = input_ids_BT.shape
    positions_BT = (attention_mask_BT.long().cumsum(-1) - 1).clamp(min=0)
    needed_BT = attention_mask_BT.bool() if needed_BT is None else needed_BT.bool()
    Q = shared_split(input_ids_BT, attention_mask_BT)
    if Q == 0:
        return _needed_logprobs(model, input_ids_BT, attention_mask_BT, positions_BT, needed_BT,
                                temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
    inner = unwrap(model)
    cache = DynamicCache(config=inner.config)
    scoring = {"temperature": temperature, "with_entropy": with_entropy, "entropy_grad": entropy_grad, "cache": cache}
    # 1. the common tokens 0..Q-1, once: their logits score columns 1..Q (common tokens too)
    keep_1Q = needed_BT[:, 1 : Q + 1].any(dim=0, keepdim=True)
    if keep_1Q.any():
        lp_pre_N, ent_pre_N, _ = _score_positions(model, input_ids_BT[:1, :Q], attention_mask_BT[:1, :Q],
                                                  positions_BT[:1, :Q], keep_1Q, input_ids_BT[0, 1 : Q + 1][keep_1Q[0]],
                                                  **scoring)
    else:  # nothing to score there (a prompt): the cache only
        model(input_ids=input_ids_BT[:1, :Q], attention_mask=attention_mask_BT[:1, :Q],
              position_ids=positions_BT[:1, :Q], use_cache=True, logits_to_keep=1, **{cache_kwarg(inner): cache})
        lp_pre_N = ent_pre_N = None
    cache.batch_repeat_interleave(B)  # differentiable: each row's gradient flows back into the one prefix
    # 2. every row from column Q on (the mask covers the cached columns too): logits at Q..T-2 score Q+1..T-1
    keep_BS = torch.zeros(B, T - Q, dtype=torch.bool, device=needed_BT.device)
    keep_BS[:, :-1] = needed_BT[:, Q + 1 :]
    lp_N, ent_N, anchor = _score_positions(model, input_ids_BT[:, Q:], attention_mask_BT, positions_BT[:, Q:],
                                           keep_BS, input_ids_BT[:, Q + 1 :][needed_BT[:, Q + 1 :]], **scoring)

    def assemble(pre_N, suf_N):
        zeros_1Q = torch.zeros(1, Q, dtype=suf_N.dtype, device=suf_N.device)
        pre_BQ = (zeros_1Q if pre_N is None else zeros_1Q.masked_scatter(keep_1Q, pre_N)).expand(B, Q)
        pre_BQ = torch.where(needed_BT[:, 1 : Q + 1], pre_BQ, 0.0)  # a row left out of the loss: 0 there too
        suf_BS = torch.zeros(B, T - Q - 1, dtype=suf_N.dtype, device=suf_N.device)
        return torch.cat([pre_BQ, suf_BS.masked_scatter(needed_BT[:, Q + 1 :], suf_N)], dim=1)  # [B, T-1]

    lp_Bt = assemble(lp_pre_N, lp_N)
    ent_Bt = assemble(ent_pre_N, ent_N) if ent_N is not None else None
    return _with_first_column(*_anchored(lp_Bt, ent_Bt, anchor))


def _with_first_column(lp_Bt: torch.Tensor, ent_Bt: torch.Tensor | None):
    """[B, T-1] per-token values -> [B, T] with column 0 (no prefix) = 0."""
    B = lp_Bt.shape[0]
    zero_B1 = torch.zeros(B, 1, dtype=lp_Bt.dtype, device=lp_Bt.device)
    lp_BT = torch.cat([zero_B1, lp_Bt], dim=1)  # [B, T]
    ent_BT = torch.cat([zero_B1, ent_Bt], dim=1) if ent_Bt is not None else None
    return lp_BT, ent_BT


@torch.no_grad()
def batched_logprobs(
    model,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    *,
    micro_batch_size: int,
    max_tokens: int | None = None,
    temperature: float = 1.0,
    needed_BT: torch.Tensor | None = None,
    packed: bool = False,
    shared_prefix: bool = False,
) -> torch.Tensor:
    """``token_logprobs`` over a whole batch in length buckets (``micro_batch_size`` rows and
    ``max_tokens`` token slots at most), without gradients; [B, T] on the inputs' device. With
    ``needed_BT`` only those columns are computed (the rest hold 0); ``packed``: each bucket's rows
    run as one row without padding; ``shared_prefix``: buckets of rows with common leading tokens
    (``sleuth.train.prefix_share.prefix_buckets``), run once."""

    def run(take):
        needed = None if needed_BT is None else take(needed_BT)
        return token_logprobs(model, take(input_ids_BT), take(attention_mask_BT), temperature=temperature,
                              needed_BT=needed, packed=packed, shared_prefix=shared_prefix)[0]

    buckets = prefix_buckets(input_ids_BT, attention_mask_BT, micro_batch_size, max_tokens) if shared_prefix else None
    return _over_buckets(run, model, attention_mask_BT, micro_batch_size, max_tokens, packed, buckets)


def critic_values(critic, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, *,
                  packed: bool = False) -> torch.Tensor:
    """``critic(input_ids_BT, attention_mask_BT)`` (a :class:`sleuth.models.ValueHead`: [B, T], the
    value before each token, column 0 = 0), or with ``packed`` the same from one row without
    padding (its values at each row's first token are 0)."""
    if not packed:
        return critic(input_ids_BT, attention_mask_BT)
    ids_1N, positions_1N, keep_BT = pack(input_ids_BT, attention_mask_BT)
    return unpack(critic(ids_1N, None, position_ids_BT=positions_1N), keep_BT)


@torch.no_grad()
def batched_values(critic, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, *, micro_batch_size: int,
                   max_tokens: int | None = None, packed: bool = False) -> torch.Tensor:
    """The critic's values [B, T] (float32, on the inputs' device) in the same length buckets as the
    policy's passes; columns past a row's length hold 0."""
    return _over_buckets(lambda take: critic_values(critic, take(input_ids_BT), take(attention_mask_BT), packed=packed),
                         critic, attention_mask_BT, micro_batch_size, max_tokens, packed)


def _over_buckets(run, model, attention_mask_BT, micro_batch_size: int, max_tokens: int | None,
                  packed: bool = False, buckets: list[list[int]] | None = None) -> torch.Tensor:
    """[B, T] float32 on the inputs' device: ``run(take)`` per length bucket, where ``take(t_BT)``
    gives the bucket's rows of ``t_BT`` trimmed to their longest row, on the model's device; 0 past
    each row's length (whatever the bucket's other rows, packed or not). ``buckets``: these instead of
    :func:`length_buckets`."""
    lengths_B = attention_mask_BT.sum(-1).tolist()
    out_BT = torch.zeros(attention_mask_BT.shape, dtype=torch.float32, device=attention_mask_BT.device)
    device = next(model.parameters()).device
    for rows in buckets or length_buckets(lengths_B, micro_batch_size, max_tokens, packed=packed):
        L = max(lengths_B[i] for i in rows)
        idx = torch.tensor(rows, device=attention_mask_BT.device)
        out_BT[idx, :L] = run(lambda t_BT: t_BT[idx, :L].to(device)).float().to(out_BT.device)
    return out_BT.masked_fill_(~attention_mask_BT.bool(), 0.0)
