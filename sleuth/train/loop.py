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

import copy
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from sleuth.config import Config, to_dict, validate
from sleuth.train import distributed as par
from sleuth.train.checkpoint import (latest_checkpoint, load_checkpoint_file, load_optimizer_state, load_policy_weights,
                                     load_trainer_state, optimizer_state, save_checkpoint, set_rng_state,
                                     write_run_config)
from sleuth.train.forward import batched_logprobs, length_buckets, padding_share
from sleuth.train.logging import MetricsLogger
from sleuth.models import DTYPES, compute_autocast
from sleuth.train.sampler import CollapseWatch, QuestionSampler
from sleuth.train.setup import (build_format, build_run_retriever, check_run_dir, init_distributed,
                                load_eval_questions, load_questions_for, probe_retriever, warn_changed_settings)
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_scheduler(optimizer, cfg: Config):
    """Linear warm-up, then constant or cosine decay to 0 at ``train.total_steps``."""
    warm, total, kind = cfg.train.warmup_steps, max(cfg.train.total_steps, 1), cfg.train.schedule
    if kind not in ("constant", "cosine"):
        raise ValueError(f"train.schedule must be constant or cosine, got {kind!r}")

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if kind == "constant":
            return 1.0
        progress = (step - warm) / max(total - warm, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _score(trajs, reward_fn) -> dict:
    from sleuth.reward import is_valid_format
    from sleuth.reward.metrics import score_prediction

    ems, f1s, fmts = [], [], []
    for t in trajs:
        t.reward = float(reward_fn(t.response_text, t.question.golden_answers))
        s = score_prediction(t.answer, t.question.golden_answers)
        ems.append(s.em)
        f1s.append(s.f1)
        fmts.append(float(is_valid_format(t.response_text)))
    n = max(len(trajs), 1)
    rewards = [t.reward for t in trajs]
    return {
        "reward/mean": sum(rewards) / n,
        "reward/em": sum(ems) / n,
        "reward/f1": sum(f1s) / n,
        "reward/format": sum(fmts) / n,
        "reward/std": float(np.std(rewards)) if rewards else 0.0,
    }


def _truncate_metrics(out: Path, step: int) -> None:
    """Drop logged rows after ``step`` (a resumed run re-does the steps after its checkpoint). Each
    file is streamed and replaced atomically; a torn last line is dropped with a warning
    (:func:`sleuth.train.logging.truncate_jsonl`)."""
    from sleuth.train.logging import truncate_jsonl

    for name in ("metrics.jsonl", "samples.jsonl"):
        truncate_jsonl(out / name, step)


class Trainer:
    """Holds the run's objects; ``run()`` is the loop. Built from a Config and an output dir."""

    def __init__(self, cfg: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True):
        from sleuth.reward import build_reward
        from sleuth.models import load_policy, make_critic

        self.cfg, self.out = validate(cfg), Path(out_dir)
        self.ctx = init_distributed()
        if self.ctx.is_main:
            check_run_dir(self.out, resume=resume, overwrite=overwrite)
        tc = cfg.train
        if tc.questions_per_step % self.ctx.world_size:
            raise ValueError(
                f"train.questions_per_step={tc.questions_per_step} must be divisible by the "
                f"{self.ctx.world_size} ranks"
            )
        par.check_parallel(tc.parallel)
        self.sharded = self.ctx.enabled and tc.parallel == "fsdp"
        if self.sharded and cfg.model.lora_rank > 0:
            raise ValueError("train.parallel=fsdp does not support LoRA (model.lora_rank > 0); "
                             "use train.parallel=ddp, which LoRA's small trainable state suits")
        seed_everything(tc.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        mc = cfg.model
        device = "cpu" if self.sharded else mc.device  # FSDP moves each rank's shards to its GPU
        # float32 master weights and optimizer state whatever model.dtype says; the forwards run in
        # model.dtype under autocast (self.compute); the frozen reference is kept in model.dtype
        self.policy, self.tokenizer = load_policy(mc.name_or_path, dtype="float32", device=device,
                                                  gguf_file=mc.gguf_file)
        if tc.cpu_threads and next(self.policy.parameters()).device.type == "cpu":
            torch.set_num_threads(tc.cpu_threads)  # after loading: building the tiny model sets its own
        if tc.grad_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.ref = None
        if mc.lora_rank > 0:
            from sleuth.models import add_lora

            self.policy = add_lora(self.policy, rank=mc.lora_rank, alpha=mc.lora_alpha, targets=mc.lora_targets)
        elif cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none":
            self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False).to(DTYPES[mc.dtype])
        self.use_ref = cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none"
        self.critic = self.critic_model = self.critic_opt = None
        if cfg.algo.advantage == "gae":
            self.critic = make_critic(mc.name_or_path, dtype="float32", device=device, gguf_file=mc.gguf_file)
        # the modules the update calls: DDP wrappers, or (FSDP) the same modules sharded in place
        wrap = dict(parallel=tc.parallel, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank)
        self.model = par.wrap_for_update(self.policy, **wrap)
        self.compute_device = next(self.policy.parameters()).device  # FSDP: where the shards went
        if self.critic is not None:
            self.critic_model = par.wrap_for_update(self.critic, **wrap)
            self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=tc.critic_lr,
                                                weight_decay=tc.weight_decay)
        if self.sharded and self.ref is not None:
            par.shard(self.ref)  # forward-only; gathered around its logprob pass
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, cfg)
        self.fmt = build_format(cfg.rollout.format)
        self.retriever = build_run_retriever(cfg)
        self.reward_fn = build_reward(cfg.reward)
        self.sampler = QuestionSampler(load_questions_for(cfg.data.train_files, cfg), seed=tc.seed,
                                       shuffle=cfg.data.shuffle)
        if len(self.sampler.questions) < tc.questions_per_step:
            raise ValueError(f"train.questions_per_step={tc.questions_per_step} but data.train_files hold "
                             f"{len(self.sampler.questions)} questions; lower it or add questions")
        if cfg.rollout.max_turns > 0:
            probe_retriever(self.retriever, cfg)
        self.eval_questions = load_eval_questions(cfg)  # train.eval_limit per eval file
        self.watch = CollapseWatch()
        self.step = 0
        self.last_eval: tuple[dict, list[dict]] | None = None
        if resume:
            warn_changed_settings(self.out / "config.yaml", cfg)
            self._resume()
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_run_config(cfg, self.out)  # atomically; a file already holding these settings is kept as is
            _truncate_metrics(self.out, self.step)
        # the vLLM rollout engine, built after a resume so that it starts from the current weights
        self.vllm = self._build_vllm() if cfg.rollout.backend != "hf" else None
        self.logger = MetricsLogger(self.out, total_steps=tc.total_steps, tensorboard=tc.tensorboard,
                                    wandb=tc.wandb, config=to_dict(cfg), enabled=self.ctx.is_main,
                                    progress=progress, resume=resume and self.step > 0)

    def compute(self):
        """The context every forward of the run executes in (autocast to ``model.dtype``)."""
        return compute_autocast(self.cfg.model.dtype, self.compute_device)

    def _build_vllm(self):
        """The vLLM rollout engine (``rollout.backend: vllm``), holding the policy's current weights."""
        from sleuth.rollout.vllm_backend import VLLMBackend

        return VLLMBackend.from_trainer(self.policy, self.tokenizer, self.out / "vllm_engine", self.cfg.rollout,
                                        dtype=self.cfg.model.dtype, seed=self.cfg.train.seed,
                                        world_size=self.ctx.world_size)

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self) -> dict:
        """Optimizer (FSDP: gathered, keyed by parameter name; a collective), scheduler, cursor."""
        return {
            "optimizer": optimizer_state(self.policy, self.optimizer, sharded=self.sharded),
            "scheduler": self.scheduler.state_dict(),
            "critic_optimizer": optimizer_state(self.critic, self.critic_opt, sharded=self.sharded)
            if self.critic_opt else None,
            "cursor": self.sampler.state(),
        }

    def save(self) -> Path | None:
        """Every rank calls this (FSDP gathers the full state); rank 0 writes the checkpoint.

        A step whose checkpoint already holds the current state (the trainer resumed from it and has
        not stepped since, e.g. ``--resume`` of a finished run) is not written again: rewriting the
        checkpoint ``latest`` names could not be atomic. Every rank makes the same decision."""
        if getattr(self, "_checkpointed_step", None) == self.step:
            return self.out / "checkpoints" / f"step_{self.step:06d}" if self.ctx.is_main else None
        state, policy, critic_state = self._state(), self.policy, None
        if self.sharded:
            full = par.full_model_state(self.policy)
            critic_state = par.full_model_state(self.critic) if self.critic is not None else None
            policy = par.plain_model(self.policy, full) if self.ctx.is_main else None
        self._checkpointed_step = self.step
        if not self.ctx.is_main:
            return None
        return save_checkpoint(self.out, self.step, policy=policy, tokenizer=self.tokenizer, trainer_state=state,
                               critic=self.critic, critic_state=critic_state, keep=self.cfg.train.keep_checkpoints)

    def _resume(self, ckpt: Path | None = None) -> None:
        """Load a checkpoint (the run's latest by default). Its files are read as tensors and plain
        data only (no pickled code runs); a damaged one is a CheckpointError naming the file."""
        ckpt = ckpt or latest_checkpoint(self.out)
        if ckpt is None:
            return  # nothing to resume: start fresh
        ts = load_trainer_state(ckpt)  # first: the small file, a damaged one fails before the weights load
        load_policy_weights(self.policy, ckpt)
        load_optimizer_state(self.policy, self.optimizer, ts["optimizer"], where=ckpt)
        self.scheduler.load_state_dict(ts["scheduler"])
        if self.critic is not None:
            par.load_model_state(self.critic, load_checkpoint_file(ckpt, "critic.pt"))
            load_optimizer_state(self.critic, self.critic_opt, ts["critic_optimizer"], where=ckpt)
        self.sampler.load_state(ts["cursor"])
        set_rng_state(ts["rng"])
        self.step = self._checkpointed_step = ts["step"]

    # -- one step ----------------------------------------------------------------------------
    def rollout(self, questions, *, greedy=False, group_size=None, step=0):
        from sleuth.rollout.hf_backend import HFBackend
        from sleuth.rollout.loop import run_rollouts

        self.policy.eval()
        backend = self.vllm if self.vllm is not None else HFBackend(self.policy, self.tokenizer)
        return run_rollouts(questions, backend, self.tokenizer, self.fmt, self.retriever, self.cfg.rollout,
                            seed=self.cfg.train.seed, step=step, k=self.cfg.retrieval.topk, greedy=greedy,
                            group_size=group_size)

    def train_step(self) -> tuple[dict, list]:
        """One step (rollout, rewards, advantages, update) in ``model.dtype``; ``(metrics, trajectories)``."""
        with self.compute():
            return self._train_step()

    def _train_step(self) -> tuple[dict, list]:
        from sleuth.rollout.batching import trajectories_to_batch

        cfg, tc = self.cfg, self.cfg.train
        t0 = time.perf_counter()
        questions = self.sampler.next(tc.questions_per_step)
        share = tc.questions_per_step // self.ctx.world_size
        mine = questions[self.ctx.rank * share : (self.ctx.rank + 1) * share]
        mbs, temp = tc.micro_batch_size, max(cfg.rollout.temperature, 1e-6)
        with par.gathered(self.policy):  # FSDP: full weights for generation and the no-grad forward
            trajs, metrics = self.rollout(mine, step=self.step)
            t_rollout = time.perf_counter() - t0
            rb = trajectories_to_batch(trajs, self.tokenizer.pad_token_id)
            device = next(self.policy.parameters()).device
            ids, att, mask = (rb.input_ids_BT.to(device), rb.attention_mask_BT.to(device),
                              rb.loss_mask_BT.to(device))
            old = batched_logprobs(self.policy, ids, att, micro_batch_size=mbs, temperature=temp)
        group_ids, mask = self._leave_out_failed_searches(trajs, rb.group_ids, mask, metrics)
        metrics.update(_score(trajs, self.reward_fn))
        turns = sum(t.num_turns for t in trajs)
        metrics["rollout/invalid_rate"] = sum(t.num_invalid for t in trajs) / max(turns, 1)
        ref = self._ref_logprobs(ids, att, mbs, temp) if self.use_ref else None
        values = returns = None
        if self.critic is not None:
            with par.gathered(self.critic), torch.no_grad():
                values = self.critic(ids, att).float()
        scores = torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device)
        adv, returns = compute_advantages(cfg.algo, scores, group_ids, mask, old_logprobs_BT=old,
                                          ref_logprobs_BT=ref, values_BT=values)
        batch = UpdateBatch(ids, att, mask, adv, old, sampler_logprobs_BT=rb.old_logprobs_BT.to(device),
                            ref_logprobs_BT=ref, returns_BT=returns, old_values_BT=values)
        self.policy.train()
        metrics.update(policy_update(
            self.model, self.optimizer, batch, cfg.algo, micro_batch_size=mbs, mini_batches=tc.mini_batches,
            epochs=tc.epochs, grad_clip=tc.grad_clip, temperature=temp, scheduler=self.scheduler,
            seed=tc.seed * 1_000_003 + self.step, critic=self.critic_model, critic_optimizer=self.critic_opt,
            norm_len=cfg.rollout.max_context_tokens,
        ))
        if self.vllm is not None:  # the next rollout samples from the updated weights
            t_sync = time.perf_counter()
            self.vllm.sync_weights(self.policy)
            metrics["perf/weight_sync_s"] = time.perf_counter() - t_sync
        lengths = rb.lengths_B.tolist()
        total = time.perf_counter() - t0
        metrics.update({
            "perf/padding_share": padding_share(lengths, length_buckets(lengths, mbs)),
            "perf/trained_token_share": float(mask.sum() / att.sum()),
            "perf/step_s": total,
            "perf/train_s": total - t_rollout,
            "perf/tokens_per_s": float(att.sum()) / max(total, 1e-9),
        })
        metrics = par.reduce_metrics(metrics, world_size=self.ctx.world_size, question_ids=[q.id for q in mine])
        return metrics, trajs

    def _leave_out_failed_searches(self, trajs, group_ids: list[str], mask_BT: torch.Tensor, metrics: dict):
        """A trajectory whose search failed (after the client's retries) read an error instead of
        passages: not the policy's doing, so it is left out of the loss (its trained tokens are
        unmasked, and it becomes a group of its own, so its reward enters no group's baseline or the
        whitening). Counted in ``rollout/failed_search_trajectories``. When every search of the step
        failed on every rank, the retriever is down: the run stops (RetrieverDownError) before the
        update. Returns ``(group_ids, mask_BT)``; a collective under torchrun."""
        from sleuth.retrieval.base import RetrieverDownError

        failed_B = [t.num_retrieval_errors > 0 for t in trajs]
        n_failed = sum(failed_B)
        errors, ok = par.all_sum([sum(t.num_retrieval_errors for t in trajs), sum(t.num_searches for t in trajs)],
                                 mask_BT.device)
        if errors and not ok:
            r = self.cfg.retrieval
            where = f"{r.kind}: {r.url or r.index_dir or r.corpus}"
            seen = next((text for t in trajs for text in t.retrieved_text if t.num_retrieval_errors), "")
            last = self.latest_checkpoint_name()
            raise RetrieverDownError(
                f"every search of step {self.step} failed ({int(errors)} searches; the retriever ({where}) "
                f"is down or failing): {seen.strip()[:300]!r}. Nothing of this step was trained. Start or fix "
                f"the retriever, then continue with --resume ({last})")
        metrics["rollout/failed_search_trajectories"] = float(n_failed)
        if not n_failed:
            return group_ids, mask_BT
        keep_B1 = torch.tensor([not f for f in failed_B], device=mask_BT.device)[:, None]
        mask_BT = torch.where(keep_B1, mask_BT, torch.zeros_like(mask_BT))
        group_ids = [f"{g}/failed-search/{i}" if f else g for i, (g, f) in enumerate(zip(group_ids, failed_B))]
        return group_ids, mask_BT

    def latest_checkpoint_name(self) -> str:
        ckpt = latest_checkpoint(self.out)
        return f"the latest checkpoint is {ckpt.name}" if ckpt else "no checkpoint was written yet"

    def _ref_logprobs(self, ids, att, mbs, temp):
        """The frozen reference's logprobs: a separate copy, or (LoRA) the policy without adapters."""
        if self.ref is not None:
            with par.gathered(self.ref):
                return batched_logprobs(self.ref, ids, att, micro_batch_size=mbs, temperature=temp)
        with self.policy.disable_adapter():
            return batched_logprobs(self.policy, ids, att, micro_batch_size=mbs, temperature=temp)

    def evaluate(self, *, no_search: bool = False) -> dict:
        """Greedy, one sample per question, the same rollout code (``sleuth.eval.evaluate``);
        flat ``eval/<metric>`` and ``eval/<source>/<metric>`` keys. The full summary and rows of
        the latest evaluation stay in ``self.last_eval``."""
        from sleuth.eval.evaluate import evaluate, summarize

        if not self.eval_questions:
            return {}
        world, rank = self.ctx.world_size, self.ctx.rank
        mine = self.eval_questions[rank::world]  # under torchrun every rank evaluates a share
        perf = {"seconds": 0.0, "generate_s": 0.0, "retrieve_s": 0.0}
        rows: list[dict] = []
        if mine:
            with self.compute():
                summary, rows = evaluate(self.policy, self.tokenizer, mine, self.fmt, self.retriever, self.cfg.rollout,
                                         topk=self.cfg.retrieval.topk, batch_size=self.cfg.eval.batch_size,
                                         no_search=no_search, seed=self.cfg.train.seed)
            perf = summary["perf"]
        if world > 1 or not mine:
            shards = par.all_gather_objects((rows, perf), world_size=world)
            rows = par.interleave([r for r, _ in shards])
            summary = summarize(rows)
            wall = max(p["seconds"] for _, p in shards)  # the slowest rank's
            summary["perf"] = {"seconds": wall, "generate_s": max(p["generate_s"] for _, p in shards),
                               "retrieve_s": max(p["retrieve_s"] for _, p in shards),
                               "questions_per_s": len(rows) / wall if wall > 0 else 0.0, "ranks": world}
        self.last_eval = (summary, rows)
        out = {f"eval/{m}": summary[m] for m in ("em", "f1", "cover_em", "searches")}
        out["eval/questions"] = float(summary["n"])
        for src, s in summary["by_source"].items():
            out.update({f"eval/{src}/{m}": s[m] for m in ("em", "f1", "searches")})
        return out

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        tc = self.cfg.train
        last: dict = {}
        saved_at = None  # the step last checkpointed, so the final save does not write it twice
        while self.step < tc.total_steps:
            self.step += 1
            metrics, trajs = self.train_step()
            due = (tc.eval_every and self.step % tc.eval_every == 0) or self.step == tc.total_steps
            if due:
                with par.gathered(self.policy):  # a collective under FSDP: every rank enters
                    eval_metrics = self.evaluate()  # every rank its share; all get the whole set's figures
                if self.ctx.is_main:
                    metrics.update(eval_metrics)
            self.logger.log(self.step, metrics)
            self.logger.log_samples(self.step, trajs)
            last = metrics
            warning = self.watch.check(metrics["reward/mean"], metrics.get("rollout/invalid_rate", 0.0),
                                       metrics.get("algo/entropy", 0.0))
            if warning and self._on_collapse(warning):
                break
            if tc.save_every and self.step % tc.save_every == 0:
                self.save()
                saved_at = self.step
        if saved_at != self.step:
            self.save()
        self.logger.close()
        return last

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
                    self.vllm.sync_weights(self.policy)
        return False
