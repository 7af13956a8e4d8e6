"""The learning-rate schedule (sleuth.train.state.make_scheduler), by hand: warm-up k / N (Sleuth's
default) or (k - 1) / N (train.warmup_from_zero: verl's get_constant_schedule_with_warmup, whose
first update runs at rate 0), then constant or cosine; the critic's own warm-up, constant after."""

import math

import pytest
import torch

from sleuth.config import Config
from sleuth.train.state import make_scheduler

pytestmark = pytest.mark.unit


def _rates(cfg, updates, **kw):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = make_scheduler(opt, cfg, **kw)
    rates = []
    for _ in range(updates):
        rates.append(opt.param_groups[0]["lr"])  # the rate the update runs at
        opt.step()
        sched.step()
    return rates


def test_warm_up_from_the_first_step_or_from_zero():
    cfg = Config()
    cfg.train.warmup_steps, cfg.train.total_steps = 4, 100
    assert _rates(cfg, 6) == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0, 2.0])
    cfg.train.warmup_from_zero = True
    assert _rates(cfg, 6) == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.0])


def test_cosine_after_warm_up_and_the_critic_schedule():
    cfg = Config()
    cfg.train.warmup_steps, cfg.train.total_steps, cfg.train.schedule = 2, 6, "cosine"
    # after 2 warm-up updates, progress (k - 2) / 4 for k = 2..5 updates done
    want = [1.0, 2.0] + [1.0 + math.cos(math.pi * p) for p in (0.0, 0.25, 0.5, 0.75)]
    assert _rates(cfg, 6) == pytest.approx(want)
    cfg.train.warmup_from_zero = True
    assert _rates(cfg, 4, warmup_steps=3, schedule="constant") == pytest.approx([0.0, 2 / 3, 4 / 3, 2.0])
    with pytest.raises(ValueError, match="train.schedule"):
        _rates(cfg, 1, schedule="linear")
