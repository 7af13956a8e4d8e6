"""Asynchronous rollouts over a split of the ``torchrun`` ranks (``rollout.workers: K`` with
``rollout.async_steps: N``; verl's one-step-off split): ranks ``0..K-1`` train (DDP or FSDP among themselves),
ranks ``K..2K-1`` generate. Rollout rank ``i`` runs the :class:`~sleuth.train.rollout_worker.RolloutWorker` a single
process would spawn, as training rank ``i``'s share of every step (its context: rank ``i`` of ``K``; dynamic
sampling's collectives run over the rollout ranks), and sends each batch to training rank ``i``. Training rank
``i`` broadcasts its weights to rollout rank ``i`` after every update (every training rank holds the same
weights, so each pair moves its own copy; under FSDP the training ranks gather each tensor first, together):

    training rank i:  learn(t) -> weights v(t) --(the pair's weights group, asynchronous broadcast)--> rollout rank i
    rollout rank i:   collect(t + 1) from v(t - N) --(the pair's batch group, send)--> training rank i

The schedule is the single process's (:func:`~sleuth.train.rollout_worker.version_for`): batch ``t`` comes from
the weights after update ``t - 1 - N``. Versions are needed one after another, so each is broadcast once, in
order, and received once; versions no batch needs are not sent. The weights of update ``t`` go when batch
``t + 1`` is asked for (they do not change before; a run that stops after update ``t`` sends them not at all).
A broadcast does not hold the trainer up: the weights are copied into one of ``N + 1`` buffers and go while it
works on (a buffer is reused once its earlier broadcast completed, which the schedule guarantees: version
``v - N - 1`` was received before batch ``v`` was generated, and batch ``v`` was taken before update ``v``).
Weights and batches use two process groups, so a pending broadcast never stands in front of a batch. Each
broadcast carries a header, the version, or -1: stop. The pair's groups wait up to ``PAIR_TIMEOUT`` (six hours).

At the start (and on resume) training rank ``i`` sends the step it starts at, the question sampler's cursor,
the last step and the size of its weights (checked). When training ends before the last step
(``train.time_limit_minutes``, a collapse stop), :meth:`RankRollouts.close` takes the batches the rollout rank
can still make with the weights it was sent (``N`` of them) and sends the stop header it waits on next. A
training rank that fails waits for nothing: the job goes down with it (torchrun stops the other ranks). A
rollout rank that fails sends its exception to its training rank, which raises it with the rollout rank's
traceback, and fails itself; one that dies is torchrun's to report (its agent stops the job naming the rank
and its exit code).
"""

from __future__ import annotations

import pickle
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from sleuth.train.async_rollout import raise_sent_error, received
from sleuth.train.collect import ScoredBatch
from sleuth.train.distributed import full_tensors
from sleuth.train.rollout_worker import RolloutWorker, version_for

STOP = -1.0  # the header of the broadcast that ends a rollout rank's loop


