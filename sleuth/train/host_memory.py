"""Freed CPU memory handed back to the system after every step.

A step on a CPU allocates and frees tensors of shapes that change with each batch's row lengths. glibc keeps
what was freed in its heaps for reuse (its mmap threshold rises after the first large frees), and with
shapes that keep changing the reuse is poor: the process's resident memory grows step after step. Measured
2026-11-27: ``sleuth sft`` of SmolLM2-135M (bf16, batch 8) grew from ~7 to 17-21 GiB within 50-140 steps and
was killed by the kernel's out-of-memory killer twice on a 24 GiB machine; a 4-layer model stepped on rows
of random lengths grew 1,396 -> 2,238 MiB over 40 steps, and 560 -> 838 MiB with ``malloc_trim(0)`` after
each step (the same as forcing mmap for every block of 64 KiB or more). So the trainers call
:func:`release_freed_memory` once per step: a few milliseconds against a step of seconds. Elsewhere than
glibc (macOS, musl) it does nothing.

Second, oneDNN's kernel caches (:func:`limit_kernel_caches`). On a CPU with bfloat16 instructions, PyTorch runs
bf16 matmuls through oneDNN, which keeps every kernel it built, keyed by the exact shapes, in two caches of
1,024 entries each (oneDNN's primitive cache and PyTorch's ideep cache); the step peaks fell with the caches
limited, so the cached kernels also hold memory sized by their shapes. Training rows change length every micro-batch and rollout batches shrink as rows finish, so the caches
fill with kernels that are never used again. Measured 2026-11-28 (``bench/host_memory.py`` on Gemma-3-270M's
attempt-3 recipe, the same batches): with the default caches the process kept 55 MB more after every step
(heap memory still in use after ``malloc_trim``; not tensors, not Python objects) and its step peak rose from
10.8 to 13.2 GiB in 10 steps; attempt 3's own trainer was killed by the kernel's out-of-memory killer at
24.4 GiB in its 44th step, where a fresh process ran the same step at ~15.8 GiB. With both caches at 16
entries the process stayed at 3.68 GiB between steps and peaked at 7.7-8.8 GiB through 6 steps, and the steps
ran ~11% faster. Sleuth sets both (unless the user has) before the process's first oneDNN call: first thing in
the ``sleuth`` command and in the trainers' constructors.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
from pathlib import Path

GIB = 2**30
_STATUS = Path("/proc/self/status")


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), "malloc_trim", None)  # glibc's; musl has none
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the C heap's free memory to the system (glibc ``malloc_trim(0)``); False where there is none."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


KERNEL_CACHE_ENTRIES = 16  # measured above; oneDNN's default is 1,024
KERNEL_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's; PyTorch's ideep


def limit_kernel_caches(entries: int = KERNEL_CACHE_ENTRIES) -> dict[str, str]:
    """Cap oneDNN's kernel caches at ``entries`` each (see the module's docstring), leaving a variable the user
    set alone; returns the settings in force. Read once, when the process first uses oneDNN: called after
    that, it changes nothing in this process (but still in the processes it starts, which inherit them)."""
    if entries < 1:  # LRU_CACHE_CAPACITY=0 makes PyTorch's ideep cache crash
        raise ValueError(f"entries must be >= 1, got {entries}")
    return {var: os.environ.setdefault(var, str(entries)) for var in KERNEL_CACHE_VARS}


def _status_gib(field: str) -> float | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 / GIB if m else None


def resident_gib() -> float | None:
    """This process's resident memory now (Linux ``VmRSS``); None elsewhere."""
    return _status_gib("VmRSS")


def resident_peak_gib() -> float | None:
    """This process's largest resident memory since it started or since :func:`reset_resident_peak`
    (Linux ``VmHWM``); None elsewhere."""
    return _status_gib("VmHWM")


def reset_resident_peak() -> bool:
    """Count the resident peak again from the current resident size (Linux >= 4.0: ``5`` written to
    ``/proc/self/clear_refs``); False where that cannot be done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
