"""bench/gpu_check.sh --dry-run: every step of the GPU check runs on CPU with tiny shapes, so the
script cannot rot between GPU visits. Each step must end ok with its JSON summary, the files the
device tool brings back stay within its limits (at most 8), and the table names every step."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["canaries", "trainer_step", "trainer_step_05b", "recipe", "decode", "cuda_tests", "retrieval", "plain_loop_mfu", "compile",
         "transformers_drift"]


@pytest.mark.timeout(3600)  # hang guards, all three: ~1.5 min idle, 2 min seen beside other work
def test_the_gpu_check_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", str(out), "--deadline", "3000"],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**__import__("os").environ, "PYTHON": sys.executable})
    rows = [json.loads(line) for line in (out / "summary.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == "env" and rows[0]["dry_run"] is True and rows[0]["torch"]
    by_step = {r["step"]: r for r in rows[1:]}
    assert list(by_step) == STEPS
    failed = {k: (r["status"], r.get("tail")) for k, r in by_step.items() if r["status"] != "ok"}
    assert not failed and proc.returncode == 0, (failed, proc.stdout[-3000:])
    for name in ("canaries", "trainer_step", "trainer_step_05b", "decode", "retrieval", "plain_loop_mfu", "compile"):
        assert isinstance(by_step[name]["result"], dict), name  # its JSON summary was read
    assert by_step["recipe"]["result"]["step2.step_s"] > 0
    assert (out / "recipe_metrics.jsonl").exists()
    files = [p for p in out.rglob("*") if p.is_file() and "work" not in p.relative_to(out).parts]
    assert len(files) <= 8, files
    table = (out / "table.txt").read_text()
    assert all(name in table for name in STEPS) and table in proc.stdout


def test_only_runs_the_named_steps_in_its_order_and_refuses_unknown_names():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "bench"))
    steps = gpu_check.steps("random-smollm2", False, True, Path("/nonexistent"))
    assert [s.name for s in gpu_check.ordered(steps, None)] == STEPS
    assert [s.name for s in gpu_check.ordered(steps, "recipe, canaries")] == ["recipe", "canaries"]
    with pytest.raises(SystemExit, match="unknown steps \\['recpie'\\]"):
        gpu_check.ordered(steps, "canaries,recpie")
