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
from sleuth.eval.evaluate import evaluate
from sleuth.eval.metrics import EvalPerf, EvalSummary, summarize
from sleuth.models import compute_autocast
from sleuth.reward.trajectory import assign_rewards, reward_metrics
from sleuth.rollout.batching import trajectories_to_batch
from sleuth.rollout.hf_cache import supports_reuse
from sleuth.rollout.hf_static import hf_backend
from sleuth.rollout.loop import run_rollouts
from sleuth.train import distributed as par
from sleuth.train import reduce
from sleuth.train.checkpoint import latest_checkpoint
from sleuth.train.distributed import init_distributed
from sleuth.train.failed_searches import leave_out, retriever_down_error
from sleuth.train.forward import batched_logprobs, batched_values, length_buckets, padding_share, supports_packing
from sleuth.train.logging import MetricsLogger, truncate_logs
from sleuth.train.memory_plan import check_memory
from sleuth.train.offload import on_device
from sleuth.train.phase_memory import PhasePeaks
from sleuth.train.prefix_share import computed_share, prefix_buckets
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
)
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update


class Trainer:
    """Holds the run's objects; ``run()`` is the loop. Built from a Config and an output dir."""

    def __init__(self, cfg: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True):
        self.cfg, self.out = validate(cfg), Path(out_dir)
        self.ctx = init_distributed()
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
        self.packed = self._packing()
        self.shared = self._sharing()
        self.fmt, self.retriever, self.reward_fn = build_format(cfg), build_retriever(cfg), build_reward(cfg)
        self.sampler = QuestionSampler(train_questions(cfg), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        if len(self.sampler.questions) < cfg.train.questions_per_step:
            raise ValueError(f"train.questions_per_step={cfg.train.questions_per_step} but data.train_files hold "
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
        # the vLLM rollout engine, built after a resume so that it starts from the current weights
        self.vllm = self._build_vllm() if cfg.rollout.backend == "vllm" else None
        self._hf = None  # the HF-family rollout backend, built at the first rollout and kept (a compiled step too)
        self.logger = MetricsLogger(self.out, total_steps=cfg.train.total_steps, tensorboard=cfg.train.tensorboard,
                                    wandb=cfg.train.wandb, config=to_dict(cfg), enabled=self.ctx.is_main,
                                    progress=progress, resume=resume and self.step > 0)

    def _packing(self) -> bool:
        """``train.remove_padding`` where the model supports it (else a warning: the run goes padded)."""
        if not self.cfg.train.remove_padding:
            return False
        if supports_packing(self.policy):
            return True
        if self.ctx.is_main:
            config = getattr(self.policy, "config", None)
            print(f"warning: train.remove_padding is set but {getattr(config, 'model_type', type(self.policy).__name__)!r}"
                  f" with attention {getattr(config, '_attn_implementation', None)!r} cannot run packed rows "
                  "(sleuth.train.forward.supports_packing); the micro-batches run padded", flush=True)
        return False

    def _sharing(self) -> bool:
        """``train.share_prefix`` where the model's KV cache is plain full attention (else a warning: the
        micro-batches run whole)."""
        if not self.cfg.train.share_prefix:  # settings it cannot run with: refused before loading (state.py)
            return False
        if supports_reuse(self.policy):
            return True
        if self.ctx.is_main:
            print(f"warning: train.share_prefix is set but {type(self.policy).__name__}'s KV cache is not plain "
                  "full attention (sleuth.rollout.hf_cache.supports_reuse); the micro-batches run whole", flush=True)
        return False

    def compute(self):
        """The context every forward of the run executes in (autocast to ``model.dtype``)."""
        return compute_autocast(self.cfg.model.dtype, self.state.compute_device)

    def _build_vllm(self):
        """The vLLM rollout engine (``rollout.backend: vllm``), holding the policy's current weights."""
        from sleuth.rollout.vllm_backend import VLLMBackend  # lazy: only rollout.backend=vllm runs need it

        with par.gathered(self.policy):  # FSDP: the push gathers the full weights on every rank
            return VLLMBackend.from_trainer(self.policy, self.tokenizer, self.out / "vllm_engine", self.cfg.rollout,
                                            dtype=self.cfg.model.dtype, seed=self.cfg.train.seed,
                                            rank=self.ctx.rank, world_size=self.ctx.world_size)

    def _sync_engine(self) -> None:
        """Push the policy's weights into the vLLM engine (every rank; waking it if it sleeps)."""
        with par.gathered(self.policy):
            self.vllm.sync_weights(self.policy)

    def _tp(self) -> int:
        """Ranks that generate together: a tensor-parallel vLLM engine's group (1 otherwise)."""
        return self.cfg.rollout.vllm_tensor_parallel_size if self.vllm is not None else 1

    def close(self) -> None:
        """Shut the vLLM engine down (while the process group is alive); a no-op without one."""
        engine, self.vllm = getattr(self, "vllm", None), None
        if engine is not None:
            engine.close()

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
        """The rollout engine: the vLLM engine, else the HF backend ``rollout.backend`` names."""
        if self.vllm is not None:
            return self.vllm
        if self._hf is None:
            self._hf = hf_backend(self.policy, self.tokenizer, self.cfg.rollout)
        return self._hf

    def rollout(self, questions, *, greedy=False, group_size=None, step=0, keep=None):
        self.policy.eval()
        backend = self.backend()
        return run_rollouts(questions, backend, self.tokenizer, self.fmt, self.retriever, self.cfg.rollout,
                            seed=self.cfg.train.seed, step=step, k=self.cfg.retrieval.topk, greedy=greedy,
                            group_size=group_size, keep=keep)

    def train_step(self) -> tuple[dict, list]:
        """One step (rollout, rewards, advantages, update) in ``model.dtype``; ``(metrics, trajectories)``."""
        try:
            with self.compute():
                return self._train_step()
        except torch.OutOfMemoryError as e:  # where the memory went, beside the plan printed at start
            peaks = getattr(self, "_peaks", None)
            e.add_note(f"sleuth: step {self.step + 1} ran out of device memory; {peaks.report() if peaks else ''}")
            raise

    def _train_step(self) -> tuple[dict, list]:
        cfg, tc = self.cfg, self.cfg.train
        t0 = time.perf_counter()
        peaks = self._peaks = PhasePeaks(self.state.compute_device, self.memory_plan)  # CUDA: mem/<phase>_peak_gib
        questions = self.sampler.next(tc.questions_per_step)
        share, tp = tc.questions_per_step // self.ctx.world_size, self._tp()
        mine = questions[self.ctx.rank * share : (self.ctx.rank + 1) * share]
        first = self.ctx.rank // tp * tp  # a tensor-parallel engine's ranks generate their questions together
        together = questions[first * share : (first + tp) * share]
        mbs, temp = (tc.micro_batch_size, tc.max_tokens_per_micro_batch), max(cfg.rollout.temperature, 1e-6)
        with par.gathered(self.policy):  # FSDP: full weights for generation and the no-grad forward
            own = range((self.ctx.rank - first) * share, (self.ctx.rank - first + 1) * share)
            trajs, metrics = self.rollout(together, step=self.step, keep=own if tp > 1 else None)
            if self.vllm is not None:  # its weights and KV cache are freed for the update; the push wakes it
                self.vllm.sleep()
            t_rollout = time.perf_counter() - t0
            peaks.mark("rollout")
            rb = trajectories_to_batch(trajs, self.tokenizer.pad_token_id)
            device = next(self.policy.parameters()).device
            ids, att, mask = (rb.input_ids_BT.to(device), rb.attention_mask_BT.to(device),
                              rb.loss_mask_BT.to(device))
            reuse = self.sampler_logprobs_are_old()
            if reuse and not self.sampler_gap.needs_forward(self.step):
                old = rb.old_logprobs_BT.to(device)  # the same quantity: one no-grad forward saved
            else:
                old = batched_logprobs(self.policy, ids, att, micro_batch_size=mbs[0], max_tokens=mbs[1],
                                       temperature=temp, needed_BT=mask, packed=self.packed,
                                       shared_prefix=self.shared)
                if reuse:  # a check step, or recomputing since a check found the gap too large
                    metrics.update(self.sampler_gap.compare(rb.old_logprobs_BT, old, mask, self.step))
        group_ids, mask = self._leave_out_failed_searches(trajs, rb.group_ids, mask, metrics)
        rewards = assign_rewards(trajs, self.reward_fn)  # each trajectory's reward, also kept in t.reward
        metrics.update(reward_metrics(trajs, rewards))
        turns = sum(t.num_turns for t in trajs)
        metrics["rollout/invalid_rate"] = sum(t.num_invalid for t in trajs) / max(turns, 1)
        ref = self._ref_logprobs(ids, att, mask, mbs, temp) if self.state.use_ref else None
        values = returns = None
        if self.state.critic is not None:
            with par.gathered(self.state.critic):
                values = batched_values(self.state.critic, ids, att, micro_batch_size=mbs[0], max_tokens=mbs[1],
                                        packed=self.packed)
        peaks.mark("logprob passes", "reference pass")  # old (unless the sampler's), reference, critic values
        scores = torch.tensor(rewards, dtype=torch.float32, device=device)
        adv, returns = compute_advantages(cfg.algo, scores, group_ids, mask, old_logprobs_BT=old,
                                          ref_logprobs_BT=ref, values_BT=values)
        batch = UpdateBatch(ids, att, mask, adv, old, sampler_logprobs_BT=rb.old_logprobs_BT.to(device),
                            ref_logprobs_BT=ref, returns_BT=returns, old_values_BT=values)
        self.policy.train()
        # FSDP: the update casts weights at each use (an autocast cache would gather a full copy of the model)
        with compute_autocast(cfg.model.dtype, self.state.compute_device, cache=not self.state.sharded):
            metrics.update(policy_update(
                self.state.model, self.optimizer, batch, cfg.algo, micro_batch_size=mbs[0], max_tokens=mbs[1],
                mini_batches=tc.mini_batches, epochs=tc.epochs, grad_clip=tc.grad_clip, temperature=temp,
                scheduler=self.state.scheduler, seed=tc.seed * 1_000_003 + self.step, critic=self.state.critic_model,
                critic_optimizer=self.state.critic_opt, critic_scheduler=self.state.critic_scheduler,
                norm_len=cfg.rollout.max_context_tokens, train_policy=not 0 < self.step <= tc.critic_warmup_steps,
                packed=self.packed, shared_prefix=self.shared,
            ))
        peaks.mark("update", "update", "optimizer step")
        if self.vllm is not None:  # the next rollout samples from the updated weights
            t_sync = time.perf_counter()
            self._sync_engine()
            metrics["perf/weight_sync_s"] = time.perf_counter() - t_sync
        lengths = rb.lengths_B.tolist()
        total = time.perf_counter() - t0
        metrics.update({
            **({"perf/computed_token_share": computed_share(ids, att, prefix_buckets(ids, att, *mbs))} if self.shared
               else {"perf/padding_share": padding_share(lengths, length_buckets(lengths, *mbs, packed=self.packed),
                                                         packed=self.packed)}),
            "perf/trained_token_share": float(mask.sum() / att.sum()),
            "perf/step_s": total,
            "perf/train_s": total - t_rollout,
            "perf/tokens_per_s": float(att.sum()) / max(total, 1e-9),
            **peaks.figures,
        })
        metrics = reduce.reduce_metrics(metrics, world_size=self.ctx.world_size, question_ids=[q.id for q in mine])
        return metrics, trajs

    def sampler_logprobs_are_old(self) -> bool:
        """Whether the rollout's own logprobs serve as the old policy's: one on-policy pass (one epoch,
        one mini-batch), sampled by our HF decode from the weights being trained at the training
        temperature, so they are ``log_softmax(logits / T)`` of the same tokens (equal to float
        rounding). Not with TIS, which compares the two, nor with vLLM (another engine)."""
        cfg, tc = self.cfg, self.cfg.train
        return (tc.epochs == 1 and tc.mini_batches == 1 and cfg.algo.tis_cap is None and self.vllm is None
                and cfg.rollout.temperature > 0)

    def _leave_out_failed_searches(self, trajs, group_ids: list[str], mask_BT: torch.Tensor, metrics: dict):
        """:func:`sleuth.train.failed_searches.leave_out` (a collective under torchrun); a step whose
        every search failed on every rank stops the run (RetrieverDownError) before the update."""
        errors, ok = reduce.all_sum([sum(t.num_retrieval_errors for t in trajs), sum(t.num_searches for t in trajs)],
                                    mask_BT.device)
        if errors and not ok:
            raise retriever_down_error(trajs, self.cfg, self.step, int(errors), latest_checkpoint(self.out))
        group_ids, mask_BT, n_failed = leave_out(trajs, group_ids, mask_BT)
        metrics["rollout/failed_search_trajectories"] = float(n_failed)
        return group_ids, mask_BT

    def _ref_logprobs(self, ids, att, mask, mbs, temp):
        """The frozen reference's logprobs at the trained tokens: a separate copy, or (LoRA) the policy
        without adapters."""
        if self.state.ref is not None:
            with on_device(self.state.ref, self.state.compute_device, offloaded=self.state.ref_offloaded), \
                    par.gathered(self.state.ref):
                return batched_logprobs(self.state.ref, ids, att, micro_batch_size=mbs[0], max_tokens=mbs[1],
                                        temperature=temp, needed_BT=mask, packed=self.packed,
                                        shared_prefix=self.shared)
        with self.policy.disable_adapter():
            return batched_logprobs(self.policy, ids, att, micro_batch_size=mbs[0], max_tokens=mbs[1],
                                    temperature=temp, needed_BT=mask, packed=self.packed, shared_prefix=self.shared)

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
            engine = self.backend() if self._tp() == 1 else None
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
                                       metrics.get("algo/entropy", 0.0))
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
        return elapsed + step_s >= 60 * limit

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
                if self.vllm is not None:
                    self._sync_engine()
        return False
