"""Check a ``--device`` (encoders, rerankers, the policy's ``model.device``) before torch sees it.

A bad string (``banana``) or a GPU that is not there (``cuda`` on a CPU-only torch, ``cuda:3`` on a
one-GPU machine) otherwise fails deep inside torch with a message that names neither the flag nor
the value.
"""

from __future__ import annotations

import re

from sleuth.errors import ConfigError

VALID = "cpu, cuda, cuda:N, mps or auto"


def check_device(device: str | None, flag: str = "--device") -> str | None:
    """``device`` as sentence-transformers takes it: ``None`` for ``auto`` (or unset, meaning the
    library's choice: a GPU when there is one), else the string; a ConfigError naming ``flag``, the
    value and what is valid when it is malformed or names a device this machine does not have."""
    if device is None or device == "auto":
        return None
    match = re.fullmatch(r"cpu|mps|cuda(?::(\d+))?", device)
    if not match:
        raise ConfigError(f"{flag} {device!r} is not a device; use {VALID}")
    if device.startswith("cuda"):
        _check_cuda(device, int(match.group(1) or 0), flag)
    if device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError(f"{flag} mps: this machine has no Apple GPU (MPS); use cpu or auto")
    return device


def _check_cuda(device: str, index: int, flag: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} {device}: CUDA is not available here (torch {torch.__version__} "
                          f"sees no GPU); use {flag} cpu or auto")
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{flag} {device}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}")
