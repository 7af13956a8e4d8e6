"""Policy, value and entropy loss terms; truncated importance-sampling (TIS) weights.

The clipped policy loss (PPO, arXiv 1707.06347) per token, with ``r = exp(logp - old_logp)`` and
advantage ``A``::

    loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
    loss = min(loss, -A * dual_clip)        only where A < 0, when dual_clip is set

Departures / choices:

* Separate ``clip_low`` / ``clip_high`` (DAPO's clip-higher, arXiv 2503.14476); PPO is
  ``clip_low == clip_high``.
* Dual clip (Ye et al. 2020, arXiv 1912.09729) bounds the loss of negative-advantage tokens whose
  ratio has exploded by ``-A * c`` (c > 1).
* ``logp - old_logp`` is clamped to ``[-20, 20]`` before ``exp`` (as verl) so a stale token cannot
  produce inf.
* ``approx_kl`` in the stats is the k3 estimator of KL(old || new) (non-negative), not k1.
* TIS (verl / slime "truncated importance sampling"): when the sampler (e.g. vLLM) and the trainer
  disagree numerically, the trainer's ``old_logprobs`` and the sampler's logprobs differ. Each token's
  loss is multiplied by ``min(exp(old_logp - sampler_logp), cap)``, detached. Weights outside the
  mask are set to 0 so that a missing sampler logprob (NaN) at an injected token cannot reach the
  gradient.
* The value loss is PPO's clipped value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
  ``V_clip = V_old + clip(V - V_old, -clip, clip)``; ``clip=None`` gives the plain squared error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sleuth.algo.aggregate import aggregate_loss, check_same_shape, masked_max, masked_mean
from sleuth.algo.kl import kl_k3
from sleuth.errors import ConfigError

__all__ = [
    "PolicyLossStats",
    "clipped_policy_loss",
    "entropy_bonus",
    "policy_loss_per_token",
    "tis_weights",
    "value_loss",
]

_LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossStats:
    """Detached 0-dim tensors describing one policy-loss evaluation (over masked tokens)."""

    clipfrac: torch.Tensor
    """Fraction of tokens where the ratio clip is active (the token's gradient is zero)."""
    clipfrac_dual: torch.Tensor
    """Fraction of tokens where the dual clip is active (always 0 without ``dual_clip``)."""
    approx_kl: torch.Tensor
    """Mean k3 estimate of KL(old || new)."""
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor

    def to_metrics(self, prefix: str = "algo/") -> dict[str, float]:
        """Plain floats keyed ``algo/clipfrac`` … for the metrics dict."""
        return {f"{prefix}{name}": float(getattr(self, name)) for name in self.__dataclass_fields__}


def _check_clips(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ConfigError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")


def policy_loss_per_token(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate: ``(loss_BT, ratio_BT, clipped_BT, dual_clipped_BT)``.

    ``old_logprobs_BT`` and ``advantages_BT`` are detached; ``clipped_BT`` / ``dual_clipped_BT``
    are bool masks of where each clip is active.
    """
    _check_clips(clip_low, clip_high, dual_clip)
    check_same_shape(logprobs_BT=logprobs_BT, old_logprobs_BT=old_logprobs_BT, advantages_BT=advantages_BT)
    adv_BT = advantages_BT.detach()  # [B, T]
    log_ratio_BT = (logprobs_BT - old_logprobs_BT.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, T]
    ratio_BT = torch.exp(log_ratio_BT)  # [B, T]
    unclipped_BT = -adv_BT * ratio_BT  # [B, T]
    clipped_loss_BT = -adv_BT * ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high)  # [B, T]
    loss_BT = torch.maximum(unclipped_BT, clipped_loss_BT)  # [B, T]
    clipped_BT = clipped_loss_BT > unclipped_BT  # [B, T]
    dual_clipped_BT = torch.zeros_like(clipped_BT)  # [B, T]
    if dual_clip is not None:
        bound_BT = -adv_BT * dual_clip  # [B, T]
        dual_clipped_BT = (adv_BT < 0) & (loss_BT > bound_BT)  # [B, T]
        loss_BT = torch.where(dual_clipped_BT, bound_BT, loss_BT)  # [B, T]
    return loss_BT, ratio_BT, clipped_BT, dual_clipped_BT


def clipped_policy_loss(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    tis_weights_BT: torch.Tensor | None = None,
    agg: str = "token_mean",
    norm_len: float | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """The clipped policy-gradient loss aggregated with ``agg``, and its :class:`PolicyLossStats`.

    ``tis_weights_BT`` (from :func:`tis_weights`) multiplies each token's loss when given.
    """
    check_same_shape(logprobs_BT=logprobs_BT, mask_BT=mask_BT)
    loss_BT, ratio_BT, clipped_BT, dual_BT = policy_loss_per_token(
        logprobs_BT, old_logprobs_BT, advantages_BT, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    if tis_weights_BT is not None:
        check_same_shape(tis_weights_BT=tis_weights_BT, mask_BT=mask_BT)
        loss_BT = loss_BT * tis_weights_BT.detach()  # [B, T]
    loss = aggregate_loss(loss_BT, mask_BT, mode=agg, norm_len=norm_len, denominator=denominator)  # ()
    with torch.no_grad():
        stats = PolicyLossStats(
            clipfrac=masked_mean(clipped_BT.to(ratio_BT.dtype), mask_BT),
            clipfrac_dual=masked_mean(dual_BT.to(ratio_BT.dtype), mask_BT),
            approx_kl=masked_mean(kl_k3(old_logprobs_BT.detach(), logprobs_BT.detach()), mask_BT),
            ratio_mean=masked_mean(ratio_BT.detach(), mask_BT),
            ratio_max=masked_max(ratio_BT.detach(), mask_BT),
        )
    return loss, stats


def tis_weights(
    old_logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor, *, cap: float = 2.0
) -> torch.Tensor:
    """Truncated importance weights ``min(exp(old_logp - sampler_logp), cap)``, detached; 0 off-mask.

    Three policies meet when the sampler is not the trainer (vLLM) or is older than it (asynchronous rollouts,
    ``rollout.async_steps``): the behaviour policy mu that sampled the tokens (``sampler_logp``), the proximal
    policy pi_old (the trainer's weights when the batch is trained on: the update's recomputed ``old_logp``),
    and pi_theta being optimised. Each token's loss is decoupled PPO's (AReaL; verl's one-step-off mode with TIS):

        w * max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)),   r = pi_theta / pi_old,
        w = min(pi_old / mu, cap)

    so the clip keeps the update near the weights the trainer holds, and ``w`` corrects for sampling by mu.
    """
    if not cap > 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    check_same_shape(old_logprobs_BT=old_logprobs_BT, sampler_logprobs_BT=sampler_logprobs_BT, mask_BT=mask_BT)
    with torch.no_grad():
        log_w_BT = (old_logprobs_BT - sampler_logprobs_BT).clamp(max=_LOG_RATIO_CLAMP)  # [B, T]
        w_BT = torch.exp(log_w_BT).clamp(max=cap)  # [B, T]
        return torch.where(mask_BT.bool(), w_BT, torch.zeros_like(w_BT))  # [B, T]


def value_loss(
    values_BT: torch.Tensor,
    old_values_BT: torch.Tensor,
    returns_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip: float | None = 0.2,
    agg: str = "token_mean",
    norm_len: float | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss; returns ``(loss, clipfrac)`` (clipfrac detached)."""
    check_same_shape(values_BT=values_BT, old_values_BT=old_values_BT, returns_BT=returns_BT, mask_BT=mask_BT)
    if clip is not None and clip < 0:
        raise ConfigError(f"value clip must be >= 0 (or None to disable), got {clip}")
    old_BT, target_BT = old_values_BT.detach(), returns_BT.detach()  # [B, T]
    sq_BT = (values_BT - target_BT).square()  # [B, T]
    if clip is None:
        per_token_BT, clipped_BT = 0.5 * sq_BT, torch.zeros_like(mask_BT, dtype=torch.bool)  # [B, T]
    else:
        v_clip_BT = old_BT + (values_BT - old_BT).clamp(-clip, clip)  # [B, T]
        sq_clip_BT = (v_clip_BT - target_BT).square()  # [B, T]
        per_token_BT = 0.5 * torch.maximum(sq_BT, sq_clip_BT)  # [B, T]
        clipped_BT = sq_clip_BT > sq_BT  # [B, T]
    loss = aggregate_loss(per_token_BT, mask_BT, mode=agg, norm_len=norm_len, denominator=denominator)  # ()
    clipfrac = masked_mean(clipped_BT.to(sq_BT.dtype), mask_BT).detach()  # ()
    return loss, clipfrac


def entropy_bonus(
    entropy_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    coef: float = 0.0,
    agg: str = "token_mean",
    norm_len: float | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy bonus as a loss term: ``(-coef * aggregated_entropy, aggregated_entropy)``.

    Adding the first to the loss raises entropy; the second (detached) is for logging.
    """
    mean_entropy = aggregate_loss(entropy_BT, mask_BT, mode=agg, norm_len=norm_len, denominator=denominator)  # ()
    return -coef * mean_entropy, mean_entropy.detach()
