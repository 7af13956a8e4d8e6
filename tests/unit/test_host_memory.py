"""train/host_memory: glibc's malloc_trim after each step (the trainers' calls: tests/e2e/test_sft_e2e.py)."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.train import host_memory

pytestmark = pytest.mark.unit


def _rss_kib() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4


@pytest.mark.skipif(not sys.platform.startswith("linux") or host_memory._malloc_trim() is None, reason="glibc only")
def test_freed_heap_memory_goes_back_to_the_system():
    """Many blocks below glibc's mmap threshold freed while one late block pins the heap's top: without a trim
    glibc keeps the freed pages; the trim hands most of them back."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    host_memory.release_freed_memory()
    blocks = [libc.malloc(100_000) for _ in range(2000)]  # ~200 MB of 100 kB blocks (below the 128 kB threshold)
    for b in blocks:
        ctypes.memset(b, 1, 100_000)  # touched: resident
    pin = libc.malloc(100_000)
    for b in blocks:
        libc.free(b)
    before = _rss_kib()
    assert host_memory.release_freed_memory()
    after = _rss_kib()
    libc.free(pin)
    assert before - after > 100_000, (before, after)  # > 100 MB of the ~200 MB came back


def test_without_glibc_it_does_nothing(monkeypatch):
    monkeypatch.setattr(host_memory, "_malloc_trim", lambda: None)
    assert host_memory.release_freed_memory() is False



def test_the_kernel_caches_are_limited_unless_the_user_set_them(monkeypatch):
    for var in host_memory.KERNEL_CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "300")  # the user's own choice stays
    assert host_memory.limit_kernel_caches(16) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16",
                                                   "LRU_CACHE_CAPACITY": "300"}
    assert host_memory.limit_kernel_caches(64)["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"  # set once: kept
    with pytest.raises(ValueError, match="entries must be >= 1, got 0"):
        host_memory.limit_kernel_caches(0)


def test_the_sleuth_command_limits_the_kernel_caches_before_it_runs(monkeypatch, tmp_path, capsys):
    from sleuth.cli import main

    for var in host_memory.KERNEL_CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"response": "<answer>Paris</answer>", "golden_answers": ["Paris"]}\n')
    assert main(["reward", "score", "--input", str(rows), "--json"]) == 0
    assert [os.environ.get(v) for v in host_memory.KERNEL_CACHE_VARS] == ["16", "16"]


KERNEL_CACHE_WORKLOAD = """
import ctypes, re, sys
if sys.argv[1] == "limited":
    from sleuth.train.host_memory import limit_kernel_caches
    limit_kernel_caches()
import torch
torch.set_num_threads(1)
trim = ctypes.CDLL("libc.so.6").malloc_trim
rss = lambda: int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
torch.manual_seed(1)
w = torch.randn(2048, 640, dtype=torch.bfloat16)
(torch.randn(4, 640, dtype=torch.bfloat16) @ w.t()).sum()
trim(0)
before = rss()
torch.manual_seed(0)
total = 0.0
for m in range(500, 900):  # 400 shapes, as rows of changing lengths give
    total += (torch.randn(m, 640, dtype=torch.bfloat16) @ w.t()).double().sum().item()
for m in range(500, 510):  # shapes seen before: rebuilt kernels give the same products
    total += (torch.randn(m, 640, dtype=torch.bfloat16) @ w.t()).double().sum().item()
trim(0)
print(repr(total), (rss() - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or host_memory._malloc_trim() is None, reason="glibc only")
def test_limited_kernel_caches_keep_no_memory_per_matmul_shape(tmp_path):
    """bf16 matmuls of 400 shapes in a fresh process: with oneDNN's default caches the process keeps memory for
    every shape after a trim (measured: 248 MiB); limited, next to none (10 MiB), and the products are the same."""
    script = tmp_path / "workload.py"
    script.write_text(KERNEL_CACHE_WORKLOAD)
    env = {k: v for k, v in os.environ.items() if k not in host_memory.KERNEL_CACHE_VARS}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    kept, totals = {}, {}
    for mode in ("default", "limited"):
        done = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                              timeout=600)  # a hang guard: ~4 s each idle
        assert done.returncode == 0, done.stderr
        totals[mode], kept[mode] = map(float, done.stdout.split()[-2:])
    if kept["default"] < 64:
        pytest.skip(f"this CPU's bf16 matmuls keep nothing per shape ({kept}): oneDNN's caches are not in play")
    assert totals["limited"] == totals["default"]
    assert kept["limited"] < kept["default"] / 4, kept
