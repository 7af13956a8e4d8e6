"""Rows that start alike, computed once: which rows share a micro-batch, and how many tokens they share.

A GRPO group's rows are one question's samples: the same prompt and, when the samples search with the
same query, the same first turn and the same ``<information>`` block, up to the answer turn. Padded
micro-batches recompute that prefix in every row. With ``train.share_prefix`` a micro-batch whose rows
begin with the same tokens runs them in two passes (``sleuth.train.forward``): the shared tokens once,
as one row whose KV cache is kept, then each row's remaining tokens attending to that cache repeated over
the rows. Forward values and gradients are those of the rows run whole, to float rounding; the cost is
the prefix once plus the rows' suffixes.

Which rows go together (:func:`prefix_buckets`): the rows in the order of their tokens, so that rows with
a common prefix are neighbours, cut into runs of neighbours (by dynamic programming over the cut points)
so that the token slots computed (:func:`computed_slots`) are fewest, within ``micro_batch_size`` rows and
the token budget (counted as computed slots) per micro-batch. (A greedy cut is not enough: a group's odd
row sorted first would take its neighbours into a micro-batch sharing only the prompt.)

Split point: with ``P`` leading tokens common to all rows, the first ``Q = P - 1`` run once. Their
logits score columns 1..Q (column ``t`` is scored by the logits at ``t - 1``; column ``Q`` is still a
common token); the rows' own pass starts at column ``Q`` and scores columns ``Q + 1`` on.
"""

from __future__ import annotations

import torch


def common_prefix_len(input_ids_BT: torch.Tensor, lengths_B: torch.Tensor) -> int:
    """How many leading tokens every row has, identical in all of them (at most the shortest row)."""
    if input_ids_BT.shape[0] == 0:
        return 0
    n = int(lengths_B.min())
    same_T = (input_ids_BT[:, :n] == input_ids_BT[:1, :n]).all(dim=0)
    first_diff = (~same_T).nonzero()
    return int(first_diff[0]) if len(first_diff) else n


def shared_split(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> int:
    """``Q``: the tokens the rows run once (0: nothing to share, one row or no common token pair)."""
    if input_ids_BT.shape[0] < 2:
        return 0
    return max(common_prefix_len(input_ids_BT, attention_mask_BT.sum(-1)) - 1, 0)


def computed_slots(rows: int, common: int, longest: int) -> int:
    """Token slots a micro-batch computes: ``rows`` rows, ``common`` leading tokens shared by all, the
    longest ``longest`` tokens: the shared part once, then every row padded to the longest suffix."""
    if rows == 1:
        return longest
    q = max(common - 1, 0)
    return q + rows * (longest - q)


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def prefix_buckets(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, micro_batch_size: int,
                   max_tokens: int | None = None) -> list[list[int]]:
    """Row indices grouped into micro-batches of rows that share leading tokens (see the module's doc).

    The rows in the order of their tokens, cut into runs of neighbours so that the token slots computed
    (:func:`computed_slots`, summed over the runs) are fewest; ties: fewer micro-batches. A run holds at most
    ``micro_batch_size`` rows and, with ``max_tokens``, at most that many computed slots (a row longer than
    the budget goes alone). Every row is in exactly one micro-batch."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (or None), got {max_tokens}")
    lengths = attention_mask_BT.sum(-1).tolist()
    seqs = [input_ids_BT[i, : lengths[i]].tolist() for i in range(len(lengths))]
    order = sorted(range(len(seqs)), key=lambda i: (seqs[i], i))  # a common prefix makes neighbours
    n = len(order)
    next_common = [_common(seqs[order[k]], seqs[order[k + 1]]) for k in range(n - 1)]
    # best[j]: (slots, micro-batches) of the best cut of the first j rows; cut[j]: where its last run starts
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        common, longest, options = lengths[order[j - 1]], 0, []
        for i in range(j - 1, max(j - micro_batch_size, 0) - 1, -1):  # the last run: rows i..j-1
            if i < j - 1:
                common = min(common, next_common[i])
            longest = max(longest, lengths[order[i]])
            slots = computed_slots(j - i, common, longest)
            if max_tokens is not None and slots > max_tokens and i < j - 1:
                break  # longer runs only cost more slots
            options.append(((best[i][0] + slots, best[i][1] + 1), i))
        best[j], cut[j] = min(options)
    buckets: list[list[int]] = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


def computed_share(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, buckets: list[list[int]]) -> float:
    """Token slots computed under ``buckets`` with shared prefixes, as a share of the rows' real tokens
    (below 1: the prefixes saved more than the padding cost)."""
    real = int(attention_mask_BT.sum())
    done = 0
    for rows in buckets:
        idx = torch.tensor(rows)
        lengths = attention_mask_BT[idx].sum(-1)
        done += computed_slots(len(rows), common_prefix_len(input_ids_BT[idx], lengths), int(lengths.max()))
    return done / max(real, 1)
