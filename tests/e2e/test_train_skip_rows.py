"""`sleuth train` with ``train.skip_zero_advantage``: the rows of groups whose rewards are all equal run no pass,
and the step's update is the full one's."""

import json

import pytest

from sleuth.cli import main
from tests.e2e.test_train_e2e import _args, _rel, world  # noqa: F401  (world: the module's fixture)

pytestmark = pytest.mark.e2e


def test_a_run_skipping_rows_without_signal_logs_the_full_runs_update(world, tmp_path):  # noqa: F811
    runs = {}
    for skip in (False, True):
        out = tmp_path / f"skip_{skip}"
        extra = ["algo.kl_coef=0", "train.eval_every=0", "train.eval_limit=1", "train.questions_per_step=8",
                 "train.seed=3", f"train.skip_zero_advantage={str(skip).lower()}"]
        assert main(_args(world, out, 1, extra)) == 0
        runs[skip] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    full, skip = runs[False], runs[True]
    assert full["reward/mean"] == skip["reward/mean"]  # the same rollouts
    alike = full["groups/count"] - full["groups/reward_variance_count"]
    assert 0 < alike < full["groups/count"]  # both kinds of group in the step: some rows skipped, some run
    assert full["algo/rows_skipped"] == 0.0 and skip["algo/rows_skipped"] == alike * 4  # group_size 4
    for k in ("algo/loss", "algo/grad_norm"):
        assert skip[k] == pytest.approx(full[k], rel=_rel(1e-5), abs=1e-7), k
