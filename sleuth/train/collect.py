"""The first half of a train step, ``collect``: questions in, a scored batch out, no forward pass of the
policy beyond its generation.

    draw the step's questions -> this rank's share -> rollouts (the engine) -> rewards
    [train.dynamic_sampling: more rounds until the step holds enough groups whose rewards differ]
    -> tensors -> failed searches left out -> [train.overlong] -> ScoredBatch

Everything here looks at trajectories and rewards only, so a group is judged (and dropped) before any
logprob pass is paid for it. :func:`sleuth.train.learn.learn` takes the batch on.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from sleuth.reward.trajectory import assign_rewards, reward_metrics
from sleuth.rollout.batching import trajectories_to_batch
from sleuth.train import distributed as par
from sleuth.train import reduce
from sleuth.train.failed_searches import leave_out, retriever_down_error
from sleuth.train.groups import group_diagnostics
from sleuth.train.guide import GuideRows
from sleuth.types import Question, StopReason, Trajectory

CUT = (StopReason.MAX_TOKENS, StopReason.CONTEXT_FULL)  # stopped by a token budget, not by the policy


@dataclass
class ScoredBatch:
    """One step's rollouts, scored and as tensors on the compute device (right-padded [B, T], the
    conventions of :mod:`sleuth.rollout.batching`)."""

    trajectories: list[Trajectory]
    questions: list[Question]  # this rank's questions (metrics reduce over their ids)
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    loss_mask_BT: torch.Tensor  # the sampled tokens, less those of trajectories whose search failed
    group_ids: list[str]  # GRPO groups (a failed-search trajectory in a group of its own)
    scores_B: torch.Tensor  # each trajectory's reward
    sampler_logprobs_BT: torch.Tensor  # the sampler's logprob of each sampled token (0 elsewhere)
    metrics: dict[str, float] = field(default_factory=dict)  # rollout/, reward/, groups/, sampling/ figures
    guide: GuideRows | None = None  # algo.guide_coef: gold transcripts of the groups that all failed
    started: float = 0.0  # perf_counter() when the step began
    cursor: dict | None = None  # rollout.async_steps: the question sampler's cursor after this batch's draws
    rollout_s: float = 0.0
    ref_logprobs_BT: torch.Tensor | None = None  # rollout.async_steps: the frozen reference's, from the worker

    def to(self, device) -> ScoredBatch:
        """The batch with its tensors on ``device`` (in place; asynchronous rollouts cross processes on the CPU)."""
        for name in ("input_ids_BT", "attention_mask_BT", "loss_mask_BT", "scores_B", "sampler_logprobs_BT",
                     "ref_logprobs_BT"):
            if (t := getattr(self, name)) is not None:
                setattr(self, name, t.to(device))
        return self


def collect(step: int, *, sampler, engine, fmt, retriever, reward_fn, cfg, ctx, peaks, latest_checkpoint,
            guide=None) -> ScoredBatch:
    """Step ``step``'s batch: every rank draws the same questions and rolls out its share (a tensor-
    parallel engine's ranks generate their group's together and each keeps its own)."""
    t0, tc = time.perf_counter(), cfg.train
    per_rank = tc.questions_per_step // ctx.world_size

    def roll():
        together, keep, mine = engine.share(sampler.next(tc.questions_per_step), per_rank)
        with par.gathered(engine.policy):  # FSDP: the full weights for generation
            trajs, metrics = engine.rollout(together, fmt, retriever, step=step, keep=keep)
            engine.release()  # a sleeping vLLM engine frees its memory for the update
        return trajs, metrics, mine

    # one scorer for both paths (rewards into t.reward): the reward settings cannot differ between them
    score = functools.partial(assign_rewards, reward_fn=reward_fn, search_cost=cfg.reward.search_cost,
                              read_corrective=cfg.reward.read_corrective)
    if tc.dynamic_sampling:
        trajs, metrics, mine, rewards, drawn = _rounds(roll, score, per_rank, tc.max_sampling_rounds, engine)
    else:
        (trajs, metrics, mine), rewards = roll(), None
        drawn = trajs
    rollout_s = time.perf_counter() - t0
    peaks.mark("rollout")
    rb = trajectories_to_batch(trajs, engine.tokenizer.pad_token_id)
    device = next(engine.policy.parameters()).device
    ids, att, mask = rb.input_ids_BT.to(device), rb.attention_mask_BT.to(device), rb.loss_mask_BT.to(device)
    group_ids, mask = _leave_out_failed_searches(trajs, rb.group_ids, mask, metrics, cfg, step, latest_checkpoint)
    if rewards is None:
        rewards = score(trajs)
        metrics.update(reward_metrics(trajs, rewards))
        metrics.update(group_diagnostics(trajs, rewards))
    rewards, mask = _overlong(trajs, rewards, mask, tc, metrics)
    turns = sum(t.num_turns for t in trajs)
    metrics["rollout/invalid_rate"] = sum(t.num_invalid for t in trajs) / max(turns, 1)
    return ScoredBatch(trajs, mine, ids, att, mask, group_ids, torch.tensor(rewards, dtype=torch.float32, device=device),
                       rb.old_logprobs_BT.to(device), metrics, started=t0, rollout_s=rollout_s,
                       guide=guide.rows_for(drawn) if guide is not None else None)


def _rounds(roll, score, per_rank: int, max_rounds: int, engine):
    """Dynamic sampling: rounds of rollouts until this rank holds ``per_rank`` groups whose rewards differ
    (every rank runs as many rounds as the rank that needs the most: generation is a collective under FSDP
    and tensor-parallel vLLM). Groups past the target, of a question already held, or without variance are
    dropped; short of the target after ``max_rounds``, groups without variance fill the step. The reward and
    group figures describe every drawn trajectory (the policy as sampled), ``sampling/*`` what was kept. Also
    returns every drawn trajectory: guidance (``algo.guide_coef``) takes the groups that all failed from them,
    the very groups dynamic sampling drops (their transcripts cost one supervised pass, not the group's)."""
    kept: dict[str, list[Trajectory]] = {}
    spare: dict[str, list[Trajectory]] = {}
    drawn_trajs: list[Trajectory] = []
    rounds_metrics: list[dict] = []
    mine_all: list[Question] = []
    rounds = drawn = 0
    device = next(engine.policy.parameters()).device
    while True:
        rounds += 1
        trajs, metrics, mine = roll()
        score(trajs)  # rewards into t.reward
        drawn_trajs += trajs
        rounds_metrics.append(metrics)
        mine_all += mine
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            groups[t.group_id].append(t)
        for qid, group in groups.items():
            drawn += 1
            if qid in kept or len(kept) >= per_rank:
                continue
            if len({t.reward for t in group}) > 1:
                kept[qid] = group
            elif qid not in spare:
                spare[qid] = group
        (need,) = reduce.all_max([float(per_rank - len(kept))], device)
        if need <= 0 or rounds >= max_rounds:
            break
    filled = 0
    for qid, group in spare.items():  # short of the target: groups without variance fill the step
        if len(kept) >= per_rank:
            break
        kept[qid] = group
        filled += 1
    trajs = [t for group in kept.values() for t in group]
    rewards = [float(t.reward) for t in trajs]
    all_rewards = [float(t.reward) for t in drawn_trajs]
    metrics = _merge_rounds(rounds_metrics)
    metrics.update(reward_metrics(drawn_trajs, all_rewards))
    metrics.update(group_diagnostics(drawn_trajs, all_rewards))
    metrics.update({"sampling/rounds": float(rounds), "sampling/drawn_groups": float(drawn),
                    "sampling/kept_groups": float(len(kept)), "sampling/filled_groups": float(filled),
                    "sampling/dropped_groups": float(drawn - len(kept))})
    by_id = {q.id: q for q in mine_all}
    return trajs, metrics, [by_id[qid] for qid in kept if qid in by_id], rewards, drawn_trajs


def _merge_rounds(rounds: list[dict]) -> dict[str, float]:
    """Rollout metrics of several rounds as one: means and shares weighted by each round's trajectories,
    everything else (counts, seconds) summed."""
    if len(rounds) == 1:
        return dict(rounds[0])
    weights = [r.get("rollout/trajectories", 1.0) for r in rounds]
    out: dict[str, float] = {}
    for key in rounds[0]:
        values = [r.get(key, 0.0) for r in rounds]
        if key.endswith(("_mean", "_frac", "_ratio")) or key.startswith("perf/"):
            out[key] = sum(v * w for v, w in zip(values, weights)) / max(sum(weights), 1.0)
        else:
            out[key] = sum(values)
    return out


def _overlong(trajs, rewards: list[float], mask_BT: torch.Tensor, tc, metrics: dict):
    """``train.overlong``: trajectories cut by a token budget kept, left out of the loss, or penalised."""
    cut = [t.stop_reason in CUT for t in trajs]
    metrics["rollout/overlong_trajectories"] = float(sum(cut))
    if tc.overlong == "keep":
        return rewards, mask_BT
    if tc.overlong == "mask":
        keep_B1 = torch.tensor([not c for c in cut], device=mask_BT.device)[:, None]
        return rewards, torch.where(keep_B1, mask_BT, torch.zeros_like(mask_BT))
    penalised = [r - tc.overlong_penalty if c else r for r, c in zip(rewards, cut)]
    for t, r in zip(trajs, penalised):
        t.reward = r
    return penalised, mask_BT


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
