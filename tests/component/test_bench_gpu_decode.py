"""``bench/gpu_decode.py`` in training's configuration (float32 master weights under bf16 autocast),
its engine selection, its per-figure failure records, the compiled hf_static recompile probe
(``--churn``) and fixed-batch rate (``--compiled-fixed``), and ``bench/decode.py --device``. All on
CPU at toy sizes; figures are checked against their definitions, never timings."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.component

BENCH = Path(__file__).resolve().parents[2] / "bench"
BW = 0.01  # TB/s given on the command line (nothing is looked up on CPU)


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_json(argv: list[str], capsys, mod=None, rc: int = 0) -> dict:
    mod = mod or load("gpu_decode")
    assert mod.main(argv + ["--tiny", "--device", "cpu", "--json"]) == rc
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_autocast_rows_decode_float32_master_weights_against_the_bf16_floor(capsys):
    r = run_json(["--autocast", "--engines", "hf,hf_static", "--model", "random-smollm2", "--bandwidth", str(BW)],
                 capsys)
    assert r["autocast"] is True and r["param_dtype"] == "float32" and r["dtype"] == "bfloat16"
    assert r["model"] == "random-smollm2-tiny" and r["engines"] == ["hf", "hf_static"] and r["failed"] == []
    assert r["vllm"].startswith("skipped")
    # the rollout's KV cache (SlotLayer): values leave v_proj in bf16; keys as the cache stores them
    size = {"float32": 4, "bfloat16": 2}
    assert r["value_dtype"] == "bfloat16" and r["key_dtype"] in size
    assert r["kv_bytes_per_token"] == 2 * 2 * 16 * (size[r["key_dtype"]] + 2)  # layers * kv heads * head dim
    # autocast's cache holds the weights' bf16 casts inside one context, no_grad included
    assert r["autocast_weight_casts_per_step"] == 0
    # the floor: cast weights at bf16 size, the rest (norms) at float32; recast: f32 read + bf16 write + read
    assert 0.9 * r["params"] < r["params_cast"] < r["params"]
    rest = 4 * (r["params"] - r["params_cast"])
    assert r["weight_bytes"] == 2 * r["params_cast"] + rest
    assert r["weight_bytes_recast"] == 8 * r["params_cast"] + rest
    mean_ctx = r["prompt_len"] + r["new_tokens"] / 2
    assert [row["batch"] for row in r["rows"]] == [1, 4]
    for row in r["rows"]:
        b = row["batch"]
        assert not any(k.startswith(("generate", "vllm")) for k in row)
        assert row["limit_tokens_per_s"] == pytest.approx(b * BW * 1e12 / r["weight_bytes"])
        assert row["limit_recast_tokens_per_s"] == pytest.approx(b * BW * 1e12 / r["weight_bytes_recast"])
        assert row["limit_incl_kv_tokens_per_s"] == pytest.approx(
            b * BW * 1e12 / (r["weight_bytes"] + b * mean_ctx * r["kv_bytes_per_token"]))
        for e in ("hf", "hf_static"):
            tps = row[f"{e}_tokens_per_s"]
            assert tps > 0 and row[f"{e}_ms_per_step"] == pytest.approx(1e3 * b / tps)
            assert row[f"{e}_bandwidth_fraction"] == pytest.approx(tps / row["limit_tokens_per_s"])
            assert row[f"{e}_bandwidth_fraction_recast"] == pytest.approx(tps / row["limit_recast_tokens_per_s"])
        assert row["hf_static_vs_hf"] == pytest.approx(row["hf_static_tokens_per_s"] / row["hf_tokens_per_s"])


def test_engine_and_size_arguments():
    mod = load("gpu_decode")
    args = mod.parse_args(["--tiny", "--new-tokens", "8", "--no-generate"])
    assert args.engines == {"hf", "hf_static", "vllm"} and args.model == "random-qwen2"
    assert (args.new_tokens, args.prompt_len, args.batch_sizes, args.repeats) == (8, 8, "1,4", 1)
    assert mod.parse_args(["--engines", "none"]).engines == set()
    full = mod.parse_args([])
    assert (full.prompt_len, full.new_tokens, full.batch_sizes) == (128, 128, "1,32,128")
    with pytest.raises(SystemExit):
        mod.parse_args(["--engines", "hf,sglang"])
    static = mod.parse_args(["--engines", "hf_static", "--static-cache"])
    assert sorted(mod.row_runners(static)) == ["hf_static", "hf_static_compiled"]


def test_a_failed_figure_is_recorded_and_the_others_are_measured(monkeypatch, capsys):
    mod = load("gpu_decode")

    def broken(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(mod, "StaticHFBackend", broken)
    r = run_json(["--engines", "hf,hf_static", "--batch-sizes", "2", "--model", "random-smollm2"], capsys,
                 mod=mod, rc=1)
    (row,) = r["rows"]
    assert row["hf_tokens_per_s"] > 0 and "hf_static_tokens_per_s" not in row
    assert row["hf_static_error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert r["failed"] == ["hf_static@2"]


def test_churn_probe_counts_at_most_one_compile_per_bucket(capsys):
    """Review item 1: the compiled hf_static step runs over a persistent KV pool at bucketed shapes (batch
    rounded up to a power of two, width to a multiple of 256), so shapes that change the way training
    changes them compile once per bucket: here the prompt and cap changes stay in bucket (2, 256) and one
    more row moves to (4, 256), one more compile (before the pool: one compile per new shape)."""
    r = run_json(["--engines", "none", "--model", "random-smollm2", "--churn", "5", "--compile-backend", "eager",
                  "--batch-sizes", "2"], capsys)
    assert r["rows"] == [] and r["failed"] == [] and r["churn_failed_calls"] == 0
    calls = r["churn"]
    assert [c["change"] for c in calls] == ["base", "prompt+1", "cap+1", "rows+1", "same"]
    assert [(c["batch"], c["width"]) for c in calls] == [(2, 14), (2, 15), (2, 16), (3, 16), (3, 16)]
    assert [c["new_shape"] for c in calls] == [False, True, True, True, False]
    assert [c["bucket"] for c in calls] == [[2, 256]] * 3 + [[4, 256]] * 2
    assert [c["new_bucket"] for c in calls] == [False, False, False, True, False]
    assert calls[0]["graphs"] >= 1
    for c in calls[1:]:  # a new bucket compiles as often as the first call did; anything else reuses a graph
        assert c["graphs"] == (calls[0]["graphs"] if c["new_bucket"] else 0), c
    assert r["churn_new_shapes"] == 3 and r["churn_new_buckets"] == 1
    assert r["churn_graphs_total"] == 2 * calls[0]["graphs"] == sum(c["graphs"] for c in calls)
    assert r["churn_graphs_per_new_shape"] == pytest.approx(calls[0]["graphs"] / 3)
    assert r["churn_graphs_after_first"] == r["churn_graphs_total"] - calls[0]["graphs"]
    assert r["churn_graphs_on_seen_shapes"] == 0 and r["churn_graphs_in_seen_buckets"] == 0
    assert r["churn_compiles_per_call"] == pytest.approx(r["churn_graphs_total"] / 5)
    assert r["churn_s_per_call"] == pytest.approx(sum(c["seconds"] for c in calls) / 5)
    assert r["recompile_limit"] == torch._dynamo.config.recompile_limit and not r["churn_recompile_limit_hit"]
    assert r["churn_cudagraph_records"] == 0 and r["churn_compile_backend"] == "eager"


def test_compiled_fixed_batch_compiles_once_then_decodes(capsys):
    r = run_json(["--engines", "none", "--model", "random-smollm2", "--compiled-fixed", "2",
                  "--compile-backend", "eager", "--bandwidth", str(BW)], capsys)
    assert r["failed"] == [] and r["compiled_batch"] == 2
    assert r["compiled_graphs_first_call"] >= 1 and r["compiled_graphs_steady"] == 0
    tps = r["compiled_tokens_per_s"]
    assert tps > 0 and r["compiled_ms_per_step"] == pytest.approx(1e3 * 2 / tps)
    assert r["compiled_bandwidth_fraction"] == pytest.approx(tps / (2 * BW * 1e12 / r["weight_bytes"]))
    assert isinstance(r["compiled_compile_s"], float) and r["compiled_first_call_s"] > 0


def test_decode_bench_device_flag_reaches_the_model_load(monkeypatch):
    """``bench/decode.py --device`` is passed to load_policy (default cpu, as before)."""
    import sleuth.models

    seen = []

    class Stop(Exception):
        pass

    def fake_load(name, dtype, device):
        seen.append(device)
        raise Stop

    monkeypatch.setattr(sleuth.models, "smollm2_gguf", lambda: "x.gguf")
    monkeypatch.setattr(sleuth.models, "load_policy", fake_load)
    mod = load("decode")
    for argv, want in (([], "cpu"), (["--device", "cuda:1"], "cuda:1")):
        with pytest.raises(Stop):
            mod.main(argv)
        assert seen[-1] == want
    assert mod.gemm_gflops(4, torch.device("cpu")) > 0
