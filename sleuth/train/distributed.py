"""Data-parallel training under ``torchrun``: DDP (a full replica per rank) or FSDP (sharded).

``train.parallel`` picks the wrapper; both are no-ops in a single process.

* ``ddp``: ``DistributedDataParallel``; every rank holds the whole model, gradients and optimizer
  state; gradients are averaged by all-reduce.
* ``fsdp``: PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``): every decoder block (the
  classes a Hugging Face model lists in ``_no_split_modules``) is sharded, then the root; each rank
  keeps 1/N of the parameters, gradients and AdamW state, so models that do not fit one device
  train on several. Forward/backward all-gather one block at a time.

Rollouts and the no-gradient forwards (old/reference logprobs, critic values, evaluation) run
under :func:`gathered`: every block is all-gathered once, so each rank may then run any number of
forwards, which per-rank generation needs (ranks decode different lengths); the full parameters
live only for that phase (no gradients or optimizer state beside them). The update then runs
sharded, with the same number of micro-batches on every rank.

Checkpoints stay plain: :func:`full_model_state` gathers the full state dict on rank 0 (on CPU) and
:func:`plain_model` rebuilds an unwrapped Hugging Face model from it for ``save_pretrained``; the
optimizer state is saved as a full, parameter-name-keyed dict and re-sharded on resume.

Also here: the rank context (:class:`DistContext`, :func:`init_distributed`) and leaving the group
(:func:`shutdown`). Combining what the ranks computed is :mod:`sleuth.train.reduce`.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sleuth.errors import ConfigError
from sleuth.train import reduce

PARALLEL = ("ddp", "fsdp")



def check_parallel(parallel: str) -> None:
    if parallel not in PARALLEL:
        raise ConfigError(f"train.parallel must be one of {PARALLEL}, got {parallel!r}")


def wrap_for_update(model: torch.nn.Module, *, parallel: str, world_size: int, local_rank: int = 0):
    """The module the update step calls: ``model`` itself (one process, or FSDP, which shards it
    in place) or a DDP wrapper around it."""
    check_parallel(parallel)
    if world_size <= 1:
        return model
    if parallel == "fsdp":
        return shard(model)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None, process_group=reduce.group())


def _block_classes(model: torch.nn.Module) -> set[str]:
    """Names of the decoder-block classes Hugging Face models declare in ``_no_split_modules``."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names


def shard(model: torch.nn.Module, mesh=None, *, offload: bool = False) -> torch.nn.Module:
    """Apply FSDP2 in place: each decoder block, then the root (embeddings, norm, head, the rest).

    Works on CPU with gloo and on GPUs with nccl; ``mesh`` defaults to the ranks of this rank's role
    (:func:`sleuth.train.reduce.group`: the training ranks under ``rollout.workers``, else all) on this
    process's device type. ``offload`` (GPU meshes; a no-op on CPU): the shards live in pinned CPU
    memory (FSDP2's ``CPUOffloadPolicy``) and are copied to the GPU when gathered.
    """
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    if mesh is None:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
        group = reduce.group()
        mesh = (init_device_mesh(kind, (dist.get_world_size(),)) if group is None
                else DeviceMesh.from_group(group, kind))
    policy = CPUOffloadPolicy(pin_memory=True) if offload and mesh.device_type == "cuda" else OffloadPolicy()
    names = _block_classes(model)
    for block in [m for m in model.modules() if type(m).__name__ in names]:
        fully_shard(block, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    return model


def is_sharded(model: torch.nn.Module | None) -> bool:
    if model is None or not dist.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state dict, each tensor whole, in its order: an FSDP model's shards gathered one tensor at
    a time (a collective: every rank of its mesh iterates the same way, to the end); the tensors themselves
    otherwise (not copies)."""
    from torch.distributed.tensor import DTensor

    for k, v in model.state_dict().items():
        yield k, (v.full_tensor() if isinstance(v, DTensor) else v)


@contextlib.contextmanager
def gathered(model: torch.nn.Module | None) -> Iterator[None]:
    """Hold the full parameters of an FSDP ``model`` on every rank for the duration (a no-op for
    anything else). Entering is a collective: every rank must enter; inside, forwards are local."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    blocks = [m for m in model.modules() if isinstance(m, FSDPModule)]
    model.set_reshard_after_forward(False)  # recursive: forwards inside keep the full weights
    for m in blocks:
        m.unshard()
    try:
        yield
    finally:
        # casts of the full weights made inside (the rollout under the step's autocast) would keep a
        # full low-precision copy of the model alive through the sharded update
        torch.clear_autocast_cache()
        for m in blocks:
            m.reshard()
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)  # FSDP's default for the root


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on CPU: complete on rank 0, empty on other ranks of an FSDP
    model (a collective there); ``state_dict()`` on CPU otherwise."""
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by parameter name, full on rank 0 (FSDP: a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load a full state dict into ``model`` (sharding it for FSDP); ``(missing, unexpected)`` keys."""
    if not is_sharded(model):
        result = model.load_state_dict(state, strict=False)
        return list(result.missing_keys), list(result.unexpected_keys)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    set_model_state_dict(model, {k: v for k, v in state.items() if k in expected}, options=_options(strict=False))
    return missing, unexpected


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a name-keyed full optimizer state (from :func:`full_optimizer_state`) on every rank."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=_options())


