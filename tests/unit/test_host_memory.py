"""train/host_memory: glibc's malloc_trim after each step (the trainers' calls: tests/e2e/test_sft_e2e.py)."""

import ctypes
import sys

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

