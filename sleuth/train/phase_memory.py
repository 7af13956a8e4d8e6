"""Peak device memory of each phase of a train step, beside the memory plan's figure for it.

On CUDA, :class:`PhasePeaks` reads ``torch.cuda.max_memory_allocated`` at the end of each phase and
resets the peak counter, so ``mem/<phase>_peak_gib`` is the most memory tensors held during that
phase alone (what the allocator caches beyond it is not counted, as the plan does not count it).
``mem/<phase>_plan_gib`` is :mod:`sleuth.train.memory_plan`'s figure for the same phase, so a run's
metrics show how far the plan is from what happened. Elsewhere (CPU) it records nothing.
"""

from __future__ import annotations

import torch

GIB = 2**30


class PhasePeaks:
    def __init__(self, device: torch.device, plan=None):
        self.on = torch.device(device).type == "cuda"
        self.device, self.plan, self.figures = device, plan, {}
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self, phase: str, *plan_phases: str) -> None:
        """End of ``phase``: record its peak (and the largest of the plan's ``plan_phases``, default
        ``phase``), then count the next phase from here."""
        if not self.on:
            return
        name = phase.replace(" ", "_")
        self.figures[f"mem/{name}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / GIB
        planned = [self.plan.phases[p][0] for p in plan_phases or (phase,) if self.plan and p in self.plan.phases]
        if planned:
            self.figures[f"mem/{name}_plan_gib"] = max(planned) / GIB
        torch.cuda.reset_peak_memory_stats(self.device)
