"""``sleuth index build`` / ``sleuth search`` in-process: --json last line, clear input errors."""

import json

import pytest

from tests.helpers.cli import cli_runner

pytestmark = pytest.mark.component


@pytest.fixture
def run(monkeypatch, capsys):
    """Run ``sleuth ARGS`` with only the retrieval commands registered; return (rc, out, err)."""
    return cli_runner(monkeypatch, capsys, ["sleuth.retrieval.cli"])


@pytest.fixture
def corpus(tmp_path):
    rows = [{"id": "fr", "contents": '"France"\nParis is the capital of France.'},
            {"id": "it", "contents": '"Italy"\nRome is the capital of Italy.'},
            {"id": "jp", "title": "Japan", "text": "Tokyo is the capital of Japan."}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_build_then_search_json(run, corpus, tmp_path):
    rc, out, _ = run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "idx", "--json")
    assert rc == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["kind"] == "bm25" and summary["n_passages"] == 3 and summary["n_skipped"] == 0

    rc, out, _ = run("search", "--index", tmp_path / "idx", "capital of Italy", "Tokyo", "-k", "2", "--json")
    assert rc == 0 and "1. [it] Italy" in out
    res = json.loads(out.strip().splitlines()[-1])
    assert res["k"] == 2 and [r["query"] for r in res["results"]] == ["capital of Italy", "Tokyo"]
    assert res["results"][0]["passages"][0]["id"] == "it"
    assert [p["id"] for p in res["results"][1]["passages"]] == ["jp"]


def test_build_refuses_to_overwrite_without_flag(run, corpus, tmp_path):
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "i")[0] == 0
    rc, _, err = run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "i")
    assert rc == 2 and "already holds an index" in err and "--overwrite" in err
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "i", "--overwrite")[0] == 0


def test_bad_corpus_line_is_reported(run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "b", "txt": "y"}\n')
    rc, _, err = run("index", "build", "--corpus", bad, "--kind", "bm25", "--out", tmp_path / "i")
    assert rc == 2 and "bad.jsonl:2" in err and "'text'" in err
    rc, out, _ = run("index", "build", "--corpus", bad, "--kind", "bm25", "--out", tmp_path / "i",
                     "--skip-bad", "--json")
    assert rc == 0 and json.loads(out.strip().splitlines()[-1])["n_skipped"] == 1


def test_search_errors(run, corpus, tmp_path):
    rc, _, err = run("search", "--index", tmp_path / "none", "q")
    assert rc == 2 and "does not exist" in err and "sleuth index build" in err
    (tmp_path / "half").mkdir()
    rc, _, err = run("search", "--index", tmp_path / "half", "q")
    assert rc == 2 and "no meta.json" in err
    run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "idx")
    rc, _, err = run("search", "--index", tmp_path / "idx", "q", "-k", "0")
    assert rc == 2 and "-k must be >= 1" in err
    rc, out, _ = run("search", "--index", tmp_path / "idx", "the of", "--json")
    assert rc == 0 and "no searchable term" in out
    assert json.loads(out.strip().splitlines()[-1])["results"][0]["passages"] == []


def test_search_url_server_down_is_a_clear_error(run):
    pytest.importorskip("httpx")
    rc, _, err = run("search", "--url", "http://127.0.0.1:9", "q")  # port 9 (discard): nothing listens
    assert rc == 2 and "127.0.0.1:9" in err and "failed" in err
    with pytest.raises(SystemExit):  # --index and --url together: argparse refuses
        run("search", "--url", "http://x", "--index", "d", "q")


def test_build_out_that_is_a_file_is_a_clear_error(run, corpus, tmp_path):
    taken = tmp_path / "taken.jsonl"
    taken.write_text("{}\n")
    rc, _, err = run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", taken)
    assert rc == 2 and "--out" in err and "taken.jsonl is a file, not a directory" in err
    assert taken.read_text() == "{}\n"  # untouched


