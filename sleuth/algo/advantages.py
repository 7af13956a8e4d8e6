"""Advantage estimators: GRPO / Dr.GRPO, RLOO, REINFORCE++, GAE; broadcast to tokens.

Sequence-level estimators (GRPO, RLOO) take one scalar reward per row, ``rewards_B``, and a group
id per row (the question id; any hashable, in any order: rows of a group need not be contiguous).
Token-level estimators (REINFORCE++, GAE) work on ``[B, T]`` tensors and a loss mask ``mask_BT``
that is set on sampled (trained) tokens only.

All outputs are detached: an advantage is a constant of the policy-gradient loss.

Departures from the papers / other frameworks:

* GRPO (DeepSeekMath, arXiv 2402.03300) uses the unbiased (Bessel-corrected) group std as TRL and
  verl do, and ``(r - mean) / (std + eps)``. A group of one row gets advantage 0 (no baseline can
  be estimated from one sample; verl instead returns the raw reward).
* Dr.GRPO (arXiv 2503.20783) is ``grpo_advantages(..., scale_by_std=False)``: ``r - mean``.
* RLOO (Ahmadian et al. 2024): baseline = mean of the *other* rows of the group; a group of one
  row gets advantage 0 instead of a division by zero.
* Multi-turn trajectories have injected tokens (observations) *between* sampled tokens.
  ``discounted_returns`` and ``gae_advantages`` step over masked (sampled) tokens only: an injected
  token is not a time step, so it neither discounts the return nor ends the episode, and the
  critic's value at injected positions is never used. (OpenRLHF discounts over every position;
  verl resets the running return at unmasked positions, which cuts multi-turn credit assignment.)
* REINFORCE++ (arXiv 2501.03262) whitens the returns over all masked tokens of the batch with the
  unbiased variance, ``(x - mean) * rsqrt(var + eps)``; a batch with < 2 masked tokens gives 0.
* The sequence reward is placed on the last sampled token of the row; a row with no sampled token
  carries no reward (there is nothing to credit it to).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from sleuth.algo.aggregate import check_same_shape, masked_whiten

__all__ = [
    "ADVANTAGES",
    "broadcast_to_tokens",
    "discounted_returns",
    "gae_advantages",
    "group_index",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_rewards",
]

ADVANTAGES = ("grpo", "drgrpo", "rloo", "reinforce_pp", "gae")
"""The estimators ``algo.advantage`` names (``sleuth.train.update.compute_advantages`` dispatches on them)."""

GroupIds = Sequence[Hashable] | torch.Tensor


def group_index(group_ids: GroupIds, batch_size: int) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to ``(index_B, num_groups)`` with ``index_B`` in ``[0, num_groups)``.

    Python sequences / numpy arrays are numbered in order of first appearance; integer tensors via
    ``torch.unique``. Raises ValueError when the length differs from ``batch_size``.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1 or group_ids.dtype.is_floating_point:
            raise ValueError(
                f"group_ids tensor must be 1-D integer, got shape {list(group_ids.shape)} dtype {group_ids.dtype}"
            )
        _, index_B = torch.unique(group_ids, return_inverse=True)  # [B]
    else:
        try:
            numbering: dict[Hashable, int] = {}
            index_B = torch.tensor(
                [numbering.setdefault(g, len(numbering)) for g in group_ids], dtype=torch.long
            )  # [B]
        except TypeError as e:
            raise ValueError(f"group_ids must be hashable ids (e.g. question ids): {e}") from e
    if index_B.numel() != batch_size:
        raise ValueError(f"group_ids has {index_B.numel()} entries but rewards_B has {batch_size} rows")
    num_groups = int(index_B.max()) + 1 if index_B.numel() else 0
    return index_B, num_groups


def _check_rewards(rewards_B: torch.Tensor) -> torch.Tensor:
    """Detached float rewards of shape [B]; ValueError naming the first non-finite row."""
    rewards_B = torch.as_tensor(rewards_B).detach()
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards_B must have shape [B], got {list(rewards_B.shape)}")
    if not rewards_B.dtype.is_floating_point:
        rewards_B = rewards_B.float()
    bad = (~torch.isfinite(rewards_B)).nonzero()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"rewards_B[{row}] = {rewards_B[row].item()} is not finite; fix the reward function")
    return rewards_B


def _group_stats(rewards_B: torch.Tensor, index_B: torch.Tensor, num_groups: int):
    """Per-group ``(counts_Q, sums_Q, mean_Q, unbiased_std_Q)``; std is 0 for groups of one row."""
    index_B = index_B.to(rewards_B.device)
    counts_Q = torch.bincount(index_B, minlength=num_groups).to(rewards_B.dtype)  # [Q]
    sums_Q = rewards_B.new_zeros(num_groups).index_add(0, index_B, rewards_B)  # [Q]
    mean_Q = sums_Q / counts_Q  # [Q]
    sq_Q = rewards_B.new_zeros(num_groups).index_add(0, index_B, (rewards_B - mean_Q[index_B]).square())  # [Q]
    std_Q = (sq_Q / (counts_Q - 1).clamp(min=1)).sqrt()  # [Q]
    return counts_Q, sums_Q, mean_Q, std_Q


def grpo_advantages(
    rewards_B: torch.Tensor, group_ids: GroupIds, *, eps: float = 1e-6, scale_by_std: bool = True
) -> torch.Tensor:
    """GRPO: ``(r - group_mean) / (group_std + eps)``; Dr.GRPO with ``scale_by_std=False``."""
    rewards_B = _check_rewards(rewards_B)
    index_B, num_groups = group_index(group_ids, rewards_B.shape[0])
    _, _, mean_Q, std_Q = _group_stats(rewards_B, index_B, num_groups)
    index_B = index_B.to(rewards_B.device)
    centered_B = rewards_B - mean_Q[index_B]  # [B]; exactly 0 for a group of one row
    if not scale_by_std:
        return centered_B
    return centered_B / (std_Q[index_B] + eps)  # [B]


def rloo_advantages(rewards_B: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """RLOO: ``r_i - mean_{j != i} r_j`` within the group; 0 for a group of one row."""
    rewards_B = _check_rewards(rewards_B)
    index_B, num_groups = group_index(group_ids, rewards_B.shape[0])
    counts_Q, sums_Q, _, _ = _group_stats(rewards_B, index_B, num_groups)
    index_B = index_B.to(rewards_B.device)
    others_B = (counts_Q[index_B] - 1).clamp(min=1)  # [B] rows in the group besides this one
    baseline_B = (sums_Q[index_B] - rewards_B) / others_B  # [B]
    return torch.where(counts_Q[index_B] > 1, rewards_B - baseline_B, torch.zeros_like(rewards_B))  # [B]


def broadcast_to_tokens(advantages_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Copy each row's advantage to its masked tokens; 0 elsewhere. Shape [B, T]."""
    if advantages_B.dim() != 1 or mask_BT.dim() != 2 or advantages_B.shape[0] != mask_BT.shape[0]:
        raise ValueError(
            f"broadcast_to_tokens: advantages_B {list(advantages_B.shape)} must be [B] for mask_BT "
            f"{list(mask_BT.shape)}"
        )
    expanded_BT = advantages_B.detach()[:, None].expand(mask_BT.shape)  # [B, T] view
    return torch.where(mask_BT.bool(), expanded_BT, torch.zeros_like(expanded_BT))  # [B, T]


