"""When ``Trainer.run`` writes checkpoints: every ``save_every`` steps and once at the end, never
the same step twice. The loop runs with stubbed steps (no model): only its bookkeeping is tested."""

import pytest
import torch

from sleuth.config import Config
from sleuth.train.distributed import DistContext
from sleuth.train.loop import Trainer
from sleuth.train.sampler import CollapseWatch

pytestmark = pytest.mark.unit


class _Logger:
    """Stands in for MetricsLogger: logs nothing."""

    def log(self, step, metrics):
        pass

    def log_samples(self, step, trajs, n=2):
        pass

    def close(self):
        pass


def _saves(total_steps: int, save_every: int) -> list[int]:
    """The steps at which a stubbed run of ``total_steps`` steps saves."""
    cfg = Config()
    cfg.train.total_steps, cfg.train.save_every, cfg.train.eval_every = total_steps, save_every, 0
    t = Trainer.__new__(Trainer)  # no __init__: no model, data or retriever
    t.cfg, t.ctx, t.step, t.watch, t.logger = cfg, DistContext(), 0, CollapseWatch(), _Logger()
    t.policy = torch.nn.Linear(1, 1)
    t.train_step = lambda: ({"reward/mean": 0.5}, [])
    t.evaluate = lambda: {}
    saved: list[int] = []
    t.save = lambda: saved.append(t.step)
    t.run()
    return saved


@pytest.mark.parametrize("total, every, expected", [
    (10, 5, [5, 10]),   # the last periodic save is the end: written once (it was written twice)
    (7, 3, [3, 6, 7]),  # the end falls between periodic saves: saved at the end too
    (3, 0, [3]),        # save_every=0: only at the end
])
def test_run_saves_each_step_once(total, every, expected):
    assert _saves(total, every) == expected