class StopRollouts(Exception):
    """The training rank said stop (it ended before the last step)."""


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The floating-point tensors of ``model``'s state dict, in its order (both sides hold the same model; an
    FSDP model's are DTensors, whose ``numel`` is the whole tensor's)."""
    return [v for v in model.state_dict().values() if v.is_floating_point()]


def _comm_device(group) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _needed(version: int, start: int, last: int, n: int) -> bool:
    """Whether some batch of steps ``start + 1 .. last`` is generated from ``version``."""
    return start < last if version == start else version_for(last, n, start) >= version > start


class PairWeights:
    """The rollout rank's side: ``load(version, model)`` receives the broadcasts up to ``version`` (the interface
    of :class:`~sleuth.train.rollout_worker.WeightSlots`); the stop header raises :class:`StopRollouts`."""

    def __init__(self, ctx):
        self.ctx, self.buf, self.received = ctx, None, None

    def load(self, version: int, model: torch.nn.Module, *, alive=lambda: True) -> float:
        tensors = _weights(model)
        if self.buf is None:
            self.buf = torch.empty(1 + sum(t.numel() for t in tensors), device=_comm_device(self.ctx.weights_group))
        t0 = time.perf_counter()
        while self.received is None or self.received < version:
            dist.broadcast(self.buf, src=self.ctx.peer, group=self.ctx.weights_group)
            head = int(self.buf[0].item())
            if head == STOP:
                raise StopRollouts
            assert self.received is None or head == self.received + 1, (head, self.received)
            self.received = head
        assert self.received == version, (self.received, version)
        waited = time.perf_counter() - t0
        with torch.no_grad():
            offset = 1
            for t in tensors:
                t.copy_(self.buf[offset: offset + t.numel()].view_as(t))
                offset += t.numel()
        return waited


def serve_rollouts(cfg, out: Path, ctx) -> None:
    """A rollout rank's whole run: its training rank's batches, one step after another, until the last step or
    a stop."""
    head = [None]
    dist.broadcast_object_list(head, src=ctx.peer, group=ctx.batch_group)
    start, cursor, last, size = head[0]
    if start >= last:  # nothing left to roll out
        return
    threads = cfg.rollout.async_threads or cfg.train.cpu_threads
    worker = None
    try:
        worker = RolloutWorker(cfg, out, cursor=cursor, start=start, slots=PairWeights(ctx), ctx=ctx)
        mine = 1 + sum(t.numel() for t in _weights(worker.policy))
        if mine != size:  # an internal invariant: both sides build the same model from the same config
            raise AssertionError(f"the training rank sends {size - 1} weights, this rank's model holds {mine - 1}")
        if threads and worker.device.type == "cpu":
            torch.set_num_threads(threads)
        for step in range(start + 1, last + 1):
            try:
                b = worker.batch(step)
            except StopRollouts:
                return
            dist.send_object_list([("batch", step, b.to("cpu"))], dst=ctx.peer, group=ctx.batch_group)
    except Exception as e:
        text = traceback.format_exc()
        sent = e
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001 - an exception that does not pickle both ways: its text goes alone
            sent = None
        dist.send_object_list([("error", sent, text)], dst=ctx.peer, group=ctx.batch_group)
        raise  # this rank fails too (torchrun names it)
    finally:
        if worker is not None:
            worker.close()


class RankRollouts:
    """The training rank's side (the interface of :class:`~sleuth.train.async_rollout.AsyncRollouts`)."""

    publish_s = 0.0  # the last send's copy of the weights into its buffer

    def __init__(self, cfg, policy: torch.nn.Module, ctx, *, cursor: dict, step: int):
        self.ctx, self.n, self.start, self.last = ctx, cfg.rollout.async_steps, step, cfg.train.total_steps
        self.device = next(policy.parameters()).device
        self.me = dist.get_rank()
        size = 1 + sum(t.numel() for t in _weights(policy))
        dist.broadcast_object_list([(step, cursor, self.last, size)], src=self.me, group=ctx.batch_group)
        dev = _comm_device(ctx.weights_group)
        self.bufs = [torch.empty(size, device=dev) for _ in range(self.n + 1)]
        self.works: list = [None] * (self.n + 1)
        self.taken, self.published, self.closed, self.failed = step, None, False, False
        self.pending: tuple[int, torch.nn.Module] | None = None
        self.publish(step, policy)
        self._flush()

    def next(self, step: int) -> ScoredBatch:
        t0 = time.perf_counter()
        self._flush()  # the weights of the last update go now, when the run goes on
        item = self._receive()
        if item[0] == "batch":
            self.taken = item[1]
        if item[0] == "error":
            self.failed = True
            raise_sent_error(item, f"rollout rank {self.ctx.peer}", "rollout.workers")
        _, sent, b = item
        assert sent == step, (sent, step)
        return received(b, step, n=self.n, start=self.start, t0=t0, device=self.device)

    def _receive(self):
        box = [None]
        dist.recv_object_list(box, src=self.ctx.peer, group=self.ctx.batch_group)
        return box[0]

    def publish(self, step: int, policy: torch.nn.Module) -> dict[str, float]:
        """The weights after update ``step`` for the rollout rank (when a batch needs them): sent when the next
        batch is asked for (the weights do not change before that), so a run that stops after this update sends
        nothing more than its stop. ``async/publish_s``: the previous send's copy."""
        took, self.publish_s = self.publish_s, 0.0
        if _needed(step, self.start, self.last, self.n):
            self.pending = (step, policy)
        return {"async/publish_s": took}

    def _flush(self) -> None:
        if self.pending is None:
            return
        (step, policy), self.pending = self.pending, None
        t0 = time.perf_counter()
        buf = self._buffer(step)
        buf[0] = float(step)
        with torch.no_grad():
            offset = 1
            for _, t in full_tensors(policy):  # FSDP: each tensor gathered over the training ranks (all flush together)
                if t.is_floating_point():
                    buf[offset: offset + t.numel()].copy_(t.detach().reshape(-1))
                    offset += t.numel()
        self.works[step % len(self.bufs)] = dist.broadcast(buf, src=self.me, group=self.ctx.weights_group,
                                                           async_op=True)
        self.published = step
        self.publish_s = time.perf_counter() - t0

    def _buffer(self, version: int) -> torch.Tensor:
        i = version % len(self.bufs)
        if self.works[i] is not None:
            self.works[i].wait()
            self.works[i] = None
        return self.bufs[i]

    def close(self, finished: bool = False) -> None:
        """``finished`` (the run ended, early or not): take the batches the rollout rank can still make with the
        weights it was sent, then send the stop it waits for when it has steps left; a rollout rank's error
        among them is raised. Otherwise (an error on this side) nothing is waited for: the job is going down and
        torchrun stops the other ranks. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.pending = None
        if not finished or self.failed or self.published is None:  # aborting, gone, or it never started
            return
        made = min(self.last, self.published + 1 + self.n)  # its batches from the versions it was sent
        for _ in range(self.taken + 1, made + 1):
            item = self._receive()
            if item[0] == "error":
                self.failed = True
                raise_sent_error(item, f"rollout rank {self.ctx.peer}", "rollout.workers")
        if made < self.last:  # it waits for version published + 1: the stop instead
            buf = self._buffer(self.published + 1)
            buf[0] = STOP
            dist.broadcast(buf, src=self.me, group=self.ctx.weights_group)
        for i, w in enumerate(self.works):
            if w is not None:
                w.wait()
                self.works[i] = None
        if self.bufs[0].device.type == "cuda":
            torch.cuda.synchronize()  # NCCL's wait() orders the stream only: the sends done before the group goes
