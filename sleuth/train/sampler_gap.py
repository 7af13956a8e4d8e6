"""Whether the sampler's logprobs may stand in for the old policy's, checked against the trainer's.

With one on-policy pass (one epoch, one mini-batch, our HF decode at the training temperature) the
rollout's logprobs are the old policy's, and the trainer skips a no-grad forward
(``learn.sampler_logprobs_are_old``). On a CPU in float32 the two agree to float rounding. On a GPU
in bf16 they need not: the decode (one query position, GEMV-shaped products, the cache read step by
step) and the trainer's full-sequence forward round differently, and the PPO ratio of the only
mini-batch is then not 1 where it should be.

:class:`SamplerGap` measures it: on check steps the trainer also runs the forward, uses its logprobs
(they are there) and logs the gap at the trained tokens: ``rollout/sampler_gap_mean`` and ``_max``
(|sampler - trainer| logprob) and ``rollout/sampler_ratio_dev_max`` (max |exp(trainer - sampler) - 1|).
When the mean gap exceeds ``train.sampler_max_gap`` the run takes the old logprobs from the trainer at every
step from then on (a warning says so; ``train/old_logprobs_recomputed`` is 1 in every later step): from the
update's own forward, detached, where ``learn.old_from_update`` holds (one epoch of one mini-batch, no KL in the
reward, no dropout: the ratio is then exactly 1, at no cost), else from a separate no-grad forward, which also
logs the gap at every step.
Check steps: every ``train.sampler_check_every`` steps from step 1; None (default) means every 10
steps where it can matter (a GPU, or bf16/float16 compute) and never on a CPU in float32. A check step
trains with the trainer's logprobs as the old policy's (they are there): the setting is a training setting.
Under torchrun every rank takes the decision of the rank with the largest gap. The switch is kept in
checkpoints (``state()`` / ``load_state``), so a resumed run trains as the uninterrupted one.
"""

from __future__ import annotations

import sys

import torch

from sleuth.train.reduce import all_max

DEFAULT_EVERY = 10


class SamplerGap:
    def __init__(self, every: int | None, max_gap: float, *, device: torch.device, dtype: str):
        if every is None:
            every = DEFAULT_EVERY if torch.device(device).type == "cuda" or dtype != "float32" else 0
        self.every, self.max_gap, self.recompute = every, max_gap, False

    def state(self) -> dict:
        return {"recompute": self.recompute}

    def load_state(self, state: dict | None) -> None:
        self.recompute = bool((state or {}).get("recompute", False))  # checkpoints from before: not switched

    def needs_forward(self, step: int) -> bool:
        """Whether step ``step`` (1-based) computes the old logprobs with the trainer's forward."""
        return self.recompute or (self.every > 0 and (step - 1) % self.every == 0)

    def compare(self, sampler_BT: torch.Tensor, trainer_BT: torch.Tensor, mask_BT: torch.Tensor,
                step: int) -> dict[str, float]:
        """The gap at the trained tokens of one step; switches to recomputing when it is too large."""
        out = {"train/old_logprobs_recomputed": float(self.recompute)}
        dev = trainer_BT.device  # the rollout's logprobs come from the CPU batch, the trainer's are on its device
        m = mask_BT.to(dev).bool()
        d = trainer_BT[m].float() - sampler_BT.to(dev)[m].float()
        gap = d.abs()
        n = int(m.sum())
        # every rank takes the same decision (a collective under torchrun): the largest rank's mean gap
        (worst,) = all_max([float(gap.mean()) if n else 0.0], dev)
        if n:
            out.update({"rollout/sampler_gap_mean": float(gap.mean()), "rollout/sampler_gap_max": float(gap.max()),
                        "rollout/sampler_ratio_dev_max": float((d.exp() - 1).abs().max())})
        if not self.recompute and worst > self.max_gap:
            self.recompute = True
            print(f"sleuth: step {step}: the sampler's logprobs differ from the trainer's by "
                  f"{worst:.3g} on average (train.sampler_max_gap {self.max_gap:g}); "
                  "the old policy's logprobs are the trainer's from now on (the update's own forward where one "
                  "epoch of one mini-batch allows, else a forward pass)", file=sys.stderr)
        return out
