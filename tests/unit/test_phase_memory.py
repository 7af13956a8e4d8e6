"""mem/<phase>_peak_gib: each phase's own peak (the counter reset between phases) beside the plan's
figure: on CUDA the allocator's (its counters faked), on a Linux CPU the process's resident peak (real)."""

import sys

import pytest
import torch

from sleuth.train.host_memory import release_freed_memory
from sleuth.train.memory_plan import MemoryPlan
from sleuth.train.phase_memory import PhasePeaks

pytestmark = pytest.mark.unit


def test_nothing_is_recorded_on_a_cpu_whose_resident_peak_cannot_be_reset(monkeypatch):
    from sleuth.train import host_memory

    monkeypatch.setattr(host_memory, "reset_resident_peak", lambda: False)  # not Linux, or /proc not writable
    peaks = PhasePeaks(torch.device("cpu"))
    peaks.mark("rollout")
    assert peaks.figures == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_on_a_cpu_each_phase_gets_the_process_resident_peak_of_that_phase_alone():
    gib = 2**30
    plan = MemoryPlan(phases={"rollout": (3 * gib, ""), "update": (5 * gib, "")})
    release_freed_memory()  # a heap's free resident top could hold the block below without a new page
    peaks = PhasePeaks(torch.device("cpu"), plan)
    block = torch.ones(300 * 2**20, dtype=torch.uint8)  # 300 MiB, every page touched
    del block
    release_freed_memory()  # given back to the system whether it came from the heap or its own mapping
    peaks.mark("rollout")
    peaks.mark("update")  # nothing large since the reset
    figures = peaks.figures
    assert set(figures) == {"mem/rollout_peak_gib", "mem/rollout_plan_gib", "mem/update_peak_gib",
                            "mem/update_plan_gib"}
    assert figures["mem/rollout_plan_gib"] == 3.0 and figures["mem/update_plan_gib"] == 5.0
    assert figures["mem/rollout_peak_gib"] - figures["mem/update_peak_gib"] > 0.25, figures


def test_each_phase_gets_its_own_peak_and_the_plans_figure(monkeypatch):
    gib = 2**30
    state = {"peak": 0, "resets": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda d=None: state.update(peak=0, resets=state["resets"] + 1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (70 * gib, 80 * gib))  # 10 GiB in use
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: state["peak"] + gib)  # cached: 1 more
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: state["peak"] // 2)  # half of it freed since
    plan = MemoryPlan(phases={"rollout": (3 * gib, ""), "update": (5 * gib, ""), "optimizer step": (6 * gib, "")})
    peaks = PhasePeaks(torch.device("cuda"), plan)
    assert state["resets"] == 1
    state["peak"] = 4 * gib
    peaks.mark("rollout")
    peaks.mark("logprob passes")  # nothing allocated since the reset; no plan phase of that name
    state["peak"] = 7 * gib
    peaks.mark("update", "update", "optimizer step")  # the larger of the two planned phases
    assert peaks.figures == {"mem/rollout_peak_gib": 4.0, "mem/rollout_plan_gib": 3.0,
                             "mem/rollout_outside_torch_gib": 5.0, "mem/rollout_cached_gib": 3.0,
                             "mem/logprob_passes_peak_gib": 0.0, "mem/logprob_passes_outside_torch_gib": 9.0,
                             "mem/logprob_passes_cached_gib": 1.0,
                             "mem/update_peak_gib": 7.0, "mem/update_plan_gib": 6.0,
                             "mem/update_outside_torch_gib": 2.0, "mem/update_cached_gib": 4.5}
    assert state["resets"] == 4


def test_an_out_of_memory_note_names_the_phases_so_far_and_memory_outside_the_allocator(monkeypatch):
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: 4 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 19 * gib)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (1 * gib, 80 * gib))
    peaks = PhasePeaks(torch.device("cuda"))
    assert "none ended" in peaks.report()
    peaks.mark("rollout")
    text = peaks.report()
    assert "rollout_peak_gib 4.00" in text and "rollout_outside_torch_gib 60.00" in text
    assert "3.00 GiB allocated, 19.00 GiB held by PyTorch's allocator, 60.00 GiB in use outside it, 1.00 GiB free" in text
    assert PhasePeaks(torch.device("cpu")).report() == ""
