"""The ``sleuth sft`` run, top to bottom:

    transcripts (synthesized, or read and filtered) -> OUT/transcripts.jsonl -> encode as the rollout
    tokenises -> steps of ``sft.batch_size`` transcripts (train/sft.supervised_step) -> log -> checkpoint

The run directory is a Sleuth run like ``sleuth train``'s (``config.yaml``, ``metrics.jsonl``,
``checkpoints/`` with ``latest``), so ``sleuth train``, ``eval`` and ``ask`` take it as ``--model``
(``model.name_or_path``), and eval reads its format, top-k and budgets from its ``config.yaml``.
The model, the optimizer and the schedule are ``sleuth train``'s (:func:`sleuth.train.state.build_state`:
float32 master weights, autocast in ``model.dtype``, LoRA with ``model.lora_rank``).

``train.time_limit_minutes`` stops the run after the step after which one more like it would end past the limit
(saved as a last step), as it stops ``sleuth train``; ``--resume`` continues.

Exact resume: the transcripts are read back from ``OUT/transcripts.jsonl``; the order of each epoch
is a permutation drawn from ``train.seed`` and the epoch number, so step ``s`` always takes the same
transcripts, and the checkpoint's step, optimizer, schedule and RNG state are all that is needed.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from sleuth.build import build_format, build_retriever, probe_retriever, train_questions
from sleuth.config import Config
from sleuth.config_file import to_dict, validate
from sleuth.errors import UserError
from sleuth.models import compute_autocast
from sleuth.rollout.chat import ChatRenderer
from sleuth.sft.synthesize import synthesize
from sleuth.data.transcripts import Transcript, encode, load_transcripts, read_transcripts, write_transcripts
from sleuth.train.checkpoint import latest_checkpoint
from sleuth.train.distributed import init_distributed
from sleuth.train.host_memory import limit_kernel_caches, release_freed_memory
from sleuth.train.logging import MetricsLogger, truncate_logs
from sleuth.train.rundir import check_run_dir, warn_changed_settings, write_run_config
from sleuth.train.sft import supervised_step
from sleuth.train.state import (build_state, make_scheduler, restore_state, save_state, seed_everything,
                                set_determinism, time_limit_reached)

TRANSCRIPTS = "transcripts.jsonl"


def _report(counts: Counter, log) -> None:
    kept = sum(n for k, n in counts.items() if k.startswith("kept"))
    log(f"sft transcripts: {kept} kept of {sum(counts.values())}")
    for reason, n in sorted(counts.items()):
        log(f"  {reason}: {n}")


def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The order of transcript indices in ``epoch`` (a permutation fixed by the seed and the epoch)."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def step_indices(n: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Transcripts of optimizer step ``step`` (1-based): the next ``batch_size`` of the epochs' orders
    laid end to end."""
    start = (step - 1) * batch_size
    orders: dict[int, list[int]] = {}
    out = []
    for pos in range(start, start + batch_size):
        epoch, i = divmod(pos, n)
        if epoch not in orders:
            orders[epoch] = epoch_order(n, epoch, seed)
        out.append(orders[epoch][i])
    return out


