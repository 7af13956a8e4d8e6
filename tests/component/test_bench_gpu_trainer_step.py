"""``bench/gpu_trainer_step.py`` (Sleuth's reference pass + ``policy_update``) end to end on CPU with toy
sizes, and ``bench/train.py --device``: the JSON summary's keys, figures consistent with their
definitions, the batch it times, shared prefixes computing fewer slots, and failures recorded as such.
No timing is asserted; the real figures come from a GPU machine."""

import contextlib
import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.component

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["--tiny", "--device", "cpu", "--json", "--rows", "16", "--group-size", "4", "--micro-batch-size", "8",
        "--max-tokens", "4096", "--repeats", "1"]
ARM_KEYS = ("update_s", "reference_s", "tokens", "tokens_per_s", "computed_slots", "micro_batches",
            "achieved_tflops", "achieved_tflops_incl_attention", "mfu", "mfu_incl_attention", "mfu_measured_peak",
            "mfu_incl_attention_measured_peak", "measured_reference_gib", "measured_update_gib", "plan_update_gib",
            "update_gib_ratio", "first_step_loss", "first_step_kl", "params_moved", "params_moved_share")


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(mod, argv: list[str]) -> tuple[int, dict]:
    """``mod.main(argv)``: exit status and the JSON summary (the last stdout line); torch's thread
    count restored after (the bench sets one thread for a toy model)."""
    threads, out = torch.get_num_threads(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = mod.main(argv)
    finally:
        torch.set_num_threads(threads)
    return rc, json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bench():
    return load("gpu_trainer_step")


@pytest.fixture(scope="module")
def result(bench):
    rc, r = run(bench, TINY + ["--peak-tflops", "0.05", "--measured-peak-tflops", "0.04"])
    assert rc == 0, r
    return r


def test_every_arm_has_its_figures(result):
    assert [a["arm"] for a in result["arms"]] == ["off", "on"]
    assert [a["share_prefix"] for a in result["arms"]] == [False, True]
    for arm in result["arms"]:
        assert arm["status"] == "ok", arm
        missing = [k for k in ARM_KEYS if k not in arm]
        assert not missing, missing
        for key in ("update_s", "reference_s", "tokens_per_s", "achieved_tflops", "mfu", "mfu_measured_peak"):
            assert arm[key] > 0, key
    assert result["failed"] == [] and result["out_of_memory"] == []
    assert result["peak_tflops"] == 0.05 and result["measured_peak_tflops"] == 0.04
    assert result["measured_peak_source"] == "--measured-peak-tflops"
    assert result["device_name"] == "cpu" and result["model"] == "random-smollm2-tiny"


def test_mfu_is_six_n_tokens_over_update_time_and_peak(result):
    n = result["params"]
    for arm in result["arms"]:
        flops = 6 * n * arm["tokens"]
        assert arm["achieved_tflops"] == pytest.approx(flops / arm["update_s"] / 1e12)
        assert arm["mfu"] == pytest.approx(flops / arm["update_s"] / 0.05e12)
        assert arm["mfu_measured_peak"] == pytest.approx(flops / arm["update_s"] / 0.04e12)
        assert arm["tokens_per_s"] == pytest.approx(arm["tokens"] / arm["update_s"])
        # attention adds 12 L H T per token of a row of T tokens
        attn = 12 * result["layers"] * result["hidden"] * result["tokens_per_row"] * arm["tokens"]
        assert arm["mfu_incl_attention"] == pytest.approx((flops + attn) / arm["update_s"] / 0.05e12)
        assert arm["mfu_incl_attention_measured_peak"] > arm["mfu_incl_attention"] > arm["mfu"]


def test_tokens_are_the_attention_mask_sum_of_the_recipe_shaped_batch(bench, result):
    ids, att, mask = bench.build_batch(result["vocab"], 16, 4, 2, tiny=True)
    assert result["tokens"] == int(att.sum()) and all(a["tokens"] == int(att.sum()) for a in result["arms"])
    assert result["trained_tokens"] == int(mask.sum())
    prompt, sampled1, obs, sampled2 = result["layout"]  # the recipe's spans, a quarter of their length
    assert [prompt, sampled1, obs, sampled2] == [45, 10, 75, 15] and ids.shape[1] == result["tokens_per_row"]
    trained = torch.zeros(ids.shape[1], dtype=torch.long)
    trained[prompt:prompt + sampled1] = 1
    trained[prompt + sampled1 + obs:] = 1  # sampled tokens only: not the prompt, not the observation
    assert (mask == trained).all()
    before_last = ids.shape[1] - sampled2
    for g in range(0, 16, 4):  # a group: one prompt; 3 of its 4 rows share the first turn and observation
        assert (ids[g:g + 4, :prompt] == ids[g, :prompt]).all()
        assert (ids[g:g + 3, :before_last] == ids[g, :before_last]).all()
        assert not (ids[g + 3, :before_last] == ids[g, :before_last]).all()
        assert not (ids[g + 1, before_last:] == ids[g, before_last:]).all()


def test_shared_prefixes_compute_fewer_slots(result):
    off, on = result["arms"]
    assert off["computed_slots"] == off["tokens"]  # equal rows: no padding
    assert on["computed_slots"] < off["computed_slots"]


def test_the_first_update_moves_every_parameter_and_both_arms_agree(result):
    for arm in result["arms"]:
        assert arm["params_moved"] and arm["params_moved_share"] == 1.0
        assert math.isfinite(arm["first_step_loss"]) and arm["first_step_kl"] >= 0
    # the same first update from the same weights, whole rows or shared prefixes: equal to rounding
    # (a wrong shared pass moves the ratios off 1 and the clipped loss by ~0.1)
    assert result["first_step_loss_abs_diff"] < 1e-3


def test_memory_figures_are_null_on_cpu_and_the_plan_is_given(result):
    assert result["plan_update_gib"] > 0 and result["plan_optimizer_step_gib"] > 0
    for arm in result["arms"]:
        assert arm["measured_update_gib"] is None and arm["measured_reference_gib"] is None
        assert arm["update_gib_ratio"] is None and arm["plan_update_gib"] == result["plan_update_gib"]


def test_measured_peak_defaults_to_798_on_an_h100_sxm_only(bench):
    assert bench.measured_peak({"spec": "H100 SXM"}, None)[0] == 798.0
    assert bench.measured_peak({"spec": "H100 SXM"}, 700.0) == (700.0, "--measured-peak-tflops")
    assert bench.measured_peak({"spec": "H200"}, None) == (None, None)
    assert bench.measured_peak({"spec": None}, None) == (None, None)


def test_out_of_memory_is_recorded_and_the_next_arm_runs(bench, monkeypatch):
    mod = load("gpu_trainer_step")
    real, calls = mod.policy_update, []

    def first_call_runs_out(*args, **kwargs):
        calls.append(args[4].shared_prefix)  # the RowLayout
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, "policy_update", first_call_runs_out)
    rc, r = run(mod, TINY)
    off, on = r["arms"]
    assert off["status"] == "oom" and off["error"].startswith("out of memory: CUDA out of memory")
    assert on["status"] == "ok" and on["params_moved"] and calls[0] is False and calls[1] is True
    assert r["out_of_memory"] == ["off"] and r["failed"] == [] and rc == 0


