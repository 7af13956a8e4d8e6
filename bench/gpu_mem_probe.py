"""Which torch call takes device memory outside PyTorch's allocator (a GPU diagnosis, issue #32).

    python bench/gpu_mem_probe.py SLEUTH-ARGS...      e.g. train --config configs/smollm2_nq_gpu.yaml --out D ...

Runs the ``sleuth`` command given under a torch function mode that reads, after every torch call, the
device memory in use beyond what the caching allocator holds (``mem_get_info`` less ``memory_reserved``).
The first call after which it has grown by more than ``--jump`` GiB (default 2) since the smallest figure
seen is printed with its arguments' shapes, the stack and the CUDA per-thread stack limit (the driver sizes
kernels' local memory for the whole device from it), and the process exits (status 3). A torch function mode
sees this thread's torch calls only: memory that appears between two of them (a library's own allocation) is
reported at the next one, with the stack that locates the window. On an H100 the GPU recipe had 60 GiB
outside the allocator; this probe placed its arrival between loading the model and the first step, where
bm25s' import runs JAX (docs/benchmarks.md, GPU check).
"""

from __future__ import annotations

import ctypes
import sys
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
GIB = 2**30


def stack_limit() -> int | None:
    """cudaDeviceGetLimit(cudaLimitStackSize): bytes of stack per thread the context now provides."""
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        value = ctypes.c_size_t()
        if lib.cudaDeviceGetLimit(ctypes.byref(value), 0) == 0:
            return value.value
    return None


def outside_gib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GIB


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)}:{str(x.dtype).removeprefix('torch.')}:{x.device.type}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in x[:4]) + (", ..." if len(x) > 4 else "") + "]"
    return type(x).__name__


class Probe(TorchFunctionMode):
    def __init__(self, jump: float):
        super().__init__()
        self.jump, self.low, self.calls = jump, None, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not torch.cuda.is_initialized():
            return out
        self.calls += 1
        now = outside_gib()
        self.low = now if self.low is None else min(self.low, now)
        if now - self.low > self.jump:
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            print(f"gpu_mem_probe: after call {self.calls} ({name}) {now - self.low:.2f} GiB more outside the "
                  f"allocator ({self.low:.2f} -> {now:.2f}); stack limit {stack_limit()} bytes a thread",
                  flush=True)
            print("gpu_mem_probe: args " + ", ".join(describe(a) for a in args), flush=True)
            print("".join(traceback.format_stack(limit=14)[:-1]), flush=True)
            raise SystemExit(3)
        return out


def main(argv: list[str]) -> int:
    jump = 2.0
    if argv[:1] == ["--jump"]:
        jump, argv = float(argv[1]), argv[2:]
    from sleuth.cli import main as sleuth_main

    print(f"gpu_mem_probe: stack limit at start {stack_limit()} bytes a thread", flush=True)
    with Probe(jump):
        rc = sleuth_main(argv)
    now = f"{outside_gib():.2f}" if torch.cuda.is_initialized() else "(no CUDA)"
    print(f"gpu_mem_probe: no jump over {jump} GiB; outside now {now} GiB, stack limit {stack_limit()}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
