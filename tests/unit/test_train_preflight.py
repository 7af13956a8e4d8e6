"""What a training run checks before it starts: the device, the run directory (never written over
without --resume or --overwrite), the retriever (one test search), the question count. Each
failure is one clear error that names the setting, before any step runs."""

from pathlib import Path

import pytest
import torch

from sleuth.build import probe_retriever
from sleuth.cli import main
from sleuth.config import Config
from sleuth.models import pick_device
from sleuth.train.rundir import check_run_dir

pytestmark = pytest.mark.unit


def test_pick_device_names_a_bad_value():
    assert pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"--device / model.device 'banana' is not a device; use cpu, cuda"):
        pick_device("banana")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_pick_device_cuda_without_a_gpu():
    with pytest.raises(ValueError, match=r"--device / model.device cuda:1: CUDA is not available here"):
        pick_device("cuda:1")


def _earlier_run(out):
    (out / "checkpoints" / "step_000002" / "policy").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (out / "samples.jsonl").write_text("{}\n")
    (out / "notes.txt").write_text("mine")


def test_check_run_dir_refuses_resumes_or_overwrites(tmp_path):
    check_run_dir(tmp_path / "new", resume=False, overwrite=False)  # nothing there: fine
    out = tmp_path / "run"
    _earlier_run(out)
    with pytest.raises(ValueError, match="already holds a run.*--resume continues it, --overwrite replaces it"):
        check_run_dir(out, resume=False, overwrite=False)
    assert (out / "metrics.jsonl").exists()  # refused: nothing touched
    check_run_dir(out, resume=True, overwrite=False)  # continuing it keeps everything
    assert (out / "checkpoints" / "step_000002").is_dir()
    check_run_dir(out, resume=False, overwrite=True)
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()
    assert not (out / "samples.jsonl").exists() and (out / "notes.txt").read_text() == "mine"  # only the run's
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        check_run_dir(tmp_path / "file", resume=False, overwrite=True)


class _Down:
    def search(self, queries, k):
        raise ConnectionError("connection refused")


class _Up:
    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append((queries, k))
        return [[] for _ in queries]


def test_probe_retriever_fails_fast_naming_the_retriever():
    cfg = Config()
    cfg.retrieval.kind, cfg.retrieval.url = "url", "http://127.0.0.1:9/retrieve"
    with pytest.raises(ValueError, match=r"retriever \(url: http://127.0.0.1:9/retrieve\) failed a test search: "
                                         r"connection refused"):
        probe_retriever(_Down(), cfg)
    up = _Up()
    probe_retriever(up, cfg)
    assert up.calls == [(["sleuth start-up check"], 1)]


def test_train_refusals_through_the_command(tmp_path, capsys):
    """The same checks as `sleuth train` meets them: exit 2, one line naming the setting."""
    config = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    args = ["train", "--config", str(config), "--set", "train.total_steps=1", "--set", "train.eval_limit=2"]
    assert main(args + ["--out", str(tmp_path / "few"), "--set", "data.limit=3"]) == 2
    # data.limit keeps 3 of each data source: world:train has two (single-hop, two-hop)
    assert "train.questions_per_step=8 but data.train_files hold 6 questions" in capsys.readouterr().err
    _earlier_run(tmp_path / "old")
    assert main(args + ["--out", str(tmp_path / "old")]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "old"), "--overwrite"]) == 0  # replaced by a fresh one-step run
    rows = (tmp_path / "old" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and '"step": 1' in rows[0]


def test_resume_names_the_settings_that_changed(tmp_path, capsys):
    from sleuth.config_file import load_config, save_config
    from sleuth.train.rundir import warn_changed_settings

    save_config(load_config(None, ["rollout.group_size=5"]), tmp_path / "config.yaml")
    now = load_config(None, ["rollout.group_size=8", "train.total_steps=200"])
    changed = warn_changed_settings(tmp_path / "config.yaml", now)
    assert changed == ["rollout.group_size: 5 -> 8", "train.total_steps: 100 -> 200"]
    assert "with changed settings: rollout.group_size: 5 -> 8" in capsys.readouterr().err
    assert warn_changed_settings(tmp_path / "config.yaml", load_config(None, ["rollout.group_size=5"])) == []
    assert warn_changed_settings(tmp_path / "missing.yaml", now) == []
