"""The trainable state of a run, built from its config: the policy (float32 master weights), the frozen
reference, the critic (PPO/GAE), their optimizers and the learning-rate schedule; and what a checkpoint
holds of it (:func:`save_state`, :func:`restore_state`).

Precision: whatever ``model.dtype`` says, the policy and critic and their AdamW states are float32;
every forward runs under :func:`sleuth.models.compute_autocast` in ``model.dtype``, and the frozen
reference is held in it. Data parallelism: the modules the update calls (``TrainState.model``,
``TrainState.critic_model``) are DDP wrappers, or under FSDP the same modules sharded in place.
"""

from __future__ import annotations

import copy
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sleuth.config import Config
from sleuth.errors import ConfigError
from sleuth.models import DTYPES, add_lora, load_policy, make_critic, pick_device, reference_dtype
from sleuth.train import distributed as par
from sleuth.train.checkpoint import (
    load_checkpoint_file,
    load_optimizer_state,
    load_policy_weights,
    load_trainer_state,
    optimizer_state,
    save_checkpoint,
    set_rng_state,
)
from sleuth.train.distributed import DistContext
from sleuth.train.offload import offload_optimizer, state_on_params


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def time_limit_reached(limit_minutes: float | None, elapsed_s: float, step_s: float) -> bool:
    """``train.time_limit_minutes``: whether one more step as long as the last (``step_s``) would end past the limit,
    ``elapsed_s`` after the loop began (``sleuth train`` passes the slowest rank's clocks; ``sleuth sft`` its own)."""
    return limit_minutes is not None and elapsed_s + step_s >= 60 * limit_minutes


def set_determinism(cfg: Config, ctx: DistContext) -> bool:
    """``train.deterministic`` (None: True on CPU runs, False on GPUs) and, on a GPU, ``train.tf32``;
    returns whether deterministic algorithms were set."""
    on_gpu = (ctx.enabled and torch.cuda.is_available()) or pick_device(cfg.model.device).type == "cuda"
    wanted = cfg.train.deterministic if cfg.train.deterministic is not None else not on_gpu
    if wanted and on_gpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before its first use
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(wanted, warn_only=True)
    if on_gpu:  # float32 products on TF32 tensor cores unless asked otherwise (train.tf32)
        torch.set_float32_matmul_precision("high" if cfg.train.tf32 and not wanted else "highest")
    return wanted


