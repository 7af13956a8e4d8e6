"""Dense encoder prefixes: detection from a local model directory (Hugging Face cache snapshot,
sentence-transformers prompts, config.json), explicit overrides, and the search-time checks."""

import json
import warnings

import pytest

from sleuth.retrieval.prefixes import (
    BGE_EN_INSTRUCTION,
    choose_prefixes,
    detect_prefixes,
    encoder_prefixes,
    search_query_prefix,
)

pytestmark = pytest.mark.unit

E5 = ("query: ", "passage: ")


def model_dir(path, config=None, st_config=None):
    """A directory that looks like a model (only the files detection reads)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config or {"model_type": "bert"}))
    if st_config is not None:
        (path / "config_sentence_transformers.json").write_text(json.dumps(st_config))
    return path


def test_hugging_face_cache_snapshot_path_gets_the_family_of_its_repo(tmp_path):
    snap = model_dir(tmp_path / "hub/models--intfloat--e5-base-v2/snapshots/3c9b8b2d0f6e",
                     config={"_name_or_path": "/mnt/training/ckpt-9"})
    assert encoder_prefixes(str(snap)) == E5
    q, p, how = detect_prefixes(str(snap))
    assert (q, p) == E5 and "models--intfloat--e5-base-v2" in how and "e5 family" in how
    bge = model_dir(tmp_path / "hub/models--BAAI--bge-small-en-v1.5/snapshots/5c38ec7c405e")
    assert encoder_prefixes(str(bge)) == (BGE_EN_INSTRUCTION, "")


def test_sentence_transformers_prompts_win_and_empty_ones_say_nothing(tmp_path):
    nomic = model_dir(tmp_path / "my-model", st_config={
        "prompts": {"query": "search_query: ", "document": "search_document: "}})
    assert detect_prefixes(str(nomic))[:2] == ("search_query: ", "search_document: ")
    assert "config_sentence_transformers.json" in detect_prefixes(str(nomic))[2]
    # sentence-transformers 3+ writes {"query": "", "document": ""} for every model: no information,
    # so the name decides.
    e5 = model_dir(tmp_path / "e5-small-v2", st_config={"prompts": {"query": "", "document": ""}})
    assert encoder_prefixes(str(e5)) == E5


def test_config_name_or_path_and_symlink_names_are_read(tmp_path):
    tuned = model_dir(tmp_path / "finetuned", config={"_name_or_path": "intfloat/multilingual-e5-large"})
    assert encoder_prefixes(str(tuned)) == E5
    target = model_dir(tmp_path / "blobs" / "0a1b2c")
    (tmp_path / "e5-large-v2").symlink_to(target)
    assert encoder_prefixes(str(tmp_path / "e5-large-v2")) == E5
    plain = model_dir(tmp_path / "model", config={"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"})
    q, p, how = detect_prefixes(str(plain))
    assert (q, p) == ("", "") and how.startswith("none") and "MiniLM-L6-H384-uncased" in how


def test_explicit_prefixes_win_over_detection(tmp_path):
    snap = model_dir(tmp_path / "hub/models--intfloat--e5-base-v2/snapshots/abc")
    assert choose_prefixes(str(snap), None, None)["query_prefix"] == "query: "
    one = choose_prefixes(str(snap), "", None)  # '' = explicitly none
    assert (one["query_prefix"], one["passage_prefix"]) == ("", "passage: ")
    assert one["prefix_source"].startswith("query prefix given")
    both = choose_prefixes(str(snap), "q> ", "p> ")
    assert (both["query_prefix"], both["passage_prefix"], both["prefix_source"]) == ("q> ", "p> ", "given")


def test_search_uses_the_built_prefixes_warns_on_another_query_prefix_refuses_another_passage_prefix():
    params = {"query_prefix": "query: ", "passage_prefix": "passage: "}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing differs
        assert search_query_prefix(params, None, None, "idx") == "query: "
        assert search_query_prefix(params, "query: ", "passage: ", "idx") == "query: "
    with pytest.warns(UserWarning, match="index idx was built with query prefix 'query: '; searching with ''"):
        assert search_query_prefix(params, "", None, "idx") == ""
    with pytest.raises(ValueError, match="built with passage prefix 'passage: ', not ''.*rebuild"):
        search_query_prefix(params, None, "", "idx")
