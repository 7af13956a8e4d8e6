"""docs/experiments/gemma3_records.py: a training stage's steps kept whole (every number a step logged)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location(
    "gemma3_records", Path(__file__).resolve().parents[2] / "docs" / "experiments" / "gemma3_records.py")
records = importlib.util.module_from_spec(spec)
spec.loader.exec_module(records)


def test_a_step_keeps_every_number_it_logged_and_the_evaluation_rows_are_left_out(tmp_path):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "reward/mean": 0.0625, "algo/rows_skipped": 5, "perf/computed_token_share": 0.47612,
         "perf/train_s": 455.44449, "note": "a string", "flag": True},
        {"step": 1, "eval/em": 0.1},  # the trainer's evaluation: not a step
    ]))
    assert records.training(tmp_path) == {"rl": {"steps": 1, "per_step": [
        {"step": 1, "reward/mean": 0.0625, "algo/rows_skipped": 5, "perf/computed_token_share": 0.4761,
         "perf/train_s": 455.4445}]}}
