"""One RL update on a rollout batch: advantages, then mini-batch / micro-batch optimisation.

Read top to bottom:

1. ``compute_advantages`` turns per-row scores into per-token advantages (GRPO, Dr.GRPO, RLOO,
   REINFORCE++ or GAE), with KL folded into the reward when ``algo.kl_mode == "reward"``.
2. ``policy_update`` runs ``epochs`` passes; each pass splits the rows into ``mini_batches``
   (one optimizer step each); each mini-batch is cut into length-bucketed micro-batches whose
   gradients are accumulated. Every micro-batch loss is normalised by the *mini-batch's* token (or
   row) count, so the accumulated gradient equals the gradient of the whole mini-batch's loss,
   whatever the micro-batch size. Under DDP the count is all-reduced and the loss multiplied by
   the world size (DDP and FSDP average gradients), so N ranks produce the single-process update.
3. A non-finite loss or gradient norm skips the optimizer step and is counted (on every rank when
   any rank's loss is non-finite, so the replicas or shards stay in step).

Departures: with ``kl_mode="reward"`` and a sequence-level estimator (GRPO/RLOO), the summed token
KL is subtracted from the row's score before the group statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sleuth.algo.advantages import (
    ADVANTAGES,
    broadcast_to_tokens,
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_rewards,
)
from sleuth.algo.aggregate import masked_mean, masked_sum
from sleuth.algo.kl import kl_estimate, kl_loss
from sleuth.algo.losses import (
    clipped_policy_loss,
    entropy_bonus,
    tis_weights,
    value_loss,
)
from sleuth.config import AlgoConfig
from sleuth.errors import ConfigError
from sleuth.train.forward import critic_values, token_logprobs
from sleuth.train.layout import RowLayout
from sleuth.train.reduce import all_max, all_ranks_true, all_sum, global_whiten, world_info
from sleuth.train.sft import batch_tensors, lm_loss


@dataclass
class UpdateBatch:
    """Everything one update needs, [B, T] tensors aligned as in ``sleuth.train.forward``."""

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    advantages_BT: torch.Tensor
    # the trainer's logprobs before the update; None: the update's own forward, detached (one epoch of one
    # mini-batch only: :func:`sleuth.train.learn.old_from_update`)
    old_logprobs_BT: torch.Tensor | None
    sampler_logprobs_BT: torch.Tensor | None = None  # the sampler's (for TIS)
    ref_logprobs_BT: torch.Tensor | None = None  # the frozen reference's (for the KL loss)
    returns_BT: torch.Tensor | None = None  # critic targets (GAE)
    old_values_BT: torch.Tensor | None = None


def compute_advantages(
    algo: AlgoConfig,
    scores_B: torch.Tensor,
    group_ids: list[str],
    mask_BT: torch.Tensor,
    *,
    old_logprobs_BT: torch.Tensor | None = None,
    ref_logprobs_BT: torch.Tensor | None = None,
    values_BT: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(advantages_BT, returns_BT or None)`` for the estimator named by ``algo.advantage``."""
    if algo.advantage not in ADVANTAGES:
        raise ConfigError(f"algo.advantage must be one of {ADVANTAGES}, got {algo.advantage!r}")
    kl_BT = None
    if algo.kl_mode == "reward" and algo.kl_coef > 0:
        if old_logprobs_BT is None or ref_logprobs_BT is None:
            raise ValueError("kl_mode=reward needs old and reference logprobs")
        kl_BT = kl_estimate(old_logprobs_BT, ref_logprobs_BT, estimator=algo.kl_estimator)  # [B, T]
    if algo.advantage in ("grpo", "drgrpo", "rloo"):
        if kl_BT is not None:
            scores_B = scores_B - algo.kl_coef * masked_sum(kl_BT, mask_BT, dim=1)  # [B]
        if algo.advantage == "rloo":
            adv_B = rloo_advantages(scores_B, group_ids)
        else:
            adv_B = grpo_advantages(scores_B, group_ids, scale_by_std=algo.advantage == "grpo")
        return broadcast_to_tokens(adv_B, mask_BT), None
    if algo.advantage == "reinforce_pp":
        _, returns_BT = reinforce_pp_advantages(scores_B, mask_BT, kl_BT=kl_BT, kl_coef=algo.kl_coef,
                                                gamma=algo.gamma)
        return global_whiten(returns_BT, mask_BT), returns_BT
    if values_BT is None:
        raise ValueError("algo.advantage=gae needs a critic's values")
    rewards_BT = token_rewards(scores_B, mask_BT, kl_BT=kl_BT, kl_coef=algo.kl_coef)  # [B, T]
    adv_BT, returns_BT = gae_advantages(rewards_BT, values_BT, mask_BT, gamma=algo.gamma, lam=algo.lam)
    return global_whiten(adv_BT, mask_BT), returns_BT