def make_scheduler(optimizer, cfg: Config, *, warmup_steps: int | None = None, schedule: str | None = None):
    """Linear warm-up over ``train.warmup_steps`` updates, then constant or cosine decay to 0 at
    ``train.total_steps``. The k-th update (1-based) runs at ``k / N`` of the rate during warm-up, or
    with ``train.warmup_from_zero`` at ``(k - 1) / N`` (verl's ``get_constant_schedule_with_warmup``:
    the first update at rate 0). ``warmup_steps`` / ``schedule`` override the config's (the critic's)."""
    warm = cfg.train.warmup_steps if warmup_steps is None else warmup_steps
    total, kind = max(cfg.train.total_steps, 1), schedule or cfg.train.schedule
    if kind not in ("constant", "cosine"):
        raise ConfigError(f"train.schedule must be constant or cosine, got {kind!r}")
    shift = 0 if cfg.train.warmup_from_zero else 1

    def factor(step: int) -> float:  # step: updates done so far (0 for the first)
        if warm and step < warm:
            return (step + shift) / warm
        if kind == "constant":
            return 1.0
        progress = (step - warm) / max(total - warm, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def check_parallel_settings(cfg: Config, ctx: DistContext) -> bool:
    """Refuse settings the ranks cannot run; True when the update is sharded (FSDP under torchrun)."""
    tc = cfg.train
    if tc.questions_per_step % ctx.world_size:
        raise ConfigError(f"train.questions_per_step={tc.questions_per_step} must be divisible by the "
                          f"{ctx.world_size} ranks")
    par.check_parallel(tc.parallel)
    rc = cfg.rollout
    if rc.workers and not rc.async_steps:
        raise ConfigError(f"rollout.workers={rc.workers} splits the ranks for asynchronous rollouts: set "
                          "rollout.async_steps >= 1, or rollout.workers=0")
    if rc.async_steps and ctx.world_size > 1 and not rc.workers and rc.async_worker != "inline":
        raise ConfigError(f"rollout.async_steps={rc.async_steps} runs in one process (its rollout worker beside it) "
                          f"or over a split of the ranks (or inline, with no overlap); under torchrun ({ctx.world_size} ranks) set "
                          f"rollout.workers={ctx.world_size // 2} and launch twice the ranks, or rollout.async_steps=0")
    if rc.workers and rc.backend == "vllm":
        raise ConfigError("rollout.workers with rollout.backend=vllm is not supported yet (vLLM would build its "
                          "process group over every rank): use rollout.backend=hf or hf_static on the rollout ranks, "
                          "or run rollout.async_steps in one process")
    if rc.workers and tc.on_collapse == "rollback":
        raise ConfigError("train.on_collapse=rollback cannot restart the rollout ranks (rollout.workers): use "
                          "train.on_collapse=stop or warn")
    if tc.share_prefix:
        clash = [name for name, on in (("train.remove_padding", tc.remove_padding),
                                       ("train.grad_checkpointing", tc.grad_checkpointing),
                                       (f"torchrun ({ctx.world_size} ranks)", ctx.world_size > 1)) if on]
        if clash:
            raise ConfigError(f"train.share_prefix cannot run with {' and '.join(clash)}: it keeps the common "
                              "prefix's KV cache for the rows of one process; set train.share_prefix=false")
    sharded = ctx.enabled and tc.parallel == "fsdp"
    if sharded and cfg.model.lora_rank > 0:
        raise ConfigError("train.parallel=fsdp does not support LoRA (model.lora_rank > 0); "
                          "use train.parallel=ddp, which LoRA's small trainable state suits")
    return sharded


@dataclass
class TrainState:
    policy: torch.nn.Module
    tokenizer: object
    model: torch.nn.Module  # what the update calls: the policy, its DDP wrapper, or (FSDP) it sharded
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    compute_device: torch.device
    sharded: bool
    ref: torch.nn.Module | None = None  # the frozen reference (None with LoRA: the adapters disabled)
    use_ref: bool = False
    critic: torch.nn.Module | None = None
    critic_model: torch.nn.Module | None = None
    critic_opt: torch.optim.Optimizer | None = None
    critic_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None  # warm-up, then constant
    ref_offloaded: bool = False  # the reference lives in CPU memory, on the device for its pass only


def build_state(cfg: Config, ctx: DistContext, sharded: bool) -> TrainState:
    """Load the policy (and reference, critic), wrap them for the update, make the optimizers."""
    mc, tc = cfg.model, cfg.train
    device = "cpu" if sharded else mc.device  # FSDP moves each rank's shards to its GPU
    policy, tokenizer = load_policy(mc.name_or_path, dtype="float32", device=device, gguf_file=mc.gguf_file)
    if tc.cpu_threads and next(policy.parameters()).device.type == "cpu":
        torch.set_num_threads(tc.cpu_threads)  # after loading: building the tiny model sets its own
    if tc.grad_checkpointing:
        policy.gradient_checkpointing_enable()
    use_ref = cfg.algo.kl_coef > 0 and cfg.algo.kl_mode != "none"
    ref = None
    if mc.lora_rank > 0:
        policy = add_lora(policy, rank=mc.lora_rank, alpha=mc.lora_alpha, targets=mc.lora_targets)
    elif use_ref and not cfg.rollout.async_steps:  # asynchronous rollouts: the rollout worker holds it
        ref = copy.deepcopy(policy).eval().requires_grad_(False).to(DTYPES[reference_dtype(mc)])
        if tc.offload_reference:
            ref.to("cpu")  # train.offload_reference (FSDP: its shards, below)
    wrap = dict(parallel=tc.parallel, world_size=ctx.world_size, local_rank=ctx.local_rank)
    model = par.wrap_for_update(policy, **wrap)
    critic = critic_model = critic_opt = None
    if cfg.algo.advantage == "gae":
        critic = make_critic(mc.name_or_path, dtype="float32", device=device, gguf_file=mc.gguf_file)
        if tc.grad_checkpointing:
            critic.body.gradient_checkpointing_enable()
        critic_model = par.wrap_for_update(critic, **wrap)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=tc.critic_lr, weight_decay=tc.weight_decay)
    if sharded and ref is not None:
        par.shard(ref, offload=tc.offload_reference)  # forward-only; gathered around its logprob pass
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
    if tc.offload_optimizer:
        for opt in (optimizer, critic_opt):
            if opt is not None:
                offload_optimizer(opt)
    return TrainState(policy, tokenizer, model, optimizer, make_scheduler(optimizer, cfg),
                      compute_device=next(policy.parameters()).device,  # FSDP: where the shards went
                      sharded=sharded, ref=ref, use_ref=use_ref, critic=critic, critic_model=critic_model,
                      critic_opt=critic_opt,
                      critic_scheduler=make_scheduler(critic_opt, cfg, warmup_steps=tc.critic_lr_warmup_steps,
                                                      schedule="constant") if critic_opt else None,
                      ref_offloaded=ref is not None and tc.offload_reference and not sharded)


