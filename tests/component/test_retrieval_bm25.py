"""BM25 (bm25s + PyStemmer): hand-computed scores, toy corpora, and equivalence with rank_bm25."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sleuth.retrieval.base import Retriever
from sleuth.retrieval.bm25 import BM25Params, _make_tokenizer
from sleuth.retrieval.index import build_index, load_index

pytestmark = pytest.mark.component

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bm25_index(tmp_path, rows, params=None):
    src = write_jsonl(tmp_path / "corpus.jsonl", rows)
    build_index(src, "bm25", tmp_path / "idx", bm25_params=params, show_progress=False)
    return load_index(tmp_path / "idx")


def test_lucene_scores_hand_computed(tmp_path):
    r = bm25_index(tmp_path, [
        {"id": "d0", "text": "apple banana"},         # tokens: appl banana           (len 2)
        {"id": "d1", "text": "apples apple cherry"},  # tokens: appl appl cherri      (len 3)
        {"id": "d2", "text": "date"},                 # tokens: date                  (len 1)
    ])
    assert isinstance(r, Retriever)
    # N = 3, avgdl = 2, df(appl) = 2, k1 = 0.9, b = 0.4 (Lucene variant, Search-R1's defaults):
    #   idf = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln 1.6 = 0.4700036
    #   d0: tf 1, dl 2: 1 / (0.9 * (0.6 + 0.4 * 2/2) + 1) = 1 / 1.9  -> 0.4700036 * 0.5263158 = 0.2473703
    #   d1: tf 2, dl 3: 2 / (0.9 * (0.6 + 0.4 * 3/2) + 2) = 2 / 3.08 -> 0.4700036 * 0.6493506 = 0.3051971
    (res,) = r.search(["Apple?"], k=3)
    assert [p.id for p in res] == ["d1", "d0"]  # d2 shares no term: not returned
    np.testing.assert_allclose([p.score for p in res], [0.3051971, 0.2473703], rtol=1e-5)


def test_toy_corpus_obvious_answers(tmp_path):
    r = bm25_index(tmp_path, [
        {"id": "fr", "title": "France", "text": "Paris is the capital and largest city of France."},
        {"id": "it", "title": "Italy", "text": "Rome is the capital city of Italy."},
        {"id": "cell", "title": "Mitochondrion", "text": "Mitochondria generate most of the cell's energy."},
        {"id": "run", "title": "Running", "text": "A runner runs long distances when running marathons."},
    ])
    res = r.search(["capital of France", "mitochondria energy", "marathon runner", "Italy"], k=2)
    assert [ps[0].id for ps in res] == ["fr", "cell", "run", "it"]
    assert res[0][0].title == "France" and "Paris" in res[0][0].text
    assert all(len(ps) <= 2 for ps in res)


def test_bm25s_order_gives_the_same_passages_and_scores(tmp_path):
    """``search_bm25s_order`` (the toy transcripts' ranking) differs from ``search`` only in the order
    of passages with equal scores: same scores, and the same passages when k covers every tie."""
    rows = [{"id": f"d{i}", "text": text} for i, text in enumerate(
        ["apple banana", "apple cherry", "banana cherry", "apple", "cherry date", "apple banana", "date"])]
    r = bm25_index(tmp_path, rows)
    for query in ("apple", "banana", "cherry date", "apple banana", "fig"):
        (rows_order,) = r.search([query], k=7)
        bm25s_order = r.search_bm25s_order(query, 7)
        assert sorted((p.id, round(p.score, 5)) for p in bm25s_order) == \
            sorted((p.id, round(p.score, 5)) for p in rows_order)
        assert [round(p.score, 5) for p in bm25s_order] == [round(p.score, 5) for p in rows_order]  # best first
    assert r.search_bm25s_order("apple", 1)[0].score == r.search(["apple"], k=1)[0][0].score


def test_empty_stopword_and_unknown_queries_return_nothing(tmp_path):
    r = bm25_index(tmp_path, [{"id": "a", "text": "alpha beta"}, {"id": "b", "text": "gamma"}])
    res = r.search(["", "   ", "the of and", "zzzunknown", "alpha"], k=3)
    assert [len(ps) for ps in res] == [0, 0, 0, 0, 1]
    assert r.num_empty_queries == 4
    assert sorted(p.id for p in r.search(["alpha gamma"], k=1000)[0]) == ["a", "b"]  # huge k: all matches
    for bad in (0, -1):
        with pytest.raises(ValueError, match="k must be"):
            r.search(["alpha"], k=bad)


def test_index_is_memory_mapped(tmp_path):
    r = bm25_index(tmp_path, [{"id": "a", "text": "alpha beta"}, {"id": "b", "text": "gamma"}])
    assert isinstance(r.model.scores["data"], np.memmap)
    assert isinstance(r.store._hash, np.memmap)


@pytest.mark.skipif(not (SHARED / "corpus" / "wiki_dev.jsonl").exists(), reason="../shared/data not present")
def test_matches_rank_bm25_on_real_slice(tmp_path):
    """bm25s 'robertson' == rank_bm25 BM25Okapi(epsilon=0) up to the constant (k1 + 1) factor."""
    rank_bm25 = pytest.importorskip("rank_bm25")
    lines = (SHARED / "corpus" / "wiki_dev.jsonl").read_text().splitlines()[:400]
    (tmp_path / "slice.jsonl").write_text("\n".join(lines) + "\n")
    params = BM25Params(method="robertson", k1=1.5, b=0.75)
    build_index(tmp_path / "slice.jsonl", "bm25", tmp_path / "idx", bm25_params=params, show_progress=False)
    ours = load_index(tmp_path / "idx")
    texts = [t for _, ts in ours.store.iter_texts() for t in ts]
    docs = _make_tokenizer(params).tokenize(texts, return_as="string", show_progress=False)
    ref = rank_bm25.BM25Okapi(docs, k1=1.5, b=0.75, epsilon=0.0)
    questions = [json.loads(x)["question"] for x in (SHARED / "dev" / "nq.jsonl").read_text().splitlines()[:40]]
    checked = 0
    for q, (rows, scores) in zip(questions, ours.search_rows(questions, k=5)):
        terms = [w for w in ours._split(q.lower()) if w not in ours._stop]
        ref_scores = ref.get_scores([ours._stem(w) for w in terms])
        ref_top = np.sort(ref_scores[ref_scores > 0])[::-1][:5]
        np.testing.assert_allclose(scores * 2.5, ref_top, rtol=1e-4)  # same top-5 scores ...
        np.testing.assert_allclose(scores * 2.5, ref_scores[rows], rtol=1e-4)  # ... on the same rows
        checked += len(rows) > 0
    assert checked >= 30
    assert math.isclose(ref.avgdl, float(np.mean([len(d) for d in docs])))


def test_scores_equal_bm25s_reference(tmp_path):
    """Our column sum == bm25s' own get_scores_from_ids (np.add.at), repeated terms included."""
    r = bm25_index(tmp_path, [{"id": str(i), "text": t} for i, t in enumerate(
        ["red fox jumps", "red red dog", "blue fox", "green frog jumps high", "fox fox fox red"])])
    for q in (["red"], ["fox", "jumps"], ["red", "red", "fox"], ["high", "blue", "dog"]):
        ids = [r.model.vocab_dict[r._stem(w)] for w in q]
        np.testing.assert_allclose(r.scores(ids), r.model.get_scores_from_ids(ids), rtol=1e-6)