def test_rerank_top_n_below_one_names_the_flag(run, corpus, tmp_path):
    run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "idx")
    rc, _, err = run("search", "--index", tmp_path / "idx", "q", "--rerank", "any", "--rerank-top-n", "0")
    assert rc == 2 and "--rerank-top-n must be >= 1, got 0" in err


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / "corpus" / "passages.arrow").write_bytes(b"garbage!"), "corpus/passages.arrow"),
    (lambda d: (d / "corpus" / "id_hash.npy").write_bytes(b"garbage!"), "id_hash.npy is not a valid .npy"),
    (lambda d: (d / "bm25" / "data.csc.index.npy").write_bytes(b"garbage!"), "not a valid array"),
    (lambda d: (d / "bm25" / "vocab.index.json").unlink(), "vocab.index.json is missing"),
    (lambda d: (d / "bm25" / "sleuth_bm25.json").unlink(), "sleuth_bm25.json is missing"),
])
def test_damaged_index_says_which_and_how_to_rebuild(run, corpus, tmp_path, damage, words):
    idx = tmp_path / "idx"
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", idx)[0] == 0
    damage(idx)
    rc, _, err = run("search", "--index", idx, "capital")
    assert rc == 2 and words in err
    assert f"index {idx} is damaged or incomplete" in err
    assert f"sleuth index build --corpus {corpus} --kind bm25 --out {idx} --overwrite" in err
    assert "allow_pickle" not in err and "Errno" not in err
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", idx, "--overwrite")[0] == 0
    assert run("search", "--index", idx, "capital")[0] == 0  # the advice works


def test_bad_device_is_refused_before_any_work(run, corpus, tmp_path):
    rc, _, err = run("index", "build", "--corpus", corpus, "--kind", "dense", "--out", tmp_path / "d",
                     "--device", "banana")
    assert rc == 2 and "--device 'banana' is not a device" in err and "cpu, cuda, cuda:N" in err
    assert not (tmp_path / "d" / "corpus").exists()  # refused before the ingest
    (tmp_path / "dense").mkdir()  # only the meta is read before the device is checked
    (tmp_path / "dense" / "meta.json").write_text(json.dumps({"kind": "dense"}))
    rc, _, err = run("search", "--index", tmp_path / "dense", "q", "--device", "cuda:x")
    assert rc == 2 and "--device 'cuda:x' is not a device" in err


class _Stub:
    """A /retrieve endpoint answering one fixed body."""

    def __init__(self, body):
        from fastapi import FastAPI

        self.app = FastAPI()

        @self.app.post("/retrieve")
        def retrieve() -> dict:
            return body


def test_search_url_prints_passages_without_scores(run):
    pytest.importorskip("fastapi")
    from sleuth.retrieval.serve_cli import ServerThread

    bare = {"result": [[{"id": "1", "contents": '"T"\nbody text'}]]}  # Search-R1 without return_scores
    with ServerThread(_Stub(bare).app) as st:
        rc, out, _ = run("search", "--url", st.url + "/retrieve", "hello", "--json")
    assert rc == 0 and "1. [1] T\n     body text" in out and "score" not in out.splitlines()[1]
    assert json.loads(out.strip().splitlines()[-1])["results"][0]["passages"][0]["score"] is None
    with ServerThread(_Stub({"result": [[{"document": {"id": "1", "contents": "x"}, "score": "high"}]]}).app) as st:
        rc, _, err = run("search", "--url", st.url, "hello")
    assert rc == 2 and f"{st.url}/retrieve" in err and "'score' must be a number, got 'high'" in err


def test_search_url_sends_the_token(run, monkeypatch):
    pytest.importorskip("fastapi")
    from sleuth.retrieval.memory import InMemoryRetriever
    from sleuth.retrieval.serve_cli import ServerThread
    from sleuth.retrieval.server import make_app
    from sleuth.types import Passage

    monkeypatch.delenv("SLEUTH_RETRIEVAL_TOKEN", raising=False)
    app = make_app(InMemoryRetriever([Passage("p0", "Paris", "Paris is the capital of France.")]), token="T0k")
    with ServerThread(app) as st:
        rc, _, err = run("search", "--url", st.url, "Paris")
        assert rc == 2 and "HTTP 401" in err and "$SLEUTH_RETRIEVAL_TOKEN" in err
        rc, out, _ = run("search", "--url", st.url, "Paris", "--token", "T0k")
        assert rc == 0 and "[p0] Paris (score" in out
        monkeypatch.setenv("SLEUTH_RETRIEVAL_TOKEN", "T0k")
        rc, out, _ = run("search", "--url", st.url, "Paris")
        assert rc == 0 and "[p0] Paris" in out