def save_state(s: TrainState, out: Path, step: int, cursor: dict, *, is_main: bool, keep: int) -> Path | None:
    """Every rank calls this (FSDP gathers the full state: collectives); rank 0 writes checkpoint
    ``step`` (:func:`sleuth.train.checkpoint.save_checkpoint`)."""
    with state_on_params(s.optimizer), state_on_params(s.critic_opt):  # offloaded state: gathered from the device
        state = {
            "optimizer": optimizer_state(s.policy, s.optimizer, sharded=s.sharded),
            "scheduler": s.scheduler.state_dict(),
            "critic_optimizer": optimizer_state(s.critic, s.critic_opt, sharded=s.sharded) if s.critic_opt else None,
            "critic_scheduler": s.critic_scheduler.state_dict() if s.critic_scheduler else None,
            "cursor": cursor,
        }
    policy, critic_state = s.policy, None
    if s.sharded:
        full = par.full_model_state(s.policy)
        critic_state = par.full_model_state(s.critic) if s.critic is not None else None
        policy = par.plain_model(s.policy, full) if is_main else None
    if not is_main:
        return None
    return save_checkpoint(out, step, policy=policy, tokenizer=s.tokenizer, trainer_state=state, critic=s.critic,
                           critic_state=critic_state, keep=keep)


def restore_state(s: TrainState, ckpt: Path) -> dict:
    """Load checkpoint ``ckpt`` into ``s`` and the RNGs; returns the trainer state (step, cursor).
    Files are read as tensors and plain data only (no pickled code runs); a damaged one is a
    CheckpointError naming the file."""
    ts = load_trainer_state(ckpt)  # first: the small file, a damaged one fails before the weights load
    load_policy_weights(s.policy, ckpt)
    load_optimizer_state(s.policy, s.optimizer, ts["optimizer"], where=ckpt)
    s.scheduler.load_state_dict(ts["scheduler"])
    if s.critic is not None:
        par.load_model_state(s.critic, load_checkpoint_file(ckpt, "critic.pt"))
        load_optimizer_state(s.critic, s.critic_opt, ts["critic_optimizer"], where=ckpt)
        if ts.get("critic_scheduler") is not None:
            s.critic_scheduler.load_state_dict(ts["critic_scheduler"])
        else:  # a checkpoint from before train.critic_lr_warmup_steps: one scheduler step per update done
            for _ in range(int(ts["step"])):
                s.critic_scheduler.step()
    set_rng_state(ts["rng"])
    return ts