def token_rewards(
    scores_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token reward: ``-kl_coef * kl`` on each masked token, plus the score on the last one.

    ``kl_BT`` (e.g. ``kl_k1(logprobs, ref_logprobs)``) is detached: as a reward it is a constant.
    """
    scores_B = _check_rewards(scores_B)
    if mask_BT.dim() != 2 or mask_BT.shape[0] != scores_B.shape[0]:
        raise ValueError(f"token_rewards: mask_BT {list(mask_BT.shape)} must be [B, T] with B = {scores_B.shape[0]}")
    mask_BT = mask_BT.bool()
    rewards_BT = scores_B.new_zeros(mask_BT.shape)  # [B, T]
    if mask_BT.shape[1]:
        positions_BT = torch.arange(mask_BT.shape[1], device=mask_BT.device).expand(mask_BT.shape)  # [B, T]
        last_B = torch.where(mask_BT, positions_BT, -1).max(dim=1).values  # [B]; -1 for an empty row
        is_last_BT = (positions_BT == last_B[:, None]) & mask_BT  # [B, T]
        rewards_BT = torch.where(is_last_BT, scores_B[:, None].expand(mask_BT.shape), rewards_BT)  # [B, T]
    if kl_BT is not None:
        check_same_shape(kl_BT=kl_BT, mask_BT=mask_BT)
        penalty_BT = torch.where(mask_BT, kl_coef * kl_BT.detach().to(rewards_BT.dtype), 0.0)  # [B, T]
        rewards_BT = rewards_BT - penalty_BT  # [B, T]
    return rewards_BT


def discounted_returns(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over masked tokens only (right to left); 0 at unmasked tokens."""
    check_same_shape(rewards_BT=rewards_BT, mask_BT=mask_BT)
    rewards_BT, mask_BT = rewards_BT.detach(), mask_BT.bool()
    running_B = rewards_BT.new_zeros(rewards_BT.shape[0])  # [B]
    returns_T = []  # T tensors of [B], collected right to left
    for t in reversed(range(rewards_BT.shape[1])):
        running_B = torch.where(mask_BT[:, t], rewards_BT[:, t] + gamma * running_B, running_B)  # [B]
        returns_T.append(torch.where(mask_BT[:, t], running_B, 0.0))  # [B]
    if not returns_T:
        return rewards_BT.clone()
    return torch.stack(returns_T[::-1], dim=1)  # [B, T]


def reinforce_pp_advantages(
    scores_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    kl_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: KL folded into token rewards, discounted return, whitened over the batch.

    Returns ``(advantages_BT, returns_BT)``; both are 0 at unmasked tokens.
    """
    rewards_BT = token_rewards(scores_B, mask_BT, kl_BT=kl_BT, kl_coef=kl_coef)  # [B, T]
    returns_BT = discounted_returns(rewards_BT, mask_BT, gamma=gamma)  # [B, T]
    return masked_whiten(returns_BT, mask_BT, eps=eps), returns_BT  # [B, T], [B, T]


def gae_advantages(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE with a critic over masked tokens; returns ``(advantages_BT, returns_BT = A + V)``.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where
    "next" is the next *masked* token of the row (0 after the last one). Whitening the advantages
    (usual for PPO) is left to the caller: ``masked_whiten(advantages_BT, mask_BT)``.
    """
    check_same_shape(rewards_BT=rewards_BT, values_BT=values_BT, mask_BT=mask_BT)
    rewards_BT, values_BT, mask_BT = rewards_BT.detach(), values_BT.detach().to(rewards_BT.dtype), mask_BT.bool()
    next_value_B = rewards_BT.new_zeros(rewards_BT.shape[0])  # [B]
    next_adv_B = rewards_BT.new_zeros(rewards_BT.shape[0])  # [B]
    adv_T = []  # T tensors of [B], right to left
    for t in reversed(range(rewards_BT.shape[1])):
        m_B = mask_BT[:, t]  # [B]
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]  # [B]
        adv_B = delta_B + gamma * lam * next_adv_B  # [B]
        next_adv_B = torch.where(m_B, adv_B, next_adv_B)  # [B] injected tokens pass the carry through
        next_value_B = torch.where(m_B, values_BT[:, t], next_value_B)  # [B]
        adv_T.append(torch.where(m_B, adv_B, 0.0))  # [B]
    if not adv_T:
        return rewards_BT.clone(), rewards_BT.clone()
    advantages_BT = torch.stack(adv_T[::-1], dim=1)  # [B, T]
    returns_BT = torch.where(mask_BT, advantages_BT + values_BT, 0.0)  # [B, T]
    return advantages_BT, returns_BT
