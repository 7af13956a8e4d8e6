"""sleuth eval --samples N --temperature T: N rows a question with their reward, pass@k in results.json,
report.md and the --json line, a rerun that finds every sample done, and rows that sleuth sft reads as
trajectories (rejection sampling keeps those with reward >= 1)."""

from __future__ import annotations

import json

import pytest

from sleuth.cli import main

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(tmp_path):
    from sleuth.build import load_split
    from sleuth.config import Config
    from sleuth.named import named_world

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"id": q.id, "question": q.text, "golden_answers": list(q.golden_answers)})
                            + "\n" for q in load_split("world:test", Config())[:3]))
    return path, named_world().corpus_path(Config())


def test_sampled_eval_writes_every_sample_and_pass_at_k(world, tmp_path, capsys):
    from sleuth.data.transcripts import read_transcripts

    qa, corpus = world
    out = tmp_path / "ev"
    argv = ["eval", "--model", "tiny", "--data", str(qa), "--corpus", str(corpus), "--out", str(out),
            "--samples", "4", "--temperature", "1.0", "--no-cache", "--json", "--batch-size", "8"]
    assert main(argv) == 0
    said = capsys.readouterr()
    line = json.loads(said.out.strip().splitlines()[-1])
    assert "eval: 2/3 questions" in said.err  # --batch-size counts rollouts: 8 // 4 = 2 questions a batch
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and sorted({r["sample"] for r in rows}) == [0, 1, 2, 3]
    assert all(r["reward"] == r["em"] for r in rows)
    assert len({tuple(s["text"] for s in r["segments"]) for r in rows}) > 3  # sampled, not one greedy answer
    fig = json.loads((out / "results.json").read_text())["sampled"]
    assert fig == line["sampled"] and fig["questions"] == 3 and fig["samples"] == 4
    per_q = {}
    for r in rows:
        per_q.setdefault(r["id"], []).append(r["em"])
    assert fig["pass@4"] == pytest.approx(sum(max(v) for v in per_q.values()) / 3)
    assert fig["pass@1"] == pytest.approx(sum(r["em"] for r in rows) / 12)
    report = (out / "report.md").read_text()
    assert "## Sampled: 4 samples a question at temperature 1" in report
    assert "Exact match (EM, %), sampled at temperature 1, mean over 4 samples a question." in report
    assert "top_p" not in json.loads((out / "setting.json").read_text())  # at its default: not in the setting
    assert main(argv) == 0  # every sample done: nothing runs again
    assert "3 questions, 3 already done" in capsys.readouterr().err
    assert main(argv + ["--set", "rollout.top_p=0.9"]) == 2  # nucleus sampling is another setting: refused here
    assert "top_p: recorded None, now 0.9" in capsys.readouterr().err
    kept, counts = read_transcripts([str(out / "trajectories.jsonl")], min_reward=1.0)
    assert len(kept) == sum(r["em"] == 1.0 for r in rows)
    assert sum(counts.values()) >= 12 - len(kept)  # the others dropped and counted


def test_sampling_flags_are_checked(world, tmp_path, capsys):
    qa, corpus = world
    base = ["eval", "--model", "tiny", "--data", str(qa), "--corpus", str(corpus), "--out", str(tmp_path / "x")]
    assert main(base + ["--samples", "0"]) == 2
    assert "--samples must be >= 1" in capsys.readouterr().err
    assert main(base + ["--samples", "2", "--baseline", str(tmp_path)]) == 2
    assert "--baseline pairs greedy evals" in capsys.readouterr().err
