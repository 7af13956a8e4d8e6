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
"""

from __future__ import annotations

import ctypes
import functools
import sys


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
