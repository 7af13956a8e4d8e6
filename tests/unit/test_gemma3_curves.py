"""docs/experiments/gemma3_curves.py: a training stage's metrics.jsonl as a table a step, with hand-written rows."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location(
    "gemma3_curves", Path(__file__).resolve().parents[2] / "docs" / "experiments" / "gemma3_curves.py")
curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(curves)


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_step_is_a_row_and_the_evaluation_rows_are_left_out(tmp_path, capsys):
    _write(tmp_path / "metrics.jsonl", [
        {"step": 1, "reward/mean": 0.0625, "groups/reward_variance_count": 2.0, "groups/count": 12.0,
         "sampling/rounds": 3.0, "rollout/searches_mean": 1.04, "rollout/answered_frac": 0.6,
         "rollout/stop/max_tokens": 21.0, "rollout/stop/context_full": 0.0, "rollout/trajectories": 96.0,
         "rollout/overlong_trajectories": 9.0, "algo/rows_skipped": 5.0, "perf/computed_token_share": 0.476,
         "algo/entropy": 0.354, "perf/step_s": 600.0, "perf/train_s": 455.4, "mem/update_peak_gib": 15.971},
        {"step": 1, "eval/em": 0.1},  # the trainer's evaluation: no reward, not a step
        {"step": 2, "reward/mean": 0.0, "perf/step_s": 300.0},  # a step that logged few figures: blanks
    ])
    assert curves.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert rows == ["| 1 | 0.062 | 2 | 12 | 3 | 1.04 | 0.60 | 21 | 0 | 96 | 9 | 5 | 0.48 | 0.35 | 600 | 455 | 15.97 |",
                    "| 2 | 0.000 |  |  |  |  |  |  |  |  |  |  |  |  | 300 |  |  |"]
    assert "2 steps, 15.0 minutes of steps" in out  # (600 + 300) s


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        curves.main([str(tmp_path / "nothing")])


def test_a_records_file_is_read_as_its_stage_numbered_where_it_kept_no_step(tmp_path, capsys):
    records = tmp_path / "attempt_report.json"
    records.write_text(json.dumps({"training": {
        "rl": {"steps": 2, "per_step": [{"reward/mean": 0.125, "perf/step_s": 420.0},  # an old record: no step
                                        {"reward/mean": 0.0, "perf/step_s": 180.0}]},
        "sft": {"steps": 1, "per_step": [{"step": 7, "reward/mean": 0.5, "perf/step_s": 60.0}]}}}))
    assert curves.main([str(records), f"{records}:sft"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line[:14] for line in out if line.startswith("| ") and line[2].isdigit()] == [
        "| 1 | 0.125 | ", "| 2 | 0.000 | ", "| 7 | 0.500 | "]
    assert "2 steps, 10.0 minutes of steps" in out and "1 steps, 1.0 minutes of steps" in out


def test_a_records_file_without_the_stage_is_named(tmp_path):
    records = tmp_path / "r.json"
    records.write_text(json.dumps({"training": {"rl": {"steps": 0, "per_step": []}}}))
    with pytest.raises(SystemExit, match="no training stage 'sft' \\(it has: rl\\)"):
        curves.main([f"{records}:sft"])
    with pytest.raises(SystemExit, match="no such records file"):
        curves.main([str(tmp_path / "missing.json")])
