"""``bench/retrieval_scale.py`` at toy sizes: the JSON summary's figures, the extrapolation formulas, and
the streaming BM25 build's top-3 against today's on the real ``wiki_dev`` (no timing asserted); and
``bench/dense_scale.py`` the same way."""

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
    from sleuth.retrieval import bm25

    if bm25.NUMBA:  # 1,500 passages: no pruning; the kernel without it measured too
        assert small["pruned_share"] == 0 and small["unpruned_queries_per_s"] > 0
    if (mod.SHARED / "corpus" / "wiki_dev.jsonl").exists():
        assert r["wiki_dev_top3_equal"] == 1.0 and r["wiki_dev_questions"] >= 100
        if bm25.NUMBA:  # ranked with pruning too, and the sizes it starts from left as they were
            assert r["wiki_dev_top3_equal_pruned"] == 1.0 and (bm25.PRUNE_FROM, bm25.PRUNE_PER_K) == (200_000, 20_000)
    lines = (tmp_path / "gen.jsonl")
    mod.generate(lines, 50)
    rows = [json.loads(x) for x in lines.read_text().splitlines()]
    assert len(rows) == 50 and all(len(x["contents"].split("\n")[1].split()) == 100 for x in rows)


def test_dense_scale_smoke(monkeypatch, capsys):
    """``bench/dense_scale.py`` at toy sizes: the build finds the filled cache (a child that encodes fails),
    every figure is there, and the extrapolations follow their formulas."""
    spec = importlib.util.spec_from_file_location("dense_scale", BENCH.parent / "dense_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", ["dense_scale.py", "--json", "--passages", "1500,3000", "--queries", "16",
                                      "--factories", "PCAR256,SQ6"])
    assert mod.main() == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    small, large = r["rows"]
    assert (small["passages"], large["passages"], large["factory"], r["dim"]) == (1500, 3000, "PCAR256,SQ6", 384)
    for row in r["rows"]:
        for key in ("build_s", "build_peak_rss_gb", "index_disk_gb", "cache_gb", "queries_per_s"):
            assert row[key] > 0, key
        assert row["code_bytes"] == 192 and row["index_disk_gb"] * 2**30 > 192 * row["passages"]  # codes + PCA
        assert row["cache_gb"] * 2**30 >= 2 * 384 * row["passages"]  # float16 embeddings
    x = r["extrapolated_to_21M"]["PCAR256,SQ6"]
    slope = (large["build_peak_rss_gb"] - small["build_peak_rss_gb"]) / 1500
    assert x["build_peak_rss_gb_at_21M"] == pytest.approx(large["build_peak_rss_gb"] + slope * (21_000_000 - 3000))
    assert x["cache_gb_at_21M"] == pytest.approx(large["cache_gb"] * 7000)
    assert x["queries_per_s_at_21M"] == pytest.approx(large["queries_per_s"] * 3000 / 21_000_000)