def test_build_refuses_a_directory_that_is_not_an_index_and_touches_nothing(run, corpus, tmp_path):
    """The issue's case: ``--corpus p/corpus/x.jsonl --out p`` deleted x.jsonl (and any corpus/,
    bm25/, dense/faiss.index of a directory that was not an index)."""
    p = tmp_path / "p"
    (p / "corpus").mkdir(parents=True)
    (p / "bm25").mkdir()
    (p / "dense").mkdir()
    x = p / "corpus" / "x.jsonl"
    x.write_bytes(corpus.read_bytes())
    (p / "bm25" / "notes.txt").write_text("mine")
    (p / "dense" / "faiss.index").write_text("also mine")
    before = {f: f.read_bytes() for f in p.rglob("*") if f.is_file()}
    for extra in ([], ["--overwrite"]):
        rc, _, err = run("index", "build", "--corpus", x, "--kind", "bm25", "--out", p, *extra)
        assert rc == 2 and f"--out {p} is not empty" in err and "not a Sleuth index" in err
        assert "new or empty directory" in err
        assert {f: f.read_bytes() for f in p.rglob("*") if f.is_file()} == before  # all survive


def test_build_refuses_other_tools_meta_json_even_with_overwrite(run, corpus, tmp_path):
    d = tmp_path / "d"
    (d / "corpus").mkdir(parents=True)
    (d / "meta.json").write_text('{"name": "someone else\'s dataset"}')
    (d / "corpus" / "data.bin").write_bytes(b"precious")
    rc, _, err = run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", d, "--overwrite")
    assert rc == 2 and "not a Sleuth index" in err
    assert (d / "corpus" / "data.bin").read_bytes() == b"precious" and "someone" in (d / "meta.json").read_text()


def test_overwrite_replaces_only_the_index_and_refuses_a_corpus_inside_it(run, corpus, tmp_path):
    idx = tmp_path / "idx"
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", idx)[0] == 0
    (idx / "notes.txt").write_text("keep me")  # the user's file beside the index
    inside = idx / "corpus" / "src.jsonl"
    inside.write_bytes(corpus.read_bytes())
    rc, _, err = run("index", "build", "--corpus", inside, "--kind", "bm25", "--out", idx, "--overwrite")
    assert rc == 2 and f"--corpus {inside} lies inside {idx / 'corpus'}" in err and "choose another --out" in err
    assert inside.read_bytes() == corpus.read_bytes()
    assert run("search", "--index", idx, "capital of Italy")[0] == 0  # the index was not touched
    beside = idx / "src.jsonl"  # outside the replaced parts: fine
    inside.rename(beside)
    assert run("index", "build", "--corpus", beside, "--kind", "bm25", "--out", idx, "--overwrite")[0] == 0
    assert (idx / "notes.txt").read_text() == "keep me" and beside.is_file()
    rc, out, _ = run("search", "--index", idx, "capital of Italy")
    assert rc == 0 and "1. [it] Italy" in out


def test_unfinished_build_is_resumed_and_an_empty_directory_is_used(run, corpus, tmp_path):
    idx = tmp_path / "idx"
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", idx)[0] == 0
    (idx / "meta.json").unlink()  # as if the build had been killed before its end
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", idx)[0] == 0
    (tmp_path / "empty").mkdir()
    assert run("index", "build", "--corpus", corpus, "--kind", "bm25", "--out", tmp_path / "empty")[0] == 0
    assert run("search", "--index", tmp_path / "empty", "Tokyo")[0] == 0
