"""The second half of a train step, ``learn``: a scored batch in, updated weights and metrics out.

    old policy's logprobs (the sampler's where they are the same quantity; the update's own forward where the
    old policy is the current one) -> the reference's (the batch's,
    computed by the rollout worker, under rollout.async_steps)
    -> the critic's values -> advantages -> policy_update -> the weights pushed to the engine

:func:`sleuth.train.collect.collect` makes the batch.
"""

from __future__ import annotations

import time

import torch

from sleuth.models import compute_autocast
from sleuth.train import distributed as par
from sleuth.train.collect import ScoredBatch
from sleuth.train.offload import on_device
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update


def sampler_logprobs_are_old(cfg, engine) -> bool:
    """Whether the rollout's own logprobs serve as the old policy's: one on-policy pass (one epoch,
    one mini-batch), sampled by our HF decode from the weights being trained at the training
    temperature, so they are ``log_softmax(logits / T)`` of the same tokens (equal to float
    rounding). Not with TIS, which compares the two, nor with vLLM (another engine), nor with
    asynchronous rollouts (older weights)."""
    tc = cfg.train
    return (tc.epochs == 1 and tc.mini_batches == 1 and cfg.algo.tis_cap is None and cfg.rollout.async_steps == 0
            and engine.samples_from_policy
            and cfg.rollout.temperature > 0)


def old_from_update(cfg, policy) -> bool:
    """Whether the update's own forward, detached, gives the old (proximal) policy's logprobs, so that no
    separate no-grad pass is needed: one epoch of one mini-batch (no row's forward sees weights another row's
    gradient has moved), no KL in the reward (the advantages need the old logprobs before the update), and no
    dropout in training mode (the two passes would draw different masks). The ratio to the old policy is then
    1 with the policy gradient's derivative, as in decoupled PPO with the proximal policy the current one; the
    sampler's logprobs still enter through TIS (``algo.tis_cap``)."""
    tc = cfg.train
    return (tc.epochs == 1 and tc.mini_batches == 1 and not (cfg.algo.kl_mode == "reward" and cfg.algo.kl_coef > 0)
            and dropout_free(policy))


def dropout_free(model) -> bool:
    """No dropout module with p > 0 and no ``*dropout*`` / ``*pdrop*`` rate above 0 in a model config found
    among ``model``'s modules (LoRA's ``lora_dropout`` is a module; attention dropout is a config rate)."""
    seen = set()  # transformers' layers share their model's config: each read once
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            return False
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict") and id(config) not in seen:
            seen.add(id(config))
            if any(isinstance(v, float) and v > 0 and ("dropout" in k or "pdrop" in k)
                   for k, v in config.to_dict().items()):
                return False
    return True


def learn(b: ScoredBatch, *, step: int, cfg, state, engine, layout, sampler_gap, peaks) -> dict[str, float]:
    """One update on ``b``; returns the step's metrics (``b.metrics`` first, then the update's and perf/)."""
    tc, metrics = cfg.train, b.metrics
    temp = max(cfg.rollout.temperature, 1e-6)
    ids, att, mask = b.input_ids_BT, b.attention_mask_BT, b.loss_mask_BT
    policy = state.policy
    reuse = sampler_logprobs_are_old(cfg, engine)
    if reuse and not sampler_gap.needs_forward(step):
        old = b.sampler_logprobs_BT  # the same quantity: one no-grad forward saved
    elif (not reuse or sampler_gap.recompute) and old_from_update(cfg, policy):
        # the update's own forward, detached (asynchronous rollouts, TIS, vLLM, or the sampler's logprobs found
        # too far from the trainer's): one forward saved
        old = None
        if reuse:
            metrics["train/old_logprobs_recomputed"] = 1.0
    else:
        with par.gathered(policy):  # FSDP: the full weights for the no-grad forward
            old = layout.logprobs(policy, ids, att, temperature=temp, needed_BT=mask)
        if reuse:  # a check step, or recomputing since a check found the gap too large
            metrics.update(sampler_gap.compare(b.sampler_logprobs_BT, old, mask, step))
    ref = b.ref_logprobs_BT  # asynchronous rollouts: the worker computed them (it holds the reference)
    if ref is None and state.use_ref:
        ref = reference_logprobs(state, layout, ids, att, mask, temp)
    values = None
    if state.critic is not None:
        with par.gathered(state.critic):
            values = layout.values(state.critic, ids, att)
    peaks.mark("logprob passes", "reference pass")  # old (unless the sampler's), reference, critic values
    adv, returns = compute_advantages(cfg.algo, b.scores_B, b.group_ids, mask, old_logprobs_BT=old,
                                      ref_logprobs_BT=ref, values_BT=values)
    batch = UpdateBatch(ids, att, mask, adv, old, sampler_logprobs_BT=b.sampler_logprobs_BT, ref_logprobs_BT=ref,
                        returns_BT=returns, old_values_BT=values)
    policy.train()
    # FSDP: the update casts weights at each use (an autocast cache would gather a full copy of the model)
    with compute_autocast(cfg.model.dtype, state.compute_device, cache=not state.sharded):
        metrics.update(policy_update(
            state.model, state.optimizer, batch, cfg.algo, layout=layout, mini_batches=tc.mini_batches, epochs=tc.epochs,
            grad_clip=tc.grad_clip, temperature=temp, scheduler=state.scheduler, seed=tc.seed * 1_000_003 + step,
            critic=state.critic_model, critic_optimizer=state.critic_opt, critic_scheduler=state.critic_scheduler,
            norm_len=cfg.rollout.max_context_tokens, train_policy=not 0 < step <= tc.critic_warmup_steps,
            guide=b.guide, skip_zero_advantage=tc.skip_zero_advantage,
        ))
    peaks.mark("update", "update", "optimizer step")
    metrics.update(engine.push())  # the next rollout samples from the updated weights (vLLM)
    total = time.perf_counter() - b.started
    metrics.update({
        **layout.cost(ids, att),
        "perf/trained_token_share": float(mask.sum() / att.sum()),
        "perf/step_s": total,
        "perf/train_s": total - b.rollout_s,
        "perf/tokens_per_s": float(att.sum()) / max(total, 1e-9),
        **peaks.figures,
    })
    return metrics


def reference_logprobs(state, layout, ids, att, mask, temp) -> torch.Tensor:
    """The frozen reference's logprobs at the trained tokens: a separate copy, or (LoRA) the policy
    without adapters."""
    assert state.ref is not None or hasattr(state.policy, "disable_adapter"), "no reference held (async: the worker's)"
    return frozen_logprobs(state.ref, state.policy, layout, ids, att, mask, temp, device=state.compute_device,
                           offloaded=state.ref_offloaded)


def frozen_logprobs(ref, policy, layout, ids, att, mask, temp, *, device=None, offloaded=False) -> torch.Tensor:
    """``ref``'s logprobs at the trained tokens, or with ``ref`` None (LoRA) ``policy``'s without its adapters
    (the trainer's reference pass, and the rollout worker's under ``rollout.async_steps``)."""
    if ref is not None:
        with on_device(ref, device, offloaded=offloaded), par.gathered(ref):
            return layout.logprobs(ref, ids, att, temperature=temp, needed_BT=mask)
    with policy.disable_adapter():
        return layout.logprobs(policy, ids, att, temperature=temp, needed_BT=mask)
