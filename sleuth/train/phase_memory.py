"""Peak device memory of each phase of a train step, beside the memory plan's figure for it.

On CUDA, :class:`PhasePeaks` reads ``torch.cuda.max_memory_allocated`` at the end of each phase and
resets the peak counter, so ``mem/<phase>_peak_gib`` is the most memory tensors held during that
phase alone (what the allocator caches beyond it is not counted, as the plan does not count it).
``mem/<phase>_plan_gib`` is :mod:`sleuth.train.memory_plan`'s figure for the same phase, so a run's
metrics show how far the plan is from what happened. ``mem/<phase>_outside_torch_gib`` is the device
memory in use at the phase's end beyond what PyTorch's allocator holds (``mem_get_info`` less
``memory_reserved``: CUDA contexts, libraries' own allocations, other processes) and
``mem/<phase>_cached_gib`` what the allocator holds beyond its tensors (``memory_reserved`` less
``memory_allocated``: freed blocks kept for reuse, and fragmentation). On an H100 a GPU-config run ran out of
memory in its first update with 60 of 79 GiB outside the allocator; these figures, and a probe
(``bench/gpu_mem_probe.py``), traced it to JAX's preallocation, set off by bm25s' import
(:func:`sleuth.retrieval.bm25.import_bm25s`).

On a CPU (Linux) ``mem/<phase>_peak_gib`` is the process's resident peak during the phase (``VmHWM``, reset
between phases through ``/proc/self/clear_refs``, :mod:`sleuth.train.host_memory`): everything resident, the
Python process, libraries and the retrieval index included, not tensors only, beside the same
``mem/<phase>_plan_gib``. A trainer that grows step after step shows here before the kernel kills it: Gemma-3-270M's
attempt 3 was killed at 24.4 GiB in its 44th step where a fresh process ran the same step at ~15.8 GiB. Where the
peak cannot be read or reset (not Linux) nothing is recorded.
"""

from __future__ import annotations

import torch

from sleuth.train import host_memory

GIB = 2**30


class PhasePeaks:
    def __init__(self, device: torch.device, plan=None):
        self.on = torch.device(device).type == "cuda"
        self.device, self.plan, self.figures = device, plan, {}
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.device)
        # CPU: the process's resident peak, where it can be read and reset
        self.host = not self.on and host_memory.reset_resident_peak() and host_memory.resident_peak_gib() is not None

    def mark(self, phase: str, *plan_phases: str) -> None:
        """End of ``phase``: record its peak (and the largest of the plan's ``plan_phases``, default
        ``phase``), then count the next phase from here."""
        if not (self.on or self.host):
            return
        name = phase.replace(" ", "_")
        if self.host:
            self.figures[f"mem/{name}_peak_gib"] = host_memory.resident_peak_gib()
        else:
            self.figures[f"mem/{name}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / GIB
            free, total = torch.cuda.mem_get_info(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
            self.figures[f"mem/{name}_outside_torch_gib"] = (total - free - reserved) / GIB
            self.figures[f"mem/{name}_cached_gib"] = (reserved - torch.cuda.memory_allocated(self.device)) / GIB
        planned = [self.plan.phases[p][0] for p in plan_phases or (phase,) if self.plan and p in self.plan.phases]
        if planned:
            self.figures[f"mem/{name}_plan_gib"] = max(planned) / GIB
        if self.host:
            host_memory.reset_resident_peak()
        else:
            torch.cuda.reset_peak_memory_stats(self.device)

    def report(self) -> str:
        """What an out-of-memory error gets as a note: this step's phases so far and the device now."""
        if not self.on:
            return ""
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        now = (f"now: {torch.cuda.memory_allocated(self.device) / GIB:.2f} GiB allocated, {reserved / GIB:.2f} GiB "
               f"held by PyTorch's allocator, {(total - free - reserved) / GIB:.2f} GiB in use outside it, "
               f"{free / GIB:.2f} GiB free")
        done = ", ".join(f"{k.removeprefix('mem/')} {v:.2f}" for k, v in self.figures.items())
        return f"this step's phases so far (GiB): {done or 'none ended'}; {now}"