def plain_class(model: torch.nn.Module) -> type:
    """The model's own class (FSDP2 swaps in a subclass named ``FSDP<Class>``)."""
    if not is_sharded(model):
        return type(model)
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def plain_model(model, state: dict[str, torch.Tensor]):
    """An unwrapped Hugging Face model holding ``state`` (built on the meta device, no copy), for
    ``save_pretrained``: the files and ``config.json`` are those of the original class."""
    with torch.device("meta"):
        plain = plain_class(model)(model.config)
    plain.load_state_dict(state, strict=False, assign=True)
    if getattr(model.config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain


def shutdown() -> None:
    """Leave the process group (every rank, once the work is done; the rank context is forgotten); a no-op
    when none was joined.

    The caller drops its references to sharded models first. FSDP2 modules sit in reference
    cycles that hold the last communication work objects; collected only at interpreter exit,
    after the process group is gone, they abort the process (``terminate called without an active
    exception``, SIGABRT) in 1 run of 10 to 1 of 5 with gloo on torch 2.13, after the run itself
    succeeded. Collecting them here, while the group is alive, avoids it.
    """
    global _CONTEXT
    _CONTEXT = None
    reduce.set_group(None)
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    dist.destroy_process_group()


@dataclass
class DistContext:
    """This process's place in a ``torchrun`` job (rank 0 of 1 without one). With ``rollout.workers`` the
    job splits in two halves: ``role`` ``train`` (the first half) or ``rollout`` (the second), ``rank`` and
    ``world_size`` within the role (training rank ``i`` and rollout rank ``i`` make a pair: the rollout
    rank generates the batches the training rank would have collected), ``peer`` the partner's global rank,
    ``weights_group`` / ``batch_group`` the pair's two process groups (weights one way, batches the other)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    role: str = "train"
    peer: int | None = None
    weights_group: object = None
    batch_group: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0 and self.role == "train"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


_CONTEXT: DistContext | None = None
PAIR_TIMEOUT = datetime.timedelta(hours=6)  # rollout.workers: how long one side may wait for the other


def init_distributed(workers: int = 0) -> DistContext:
    """Join the process group when launched by ``torchrun`` (gloo on CPU, nccl on GPU); the same context
    on later calls. ``workers`` (``rollout.workers``) > 0: the last ``workers`` ranks generate and the first
    as many train (:class:`DistContext`); each rank's collectives then run over its role's ranks."""
    global _CONTEXT
    if _CONTEXT is not None:
        return _CONTEXT
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if workers and world != 2 * workers:
        raise ConfigError(f"rollout.workers={workers} pairs each rollout rank with a training rank: launch "
                          f"torchrun with --nproc_per_node {2 * workers} (this job has {world} rank(s))")
    if world <= 1:
        return DistContext()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)  # before the group: NCCL binds each rank to its own GPU, not GPU 0
    if not dist.is_initialized():
        if torch.cuda.is_available():
            dist.init_process_group(backend="nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    if not workers:
        ctx = DistContext(rank, dist.get_world_size(), local)
    else:
        # every rank creates every group, in the same order (torch.distributed.new_group's rule); a pair's two
        # ranks wait on each other for whole phases (the other's start, a rollout, an evaluation, a checkpoint)
        roles = [dist.new_group(list(range(workers)), timeout=PAIR_TIMEOUT),
                 dist.new_group(list(range(workers, world)), timeout=PAIR_TIMEOUT)]
        pairs = [tuple(dist.new_group([i, workers + i], timeout=PAIR_TIMEOUT) for _ in range(2))
                 for i in range(workers)]
        train = rank < workers
        i = rank % workers
        reduce.set_group(roles[0] if train else roles[1])
        ctx = DistContext(i, workers, local, role="train" if train else "rollout",
                          peer=workers + i if train else i, weights_group=pairs[i][0], batch_group=pairs[i][1])
    if dist.is_initialized():  # (a test may fake the group)
        _CONTEXT = ctx
    return ctx
