"""The first half of a train step, ``collect``: questions in, a scored batch out, no forward pass of the
policy beyond its generation.

    draw the step's questions -> this rank's share -> rollouts (the engine) -> tensors
    -> failed searches left out -> rewards -> ScoredBatch

Everything here looks at trajectories and rewards only, so a group can be judged (and, later,
dropped) before any logprob pass is paid for it. :func:`sleuth.train.learn.learn` takes the batch on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sleuth.reward.trajectory import assign_rewards, reward_metrics
from sleuth.rollout.batching import trajectories_to_batch
from sleuth.train import distributed as par
from sleuth.train import reduce
from sleuth.train.failed_searches import leave_out, retriever_down_error
from sleuth.types import Question, Trajectory


@dataclass
class ScoredBatch:
    """One step's rollouts, scored and as tensors on the compute device (right-padded [B, T], the
    conventions of :mod:`sleuth.rollout.batching`)."""

    trajectories: list[Trajectory]
    questions: list[Question]  # this rank's share of the step's questions (metrics reduce over their ids)
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor  # the sampled tokens, less those of trajectories whose search failed
    group_ids: list[str]  # GRPO groups (a failed-search trajectory in a group of its own)
    scores_B: torch.Tensor  # each trajectory's reward
    sampler_logprobs_BT: torch.Tensor  # the sampler's logprob of each sampled token (0 elsewhere)
    metrics: dict[str, float] = field(default_factory=dict)  # rollout/ and reward/ figures
    started: float = 0.0  # perf_counter() when the step began
    rollout_s: float = 0.0


def collect(step: int, *, sampler, engine, fmt, retriever, reward_fn, cfg, ctx, peaks, latest_checkpoint) -> ScoredBatch:
    """Step ``step``'s batch: every rank draws the same questions and rolls out its share (a tensor-
    parallel engine's ranks generate their group's together and each keeps its own)."""
    t0 = time.perf_counter()
    questions = sampler.next(cfg.train.questions_per_step)
    together, keep, mine = engine.share(questions, cfg.train.questions_per_step // ctx.world_size)
    with par.gathered(engine.policy):  # FSDP: the full weights for generation
        trajs, metrics = engine.rollout(together, fmt, retriever, step=step, keep=keep)
        engine.release()  # a sleeping vLLM engine frees its memory for the update
    rollout_s = time.perf_counter() - t0
    peaks.mark("rollout")
    rb = trajectories_to_batch(trajs, engine.tokenizer.pad_token_id)
    device = next(engine.policy.parameters()).device
    ids, att, mask = rb.input_ids_BT.to(device), rb.attention_mask_BT.to(device), rb.loss_mask_BT.to(device)
    group_ids, mask = _leave_out_failed_searches(trajs, rb.group_ids, mask, metrics, cfg, step, latest_checkpoint)
    rewards = assign_rewards(trajs, reward_fn)  # each trajectory's reward, also kept in t.reward
    metrics.update(reward_metrics(trajs, rewards))
    turns = sum(t.num_turns for t in trajs)
    metrics["rollout/invalid_rate"] = sum(t.num_invalid for t in trajs) / max(turns, 1)
    return ScoredBatch(trajs, mine, ids, att, mask, group_ids, torch.tensor(rewards, dtype=torch.float32, device=device),
                       rb.old_logprobs_BT.to(device), metrics, started=t0, rollout_s=rollout_s)


def _leave_out_failed_searches(trajs, group_ids: list[str], mask_BT: torch.Tensor, metrics: dict, cfg, step: int,
                               latest_checkpoint):
    """:func:`sleuth.train.failed_searches.leave_out` (a collective under torchrun); a step whose
    every search failed on every rank stops the run (RetrieverDownError) before the update."""
    errors, ok = reduce.all_sum([sum(t.num_retrieval_errors for t in trajs), sum(t.num_searches for t in trajs)],
                                mask_BT.device)
    if errors and not ok:
        raise retriever_down_error(trajs, cfg, step, int(errors), latest_checkpoint())
    group_ids, mask_BT, n_failed = leave_out(trajs, group_ids, mask_BT)
    metrics["rollout/failed_search_trajectories"] = float(n_failed)
    return group_ids, mask_BT
