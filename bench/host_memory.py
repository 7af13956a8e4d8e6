"""Where a CPU trainer's resident memory goes, step after step: does it grow, and in what?

Runs ``sleuth train``'s Trainer for ``--steps`` steps (a run's ``config.yaml`` or the defaults, ``--set``
overrides) and after every step (which ends with ``malloc_trim``, ``sleuth.train.host_memory``) records:

* ``rss_gib``: the process's resident memory; ``peak_gib``: its peak during the step (``VmHWM``, reset
  before the step through ``/proc/self/clear_refs``);
* ``malloc_used_gib`` / ``malloc_free_gib`` / ``mmap_gib``: glibc's ``mallinfo2`` over all arenas: bytes
  in use in the heaps, bytes free but held in them (fragmentation), bytes in mmapped blocks;
* ``tensor_gib``: the bytes of every distinct storage of a live torch tensor (a ``gc`` census: weights,
  optimizer state and anything a step left alive); ``objects``: Python objects ``gc`` tracks.

A leak of tensors shows in ``tensor_gib``, one of Python objects in ``objects``, memory freed but not given
back in ``malloc_free_gib``, and memory that no allocation Python or glibc knows of (a library's own
allocator, caches of compiled kernels) in ``rss_gib`` less the rest. The last line gives each figure's growth
per step (least squares over the steps after the first ``--skip``).

    python bench/host_memory.py --config runs/gemma3/zero3/rl/config.yaml --steps 12 --out /tmp/hm [--json]
        [--kernel-cache-entries 1024]   # oneDNN's default caches, as before 2026-11-28

Measured 2026-11-28 on Gemma-3-270M's attempt-3 recipe (2 cores; docs/results.md): with oneDNN's default
caches the process grew 55 MB a step between steps and its step peak from 10.8 to 13.2 GiB in 10 steps;
with Sleuth's limit (16 entries) 3.67 GiB flat between steps, peaks 8.1-8.6 GiB.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import sleuth.toy  # noqa: E402,F401  registers the embedded 'tiny' model and toy world, as the sleuth command does
from sleuth.config_file import load_config  # noqa: E402
from sleuth.train.host_memory import reset_resident_peak, resident_gib, resident_peak_gib  # noqa: E402

GIB = 2**30


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo() -> dict[str, float]:
    """glibc's heap figures (GiB), or nothing where there is no ``mallinfo2`` (glibc < 2.33, not glibc)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _Mallinfo2
    m = fn()
    return {"malloc_used_gib": m.uordblks / GIB, "malloc_free_gib": m.fordblks / GIB, "mmap_gib": m.hblkhd / GIB}


def tensor_census() -> tuple[float, int]:
    """(GiB of distinct live tensor storages, Python objects gc tracks)."""
    gc.collect()
    objs = gc.get_objects()
    seen: dict[int, int] = {}
    for o in objs:
        try:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                s = o.untyped_storage()
                seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        except Exception:  # a tensor without storage (meta, sparse, a subclass): not counted
            continue
    return sum(seen.values()) / GIB, len(objs)


def slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=None, help="a run's config.yaml (default: sleuth's defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the growth fit (warm-up)")
    ap.add_argument("--out", default=None, help="the run directory (default: a temporary one); must not exist")
    ap.add_argument("--memray", default=None, metavar="FILE.bin",
                    help="record with memray (pip install memray) every allocation of the steps after --skip into "
                         "FILE.bin: `memray table --leaks FILE.bin` then lists where what those steps left alive came "
                         "from (run with PYTHONMALLOC=malloc)")
    ap.add_argument("--native", action="store_true", help="--memray: with native (C/C++) stacks")
    ap.add_argument("--kernel-cache-entries", type=int, default=None,
                    help="oneDNN's kernel caches (sleuth.train.host_memory.limit_kernel_caches): default Sleuth's "
                         "16; 1024 is oneDNN's own default (the behaviour before Sleuth limited them)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from sleuth.train.host_memory import KERNEL_CACHE_ENTRIES, limit_kernel_caches

    caches = limit_kernel_caches(args.kernel_cache_entries or KERNEL_CACHE_ENTRIES)  # before torch's first matmul
    print(f"kernel caches: {caches}", file=sys.stderr)
    from sleuth.train.loop import Trainer

    cfg = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sleuth_host_memory_")) / "run"
    trainer = Trainer(cfg, out, progress=False)
    rows = []
    t0 = time.perf_counter()
    tensor_gib, objects = tensor_census()
    rows.append({"step": 0, "rss_gib": resident_gib(), "peak_gib": resident_peak_gib(),
                 **mallinfo(), "tensor_gib": tensor_gib, "objects": objects, "s": 0.0})
    tracker = contextlib.nullcontext()
    for _ in range(args.steps):
        if args.memray and trainer.step == args.skip:
            import memray

            tracker = memray.Tracker(args.memray, native_traces=args.native)
            tracker.__enter__()
        trainer.step += 1
        reset_resident_peak()
        trainer.train_step()
        peak, rss, heap = resident_peak_gib(), resident_gib(), mallinfo()  # before the census
        tensor_gib, objects = tensor_census()
        row = {"step": trainer.step, "rss_gib": rss, "peak_gib": peak, **heap,
               "tensor_gib": tensor_gib, "objects": objects, "s": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row) if args.json else "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in row.items()), flush=True)
    tracker.__exit__(None, None, None)
    trainer.close()
    fit = [r for r in rows if r["step"] > args.skip]
    growth = {f"{k}_per_step": slope([r[k] for r in fit]) for k in rows[-1] if k not in ("step", "s")}
    print(json.dumps({"growth": growth, "steps": args.steps, "skip": args.skip}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
