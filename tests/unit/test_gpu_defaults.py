"""Defaults that differ on a GPU: `sleuth eval --dtype auto` (bfloat16 on a GPU, float32 on a CPU) and
`train.deterministic` (None: deterministic algorithms on CPU runs only). A GPU is faked where needed."""

import argparse
import os

import pytest
import torch

import sleuth.models as models
from sleuth.config import Config
from sleuth.errors import UserError
from sleuth.eval.common import resolve_dtype
from sleuth.train.distributed import DistContext
from sleuth.train.state import set_determinism

pytestmark = pytest.mark.unit


def _fake_gpu(monkeypatch, bf16=True):
    monkeypatch.setattr(models, "pick_device", lambda device="auto": torch.device("cuda" if device != "cpu" else "cpu"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_eval_dtype_auto_is_bfloat16_on_a_gpu_and_float32_on_a_cpu(monkeypatch):
    assert resolve_dtype(argparse.Namespace(dtype="auto", device="cpu")) == "float32"
    assert resolve_dtype(argparse.Namespace(dtype="bfloat16", device="cpu")) == "bfloat16"  # asked: kept
    _fake_gpu(monkeypatch)
    args = argparse.Namespace(dtype="auto", device="auto")
    assert resolve_dtype(args) == "bfloat16" and args.dtype == "bfloat16"  # recorded for the eval's setting
    assert resolve_dtype(argparse.Namespace(dtype="float32", device="auto")) == "float32"
    assert resolve_dtype(argparse.Namespace(dtype="auto", device="cpu")) == "float32"
    _fake_gpu(monkeypatch, bf16=False)
    assert resolve_dtype(argparse.Namespace(dtype="auto", device="auto")) == "float32"


def test_a_bad_device_is_a_user_error():
    with pytest.raises(UserError, match="device"):
        resolve_dtype(argparse.Namespace(dtype="auto", device="tpu:7"))


@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=True)
    torch.backends.cudnn.benchmark = before[1]
    if env is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = env


def test_deterministic_algorithms_on_cpu_runs_not_forced_on_gpus(monkeypatch, restore_determinism):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cfg = Config()
    cfg.model.device = "cpu"
    assert set_determinism(cfg, DistContext()) is True and torch.are_deterministic_algorithms_enabled()
    import sleuth.train.state as state

    monkeypatch.setattr(state, "pick_device", lambda device="auto": torch.device("cuda"))
    cfg.model.device = "auto"
    assert set_determinism(cfg, DistContext()) is False and not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    cfg.train.deterministic = True  # asked for on a GPU
    assert set_determinism(cfg, DistContext()) is True and torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    cfg.train.deterministic = False
    cfg.model.device = "cpu"
    monkeypatch.setattr(state, "pick_device", lambda device="auto": torch.device("cpu"))
    assert set_determinism(cfg, DistContext()) is False


def test_a_resumed_eval_keeps_the_dtype_it_ran_in(monkeypatch, tmp_path):
    """An eval started in float32 (the old default, or a CPU) and resumed on a GPU with --dtype auto
    continues in float32 instead of refusing its own directory."""
    import json

    _fake_gpu(monkeypatch)
    (tmp_path / "setting.json").write_text(json.dumps({"dtype": "float32"}))
    assert resolve_dtype(argparse.Namespace(dtype="auto", device="auto"), tmp_path) == "float32"
    assert resolve_dtype(argparse.Namespace(dtype="auto", device="auto"), tmp_path / "new") == "bfloat16"
    assert resolve_dtype(argparse.Namespace(dtype="float16", device="auto"), tmp_path) == "float16"  # asked


def test_float32_products_use_tf32_on_gpus_unless_deterministic_or_turned_off(monkeypatch, restore_determinism):
    import sleuth.train.state as state

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        cfg = Config()
        cfg.model.device = "cpu"
        set_determinism(cfg, DistContext())
        assert torch.get_float32_matmul_precision() == "highest"  # CPU: untouched
        monkeypatch.setattr(state, "pick_device", lambda device="auto": torch.device("cuda"))
        cfg.model.device = "auto"
        set_determinism(cfg, DistContext())
        assert torch.get_float32_matmul_precision() == "high"  # TF32 tensor cores
        cfg.train.tf32 = False
        set_determinism(cfg, DistContext())
        assert torch.get_float32_matmul_precision() == "highest"
        cfg.train.tf32, cfg.train.deterministic = True, True
        set_determinism(cfg, DistContext())
        assert torch.get_float32_matmul_precision() == "highest"  # reproducible runs keep full float32
    finally:
        torch.set_float32_matmul_precision(before)
