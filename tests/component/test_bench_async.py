"""bench/async.py's smoke run: the four arms (sync and async, with and without retrieval latency) train the
tiny model through a served retriever, and the figures the bench reports come out finite, with the async
arms' idle shares and one step of staleness."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)  # a hang guard: ~1 min idle
def test_the_async_bench_runs_every_arm_and_reports_ratios():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "async.py"), "--tiny", "--steps", "3", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1700, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    arms = [r for r in rows if "arm" in r]
    assert [(r["arm"], r["latency_s"]) for r in arms] == [("sync", 0.3), ("async", 0.3), ("sync", 0.0), ("async", 0.0)]
    for r in arms:
        assert r["steps"] == 3 and r["steps_per_hour"] > 0 and math.isfinite(r["reward_per_step"])
    for r in arms[1::2]:
        assert 0 <= r["trainer_idle_share"] <= 1 and 0 <= r["worker_idle_share"] <= 1
    # the held requests show in the rollout's retrieval time: at least 0.3 s for each search turn
    assert arms[0]["retrieve_s_per_step"] >= 0.3 > arms[2]["retrieve_s_per_step"]
    ratios = [r for r in rows if "steps_per_hour_ratio" in r]
    assert [r["latency_s"] for r in ratios] == [0.3, 0.0] and all(r["steps_per_hour_ratio"] > 0 for r in ratios)
