"""Forward passes over rollout batches: per-token logprobs (and entropy) in length-bucketed
micro-batches, so little compute goes to padding.

Alignment convention (the same as ``sleuth.rollout.batching``): rows are right-padded, and column
``t`` of every ``_BT`` tensor refers to token ``input_ids[:, t]``; its logprob comes from the logits
at position ``t - 1``. Column 0 (always a prompt token) gets logprob 0.
"""

from __future__ import annotations

import torch

from sleuth.algo.logprobs import entropy_from_logits, logprobs_and_entropy


def length_buckets(lengths_B: list[int], micro_batch_size: int) -> list[list[int]]:
    """Row indices grouped into micro-batches of similar length (longest first).

    Sorting by length before cutting into micro-batches means each micro-batch is trimmed to its
    own longest row, so short rows do not pay for the batch's longest one.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    order = sorted(range(len(lengths_B)), key=lambda i: (-lengths_B[i], i))
    return [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]


def padding_share(lengths_B: list[int], buckets: list[list[int]]) -> float:
    """Share of the computed token slots that are padding under ``buckets``."""
    real = sum(lengths_B)
    computed = sum(len(b) * max(lengths_B[i] for i in b) for b in buckets if b)
    return 0.0 if computed == 0 else 1.0 - real / computed


def token_logprobs(
    model,
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token given its prefix (and the entropy of that prediction), shape [B, T].

    Runs one forward; gradients flow when called with grad enabled. ``entropy_grad=False`` computes
    the entropy outside the graph (a metric only, e.g. ``algo.entropy_coef == 0``): its softmax is
    then not kept for the backward pass (a [B, T, V] tensor per micro-batch).
    """
    B, T = input_ids_BT.shape
    positions_BT = (attention_mask_BT.long().cumsum(-1) - 1).clamp(min=0)  # right padding: 0..len-1
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, position_ids=positions_BT).logits
    lp_Bt, ent_Bt = logprobs_and_entropy(
        logits_BTV[:, :-1], input_ids_BT[:, 1:], temperature=temperature, with_entropy=with_entropy and entropy_grad
    )  # [B, T-1] each
    if with_entropy and not entropy_grad:
        with torch.no_grad():
            ent_Bt = entropy_from_logits(logits_BTV[:, :-1], temperature=temperature)  # [B, T-1]
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
    temperature: float = 1.0,
) -> torch.Tensor:
    """``token_logprobs`` over a whole batch in length buckets, without gradients; [B, T] on CPU
    of the inputs' device."""
    lengths_B = attention_mask_BT.sum(-1).tolist()
    out_BT = torch.zeros(input_ids_BT.shape, dtype=torch.float32, device=input_ids_BT.device)
    device = next(model.parameters()).device
    for rows in length_buckets(lengths_B, micro_batch_size):
        L = max(lengths_B[i] for i in rows)
        idx = torch.tensor(rows, device=input_ids_BT.device)
        lp, _ = token_logprobs(
            model,
            input_ids_BT[idx, :L].to(device),
            attention_mask_BT[idx, :L].to(device),
            temperature=temperature,
        )
        out_BT[idx, :L] = lp.float().to(out_BT.device)
    return out_BT
