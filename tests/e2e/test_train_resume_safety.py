"""`sleuth train` on the embedded tiny model: ``--resume`` of a finished run does no step and leaves
its final checkpoint as it is (a torn samples line from the kill is dropped), a damaged checkpoint
is an error naming the file, and a config kept in the run directory and passed as ``--config``
keeps its comments through the run and its resume."""

import json
import re
from pathlib import Path

import pytest

from sleuth.cli import main

pytestmark = pytest.mark.e2e

TINY = Path(__file__).parents[2] / "configs" / "tiny.yaml"
SHORT = {"total_steps: 8": "total_steps: 2", "questions_per_step: 8": "questions_per_step: 4",
         "eval_limit: 64": "eval_limit: 4", "save_every: 4": "save_every: 0"}


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_of_a_finished_run_keeps_its_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    sets = [x for k, v in SHORT.items() for x in ("--set", "train." + v.replace(": ", "="))]
    args = ["train", "--config", str(TINY), "--out", str(out), "--json", *sets]
    assert main(args) == 0
    ckpt = out / "checkpoints" / "step_000002"
    (ckpt / "untouched").write_text("a checkpoint written again would lose this file")
    metrics = (out / "metrics.jsonl").read_text()
    with open(out / "samples.jsonl", "a") as f:
        f.write('{"step": 3, "question": "Who')  # the run was killed while logging a sample
    with pytest.warns(UserWarning, match=re.escape(str(out / "samples.jsonl")) + ": dropped its last line"):
        assert main(args + ["--resume"]) == 0
    assert (ckpt / "untouched").exists()  # not re-saved
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (out / "metrics.jsonl").read_text() == metrics  # no step was done
    assert set(_steps(out / "samples.jsonl")) == {1, 2}
    capsys.readouterr()

    with open(ckpt / "trainer_state.pt", "r+b") as f:  # a kill or a full disk while it was written
        f.truncate(100)
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt} is damaged: {ckpt / 'trainer_state.pt'} is truncated" in err
    assert "no earlier checkpoint is left" in err


def test_a_config_kept_in_the_run_directory_keeps_its_comments(tmp_path):
    """``sleuth train --config D/config.yaml --out D`` (and its ``--resume``) used to write the resolved
    settings over the user's file; now a file holding the run's settings is left as it is."""
    run = tmp_path / "run"
    run.mkdir()
    text = "# my notes on this run\n" + TINY.read_text()
    for old, new in SHORT.items():
        text = text.replace(old, new)
    mine = text.replace("total_steps: 2", "total_steps: 1  # one step first")
    (run / "config.yaml").write_text(mine)
    args = ["train", "--config", str(run / "config.yaml"), "--out", str(run), "--json"]
    assert main(args) == 0
    assert (run / "config.yaml").read_text() == mine
    edited = mine.replace("total_steps: 1  # one step first", "total_steps: 2  # then one more")
    (run / "config.yaml").write_text(edited)  # the user extends the run in the file itself
    assert main(args + ["--resume"]) == 0
    assert (run / "config.yaml").read_text() == edited
    assert _steps(run / "metrics.jsonl") == [1, 2]
