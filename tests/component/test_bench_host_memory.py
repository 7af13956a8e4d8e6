"""bench/host_memory.py on a tiny Llama and 8 questions: every step's figures and the growth line, in a fresh
process (the kernel-cache setting is read once per process)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1200)  # a hang guard: ~15 s idle
def test_the_host_memory_bench_reports_every_step_and_the_growth(tmp_path):
    from tests.e2e.test_train_torchrun import _write_data
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny_model(tok, seed=0, hidden=32).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    _write_data(tmp_path)
    sets = [f"model.name_or_path={tmp_path / 'model'}", "model.device=cpu",
            f"data.train_files=[{tmp_path / 'train.jsonl'}]",
            f"retrieval.corpus={tmp_path / 'corpus.jsonl'}", "retrieval.kind=bm25", "rollout.format=search_r1",
            "rollout.use_chat_template=false", "rollout.group_size=2", "rollout.max_turns=1",
            "rollout.max_tokens_per_turn=8", "train.questions_per_step=2", "train.micro_batch_size=2",
            "train.cpu_threads=1"]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "host_memory.py"), "--steps", "3", "--skip", "1",
                           "--out", str(tmp_path / "run"), *[x for s in sets for x in ("--set", s)], "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1100, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps, (summary,) = rows[:-1], rows[-1:]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["peak_gib"] >= r["rss_gib"] > 0 and r["tensor_gib"] > 0 and r["objects"] > 0
    assert set(summary["growth"]) >= {"rss_gib_per_step", "peak_gib_per_step", "tensor_gib_per_step"}
    assert "'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '16'" in proc.stderr  # Sleuth's limit, set before the first matmul
