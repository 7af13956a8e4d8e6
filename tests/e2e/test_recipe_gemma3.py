"""``examples/gemma3_zero.sh``, RL from the base model with no SFT, on a tiny Gemma3 (sliding-window layers, no
chat template) and a handful of toy questions: every stage runs (base with search, without and RAG; RL from zero;
the SFT route on the same budget; each on a confirmation file), ``summary.md`` tables them, a second invocation
skips what is done, and ``REWARD=r1_searcher`` runs R1-Searcher's two stages in its base prompt
(``search_r1_staged``: its stage 1 read in Search-R1's tags, then Search-R1's reward). The real
recipe's figures are in docs/results.md; this only keeps the recipe working."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_gemma3_e2e import world  # noqa: F401 - the tiny Gemma3 and its toy world, a fixture

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "gemma3_zero.sh"


def _budget(world) -> str:
    # Search-R1's own prompt: the config's (three worked examples) is 1,056 of the tiny byte-level tokenizer's
    # tokens, more than the 1,024-token context (the prompt itself: tests/unit/test_format_fewshot.py)
    sets = [f"model.name_or_path={world / 'model'}", f"data.train_files=[{world / 'train.jsonl'}]",
            f"data.eval_files=[{world / 'train.jsonl'}]", f"retrieval.corpus={world / 'corpus.jsonl'}",
            "retrieval.topk=1", "rollout.format=search_r1", "rollout.group_size=2", "rollout.max_turns=1",
            "rollout.max_tokens_per_turn=48", "train.questions_per_step=1", "train.max_sampling_rounds=1",
            "train.micro_batch_size=2", "train.total_steps=1", "train.save_every=0", "train.cpu_threads=1",
            "sft.steps=1", "sft.batch_size=2"]
    return " ".join(f"--set {s}" for s in sets)


def _run(*args, **env):
    sleuth = str(Path(sys.executable).parent / "sleuth")
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=2300, check=False,
                          env={**os.environ, "SLEUTH": sleuth, "DTYPE": "float32", **env})


def test_the_recipe_refuses_bad_arguments(tmp_path):
    for args, env, said in (((), {}, "usage:"), ((tmp_path, "--bogus"), {}, "usage:"),
                            ((tmp_path,), {"REWARD": "bogus"}, "REWARD must be"),
                            ((tmp_path,), {"CONFIRM": str(tmp_path / "missing.jsonl")}, "no such file")):
        done = _run(*args, **env)
        assert done.returncode == 2 and said in done.stderr, (args, env, done.stderr[-500:])


@pytest.mark.timeout(2400)  # a hang guard: ~2 min idle (a dozen sleuth processes)
def test_the_recipe_evaluates_trains_from_zero_and_the_sft_route_then_skips_what_is_done(world, tmp_path):
    out = tmp_path / "recipe"
    env = {"SLEUTH_SET": _budget(world), "EVAL_LIMIT": "1", "RL_MINUTES": "30", "CONFIRM": str(world / "train.jsonl")}
    done = _run(out, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("base_search", "base_direct", "base_rag", "base_confirm", "rl_search", "rl_direct", "rl_confirm",
                 "sft_rl_search", "sft_rl_direct", "sft_rl_confirm"):
        assert (out / "eval" / name / "results.json").is_file(), name
    rag = json.loads((out / "eval" / "base_rag" / "results.json").read_text())
    assert rag["summary"]["searches"] == 0  # RAG: the passages in the prompt, no search turn
    confirm = json.loads((out / "eval" / "rl_confirm" / "results.json").read_text())
    assert confirm["summary"]["n"] == 8  # the whole confirmation file, not EVAL_LIMIT
    assert "time_limit_minutes: 30" in (out / "rl" / "config.yaml").read_text()
    sft_rl = (out / "sft_rl" / "config.yaml").read_text()
    assert f"name_or_path: {out / 'sft'}" in sft_rl and "time_limit_minutes: 30" not in sft_rl  # what SFT left
    assert "the SFT route's RL:" in done.stderr
    stages = [line.split("\t")[0] for line in (out / "times.tsv").read_text().splitlines()]
    assert stages[:5] == ["eval base (search)", "eval base (direct)", "eval base (rag)", "eval base (confirm)", "rl"]
    assert "sft" in stages and "sft_rl" in stages and len(stages) == 13
    summary = (out / "summary.md").read_text()
    assert "# The base Gemma-3-270M learns to search by RL alone" in summary
    for row in ("| base | RAG |", "| RL from zero | search |", "| SFT route (SFT+RL) | no search |",
                "| RL from zero | search, confirmation set |"):
        assert row in summary, row
    assert "RL from zero (search) minus base (search), EM, paired over 1 questions" in summary
    assert "RL from zero (search) minus base (RAG)" in summary and "![RL from zero reward" in summary
    again = _run(out, **env)  # everything is done: nothing runs twice
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done already: rl" in again.stderr and "done already: eval base (rag)" in again.stderr
    assert len((out / "times.tsv").read_text().splitlines()) == 13


@pytest.mark.timeout(2400)  # a hang guard: under a minute idle
@pytest.mark.parametrize("reward, stage1, stage2, fmt", [
    ("r1_searcher", "r1_searcher_stage1", "r1_searcher_stage2", "r1_searcher_base"),
    ("search_r1_staged", "search_r1_stage1", "search_r1_v03", "search_r1"),
])
def test_a_two_stage_reward_runs_its_stages_in_its_prompt(world, tmp_path, reward, stage1, stage2, fmt):
    out = tmp_path / reward
    done = _run(out, "--no-eval", SLEUTH_SET=_budget(world), REWARD=reward, SFT_ROUTE="0", RL_MINUTES="30",
                STAGE1_MINUTES="10")
    assert done.returncode == 0, done.stderr[-3000:]
    first = (out / "rl_stage1" / "config.yaml").read_text()
    second = (out / "rl" / "config.yaml").read_text()
    assert f"kind: {stage1}\n" in first and "time_limit_minutes: 10" in first
    assert f"kind: {stage2}\n" in second and "time_limit_minutes: 20" in second
    assert f"format: {fmt}\n" in first and f"format: {fmt}\n" in second
    assert f"name_or_path: {out / 'rl_stage1'}" in second and not (out / "sft").exists()
    summary = (out / "summary.md").read_text()  # both stages' curves
    assert "![RL from zero, stage 1 reward" in summary and (out / "reward_rl_stage1.png").is_file()
    assert "![RL from zero reward" in summary and (out / "reward.png").is_file()
