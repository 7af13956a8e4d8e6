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

from sleuth.config import Config, save_config, to_dict, validate
from sleuth.train import distributed as par
from sleuth.train.checkpoint import (latest_checkpoint, load_optimizer_state, load_policy_weights, load_trainer_state,
                                     optimizer_state, save_checkpoint, set_rng_state)
from sleuth.train.forward import batched_logprobs, length_buckets, padding_share
from sleuth.train.logging import MetricsLogger
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
    """Drop logged rows after ``step`` (a resumed run re-does the steps after its checkpoint)."""
    import json

    for name in ("metrics.jsonl", "samples.jsonl"):
        path = out / name
        if path.exists():
            rows = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
            path.write_text("".join(r + "\n" for r in rows))


class Trainer:
    """Holds the run's objects; ``run()`` is the loop. Built from a Config and an output dir."""

    def __init__(self, cfg: Config, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True):
        from sleuth.reward import build_reward
        from sleuth.train.models import load_policy, make_critic

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
        self.policy, self.tokenizer = load_policy(mc.name_or_path, dtype=mc.dtype, device=device,
                                                  gguf_file=mc.gguf_file)
        if tc.cpu_threads and next(self.policy.parameters()).device.type == "cpu":
            torch.set_num_threads(tc.cpu_threads)  # after loading: building the tiny model sets its own
        if tc.grad_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.ref = None
        if mc.lora_rank > 0:
            from sleuth.train.models import add_lora

            self.policy = add_lora(self.policy, rank=mc.lora_rank, alpha=mc.lora_alpha, targets=mc.lora_targets)
        elif cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none":
            self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.use_ref = cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none"
        self.critic = self.critic_model = self.critic_opt = None
        if cfg.algo.advantage == "gae":
            self.critic = make_critic(mc.name_or_path, dtype=mc.dtype, device=device, gguf_file=mc.gguf_file)
        # the modules the update calls: DDP wrappers, or (FSDP) the same modules sharded in place
        wrap = dict(parallel=tc.parallel, world_size=self.ctx.world_size, local_rank=self.ctx.local_rank)
        self.model = par.wrap_for_update(self.policy, **wrap)
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
            save_config(cfg, self.out / "config.yaml")
            _truncate_metrics(self.out, self.step)
        # the vLLM rollout engine, built after a resume so that it starts from the current weights
        self.vllm = self._build_vllm() if cfg.rollout.backend != "hf" else None
        self.logger = MetricsLogger(self.out, total_steps=tc.total_steps, tensorboard=tc.tensorboard,
                                    wandb=tc.wandb, config=to_dict(cfg), enabled=self.ctx.is_main,
                                    progress=progress, resume=resume and self.step > 0)

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
        """Every rank calls this (FSDP gathers the full state); rank 0 writes the checkpoint."""
        state, policy, critic_state = self._state(), self.policy, None
        if self.sharded:
            full = par.full_model_state(self.policy)
            critic_state = par.full_model_state(self.critic) if self.critic is not None else None
            policy = par.plain_model(self.policy, full) if self.ctx.is_main else None
        if not self.ctx.is_main:
            return None
        return save_checkpoint(self.out, self.step, policy=policy, tokenizer=self.tokenizer, trainer_state=state,
                               critic=self.critic, critic_state=critic_state, keep=self.cfg.train.keep_checkpoints)

    def _resume(self, ckpt: Path | None = None) -> None:
        ckpt = ckpt or latest_checkpoint(self.out)
        if ckpt is None:
            return  # nothing to resume: start fresh
        load_policy_weights(self.policy, ckpt)
        ts = load_trainer_state(ckpt)
        load_optimizer_state(self.policy, self.optimizer, ts["optimizer"], where=ckpt)
        self.scheduler.load_state_dict(ts["scheduler"])
        if self.critic is not None:
            par.load_model_state(self.critic, torch.load(ckpt / "critic.pt", map_location="cpu"))
            load_optimizer_state(self.critic, self.critic_opt, ts["critic_optimizer"], where=ckpt)
        self.sampler.load_state(ts["cursor"])
        set_rng_state(ts["rng"])
        self.step = ts["step"]

    # -- one step ----------------------------------------------------------------------------
    def rollout(self, questions, *, greedy=False, group_size=None, step=0):
        from sleuth.rollout.hf_backend import HFBackend
        from sleuth.rollout.loop import run_rollouts

        self.policy.eval()
        backend = self.vllm if self.vllm is not None else HFBackend(self.policy, self.tokenizer)
        return run_rollouts(questions, backend, self.tokenizer, self.fmt, self.retriever, self.cfg.rollout,
                            seed=self.cfg.train.seed, step=step, k=self.cfg.retrieval.topk, greedy=greedy,
                            group_size=group_size)

    def train_step(self) -> dict:
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
        metrics.update(_score(trajs, self.reward_fn))
        turns = sum(t.num_turns for t in trajs)
        metrics["rollout/invalid_rate"] = sum(t.num_invalid for t in trajs) / max(turns, 1)
        ref = self._ref_logprobs(ids, att, mbs, temp) if self.use_ref else None
        values = returns = None
        if self.critic is not None:
            with par.gathered(self.critic), torch.no_grad():
                values = self.critic(ids, att).float()
        scores = torch.tensor([t.reward for t in trajs], dtype=torch.float32, device=device)
        adv, returns = compute_advantages(cfg.algo, scores, rb.group_ids, mask, old_logprobs_BT=old,
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
