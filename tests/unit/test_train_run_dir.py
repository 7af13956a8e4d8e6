"""The run directory survives kills and resumes: ``--resume`` rewrites metrics.jsonl / samples.jsonl
atomically (a kill leaves the old file whole), drops a torn last line with a warning and names a
damaged line; W&B continues the same run; a ``--config`` kept in the run directory is never
written over."""

import json
import os
import re
import sys
import types
import warnings

import pytest

from sleuth.cli import main
from sleuth.config_file import load_config
from sleuth.train.logging import MetricsLogger
from sleuth.train.logging import truncate_logs as _truncate_metrics
from sleuth.train.rundir import write_run_config

pytestmark = pytest.mark.unit


def _rows(*steps):
    return "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in steps)


def test_resume_drops_a_torn_last_line_with_a_warning(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(_rows(1, 2, 3) + '{"step": 4, "rew')  # killed while writing step 4's row
    (tmp_path / "samples.jsonl").write_text(_rows(1, 2, 3, 4))
    with pytest.warns(UserWarning, match=re.escape(str(metrics)) + r": dropped its last line \(line 4\)"):
        _truncate_metrics(tmp_path, 3)
    assert metrics.read_text() == _rows(1, 2, 3)
    assert (tmp_path / "samples.jsonl").read_text() == _rows(1, 2, 3)  # rows after the checkpoint go
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second resume finds nothing to drop: no warning, same rows
        _truncate_metrics(tmp_path, 3)
    assert metrics.read_text() == _rows(1, 2, 3)


def test_resume_names_the_file_and_line_of_a_damaged_row(tmp_path):
    samples = tmp_path / "samples.jsonl"
    damaged = _rows(1) + "not json\n" + _rows(2)
    samples.write_text(damaged)
    with pytest.raises(ValueError, match=re.escape(str(samples)) + r" line 2 is not a logged row.*delete that line"):
        _truncate_metrics(tmp_path, 1)
    assert samples.read_text() == damaged  # left as it was


def test_resume_rewrite_killed_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    """The kept rows go to a temporary file renamed over the original: a kill before the rename (here
    an exception raised by the rename) leaves the original whole, and the next resume cleans up."""
    metrics = tmp_path / "metrics.jsonl"
    original = _rows(1, 2, 3, 4, 5)
    metrics.write_text(original)

    class Killed(BaseException):
        pass

    real_replace = os.replace

    def killed_at_rename(src, dst):
        if str(dst).endswith("metrics.jsonl"):
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_rename)
    with pytest.raises(Killed):
        _truncate_metrics(tmp_path, 2)
    assert metrics.read_text() == original
    monkeypatch.setattr(os, "replace", real_replace)
    (tmp_path / "metrics.jsonl.tmp-99999").write_text(_rows(1))  # what a real kill would leave behind
    _truncate_metrics(tmp_path, 2)
    assert metrics.read_text() == _rows(1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def _fake_wandb(monkeypatch) -> list[dict]:
    """A stand-in ``wandb`` module that records the keyword arguments of every ``wandb.init``."""
    calls: list[dict] = []
    run = types.SimpleNamespace(log=lambda row, step: None, finish=lambda: None)
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(kw) or run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return calls


def test_wandb_resume_continues_the_same_run(tmp_path, monkeypatch):
    calls = _fake_wandb(monkeypatch)

    def start(resume):
        MetricsLogger(tmp_path, total_steps=4, wandb=True, progress=False, resume=resume).close()
        return calls[-1]

    first = start(resume=False)
    assert first["resume"] == "allow" and first["id"]
    assert (tmp_path / "wandb_id.txt").read_text().strip() == first["id"]
    assert start(resume=True)["id"] == first["id"]  # --resume: the same W&B run
    assert start(resume=False)["id"] != first["id"]  # a new run (--overwrite): a new W&B run


def test_run_config_equal_to_the_file_is_not_rewritten(tmp_path):
    path = tmp_path / "config.yaml"
    mine = "# my notes\ntrain:\n  total_steps: 3  # short\n"
    path.write_text(mine)
    assert write_run_config(load_config(path), tmp_path) is False
    assert path.read_text() == mine
    assert write_run_config(load_config(path, ["train.total_steps=5"]), tmp_path) is True  # the run's own record
    assert load_config(path).train.total_steps == 5


def test_train_refuses_set_values_that_would_rewrite_the_config_given(tmp_path, capsys):
    """``--config D/config.yaml --out D --set …``: the run would have to write the --set values into the
    user's file; it refuses before anything runs and leaves the file as it was."""
    path = tmp_path / "config.yaml"
    mine = "# my notes\ntrain:\n  total_steps: 3  # short\n"
    path.write_text(mine)
    code = main(["train", "--config", str(path), "--out", str(tmp_path), "--set", "train.total_steps=4"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--config {path} is the run directory's config.yaml" in err and "instead of --set" in err
    assert path.read_text() == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
