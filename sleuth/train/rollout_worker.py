"""The rollout side of asynchronous training (``rollout.async_steps: N``): its own copy of the policy, the
step's ``collect`` from the weights of ``N`` updates ago.

Batch ``t`` is generated from version ``max(v0, t - 1 - N)`` of the weights, where version ``v`` is the
policy after update ``v`` and ``v0`` the step the run started (or resumed) at: with ``N = 1`` the worker
rolls out step ``t + 1`` while the trainer learns from step ``t`` (verl's one-step-off schedule). Taking
exactly that version, never a newer one that happens to be ready, makes a run reproducible whatever the
two sides' speeds; a batch more than ``N`` updates old cannot arise (the worker waits for the weights it
needs instead), so none is ever dropped.

:class:`WeightSlots` holds ``N + 1`` copies of the weights (shared memory across processes): version ``v``
goes into slot ``v mod (N + 1)``, where it overwrites version ``v - N - 1``, which only batch ``v`` was
generated from, and batch ``v`` has been taken by the trainer before update ``v`` ends. The worker waits
for the version it needs under the slots' lock.

:class:`RolloutWorker` builds what ``collect`` needs from the config (policy, tokenizer, format,
retriever, reward, guide, question sampler at the trainer's cursor) and the KL term's frozen reference, whose
logprobs it adds to each batch (the pass needs no current weights, so it runs beside the trainer's update) and is the same object in both modes:
``rollout.async_worker: process`` runs it in a spawned process (:func:`worker_main`, batches through a
queue), ``inline`` in the trainer's process, one after the other (the same schedule with no overlap: the
reference the process mode is tested against).
"""

from __future__ import annotations

import copy
import importlib
import os
import pickle
import time
import traceback
from dataclasses import replace
from pathlib import Path

import torch

from sleuth.build import build_format, build_retriever, build_reward, train_questions
from sleuth.models import DTYPES, add_lora, compute_autocast, load_policy, reference_dtype
from sleuth.train.checkpoint import latest_checkpoint
from sleuth.train.collect import ScoredBatch, collect
from sleuth.train.distributed import DistContext, full_tensors
from sleuth.train.engine import RolloutEngine
from sleuth.train.guide import make_guide
from sleuth.train.host_memory import release_freed_memory
from sleuth.train.layout import RowLayout
from sleuth.train.learn import frozen_logprobs
from sleuth.train.phase_memory import PhasePeaks
from sleuth.train.sampler import QuestionSampler
from sleuth.train.state import set_determinism

POLL_S = 0.5  # how often a wait looks at the stop flag and the other side's liveness


def version_for(step: int, async_steps: int, start: int) -> int:
    """The weights batch ``step`` is generated from: ``N`` updates before the one that trains on it,
    never before the run's first (``start``: the step it began or resumed at)."""
    return max(start, step - 1 - async_steps)


class WeightSlots:
    """``n`` copies of a module's state dict; with ``shared`` in shared memory, and ``versions`` / ``lock``
    from a multiprocessing context (``None``: one process)."""

    def __init__(self, model: torch.nn.Module, n: int, mp_context=None):
        state = model.state_dict()  # an FSDP model's: DTensors, whose shape is the whole tensor's
        self.slots = [{k: torch.empty(v.shape, dtype=v.dtype) for k, v in state.items()} for _ in range(n)]
        if mp_context is not None:
            for slot in self.slots:
                for t in slot.values():
                    t.share_memory_()
            self.versions = mp_context.Array("q", [-1] * n, lock=False)
            self.cond = mp_context.Condition()
        else:
            import threading

            self.versions, self.cond = [-1] * n, threading.Condition()

    def publish(self, version: int, model: torch.nn.Module) -> float:
        """Copy ``model``'s weights in as ``version`` (an FSDP model's gathered: a collective); the seconds it took."""
        t0 = time.perf_counter()
        i = version % len(self.slots)
        with self.cond, torch.no_grad():
            for k, v in full_tensors(model):
                self.slots[i][k].copy_(v.detach())
            self.versions[i] = version
            self.cond.notify_all()
        return time.perf_counter() - t0

    def load(self, version: int, model: torch.nn.Module, *, alive=lambda: True) -> float:
        """Wait until ``version`` is published, copy it into ``model``; the seconds spent waiting.
        ``alive()`` false (the other side gone) stops the wait with an error."""
        i = version % len(self.slots)
        t0 = time.perf_counter()
        with self.cond:
            while self.versions[i] != version:
                if self.versions[i] > version:  # overwritten: the schedule's invariant broken
                    raise AssertionError(f"weights version {version} was overwritten by {self.versions[i]}")
                if not alive():
                    raise RuntimeError(f"the trainer went away while the rollout worker waited for weights "
                                       f"version {version}")
                self.cond.wait(POLL_S)
            waited = time.perf_counter() - t0
            with torch.no_grad():
                model.load_state_dict(self.slots[i])
        return waited