def _micro_loss(policy, b: UpdateBatch, rows: list[int], algo: AlgoConfig, denom: float, temperature: float,
                norm_len: float | None, layout: RowLayout):
    """Loss of one micro-batch (already divided by the mini-batch denominator) and its stats."""
    lengths = b.attention_mask_BT[rows].sum(-1)
    L = int(lengths.max())
    device = next(policy.parameters()).device
    idx = torch.tensor(rows, device=b.input_ids_BT.device)

    def take(t):
        return None if t is None else t[idx, :L].to(device)

    mask_BT = take(b.loss_mask_BT)
    need_entropy = algo.entropy_coef != 0
    lp_BT, ent_BT = token_logprobs(
        policy, take(b.input_ids_BT), take(b.attention_mask_BT), temperature=temperature, with_entropy=True,
        entropy_grad=need_entropy,  # a metric only at coefficient 0: no graph (no [B, T, V] softmax kept)
        needed_BT=mask_BT,  # the output layer at trained positions only
        packed=layout.packed, shared_prefix=layout.shared_prefix,
    )
    old_BT = lp_BT.detach() if b.old_logprobs_BT is None else take(b.old_logprobs_BT)
    tis_BT = None
    if algo.tis_cap is not None and b.sampler_logprobs_BT is not None:
        tis_BT = tis_weights(old_BT, take(b.sampler_logprobs_BT), mask_BT, cap=algo.tis_cap)
    agg = dict(agg=algo.loss_agg, norm_len=norm_len, denominator=denom)
    loss, stats = clipped_policy_loss(
        lp_BT, old_BT, take(b.advantages_BT), mask_BT, clip_low=algo.clip_low, clip_high=algo.clip_high,
        dual_clip=algo.dual_clip, tis_weights_BT=tis_BT, **agg,
    )
    metrics = stats.to_metrics()
    if algo.kl_mode == "loss" and algo.kl_coef > 0 and b.ref_logprobs_BT is not None:
        kl_term, kl_BT = kl_loss(lp_BT, take(b.ref_logprobs_BT), mask_BT, estimator=algo.kl_estimator, **agg)
        loss = loss + algo.kl_coef * kl_term
        metrics["algo/kl"] = float(masked_mean(kl_BT.detach(), mask_BT))
    ent_term, ent_mean = entropy_bonus(ent_BT, mask_BT, coef=algo.entropy_coef if need_entropy else 0.0, **agg)
    loss = loss + ent_term
    metrics["algo/entropy"] = float(masked_mean(ent_BT.detach(), mask_BT))
    return loss, metrics, int(mask_BT.sum())


# Per-token means (weighted by each micro-batch's trained tokens, then over all ranks), maxima,
# and per-mini-batch sums of micro-batch shares (like ``algo/loss``): how ``policy_update`` combines
# the micro-batches' metrics, so that N ranks report what one process reports for the same batch.
TOKEN_MEANS = ("algo/clipfrac", "algo/clipfrac_dual", "algo/approx_kl", "algo/ratio_mean", "algo/kl",
               "algo/entropy", "algo/value_clipfrac")
MAXIMA = ("algo/ratio_max",)


def _combine_token_metrics(token_sums: dict[str, float], tokens: float, maxima: dict[str, float],
                           device: torch.device) -> dict[str, float]:
    """Token-weighted means and maxima over every rank's micro-batches (collectives under torchrun;
    every rank has the same keys, since they come from the shared config)."""
    keys, max_keys = sorted(token_sums), sorted(maxima)
    *sums, total = all_sum([token_sums[k] for k in keys] + [tokens], device)
    peaks = all_max([maxima[k] for k in max_keys], device) if max_keys else []
    if total == 0:  # no trained token ran on any rank (train.skip_zero_advantage skipped every row): not measured
        return {}
    out = {k: v / total for k, v in zip(keys, sums)}
    out.update(zip(max_keys, peaks))
    return out


