"""The RL loop, readable top to bottom:

    questions -> rollout -> rewards -> advantages -> update -> log -> evaluate every N -> checkpoint every M

Data-parallel runs (``torchrun --nproc_per_node N -m sleuth train …``): every rank draws the same
questions, keeps its own contiguous share (whole GRPO groups stay on one rank), rolls out and
scores them, and joins the update (DDP, or FSDP with ``train.parallel: fsdp``; see
``sleuth.train.distributed``); metrics are combined over ranks (counts summed, rates averaged);
every rank evaluates its share of the eval questions (rank r: questions r, r + N, …), rank 0 logs
the whole set's figures and writes checkpoints.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from sleuth.build import (
    build_format,
    build_retriever,
    build_reward,
    load_eval_questions,
    probe_retriever,
    train_questions,
)
from sleuth.config import Config
from sleuth.config_file import to_dict, validate
from sleuth.errors import ConfigError
from sleuth.eval.evaluate import evaluate
from sleuth.eval.metrics import EvalPerf, EvalSummary, summarize
from sleuth.models import compute_autocast
from sleuth.train import distributed as par
from sleuth.train import reduce
from sleuth.train.async_rollout import AsyncRollouts
from sleuth.train.checkpoint import latest_checkpoint
from sleuth.train.collect import ScoredBatch, collect
from sleuth.train.distributed import init_distributed
from sleuth.train.engine import RolloutEngine
from sleuth.train.guide import make_guide
from sleuth.train.host_memory import limit_kernel_caches, release_freed_memory, resident_gib
from sleuth.train.layout import RowLayout
from sleuth.train.learn import learn, sampler_logprobs_are_old
from sleuth.train.logging import MetricsLogger, truncate_logs
from sleuth.train.memory_plan import check_memory
from sleuth.train.phase_memory import PhasePeaks
from sleuth.train.rollout_ranks import RankRollouts
from sleuth.train.rundir import check_run_dir, warn_changed_settings, write_run_config
from sleuth.train.sampler import CollapseWatch, QuestionSampler
from sleuth.train.sampler_gap import SamplerGap
from sleuth.train.state import (
    build_state,
    check_parallel_settings,
    restore_state,
    save_state,
    seed_everything,
    set_determinism,
    time_limit_reached,
)


class Trainer:
    """Holds the run's objects; ``run()`` is the loop. Built from a Config and an output dir."""

    # rollout.async_steps: the worker's batches (sleuth.train.async_rollout), or the rollout rank's (rollout_ranks)
    rollouts: AsyncRollouts | RankRollouts | None = None

    def __init__(self, cfg: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True):
        limit_kernel_caches()  # the Python API's way in: before the weights are loaded (host_memory)
        self.cfg, self.out = validate(cfg), Path(out_dir)
        self.ctx = init_distributed(cfg.rollout.workers)  # rollout.workers: this is a training rank
        if self.ctx.is_main:
            check_run_dir(self.out, resume=resume, overwrite=overwrite)
        sharded = check_parallel_settings(cfg, self.ctx)
        self.memory_plan = check_memory(cfg, self.ctx)  # before any weight is loaded; refuses what cannot fit
        seed_everything(cfg.train.seed)
        self.deterministic = set_determinism(cfg, self.ctx)
        self.state = build_state(cfg, self.ctx, sharded)  # policy, reference, critic, optimizers
        self.policy, self.tokenizer, self.optimizer = self.state.policy, self.state.tokenizer, self.state.optimizer
        self.sampler_gap = SamplerGap(cfg.train.sampler_check_every, cfg.train.sampler_max_gap,
                                      device=self.state.compute_device, dtype=cfg.model.dtype)
        self.layout = RowLayout.choose(cfg.train, self.policy, warn=self.ctx.is_main)  # padded, packed or shared
        self._peaks = PhasePeaks(self.state.compute_device, self.memory_plan)  # each step starts its own
        self.fmt, self.retriever, self.reward_fn = build_format(cfg), build_retriever(cfg), build_reward(cfg)
        self.guide = make_guide(cfg, self.tokenizer, self.fmt)  # algo.guide_coef > 0: gold transcripts by question
        self.sampler = QuestionSampler(train_questions(cfg), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        if len(self.sampler.questions) < cfg.train.questions_per_step:
            raise ConfigError(f"train.questions_per_step={cfg.train.questions_per_step} but data.train_files hold "
                             f"{len(self.sampler.questions)} questions; lower it or add questions")
        if cfg.rollout.max_turns > 0:
            probe_retriever(self.retriever, cfg)
        self.eval_questions = load_eval_questions(cfg)  # train.eval_limit per data source of each eval file
        self.watch, self.step = CollapseWatch(), 0
        self.last_eval: tuple[EvalSummary, list[dict]] | None = None
        if resume:
            warn_changed_settings(self.out / "config.yaml", cfg)
            self._resume()
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_run_config(cfg, self.out)  # atomically; a file already holding these settings is kept as is
            truncate_logs(self.out, self.step)  # a resumed run re-does the steps after its checkpoint
        self.engine = RolloutEngine(cfg, self.policy, self.tokenizer, self.ctx, self.out)
        if cfg.rollout.async_steps:
            self._start_async()  # the worker holds the run's vLLM engine, if any
        else:
            self.engine.start()  # vLLM: built after a resume, so that it starts from the current weights
        self.logger = MetricsLogger(self.out, total_steps=cfg.train.total_steps, tensorboard=cfg.train.tensorboard,
                                    wandb=cfg.train.wandb, config=to_dict(cfg), enabled=self.ctx.is_main,
                                    progress=progress, resume=resume and self.step > 0)

    def compute(self):
        """The context every forward of the run executes in (autocast to ``model.dtype``)."""
        return compute_autocast(self.cfg.model.dtype, self.state.compute_device)

    def close(self) -> None:
        """Stop an asynchronous rollout worker; shut the vLLM engine down (while the process group is alive)."""
        if self.rollouts is not None:
            self.rollouts.close()
        self.engine.close()

    def _start_async(self) -> None:
        """A rollout worker from the current weights and question cursor (at start, resume and rollback)."""
        if self.rollouts is not None:
            self.rollouts.close()
        if self.cfg.rollout.workers:  # the batches come from this rank's rollout rank (sleuth.train.rollout_ranks)
            self.rollouts = RankRollouts(self.cfg, self.policy, self.ctx, cursor=self.sampler.state(), step=self.step)
        else:
            self.rollouts = AsyncRollouts(self.cfg, self.out, self.policy, cursor=self.sampler.state(), step=self.step,
                                          ctx=self.ctx)

    # -- checkpoints -------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Every rank calls this (FSDP gathers the full state); rank 0 writes the checkpoint.

        A step whose checkpoint already holds the current state (the trainer resumed from it and has
        not stepped since, e.g. ``--resume`` of a finished run) is not written again: rewriting the
        checkpoint ``latest`` names could not be atomic. Every rank makes the same decision."""
        if getattr(self, "_checkpointed_step", None) == self.step:
            return self.out / "checkpoints" / f"step_{self.step:06d}" if self.ctx.is_main else None
        self._checkpointed_step = self.step
        cursor = {**self.sampler.state(), "sampler_gap": self.sampler_gap.state()}
        return save_state(self.state, self.out, self.step, cursor, is_main=self.ctx.is_main,
                          keep=self.cfg.train.keep_checkpoints)

    def _resume(self, ckpt: Path | None = None) -> None:
        """Load a checkpoint (the run's latest by default; none: start fresh)."""
        ckpt = ckpt or latest_checkpoint(self.out)
        if ckpt is None:
            return
        ts = restore_state(self.state, ckpt)
        self.sampler.load_state(ts["cursor"])
        self.sampler_gap.load_state(ts["cursor"].get("sampler_gap"))
        self.step = self._checkpointed_step = ts["step"]

    # -- one step ----------------------------------------------------------------------------
    def backend(self):
        """What generates the rollouts (``sleuth.train.engine.RolloutEngine.backend``)."""
        return self.engine.backend()

    def rollout(self, questions, *, greedy=False, group_size=None, step=0, keep=None):
        return self.engine.rollout(questions, self.fmt, self.retriever, step=step, greedy=greedy,
                                   group_size=group_size, keep=keep)

    def train_step(self) -> tuple[dict, list]:
        """One step, ``learn(collect(step))``, in ``model.dtype``; ``(metrics, trajectories)``."""
        self._peaks = PhasePeaks(self.state.compute_device, self.memory_plan)  # CUDA: mem/<phase>_peak_gib
        try:
            with self.compute():
                batch = self.collect()
                metrics = self.learn(batch)
            if self.rollouts is not None:  # the updated weights to the rollout worker
                metrics.update(self.rollouts.publish(self.step, self.policy))
        except torch.OutOfMemoryError as e:  # where the memory went, beside the plan printed at start
            e.add_note(f"sleuth: step {self.step + 1} ran out of device memory; {self._peaks.report()}")
            raise
        metrics = reduce.reduce_metrics(metrics, world_size=self.ctx.world_size,
                                        question_ids=[q.id for q in batch.questions])
        release_freed_memory()  # CPU: what the step freed back to the system (train/host_memory)
        if self._peaks.host:  # CPU: what the process holds between steps (grows with a leak)
            metrics["mem/resident_gib"] = resident_gib()
        return metrics, batch.trajectories

    def collect(self) -> ScoredBatch:
        """This step's questions rolled out, scored and as tensors (``sleuth.train.collect``); with
        ``rollout.async_steps``, the rollout worker's batch (the question cursor moves to after its draws)."""
        if self.rollouts is not None:
            batch = self.rollouts.next(self.step)
            self.sampler.load_state(batch.cursor)
            return batch
        return collect(self.step, sampler=self.sampler, engine=self.engine, fmt=self.fmt, retriever=self.retriever,
                       reward_fn=self.reward_fn, cfg=self.cfg, ctx=self.ctx, peaks=self._peaks,
                       latest_checkpoint=lambda: latest_checkpoint(self.out), guide=self.guide)

    def learn(self, batch: ScoredBatch) -> dict:
        """One update on ``batch`` (``sleuth.train.learn``); the step's metrics, this rank's."""
        return learn(batch, step=self.step, cfg=self.cfg, state=self.state, engine=self.engine, layout=self.layout,
                     sampler_gap=self.sampler_gap, peaks=self._peaks)

    def sampler_logprobs_are_old(self) -> bool:
        return sampler_logprobs_are_old(self.cfg, self.engine)

    def evaluate(self, *, no_search: bool = False) -> dict:
        """Greedy, one sample per question, the same rollout code (``sleuth.eval.evaluate``);
        flat ``eval/<metric>`` and ``eval/<source>/<metric>`` keys. The full summary and rows of
        the latest evaluation (an ``EvalSummary`` and the rows) stay in ``self.last_eval``."""
        if not self.eval_questions:
            return {}
        world, rank = self.ctx.world_size, self.ctx.rank
        mine = self.eval_questions[rank::world]  # under torchrun every rank evaluates a share
        perf = EvalPerf()
        rows: list[dict] = []
        if mine:
            # a rank's own vLLM engine evaluates its share (a tensor-parallel one would need the group's)
            engine = self.backend() if self.engine.tp == 1 else None
            self.policy.eval()
            with self.compute():
                summary, rows = evaluate(self.policy, self.tokenizer, mine, self.fmt, self.retriever, self.cfg.rollout,
                                         topk=self.cfg.retrieval.topk, batch_size=self.cfg.eval.batch_size,
                                         no_search=no_search, seed=self.cfg.train.seed, backend=engine)
            perf = summary.perf
        if world > 1 or not mine:
            shards = reduce.all_gather_objects((rows, perf), world_size=world)
            rows = reduce.interleave([r for r, _ in shards])
            summary = summarize(rows)
            wall = max(p.seconds for _, p in shards)  # the slowest rank's
            summary.perf = EvalPerf(seconds=wall, generate_s=max(p.generate_s for _, p in shards),
                                    retrieve_s=max(p.retrieve_s for _, p in shards),
                                    questions_per_s=len(rows) / wall if wall > 0 else 0.0, ranks=world)
        self.last_eval = (summary, rows)
        out = {f"eval/{m}": getattr(summary, m) for m in ("em", "f1", "cover_em", "searches")}
        out["eval/questions"] = float(summary.n)
        for src, s in summary.by_source.items():
            out.update({f"eval/{src}/{m}": getattr(s, m) for m in ("em", "f1", "searches")})
        return out

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        tc = self.cfg.train
        last: dict = {}
        saved_at = None  # the step last checkpointed, so the final save does not write it twice
        t_loop = time.perf_counter()
        while self.step < tc.total_steps:
            self.step += 1
            t_step = time.perf_counter()
            metrics, trajs = self.train_step()
            out_of_time = self.step < tc.total_steps and self._out_of_time(t_loop, time.perf_counter() - t_step)
            due = (tc.eval_every and self.step % tc.eval_every == 0) or self.step == tc.total_steps or out_of_time
            if due:
                with par.gathered(self.policy):  # a collective under FSDP: every rank enters
                    eval_metrics = self.evaluate()  # every rank its share; all get the whole set's figures
                if self.ctx.is_main:
                    metrics.update(eval_metrics)
            self.logger.log(self.step, metrics)
            self.logger.log_samples(self.step, trajs, tc.log_samples)
            last = metrics
            warning = self.watch.check(metrics["reward/mean"], metrics.get("rollout/invalid_rate", 0.0),
                                       metrics.get("algo/entropy", math.nan))  # nan: no row ran (skipped)
            if warning and self._on_collapse(warning):
                break
            if tc.save_every and self.step % tc.save_every == 0:
                self.save()
                saved_at = self.step
            if out_of_time:
                if self.ctx.is_main:
                    print(f"sleuth: train.time_limit_minutes ({tc.time_limit_minutes:g}) reached after step "
                          f"{self.step} of {tc.total_steps}: evaluated and saved as a last step; --resume continues",
                          file=sys.stderr)
                break
        if saved_at != self.step:
            self.save()
        if self.rollouts is not None:
            self.rollouts.close(finished=True)  # nothing more to roll out
        self.logger.close()
        return last

    def _out_of_time(self, t_loop: float, step_s: float) -> bool:
        """Whether another step like the last one would end past ``train.time_limit_minutes`` since the
        loop began: the slowest rank's clocks (a collective under torchrun), so every rank stops after the
        same step."""
        limit = self.cfg.train.time_limit_minutes
        if limit is None:
            return False
        elapsed, step_s = reduce.all_max([time.perf_counter() - t_loop, step_s], self.state.compute_device)
        return time_limit_reached(limit, elapsed, step_s)

    def _on_collapse(self, warning: str) -> bool:
        """Handle a suspected collapse; True stops the loop."""
        import warnings

        warnings.warn(warning)
        action = self.cfg.train.on_collapse
        if action == "stop":
            return True
        if action == "rollback":
            ckpt = latest_checkpoint(self.out)
            if ckpt is not None:
                self._resume(ckpt)
                self.watch.history.clear()
                self.engine.push()
                if self.rollouts is not None:
                    self._start_async()  # from the checkpoint's weights and cursor
        return False
