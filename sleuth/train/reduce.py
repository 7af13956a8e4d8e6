"""Combining what the ranks of a ``torchrun`` job computed, so that N ranks report and train on what one
process would: sums and minima over ranks, whitening over the whole step's batch, metrics (counts
summed, durations the slowest rank's, rates averaged), and the eval rows gathered back into order.
Every function is a collective when a process group is joined (every rank must call it) and the
plain single-process result otherwise. With ``rollout.workers`` the job's ranks split into training and
rollout ranks (:func:`sleuth.train.distributed.init_distributed`); each rank's collectives then run over
the ranks of its own role (:func:`group`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sleuth.algo.aggregate import masked_whiten

# Metrics that are counts or throughputs are summed over ranks; durations take the slowest rank;
# everything else (rates, means, losses) is averaged (ranks hold equal shares of the rows).
SUMMED = {
    "rollout/trajectories", "rollout/queries", "rollout/distinct_queries", "rollout/retrieval_calls",
    "rollout/invalid", "rollout/retrieval_errors", "rollout/sampled_tokens", "rollout/injected_tokens",
    "perf/sampled_tokens_per_s", "perf/tokens_per_s",
    "rollout/failed_search_trajectories",
    "algo/loss", "algo/value_loss",  # each rank's share is divided by the global token/row count: they add up
    "guide/loss", "guide/rows",
}


_GROUP = None  # rollout.workers: the process group of this rank's role; None: every rank


def set_group(group) -> None:
    """The process group this rank's collectives run over from now on (None: every rank)."""
    global _GROUP
    _GROUP = group


def group():
    """The process group of this rank's collectives (None: the whole job)."""
    return _GROUP


def world_info() -> tuple[int, bool]:
    """``(world size, whether a process group is joined)``: the ranks of this rank's role."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(_GROUP), True
    return 1, False


def all_ranks_true(finite: bool, device: torch.device) -> bool:
    """True only if ``finite`` is True on every rank."""
    world, on = world_info()
    if not on:
        return finite
    t = torch.tensor([1.0 if finite else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_GROUP)
    return bool(t.item() > 0)


def global_whiten(values_BT: torch.Tensor, mask_BT: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """``masked_whiten`` with the mean and (unbiased) variance of the whole step's batch: under
    torchrun the masked tokens of every rank (verl whitens the whole batch; N ranks must equal one
    process). Two all-reduces (sum and count, then the squared deviations); one process: exactly
    ``masked_whiten``."""
    _, on = world_info()
    if not on:
        return masked_whiten(values_BT, mask_BT, eps=eps)
    m_BT = mask_BT.bool()
    x_BT = torch.where(m_BT, values_BT.detach(), 0.0).double()  # [B, T]
    first = torch.stack([x_BT.sum(), m_BT.sum().double()])  # [sum, count]
    dist.all_reduce(first, group=_GROUP)
    count = first[1]
    mean = first[0] / count.clamp(min=1)
    sq = torch.where(m_BT, (x_BT - mean).square(), 0.0).sum().reshape(1)
    dist.all_reduce(sq, group=_GROUP)
    var = torch.where(count >= 2, sq[0] / (count - 1).clamp(min=1), torch.zeros_like(sq[0]))
    out_BT = (x_BT - mean) * torch.rsqrt(var + eps)
    return torch.where(m_BT, out_BT, 0.0).to(values_BT.dtype)


def reduce_metrics(metrics: dict[str, float], *, world_size: int, question_ids: list[str]) -> dict[str, float]:
    """Combine per-rank metrics: counts summed (``SUMMED``, ``rollout/stop/*``), durations (``*_s``)
    the slowest rank's, the rest averaged; ``rollout/questions`` counts the distinct question ids
    over all ranks (equal to the step's questions when the shards are disjoint)."""
    if world_size <= 1 or not dist.is_initialized():
        return {**metrics, "rollout/questions": float(len(set(question_ids)))}
    gathered_: list = [None] * world_size
    dist.all_gather_object(gathered_, (metrics, list(question_ids)), group=_GROUP)
    keys = sorted({k for m, _ in gathered_ for k in m})
    out: dict[str, float] = {}
    for k in keys:
        vals = [float(m.get(k, 0.0)) for m, _ in gathered_]
        if k in SUMMED or k.startswith("rollout/stop/"):
            out[k] = sum(vals)
        elif k.endswith("_s") and not k.endswith("_per_s"):
            out[k] = max(vals)
        else:
            out[k] = sum(vals) / world_size
    out["rollout/questions"] = float(len({q for _, ids in gathered_ for q in ids}))
    return out


def _reduced(values: list[float], device: torch.device | str, op) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()):
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op, group=_GROUP)
    return t.tolist()


def all_sum(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """``values`` summed over every rank (a collective under torchrun); as they are in one process."""
    return _reduced(values, device, dist.ReduceOp.SUM)


def all_max(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """``values``' maxima over every rank (a collective under torchrun); as they are in one process."""
    return _reduced(values, device, dist.ReduceOp.MAX)


def interleave(shards: list[list]) -> list:
    """Undo ``items[rank::world]`` sharding: shard ``r`` holds items ``r, r + N, r + 2N, …`` of the
    original list (N = ``len(shards)``); returns them in the original order."""
    n = sum(len(s) for s in shards)
    world = len(shards)
    for r, s in enumerate(shards):
        if len(s) != len(range(r, n, world)):
            raise ValueError(f"shard {r} holds {len(s)} items; a {world}-way split of {n} gives it "
                             f"{len(range(r, n, world))}")
    return [shards[i % world][i // world] for i in range(n)]


def all_gather_objects(obj, *, world_size: int) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` in one process."""
    if world_size <= 1 or not dist.is_initialized():
        return [obj]
    out: list = [None] * world_size
    dist.all_gather_object(out, obj, group=_GROUP)
    return out