def _denominator(algo: AlgoConfig, mask_BT: torch.Tensor, rows: list[int]) -> float:
    if algo.loss_agg == "token_mean":
        return float(mask_BT[rows].sum())
    return float(mask_BT[rows].bool().any(dim=-1).sum())  # a row with no trained token adds no loss


def policy_update(
    policy,
    optimizer: torch.optim.Optimizer,
    batch: UpdateBatch,
    algo: AlgoConfig,
    layout: RowLayout,
    *,
    mini_batches: int = 1,
    epochs: int = 1,
    grad_clip: float | None = 1.0,
    temperature: float = 1.0,
    norm_len: float | None = None,
    scheduler=None,
    seed: int = 0,
    critic=None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    critic_scheduler=None,
    train_policy: bool = True,
    guide=None,
    skip_zero_advantage: bool = False,
) -> dict[str, float]:
    """Optimise ``policy`` (and ``critic``) on ``batch``; returns averaged ``algo/`` metrics. The rows run
    in ``layout``'s micro-batches (:class:`sleuth.train.layout.RowLayout`: padded, packed or with shared
    prefixes; its row and token budget). ``train_policy=False`` (the critic's warm-up): the critic alone
    is trained; the policy runs no forward, its optimizer and scheduler do not step. ``guide``
    (:class:`sleuth.train.guide.GuideRows`): supervised rows whose loss, times their coefficient, joins each
    mini-batch's gradient (split over the mini-batches as the rows are). ``skip_zero_advantage``: rows that add
    nothing to the gradient (:func:`_rows_with_signal`) run no forward or backward; the denominators still count
    them, so the gradient is the same (to float rounding: the micro-batches hold other rows)."""
    B = batch.input_ids_BT.shape[0]
    if not train_policy and critic is None:
        raise ValueError("train_policy=False (critic warm-up) needs a critic (algo.advantage=gae)")
    if mini_batches < 1 or mini_batches > B:
        raise ConfigError(f"train.mini_batches must be in [1, {B}] for a batch of {B} rows, got {mini_batches}")
    assert batch.old_logprobs_BT is not None or (epochs == 1 and mini_batches == 1), \
        "old logprobs from the update's own forward hold for one epoch of one mini-batch only"
    device = next(policy.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    stats = _UpdateStats(lr=optimizer.param_groups[0]["lr"],  # the rate this update uses (the scheduler moves it after)
                         critic_lr=critic_optimizer.param_groups[0]["lr"] if critic_optimizer is not None else None)
    optimizers = [o for o in (optimizer if train_policy else None, critic_optimizer) if o is not None]
    # A grad pass begins: drop every cast the rollout and the no-grad passes left in autocast's cache.
    # On torch builds before pytorch#165068 a cast made under no_grad was cached without its graph, and
    # the first mini-batch reusing it gave no nn.Linear weight a gradient, silently (on one GPU).
    torch.clear_autocast_cache()
    for _ in range(epochs):
        perm = torch.randperm(B, generator=gen).tolist() if mini_batches > 1 else list(range(B))
        for m in range(mini_batches):
            mb_rows = perm[m::mini_batches]
            (denom,) = all_sum([_denominator(algo, batch.loss_mask_BT, mb_rows)], device)
            _zero_grad(optimizer, critic_optimizer)
            finite, mb_loss, mb_value_loss = True, 0.0, 0.0
            live = (_rows_with_signal(batch, mb_rows, algo, critic is not None or not train_policy)
                    if skip_zero_advantage else mb_rows)
            stats.rows_skipped += len(mb_rows) - len(live)
            passes = _paired(layout.buckets(batch.input_ids_BT[live], batch.attention_mask_BT[live]) if live else [],
                             device)
            # no row with a gradient anywhere: one idle pass gives every weight its zero gradient, so the optimizer
            # steps as it would have (AdamW's moments and weight decay act on a zero gradient, not on none)
            for local in passes or [None]:
                rows = [mb_rows[0]] if local is None else [live[i] for i in local]
                loss, metrics, n_tokens = (_micro_loss(policy, batch, rows, algo, max(denom, 1.0), temperature, norm_len,
                                                       layout) if train_policy
                                           else (torch.zeros((), device=device), {}, 0))
                if critic is not None:
                    loss = loss + _critic_loss(critic, batch, rows, algo, max(denom, 1.0), norm_len, metrics, layout)
                    mb_value_loss += 0.0 if local is None else metrics.pop("algo/value_loss")  # shares: they add up
                if local is None:  # an idle pass, for the collectives to pair up
                    (loss * 0.0).backward()
                    stats.declare(metrics)  # a rank whose rows were all skipped still names every metric
                    continue
                finite = finite and bool(torch.isfinite(loss))
                (loss * world_info()[0]).backward()
                stats.add(metrics, n_tokens)
                mb_loss += float(loss.detach())  # micro losses share the denominator: they add up
            if guide is not None and train_policy:
                _guide_backward(policy, guide, m, mini_batches, batch, layout, stats, device)
            stats.losses.append(mb_loss)
            stats.value_losses.append(mb_value_loss)
            _optimizer_step(policy, critic, optimizers, grad_clip, all_ranks_true(finite, device), train_policy, stats,
                            skip=optimizer)
    _zero_grad(optimizer, critic_optimizer)  # the gradients are not held through the next rollout
    for sched in (scheduler if train_policy else None, critic_scheduler):
        if sched is not None:
            sched.step()
    return stats.result(device, critic=critic is not None, train_policy=train_policy)


def _rows_with_signal(batch: UpdateBatch, rows: list[int], algo: AlgoConfig, critic: bool) -> list[int]:
    """Those of ``rows`` whose loss has a gradient: a row whose advantage is 0 at every trained token (a group
    whose rewards are all equal under GRPO, Dr.GRPO or RLOO) or that has no trained token (``train.overlong:
    mask``) adds exactly 0 to the clipped policy loss, unless a term beside it reads its logprobs (a KL loss,
    an entropy bonus) or a critic trains on it: then every row."""
    kl_in_loss = algo.kl_mode == "loss" and algo.kl_coef > 0 and batch.ref_logprobs_BT is not None
    if critic or kl_in_loss or algo.entropy_coef != 0:
        return list(rows)
    signal_B = ((batch.advantages_BT != 0) & (batch.loss_mask_BT != 0)).any(dim=-1)
    return [r for r in rows if bool(signal_B[r])]


def _guide_backward(policy, guide, m: int, mini_batches: int, batch: UpdateBatch, layout: RowLayout, stats,
                    device) -> None:
    """Mini-batch ``m``'s share of the guide rows: ``coef`` x their token-mean causal-LM loss (the mean
    over every rank's guide tokens of this mini-batch) into the gradient, in micro-batches paired across
    ranks (an idle pass runs an RL row at weight 0)."""
    rows = guide.rows[m::mini_batches]
    tokens = sum(sum(1 for y in labels[1:] if y != -100) for _, labels in rows)
    (total,) = all_sum([float(tokens)], device)
    if total == 0:
        return
    world, nll = world_info()[0], 0.0
    buckets = layout.buckets(*batch_tensors(rows, pad_id=0)[::2]) if rows else []
    for local in _paired(buckets, device):
        if local is None:  # this rank has fewer guide micro-batches: an RL row, its own tokens as labels, weight 0
            ids = batch.input_ids_BT[:1, : int(batch.attention_mask_BT[0].sum())]
            (lm_loss(policy, ids.to(device), ids.to(device), torch.ones_like(ids).to(device)) * 0.0).backward()
            continue
        # pad id 0: padding is masked out of attention and labels
        ids_BT, labels_BT, mask_BT = (t.to(device) for t in batch_tensors([rows[i] for i in local], pad_id=0))
        part = lm_loss(policy, ids_BT, labels_BT, mask_BT, denominator=total)  # its share of the mean
        (guide.coef * part * world).backward()
        nll += float(part.detach())
    stats.guide_rows += len(rows)
    stats.guide_losses.append(nll)  # this rank's share: the ranks' shares add up to the mini-batch's mean


def _paired(buckets: list[list[int]], device) -> list[list[int] | None]:
    """Every rank runs as many forward/backward passes as the rank with the most micro-batches (a token
    budget splits ranks' rows differently): DDP and FSDP collectives must pair up. The extra passes
    (None) run one row at weight 0 and count for nothing."""
    (most,) = all_max([float(len(buckets))], device) if world_info()[0] > 1 else (len(buckets),)
    return buckets + [None] * (int(most) - len(buckets))


def _zero_grad(*optimizers) -> None:
    for opt in optimizers:
        if opt is not None:
            opt.zero_grad(set_to_none=True)


def _optimizer_step(policy, critic, optimizers, grad_clip, finite: bool, train_policy: bool, stats, *, skip) -> None:
    """Clip, then step every optimizer, unless the loss or the gradient norm is not finite (on any rank):
    then the step is skipped and counted (``skip``'s gradients dropped), the weights kept."""
    limit = grad_clip if grad_clip else float("inf")
    params = [p for p in policy.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, limit) if train_policy else torch.zeros(())
    if critic is not None:
        torch.nn.utils.clip_grad_norm_(critic.parameters(), limit)
    if not finite or not math.isfinite(float(norm)):
        stats.skipped += 1
        skip.zero_grad(set_to_none=True)
        return
    stats.grad_norms.append(float(norm))
    for opt in optimizers:
        opt.step()
    # autocast keeps its low-precision copy of each weight until its context exits, blind to
    # in-place updates: without this, the next mini-batch would run on the weights of the rollout
    torch.clear_autocast_cache()
    stats.steps += 1


@dataclass
class _UpdateStats:
    """The update's metrics as its micro-batches and optimizer steps report them."""

    lr: float
    critic_lr: float | None = None
    sums: dict = field(default_factory=dict)  # other per-micro-batch metrics, averaged
    token_sums: dict = field(default_factory=dict)
    maxima: dict = field(default_factory=dict)
    tokens: float = 0.0
    n: int = 0
    steps: int = 0
    skipped: int = 0
    rows_skipped: int = 0  # rows left out of the passes (no gradient), over the mini-batches and epochs
    guide_rows: int = 0
    guide_losses: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    value_losses: list = field(default_factory=list)

    def declare(self, metrics: dict[str, float]) -> None:
        """The token means and maxima of an idle pass, at weight 0: every rank combines the same keys."""
        for k in metrics:
            if k in TOKEN_MEANS:
                self.token_sums.setdefault(k, 0.0)
            elif k in MAXIMA:
                self.maxima.setdefault(k, -math.inf)

    def add(self, metrics: dict[str, float], n_tokens: int) -> None:
        self.tokens += n_tokens
        for k, v in metrics.items():
            if k in TOKEN_MEANS:
                self.token_sums[k] = self.token_sums.get(k, 0.0) + v * n_tokens
            elif k in MAXIMA:
                self.maxima[k] = max(self.maxima.get(k, -math.inf), v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v
        self.n += 1

    def result(self, device, *, critic: bool, train_policy: bool) -> dict[str, float]:
        def mean(xs):
            return sum(xs) / len(xs) if xs else float("nan")

        out = {k: v / max(self.n, 1) for k, v in self.sums.items()}
        out.update(_combine_token_metrics(self.token_sums, self.tokens, self.maxima, device))
        out["algo/loss"] = mean(self.losses)
        if critic:
            out["algo/value_loss"] = mean(self.value_losses)
        out["algo/grad_norm"] = mean(self.grad_norms)
        out["algo/optimizer_steps"] = self.steps
        if critic:
            out["algo/critic_warmup"] = float(not train_policy)  # 1: a critic-only step
        out["algo/skipped_steps"] = self.skipped
        (out["algo/rows_skipped"],) = all_sum([float(self.rows_skipped)], device)
        out["algo/lr"] = self.lr
        if self.critic_lr is not None:
            out["algo/critic_lr"] = self.critic_lr
        if self.guide_losses:
            out["guide/rows"] = float(self.guide_rows)
            out["guide/loss"] = mean(self.guide_losses)
        return out


def _critic_loss(critic, b: UpdateBatch, rows, algo: AlgoConfig, denom: float, norm_len, metrics,
                 layout: RowLayout) -> torch.Tensor:
    if b.returns_BT is None or b.old_values_BT is None:
        raise ValueError("a critic update needs returns and old values (algo.advantage=gae)")
    L = int(b.attention_mask_BT[rows].sum(-1).max())
    device = next(critic.parameters()).device
    idx = torch.tensor(rows, device=b.input_ids_BT.device)
    values_BT = critic_values(critic, b.input_ids_BT[idx, :L].to(device), b.attention_mask_BT[idx, :L].to(device),
                              packed=layout.packed)
    loss, clipfrac = value_loss(
        values_BT, b.old_values_BT[idx, :L].to(device), b.returns_BT[idx, :L].to(device),
        b.loss_mask_BT[idx, :L].to(device), clip=algo.value_clip, agg=algo.loss_agg, norm_len=norm_len,
        denominator=denom,
    )
    metrics["algo/value_loss"] = float(loss.detach())
    metrics["algo/value_clipfrac"] = float(clipfrac)
    return loss
