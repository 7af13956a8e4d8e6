"""``bench/retrieval_scale.py`` at toy sizes: the JSON summary's figures, the extrapolation formulas, and
the streaming BM25 build's top-3 against today's on the real ``wiki_dev`` (no timing asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

BENCH = Path(__file__).resolve().parents[2] / "bench" / "retrieval_scale.py"


def test_retrieval_scale_smoke(monkeypatch, capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("retrieval_scale", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["retrieval_scale.py", "--json", "--passages", "1500,3000", "--queries", "60",
                                      "--baseline-queries", "10", "--baseline-max", "1500"])
    assert mod.main() == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    small, large = r["rows"]
    assert (small["passages"], large["passages"]) == (1500, 3000)
    for row in r["rows"]:
        for key in ("build_s", "build_peak_rss_gb", "queries_per_s", "baseline_queries_per_s", "index_disk_gb"):
            assert row[key] > 0, key
    assert "baseline_build_s" in small and "baseline_build_s" not in large  # --baseline-max
    x = r["extrapolated_to_21M"]
    slope = (large["loaded_rss_gb"] - small["loaded_rss_gb"]) / 1500
    assert x["loaded_rss_gb_at_21M"] == pytest.approx(large["loaded_rss_gb"] + slope * (21_000_000 - 3000))
    assert x["queries_per_s_at_21M"] == pytest.approx(large["queries_per_s"] * 3000 / 21_000_000)
    assert x["build_hours_at_21M"] == pytest.approx(large["build_s"] / 3000 * 21_000_000 / 3600)
    if (mod.SHARED / "corpus" / "wiki_dev.jsonl").exists():
        assert r["wiki_dev_top3_equal"] == 1.0 and r["wiki_dev_questions"] >= 100
    lines = (tmp_path / "gen.jsonl")
    mod.generate(lines, 50)
    rows = [json.loads(x) for x in lines.read_text().splitlines()]
    assert len(rows) == 50 and all(len(x["contents"].split("\n")[1].split()) == 100 for x in rows)
