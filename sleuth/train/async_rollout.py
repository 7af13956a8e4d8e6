"""The trainer's side of asynchronous rollouts (``rollout.async_steps: N`` > 0): batches from a rollout
worker that runs ``N`` steps ahead, the weights published back after every update.

    worker:  collect(t + 1) from weights v(t - N)   ->  queue  ->  trainer: learn(batch t + 1)
    trainer: learn(t) -> publish weights v(t)  ->  worker

The schedule and the weight slots are :mod:`sleuth.train.rollout_worker`'s. ``rollout.async_worker:
process`` (the default) spawns the worker with its own threads (``rollout.async_threads``; the trainer
keeps the rest of ``train.cpu_threads``) or on its own device placement (``model.device``); ``inline`` rolls
out in the trainer's process before each update, the same batches with no overlap (under torchrun too, each
rank its share: the reference a split of the ranks, ``rollout.workers``, is tested against).

The batch was sampled by older weights than the trainer holds, so the update takes the old logprobs from
the current weights (the proximal policy of decoupled PPO; in one epoch of one mini-batch the update's own
forward, detached: :func:`sleuth.train.learn.old_from_update`) and, with ``algo.tis_cap``, weighs each
token by the truncated ratio to the behaviour policy whose logprobs the sampler returned
(:func:`sleuth.algo.losses.tis_weights`). Figures per step: ``async/staleness`` (updates between the
batch's weights and the trainer's), ``async/trainer_wait_s`` (the trainer idle for the batch),
``async/worker_rollout_s`` / ``async/worker_wait_s`` (the worker busy / idle for weights),
``async/publish_s`` (the weight copy), ``async/dropped_batches`` (0 by construction: the worker waits for
the weights it needs rather than generate from staler ones).

A worker that fails raises its exception here with its traceback; one that dies (killed, out of memory)
stops the run with an error naming it, never a hang.
"""

from __future__ import annotations

import os
import queue as queue_mod
import time
from pathlib import Path

import torch

from sleuth.named import registrars
from sleuth.train.collect import ScoredBatch
from sleuth.train.rollout_worker import POLL_S, RolloutWorker, WeightSlots, version_for, worker_main


def split_threads(cfg) -> tuple[int, int]:
    """``(trainer, worker)`` CPU threads for the process mode: ``rollout.async_threads`` for the worker
    (default: half of ``train.cpu_threads``, or of torch's threads), the rest (at least one) for the trainer."""
    total = cfg.train.cpu_threads or torch.get_num_threads()
    worker = cfg.rollout.async_threads or max(1, total // 2)
    return max(1, total - worker), worker


def raise_sent_error(item: tuple, who: str, setting: str):
    """Raise the ``("error", exception or None, traceback text)`` a rollout worker or rank sent: its exception
    with its traceback as a note, or (one that did not pickle) a RuntimeError holding the text."""
    _, error, text = item
    if error is None:
        raise RuntimeError(f"{who} failed:\n{text}")
    error.add_note(f"raised in {who} ({setting}), its traceback:\n{text}")
    raise error


def received(b: ScoredBatch, step: int, *, n: int, start: int, t0: float, device) -> ScoredBatch:
    """A batch the trainer got at ``perf_counter() - t0`` seconds of waiting: the schedule checked, moved to
    ``device``, ``async/*`` figures added, the step's clock started at ``t0``."""
    waited = time.perf_counter() - t0
    version = int(b.metrics["async/weights_version"])
    assert version == version_for(step, n, start), (step, version)
    staleness = step - 1 - version
    assert 0 <= staleness <= n, (step, version)
    b.to(device)
    b.metrics.update({"async/staleness": float(staleness), "async/trainer_wait_s": waited,
                      "async/dropped_batches": 0.0})
    b.started, b.rollout_s = t0, waited  # perf/step_s and perf/train_s: the trainer's own clock
    return b


class AsyncRollouts:
    def __init__(self, cfg, out: Path, policy: torch.nn.Module, *, cursor: dict, step: int, ctx=None):
        self.cfg, self.n, self.start = cfg, cfg.rollout.async_steps, step
        self.device = next(policy.parameters()).device
        self.proc = self.worker = None
        self.publish_s = 0.0
        if cfg.rollout.async_worker == "inline":
            self.slots = WeightSlots(policy, self.n + 1)
            self.slots.publish(step, policy)
            self.worker = RolloutWorker(cfg, out, cursor=cursor, start=step, slots=self.slots, ctx=ctx)
            return
        mp = torch.multiprocessing.get_context("spawn")
        self.slots = WeightSlots(policy, self.n + 1, mp)
        self.slots.publish(step, policy)
        trainer_threads, worker_threads = split_threads(cfg)
        if self.device.type == "cpu":
            torch.set_num_threads(trainer_threads)
        self.queue, self.stop = mp.Queue(), mp.Event()
        self.proc = mp.Process(target=worker_main, name="sleuth-rollout-worker", daemon=True,
                               args=(cfg, out, cursor, step, step + 1, cfg.train.total_steps, self.slots, self.queue,
                                     self.stop, os.getpid(), registrars(), worker_threads))
        self.proc.start()

    def next(self, step: int) -> ScoredBatch:
        """Step ``step``'s batch (waiting for the worker), its ``async/*`` figures added."""
        t0 = time.perf_counter()
        b = self.worker.batch(step) if self.worker is not None else self._receive(step)
        return received(b, step, n=self.n, start=self.start, t0=t0, device=self.device)

    def _receive(self, step: int) -> ScoredBatch:
        while True:
            try:
                item = self.queue.get(timeout=POLL_S)
                break
            except queue_mod.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the rollout worker (process {self.proc.pid}) exited with code "
                                       f"{self.proc.exitcode} before sending step {step}'s batch; its output "
                                       "above says why") from None
        if item[0] == "error":
            raise_sent_error(item, "the rollout worker", "rollout.async_steps")
        _, sent, b = item
        assert sent == step, (sent, step)
        return b

    def publish(self, step: int, policy: torch.nn.Module) -> dict[str, float]:
        """The weights after update ``step`` to the worker; ``async/publish_s``."""
        return {"async/publish_s": self.slots.publish(step, policy)}

    def close(self, finished: bool = False) -> None:
        """Stop the worker (it exits after its current rollout), whether the run ``finished`` or not; idempotent."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.proc is not None:
            self.stop.set()
            self.proc.join(timeout=60)
            if self.proc.is_alive():
                self.proc.terminate()
                self.proc.join(timeout=10)
            self.queue.close()
            self.proc = None
