"""bench/gpu_mem_probe.py: the first torch call after which device memory outside PyTorch's allocator has grown
by more than the threshold stops the run and is named. CUDA's readings are faked."""

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location(
    "gpu_mem_probe", Path(__file__).resolve().parents[2] / "bench" / "gpu_mem_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_the_call_after_which_memory_appeared_outside_the_allocator_is_named(monkeypatch, capsys):
    readings = iter([0.5, 0.4, 1.9, 2.6])  # GiB outside: the low is 0.4, so 2.6 is the first jump over 2
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(probe, "outside_gib", lambda: next(readings))
    monkeypatch.setattr(probe, "stack_limit", lambda: 1024)
    x = torch.ones(3)
    with pytest.raises(SystemExit) as stop, probe.Probe(2.0):
        x + 1
        x * 2
        x - 1  # 1.9: 1.5 above the low, under the threshold
        torch.zeros(2, 5)  # 2.6
        raise AssertionError("the probe should have stopped the run")
    assert stop.value.code == 3
    out = capsys.readouterr().out
    assert "after call 4 (_VariableFunctionsClass.zeros) 2.20 GiB more outside the allocator (0.40 -> 2.60)" in out
    assert "stack limit 1024" in out


def test_nothing_is_read_before_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(probe, "outside_gib", lambda: pytest.fail("read on a CPU"))
    with probe.Probe(2.0):
        assert (torch.ones(2) + 1).sum().item() == 4.0
