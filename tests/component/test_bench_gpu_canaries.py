"""``bench/gpu_canaries.py`` runs end to end on CPU with ``--tiny``: every canary is present with its
figures, the figures agree with their definitions, the Linear-gradient canary passes on this torch,
and the canaries can fail (a frozen Linear, a zeroed gradient, float32 keys in the KV cache).
No timing is asserted."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.component

BENCH = Path(__file__).resolve().parents[2] / "bench"
NAMES = ["linear_grads", "master_weights_move", "kv_dtypes", "sampler_vs_trainer", "reference_kl_step0"]


def load():
    spec = importlib.util.spec_from_file_location("gpu_canaries", BENCH / "gpu_canaries.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(mod, capsys, *extra) -> dict:
    assert mod.main(["--tiny", "--device", "cpu", "--json", *extra]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [c["name"] for c in r["canaries"]] == NAMES
    return r


def canary(r: dict, name: str) -> dict:
    return next(c for c in r["canaries"] if c["name"] == name)


@pytest.fixture(scope="module")
def result():
    """One run shared by the figure checks (capsys is per test: capture stdout here by hand)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert load().main(["--tiny", "--device", "cpu", "--json"]) == 0
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def test_env_facts_and_every_canary_reported(result):
    assert result["torch"] == torch.__version__ and result["device_name"] == "cpu"
    assert isinstance(result["allow_tf32"], bool)
    assert result["float32_matmul_precision"] in ("highest", "high", "medium")
    assert result["model"] == "random-smollm2-tiny" and result["param_dtype"] == "torch.float32"
    assert [c["name"] for c in result["canaries"]] == NAMES
    for c in result["canaries"]:
        assert c["pass"] in (True, False, None) and "error" not in c, c
    assert result["all_pass"] == all(c["pass"] is not False for c in result["canaries"])


def test_linear_grads_passes_on_this_torch(result):
    c = canary(result, "linear_grads")
    assert c["pass"] is True and c["optimizer_step_reached"] and c["optimizer_steps"] == 1
    assert c["linear_weights"] > 0 and c["linear_without_grad"] == 0 and c["trainable_without_grad"] == 0
    assert c["trainable_params"] >= c["linear_weights"] - 1  # the tied head shares the embedding
    assert c["torch_autocast_cache_drops_grad"] is False  # torch 2.13 has pytorch#165068
    assert c["tokens"] > c["rows"] > 0


def test_master_weights_figures(result):
    c = canary(result, "master_weights_move")
    assert 0.0 <= c["bf16_share_changed"] <= 1.0 and 0.0 <= c["f32_share_changed"] <= 1.0
    assert c["f32_elements"] == c["bf16_elements"] > 0
    assert c["pass"] == (c["f32_share_changed"] >= 0.8)
    assert c["f32_share_changed"] > c["bf16_share_changed"]  # bf16 rounds most of a 1e-6 step away


def test_kv_figures_against_the_plan(result):
    c = canary(result, "kv_dtypes")
    # tiny smollm2: 2 key-value heads x 16 dims, K and V in bf16 = 2 x 32 x 2 bytes per token and layer
    assert c["plan_bytes_per_token"] == 128
    assert c["ratio"] == pytest.approx(c["measured_bytes_per_token"] / c["plan_bytes_per_token"])
    assert c["pass"] == (c["ratio"] <= 1.05)
    assert c["v_dtype"] == "torch.bfloat16" and c["k_dtype"] in c["all_k_dtypes"]


def test_sampler_and_reference_figures(result):
    s = canary(result, "sampler_vs_trainer")
    for p in ("", "f32_"):
        assert s[p + "tokens"] > 0 and 0 <= s[p + "mean_abs_delta"] <= s[p + "max_abs_delta"]
        assert 0.0 <= s[p + "clipfrac_0.28"] <= s[p + "clipfrac_0.2"] <= 1.0
        assert s[p + "mean_ratio"] > 0
    assert s["f32_mean_abs_delta"] < 1e-4  # float32 sampler and trainer agree to rounding
    assert s["pass"] == (s["mean_abs_delta"] < 1e-2 and s["clipfrac_0.2"] == 0.0)
    r = canary(result, "reference_kl_step0")
    assert r["k3_mean"] >= 0 and 0 <= r["mean_abs_delta"] <= r["max_abs_delta"] and r["tokens"] > 0
    assert r["pass"] == (r["k3_mean"] < 1e-3)


def test_linear_grads_fails_on_a_frozen_linear(monkeypatch, capsys):
    mod = load()
    real = mod.load_bench_model

    def frozen(*a, **k):
        model, tok, label = real(*a, **k)
        model.model.layers[0].mlp.down_proj.weight.requires_grad_(False)
        return model, tok, label

    monkeypatch.setattr(mod, "load_bench_model", frozen)
    c = canary(run(mod, capsys), "linear_grads")
    assert c["pass"] is False and c["linear_without_grad"] == 1 and c["trainable_without_grad"] == 0
    assert c["without_grad_names"] == ["model.layers.0.mlp.down_proj.weight"]


def test_linear_grads_fails_when_the_update_zeroes_a_gradient(monkeypatch, capsys):
    mod = load()
    real = mod.policy_update

    def zeroing(policy, *a, **k):
        policy.model.layers[-1].self_attn.q_proj.weight.register_hook(torch.zeros_like)
        return real(policy, *a, **k)

    monkeypatch.setattr(mod, "policy_update", zeroing)
    r = run(mod, capsys)
    c = canary(r, "linear_grads")
    assert c["pass"] is False and r["all_pass"] is False
    assert c["linear_without_grad"] == c["trainable_without_grad"] == 1


def test_kv_canary_fails_with_float32_keys(monkeypatch, capsys):
    """The cache before the keys were stored in the values' dtype: float32 keys, 1.5x the plan."""
    from sleuth.rollout.hf_cache import SlotLayer

    def keys_as_they_come(self, keys, values):  # K buffer in the keys' float32, V in the values' bf16
        self._allocate(values)
        self.k_buf = self.k_buf.to(keys.dtype)

    monkeypatch.setattr(SlotLayer, "lazy_initialization", keys_as_they_come)
    c = canary(run(load(), capsys), "kv_dtypes")
    assert c["k_dtype"] == "torch.float32" and c["v_dtype"] == "torch.bfloat16"
    assert c["ratio"] == pytest.approx(1.5) and c["pass"] is False


def test_an_exception_is_a_failed_canary_with_its_error(monkeypatch, capsys):
    mod = load()

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(mod, "kl_estimate", broken)
    r = run(mod, capsys)
    c = canary(r, "reference_kl_step0")
    assert c["pass"] is False and "boom" in c["error"] and r["all_pass"] is False
    assert canary(r, "linear_grads")["pass"] is True  # the others are not lost