class SFTTrainer:
    """Holds the run's objects; ``run()`` is the loop."""

    def __init__(self, cfg: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, log=None):
        limit_kernel_caches()  # the Python API's way in: before the weights are loaded (train/host_memory)
        self.cfg, self.out = validate(cfg), Path(out_dir)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        ctx = init_distributed()
        if ctx.world_size > 1:
            raise UserError("sleuth sft runs in one process; start it without torchrun")
        check_run_dir(self.out, resume=resume, overwrite=overwrite)
        seed_everything(cfg.train.seed)
        self.deterministic = set_determinism(cfg, ctx)  # train.deterministic / tf32, as sleuth train sets them
        sc = cfg.sft
        state_cfg = replace(cfg, algo=replace(cfg.algo, kl_coef=0.0, advantage="grpo"),
                            train=replace(cfg.train, lr=sc.lr, warmup_steps=sc.warmup_steps))
        self.state = build_state(state_cfg, ctx, sharded=False)  # the policy, its AdamW (no reference)
        self.render = ChatRenderer(self.state.tokenizer, build_format(cfg), cfg.rollout.use_chat_template)
        self.transcripts = self._transcripts(resume)
        if not self.transcripts:
            raise UserError("no transcript to train on (every one was dropped; the counts above say why)")
        self.rows = [encode(t, self.render) for t in self.transcripts]
        per_epoch = len(self.rows) / sc.batch_size
        self.total_steps = sc.steps or max(1, math.ceil(sc.epochs * per_epoch))
        self.state.scheduler = make_scheduler(self.state.optimizer, replace(
            state_cfg, train=replace(state_cfg.train, total_steps=self.total_steps)))
        self.step = 0
        if resume:
            warn_changed_settings(self.out / "config.yaml", cfg)
            ckpt = latest_checkpoint(self.out)
            if ckpt is not None:
                self.step = restore_state(self.state, ckpt)["step"]
        self.out.mkdir(parents=True, exist_ok=True)
        write_run_config(cfg, self.out)
        truncate_logs(self.out, self.step)
        self.logger = MetricsLogger(self.out, total_steps=self.total_steps, config=to_dict(cfg), progress=progress,
                                    resume=resume and self.step > 0, label="sft", tensorboard=cfg.train.tensorboard,
                                    wandb=cfg.train.wandb)
        pad = self.state.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.state.tokenizer.eos_token_id

    def _transcripts(self, resume: bool) -> list[Transcript]:
        """The run's transcripts: read back on resume, else built (and written) now."""
        cfg, path = self.cfg, self.out / TRANSCRIPTS
        if resume and path.is_file():
            transcripts = load_transcripts(path)  # as written: the same rows, so the same step order
            self.log(f"sft: {len(transcripts)} transcripts read back from {path}")
            return transcripts
        if cfg.sft.source == "trajectories":
            transcripts, counts = read_transcripts(cfg.sft.files, cfg.sft.min_reward)
        else:
            questions = train_questions(cfg)
            if not questions:
                raise UserError("sft.source=synthesize needs questions: set data.train_files")
            retriever = build_retriever(cfg)
            probe_retriever(retriever, cfg)
            t0 = time.perf_counter()
            transcripts, counts = synthesize(questions, retriever, self.render.fmt, self.render, cfg)
            self.log(f"sft: synthesized from {len(questions)} questions in {time.perf_counter() - t0:.1f} s")
        _report(counts, self.log)
        if cfg.sft.max_transcripts is not None:
            transcripts = transcripts[:cfg.sft.max_transcripts]
        self.out.mkdir(parents=True, exist_ok=True)
        write_transcripts(path, transcripts)
        return transcripts

    def compute(self):
        return compute_autocast(self.cfg.model.dtype, self.state.compute_device)

    def train_step(self) -> dict[str, float]:
        sc, tc = self.cfg.sft, self.cfg.train
        t0 = time.perf_counter()
        idx = step_indices(len(self.rows), self.step, sc.batch_size, tc.seed)
        lr = self.state.optimizer.param_groups[0]["lr"]
        self.state.model.train()
        with self.compute():
            out = supervised_step(self.state.model, self.state.optimizer, [self.rows[i] for i in idx], self.pad_id,
                                  micro_batch_size=tc.micro_batch_size,
                                  max_tokens=tc.max_tokens_per_micro_batch, grad_clip=tc.grad_clip)
        self.state.scheduler.step()
        release_freed_memory()  # CPU: what the step freed back to the system (train/host_memory)
        seconds = time.perf_counter() - t0
        return {"sft/loss": out["loss"], "sft/trained_tokens": out["tokens"], "sft/skipped_steps": out["skipped"],
                "sft/epoch": self.step * sc.batch_size / len(self.rows), "algo/grad_norm": out["grad_norm"],
                "algo/lr": lr, "perf/step_s": seconds,
                "perf/tokens_per_s": sum(len(self.rows[i][0]) for i in idx) / max(seconds, 1e-9)}

    def save(self) -> Path | None:
        return save_state(self.state, self.out, self.step, {"step": self.step, "transcripts": len(self.rows)},
                          is_main=True, keep=self.cfg.train.keep_checkpoints)

    def run(self) -> dict:
        tc = self.cfg.train
        last: dict = {}
        saved_at = self.step if self.step else None  # a resumed run's checkpoint holds this step
        t_loop = time.perf_counter()
        while self.step < self.total_steps:
            self.step += 1
            t_step = time.perf_counter()
            last = self.train_step()
            self.logger.log(self.step, last)
            if tc.save_every and self.step % tc.save_every == 0:
                self.save()
                saved_at = self.step
            now = time.perf_counter()
            if self.step < self.total_steps and time_limit_reached(tc.time_limit_minutes, now - t_loop, now - t_step):
                self.log(f"sleuth: train.time_limit_minutes ({tc.time_limit_minutes:g}) reached after step "
                         f"{self.step} of {self.total_steps}: saved as a last step; --resume continues")
                break
        if saved_at != self.step:
            self.save()
        self.logger.close()
        return last