class RolloutWorker:
    """Builds the rollout side from ``cfg`` and rolls out one step at a time (see the module doc)."""

    def __init__(self, cfg, out: Path, *, cursor: dict, start: int, slots: WeightSlots, alive=lambda: True,
                 ctx: DistContext | None = None):
        # a vLLM engine stays awake: the update runs while it generates, so sleeping would free nothing for it
        cfg = replace(cfg, rollout=replace(cfg.rollout, vllm_sleep=False))
        self.cfg, self.out, self.start, self.slots, self.alive = cfg, Path(out), start, slots, alive
        self.ctx = ctx or DistContext()  # rollout.workers: this rollout rank's place (its share, its collectives)
        mc = cfg.model
        self.policy, self.tokenizer = load_policy(mc.name_or_path, dtype="float32", device=mc.device,
                                                  gguf_file=mc.gguf_file)
        if mc.lora_rank > 0:
            self.policy = add_lora(self.policy, rank=mc.lora_rank, alpha=mc.lora_alpha, targets=mc.lora_targets)
        self.policy.eval().requires_grad_(False)
        self.device = next(self.policy.parameters()).device
        # the KL term's frozen reference lives here: its pass needs no current weights, so it runs beside the
        # trainer's update instead of before it (a copy of the starting weights; LoRA: the policy's base)
        self.use_ref = cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none"
        self.ref = None
        if self.use_ref and mc.lora_rank == 0:
            self.ref = copy.deepcopy(self.policy).to(DTYPES[reference_dtype(mc)])
        self.layout = RowLayout.choose(cfg.train, self.policy, warn=False)
        self.fmt, self.retriever, self.reward_fn = build_format(cfg), build_retriever(cfg), build_reward(cfg)
        self.guide = make_guide(cfg, self.tokenizer, self.fmt)
        self.sampler = QuestionSampler(train_questions(cfg), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        self.sampler.load_state(cursor)
        self.engine = RolloutEngine(cfg, self.policy, self.tokenizer, self.ctx, self.out)
        self.version = None  # the weights the policy holds

    def batch(self, step: int) -> ScoredBatch:
        """Step ``step``'s batch from its weights version; ``async/*`` figures and the cursor after it added."""
        version = version_for(step, self.cfg.rollout.async_steps, self.start)
        waited = 0.0
        if version != self.version:
            waited = self.slots.load(version, self.policy, alive=self.alive)
            self.version = version
            if self.engine.vllm is None and self.cfg.rollout.backend == "vllm":
                self.engine.start()  # built from (and pushed) the first weights it holds
            else:
                self.engine.push()  # vLLM: the new weights into its engine; HF: nothing
        t0 = time.perf_counter()
        with compute_autocast(self.cfg.model.dtype, self.device):
            b = collect(step, sampler=self.sampler, engine=self.engine, fmt=self.fmt, retriever=self.retriever,
                        reward_fn=self.reward_fn, cfg=self.cfg, ctx=self.ctx, peaks=PhasePeaks(self.device),
                        latest_checkpoint=lambda: latest_checkpoint(self.out), guide=self.guide)
            if self.use_ref:
                b.ref_logprobs_BT = frozen_logprobs(self.ref, self.policy, self.layout, b.input_ids_BT,
                                                    b.attention_mask_BT, b.loss_mask_BT,
                                                    max(self.cfg.rollout.temperature, 1e-6))
        release_freed_memory()  # CPU: what the rollout freed back to the system (train/host_memory)
        b.metrics.update({"async/weights_version": float(version), "async/worker_wait_s": waited,
                          "async/worker_rollout_s": time.perf_counter() - t0})
        b.cursor = self.sampler.state()
        return b

    def close(self) -> None:
        self.engine.close()


def worker_main(cfg, out, cursor, start, first_step, last_step, slots, queue, stop, parent_pid, registrars,
                threads) -> None:
    """The spawned process: batches ``first_step..last_step`` into ``queue`` (each as ``("batch", step, b)``),
    or ``("error", exception, traceback text)`` on failure; ends early when ``stop`` is set."""
    for name in registrars:  # names the parent registered (the tiny model, the toy world)
        importlib.import_module(name)
    if threads:
        torch.set_num_threads(threads)

    def alive() -> bool:
        return not stop.is_set() and os.getppid() == parent_pid

    worker = None
    try:
        set_determinism(cfg, DistContext())  # the trainer's settings (train.deterministic, tf32): a spawned
        # process starts with torch's defaults, so generation and the reference pass would differ from inline
        worker = RolloutWorker(cfg, out, cursor=cursor, start=start, slots=slots, alive=alive)
        if threads:
            torch.set_num_threads(threads)  # again: loading the embedded tiny model sets its own
        for step in range(first_step, last_step + 1):
            if not alive():
                break
            queue.put(("batch", step, worker.batch(step).to("cpu")))
        while alive():  # the queue's tensors live in this process's shared memory until they are read
            stop.wait(POLL_S)
    except BaseException as e:  # noqa: BLE001 - everything goes to the trainer, which raises it
        text = traceback.format_exc()
        try:
            pickle.dumps(e)  # the queue pickles in a thread of its own, where a failure would lose the error
        except Exception:  # noqa: BLE001 - an exception that does not pickle: its text goes alone
            e = None
        queue.put(("error", e, text))
    finally:
        if worker is not None:
            worker.close()