def test_an_error_in_an_arm_is_recorded_as_failed(monkeypatch):
    mod = load("gpu_trainer_step")

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(mod, "policy_update", broken)
    rc, r = run(mod, TINY + ["--arms", "on"])
    assert rc == 1 and r["failed"] == ["on"]
    assert r["arms"] == [{"arm": "on", "share_prefix": True, "status": "error", "error": "RuntimeError: boom"}]


def test_a_qwen2_vocabulary_runs_through_the_chunked_head(monkeypatch):
    """--model random-qwen2 at Qwen2.5's 151,936-token vocabulary (a toy depth and width): the update and
    the reference pass score through the chunked output layer, never [N, V] logits with their graph."""
    mod = load("gpu_trainer_step")
    gpu_common, forward = sys.modules["gpu_common"], sys.modules["sleuth.train.forward"]
    tiny_qwen2 = gpu_common.qwen2_config

    def wide(tiny=False):
        config = tiny_qwen2(tiny=True)
        config.vocab_size = 151936
        return config

    heads = []
    real_head = forward.scoring_head

    def counted(*args, **kwargs):
        heads.append(1)
        return real_head(*args, **kwargs)

    monkeypatch.setattr(gpu_common, "qwen2_config", wide)
    monkeypatch.setattr(forward, "scoring_head", counted)
    rc, r = run(mod, TINY + ["--model", "random-qwen2", "--rows", "8"])
    assert rc == 0 and r["vocab"] == 151936 and r["model"] == "random-qwen2-tiny"
    assert all(a["status"] == "ok" and a["params_moved"] for a in r["arms"])
    assert heads  # the chunked head scored the tokens


def test_train_py_runs_on_the_device_it_is_given(capsys):
    train = load("train")
    assert train.main(["--device", "cpu", "--rows", "8", "--repeats", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["rows"] == 8 and r["loss_abs_diff"] < 1e-6


def test_train_py_smollm2_builds_on_the_device_it_is_given(monkeypatch, capsys):
    """The --smollm2 path (its model swapped for the tiny one): loaded on the resolved --device."""
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    import sleuth.models

    train, seen = load("train"), []

    def fake_load_policy(name, *, dtype, device, **kwargs):
        seen.append(device)
        tok = tiny_tokenizer()
        return tiny_model(tok).to(device).float(), tok

    monkeypatch.setattr(sleuth.models, "load_policy", fake_load_policy)
    threads = torch.get_num_threads()
    try:
        rc = train.main(["--smollm2", "--device", "auto", "--rows", "4", "--group-size", "2", "--repeats", "1",
                         "--threads", "1", "--micro-batch-size", "4", "--json"])
    finally:
        torch.set_num_threads(threads)
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert rc == 0 and seen == [expected] and r["device"] == expected
    assert r["max_weight_change"] > 0 and "speedup_after_shared" in r


def test_profile_names_the_ops_that_took_the_most_host_time(bench):
    """--profile: one more step per arm under torch.profiler; on CPU the host table only (no device
    times), its rows sorted, their times within the step's total."""
    rc, r = run(bench, TINY + ["--profile", "--arms", "on"])
    assert rc == 0, r
    prof = r["arms"][0]["profile"]
    rows = prof["by_host_time"]
    assert rows and prof["by_device_time"] == [] and prof["host_ms_total"] > 0
    assert [x["self_cpu_ms"] for x in rows] == sorted((x["self_cpu_ms"] for x in rows), reverse=True)
    assert all(x["calls"] >= 1 and x["op"] for x in rows)
    assert sum(x["self_cpu_ms"] for x in rows) <= prof["host_ms_total"] + 0.1
