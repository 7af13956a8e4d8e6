"""Offload options (``train.offload_optimizer``, ``train.offload_reference``): state a GPU run need not
hold on the device all the time is kept in CPU memory and brought over only when used, as verl's
``optimizer_offload`` and the reference's ``param_offload`` do.

* AdamW state (8 bytes per trainable parameter, the largest term of a full fine-tune) lives in CPU
  memory except during ``optimizer.step()``: step hooks move it to each parameter's device before
  the step and back after, and a loaded checkpoint's state goes back to CPU. The device then holds
  it only at the step, when no activations or KV cache are alive. Cost: two copies of the state
  over the host link per optimizer step.
* The frozen reference lives in CPU memory and visits the device for its log-probability pass
  (:func:`on_device`). Under FSDP its shards stay in CPU memory through FSDP2's
  ``CPUOffloadPolicy`` (:func:`sleuth.train.distributed.shard`) and are gathered onto the device
  for the pass.

On a CPU run both are no-ops: the state is already in CPU memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

HOME = torch.device("cpu")


def _move_state(optimizer: torch.optim.Optimizer, device_of) -> None:
    """Move every tensor of the optimizer's per-parameter state to ``device_of(param)`` (AdamW's
    ``step`` counter stays where the optimizer keeps it: a CPU scalar unless fused/capturable)."""
    pinned = torch.cuda.is_available()
    for param, state in optimizer.state.items():
        target = device_of(param)
        for key, value in state.items():
            if not torch.is_tensor(value) or value.device == target or (key == "step" and value.dim() == 0
                                                                        and value.device.type == "cpu"):
                continue
            moved = value.to(target, non_blocking=True)
            if target.type == "cpu" and pinned:
                moved = moved.pin_memory()
            state[key] = moved
    if pinned:
        torch.cuda.synchronize()


def state_to_home(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state into CPU memory."""
    _move_state(optimizer, lambda p: HOME)


def state_to_params(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state onto each parameter's device (for the step)."""
    _move_state(optimizer, lambda p: p.device)


def offload_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Keep ``optimizer``'s state in CPU memory except during its steps (hooks on step and on
    ``load_state_dict``); returns it. Idempotent."""
    if getattr(optimizer, "_sleuth_offloaded", False):
        return optimizer
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: state_to_params(opt))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: _home_unless_held(opt))
    optimizer.register_load_state_dict_post_hook(lambda opt: _home_unless_held(opt))
    optimizer._sleuth_offloaded = True
    optimizer._sleuth_held = 0  # > 0 inside state_on_params: the state stays on the device
    state_to_home(optimizer)
    return optimizer


def _home_unless_held(optimizer: torch.optim.Optimizer) -> None:
    if not getattr(optimizer, "_sleuth_held", 0):
        state_to_home(optimizer)


@contextlib.contextmanager
def state_on_params(optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Within, an offloaded optimizer's state is on its parameters' devices (e.g. for FSDP's
    state-dict collectives at a checkpoint, which may also create the state with a zero-rate step:
    the hooks leave it there); a no-op for others."""
    if optimizer is None or not getattr(optimizer, "_sleuth_offloaded", False):
        yield
        return
    state_to_params(optimizer)
    optimizer._sleuth_held += 1
    try:
        yield
    finally:
        optimizer._sleuth_held -= 1
        state_to_home(optimizer)


@contextlib.contextmanager
def on_device(model: torch.nn.Module, device: torch.device, *, offloaded: bool) -> Iterator[None]:
    """Within, ``model`` (kept in CPU memory when ``offloaded``) is on ``device``; back to CPU memory
    after. A no-op when not ``offloaded`` or already there."""
    if not offloaded or torch.device(device) == HOME:
        yield
        return
    model.to(device)
    try:
        yield
    finally:
        model.to(HOME)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # give the pass's blocks back for the update
