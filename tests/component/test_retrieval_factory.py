"""The cached BM25 index of a corpus file (``retrieval.corpus``): built once, published atomically,
safe when several processes or threads ask for it at the same time."""

import json

import pytest

from sleuth.retrieval.factory import _file_digest, bm25_for_corpus
from sleuth.retrieval.index import META_FILE
from tests.helpers.concurrency import run_concurrently

pytestmark = pytest.mark.component

ROWS = [{"id": str(n), "contents": f'"Town {n}"\nTown {n} lies on river {name}.'}
        for n, name in enumerate(["Arno", "Tiber", "Po", "Adige", "Brenta", "Piave"])]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _top_id(retriever, query):
    return retriever.search([query], 1)[0][0].id


def test_concurrent_builders_all_get_the_index_and_leave_no_temp_dirs(corpus, tmp_path):
    results = run_concurrently(lambda: _top_id(bm25_for_corpus(corpus), "river Brenta"), 4)
    assert results == ["4"] * 4
    entries = sorted(p.name for p in (tmp_path / "cache" / "indexes").iterdir())
    assert entries == [f"bm25-{_file_digest(corpus)}"]  # one published index, no leftovers


def test_a_partial_directory_of_an_interrupted_build_is_replaced(corpus, tmp_path):
    out = tmp_path / "cache" / "indexes" / f"bm25-{_file_digest(corpus)}"
    (out / "corpus").mkdir(parents=True)
    (out / "corpus" / "passages.arrow").write_bytes(b"")  # what a killed build leaves: no meta.json
    assert _top_id(bm25_for_corpus(corpus), "river Piave") == "5"
    assert (out / META_FILE).is_file()
    assert _top_id(bm25_for_corpus(corpus), "river Arno") == "0"  # the second call loads the cached one
