"""``sleuth sft`` end to end on the embedded tiny model and toy world: the run directory, exact
resume, the refusal to write over a run, and the SFT run as the model ``sleuth train`` starts from."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.cli import cli_runner

pytestmark = pytest.mark.e2e

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")
SMALL = ["--set", "data.limit=12", "--set", "sft.batch_size=4", "--set", "train.micro_batch_size=3",
         "--set", "sft.lr=1e-3", "--set", "train.save_every=2", "--set", "train.cpu_threads=1"]


def _weights(run: Path) -> dict:
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return load_file(str(ckpt / "policy" / "model.safetensors"))


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_sft_runs_resumes_exactly_and_feeds_train(tmp_path, monkeypatch, capsys):
    from sleuth.sft import loop as sft_loop
    from sleuth.train import loop as train_loop

    trims = []  # train/host_memory: each trainer hands freed memory back once a step
    monkeypatch.setattr(sft_loop, "release_freed_memory", lambda: trims.append("sft"))
    monkeypatch.setattr(train_loop, "release_freed_memory", lambda: trims.append("train"))
    run = cli_runner(monkeypatch, capsys, ["sleuth.sft.cli", "sleuth.train.cli"])
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        rc, out, err = run("sft", "--config", CONFIG, "--out", straight, *SMALL, "--set", "sft.steps=4", "--json")
        assert torch.are_deterministic_algorithms_enabled()  # train.deterministic's default on a CPU, as in train
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    assert rc == 0, err
    assert trims == ["sft"] * 4
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["step"] == 4 and summary["transcripts"] > 0 and "kept: one search" in err
    assert (straight / "transcripts.jsonl").is_file() and (straight / "config.yaml").is_file()
    rows = _metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["sft/loss"] < rows[0]["sft/loss"]

    # train.time_limit_minutes stops it after its first step of four (saved); --resume without the limit goes on
    # to four: the same weights and losses as the straight run
    rc, out, err = run("sft", "--config", CONFIG, "--out", halves, *SMALL, "--set", "sft.steps=4",
                       "--set", "train.time_limit_minutes=1e-9", "--json")
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["step"] == 1
    assert "train.time_limit_minutes (1e-09) reached after step 1 of 4" in err
    assert (halves / "checkpoints" / "latest").is_file()
    rc, _, err = run("sft", "--config", CONFIG, "--out", halves, *SMALL, "--set", "sft.steps=4", "--resume", "--json")
    assert rc == 0, err
    assert "read back" in err
    assert [r["sft/loss"] for r in _metrics(halves)] == [r["sft/loss"] for r in rows]
    a, b = _weights(straight), _weights(halves)
    assert all(torch.equal(a[k], b[k]) for k in a)

    # a new run never writes over an earlier one
    rc, _, err = run("sft", "--config", CONFIG, "--out", straight, *SMALL)
    assert rc == 2 and "--resume" in err and "--overwrite" in err

    # the SFT run is a model: GRPO starts from its weights
    rl = tmp_path / "rl"
    rc, out, err = run("train", "--config", CONFIG, "--out", rl, "--set", f"model.name_or_path={straight}",
                       "--set", "train.total_steps=1", "--set", "train.questions_per_step=2",
                       "--set", "train.eval_limit=2", "--set", "train.cpu_threads=1", "--json")
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["step"] == 1
    assert trims[-1:] == ["train"] and trims.count("train") == 1


def test_sft_from_a_runs_samples(tmp_path, monkeypatch, capsys):
    """source=trajectories: a run's samples.jsonl, filtered by reward (rejection-sampling fine-tuning)."""
    run = cli_runner(monkeypatch, capsys, ["sleuth.sft.cli"])
    samples = tmp_path / "samples.jsonl"
    seg = [{"kind": "sampled", "text": "<think> x </think>\n<search> Vonsen </search>"},
           {"kind": "injected", "text": "\n\n<information>Doc 1(Title: \"Vonsen\") Vonsen was born at Tazenton."
                                        "</information>\n\n"},
           {"kind": "sampled", "text": "<think> y </think>\n<answer> Tazenton </answer>"}]
    rows = [{"question_id": f"q{i}", "question": "Where was Vonsen born?", "golden_answers": ["Tazenton"],
             "reward": float(i % 2), "segments": seg[:2] + [{**seg[2], "text": seg[2]["text"] + " " * i}]}
            for i in range(6)]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, out, err = run("sft", "--config", CONFIG, "--out", tmp_path / "rft", "--set", "sft.source=trajectories",
                       "--set", f"sft.files={samples}", "--set", "sft.min_reward=1", "--set", "sft.steps=1",
                       "--set", "sft.batch_size=2", "--json")
    assert rc == 0, err
    assert "kept: 3" in err and "dropped: reward < 1: 3" in err
    assert json.loads(out.strip().splitlines()[-1])["transcripts"] == 3
    rc, _, err = run("sft", "--config", CONFIG, "--out", tmp_path / "none", "--set", "sft.source=trajectories",
                     "--set", f"sft.files={samples}", "--set", "sft.min_reward=5")
    assert rc == 2 and "no transcript to train on" in err
