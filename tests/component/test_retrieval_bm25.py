"""BM25 (bm25s + PyStemmer): hand-computed scores, toy corpora, and equivalence with rank_bm25."""

import json
import math
import os
import subprocess
import sys
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


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_streaming_build_writes_what_bm25s_index_writes(tmp_path, method):
    """The streaming build (small batches, so that pairs cross many batches and vocabulary growth) writes
    the arrays bm25s' in-memory ``index`` writes: the same vocabulary, CSC layout and scores."""
    from sleuth.retrieval.bm25 import _build_bm25_in_memory, build_bm25
    from sleuth.retrieval.corpus import CorpusStore

    if (SHARED / "corpus" / "wiki_dev.jsonl").exists():
        lines = (SHARED / "corpus" / "wiki_dev.jsonl").read_text().splitlines()[:1500]
        rows = [json.loads(x) for x in lines]
    else:
        rows = [{"id": str(i), "text": f"passage {i} about topic {i % 7} and word{i % 13} word{i % 13}"}
                for i in range(300)]
    rows.append({"id": "empty", "text": "the of and"})  # only stopwords: no indexed term
    src = write_jsonl(tmp_path / "c.jsonl", rows)
    build_index(src, "bm25", tmp_path / "idx", show_progress=False)  # any store; the builds below share it
    store = load_index(tmp_path / "idx").store
    assert isinstance(store, CorpusStore)
    params = BM25Params(method=method, k1=1.2, b=0.75)
    build_bm25(store, tmp_path / "stream", params, show_progress=False, batch_rows=97)
    _build_bm25_in_memory(store, tmp_path / "ref", params, show_progress=False)
    for name in ("indptr.csc.index.npy", "indices.csc.index.npy", "data.csc.index.npy"):
        got, want = np.load(tmp_path / "stream" / name), np.load(tmp_path / "ref" / name)
        assert got.shape == want.shape, name
        if name.startswith("data"):
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
        else:
            assert np.array_equal(got, want), name
    read = lambda d, f: json.loads((tmp_path / d / f).read_text())  # noqa: E731
    assert read("stream", "vocab.index.json") == read("ref", "vocab.index.json")
    ref_params = read("ref", "params.index.json")
    assert read("stream", "params.index.json") == ref_params and ref_params["num_docs"] == len(rows)


def _numba_or_skip(mode):
    from sleuth.retrieval.bm25 import NUMBA

    if mode != "numpy" and not NUMBA:
        pytest.skip("numba is not installed (pip install 'sleuth[fast]')")


@pytest.mark.parametrize("mode", ["numpy", "numba", "numba_pruned", "numba_pruned_small_windows"])
@pytest.mark.parametrize("threads", [1, 3])
def test_batched_search_equals_one_dense_query_at_a_time(tmp_path, monkeypatch, threads, mode):
    """search_rows (worker threads; numpy: the passages a query's postings touch, or the dense sum; the
    compiled kernel, every posting or with MaxScore pruning over windows of passages, 65,536 or 64 at a
    time) gives each query's top rows and scores of the dense
    per-query sum, ties included; buffers are left clean. Corpora: one made of repeated passages (ties
    everywhere), also as a Robertson index (a word in 2/3 of the passages: its negative idf, which bm25s
    turns into zero contributions), and real passages and questions."""
    import sleuth.retrieval.bm25 as bm25
    from sleuth.retrieval.bm25 import top_rows

    _numba_or_skip(mode)
    monkeypatch.setattr(bm25, "PRUNE_FROM", 0)  # prune however small the corpus (the default: from 200k passages)
    monkeypatch.setattr(bm25, "PRUNE_PER_K", 0)
    if mode == "numba_pruned_small_windows":  # many windows over these small corpora, thresholds rising across them
        from sleuth.retrieval import bm25_kernel

        monkeypatch.setattr(bm25_kernel, "WINDOW", 64)
    tied = [{"id": str(i), "text": f"topic {i % 7} word{i % 13} city{i % 5}" + (" common" if i % 3 else "")}
            for i in range(300)]  # "common" in 2/3 of the passages: a Robertson idf below 0
    tied_q = [f"topic {i} word{i} city{i % 5}" for i in range(13)] + ["city1 city1 topic", "common word3", "common"]
    corpora = [(tied, tied_q, None), (tied, tied_q, BM25Params(method="robertson"))]
    if (SHARED / "corpus" / "wiki_dev.jsonl").exists():
        corpora.append(([json.loads(x) for x in (SHARED / "corpus" / "wiki_dev.jsonl").read_text().splitlines()[:2000]],
                        [json.loads(x)["question"] for x in (SHARED / "dev" / "nq.jsonl").read_text().splitlines()[:80]], None))
    for n, (rows, questions, params) in enumerate(corpora):
        (tmp_path / str(n)).mkdir()
        r = bm25_index(tmp_path / str(n), rows, params)
        r.threads = threads
        r.compiled, r.pruned = mode != "numpy", mode.startswith("numba_pruned")
        questions = questions + ["the of and", "zzzz unknown", questions[0]]  # no term, absent words, a repeat
        for share in (1, 8, 10**9) if mode == "numpy" else (8,):  # numpy: every query dense; default; touched
            monkeypatch.setattr(bm25, "SPARSE_SHARE", share)
            for k in (1, 5, 40):
                got = r.search_rows(questions, k=k)
                for q, (rows_k, scores_k) in zip(questions, got):
                    ids = r.query_term_ids(q)
                    want_rows, want_scores = top_rows(r.scores(ids), k) if ids else (np.zeros(0), np.zeros(0))
                    assert rows_k.tolist() == want_rows.tolist(), (q, k)
                    assert scores_k.tolist() == want_scores.tolist(), (q, k)
                    assert rows_k.dtype == np.int64 and scores_k.dtype == np.float32
        assert not r._buffer().any()
        if r.pruned:  # every query with a term was ranked with pruning; for the best passage of each of the
            c = r.counts  # real questions, it read (and looked up) fewer than half the postings
            assert c["queries_pruned"] == c["queries"] - r.num_empty_queries > 0, c
            if n == 2:
                r.counts = dict.fromkeys(c, 0)
                r.search_rows(questions, k=1)
                assert r.counts["postings_read"] < 0.5 * r.counts["postings"], r.counts


def test_top_rows_breaks_ties_at_the_edge_by_the_lower_row():
    """The k-th place goes to the lowest row among equal scores (argpartition alone picks any of them)."""
    from sleuth.retrieval.bm25 import top_rows

    scores = np.array([0, 2, 1, 2, 3, 2, 0, 2], dtype=np.float32)
    for k, want in [(1, [4]), (2, [4, 1]), (3, [4, 1, 3]), (5, [4, 1, 3, 5, 7]), (6, [4, 1, 3, 5, 7, 2]), (9, [4, 1, 3, 5, 7, 2])]:
        rows, got = top_rows(scores, k)
        assert rows.tolist() == want and got.tolist() == scores[want].tolist(), k
    many = np.ones(10_000, dtype=np.float32)  # all tied: the first rows, in order
    assert top_rows(many, 3)[0].tolist() == [0, 1, 2]


def test_term_bounds_and_seek_by_hand():
    """Each term's largest and smallest score over its column (0 for a term with none), and the first
    position at or after p whose row is >= a row, stepping or galloping (as np.searchsorted finds it)."""
    from sleuth.retrieval.bm25 import term_bounds

    data = np.array([0.5, 2.0, 1.5, 3.0, 0.25], dtype=np.float32)
    indptr = np.array([0, 3, 3, 4, 5])  # term 0: 0.5 2.0 1.5; term 1: none; term 2: 3.0; term 3: 0.25
    tmax, tmin = term_bounds(data, indptr)
    assert tmax.tolist() == [2.0, 0.0, 3.0, 0.25] and tmin.tolist() == [0.5, 0.0, 3.0, 0.25]
    pytest.importorskip("numba")
    from sleuth.retrieval.bm25_kernel import _seek

    rows = np.array([1, 4, 5, 9] + list(range(20, 220, 2)), dtype=np.int32)  # 104 rows: long gaps gallop
    for p in (0, 2, 3, 50, len(rows)):
        for row in (0, 1, 2, 5, 6, 9, 10, 20, 21, 100, 101, 218, 219, 500):
            want = max(p, int(np.searchsorted(rows, row)))
            assert _seek(rows, p, len(rows), row) == want, (p, row)
    assert _seek(rows, 0, 3, 100) == 3  # never past the end it is given


def test_pruning_bounds_saved_by_the_build_and_unsafe_terms_ranked_in_full(tmp_path, monkeypatch):
    """The build saves each term's largest and smallest score (what pruning bounds passages with): the
    same as the columns give, every column ascending. A term whose column is out of order or holds a
    negative score makes its queries take the full ranking (same results); float64 scores take the
    numpy path; a bounds file that does not fit the index is refused with its name."""
    from sleuth.retrieval import bm25
    from sleuth.retrieval.base import IndexFileError

    _numba_or_skip("numba")
    monkeypatch.setattr(bm25, "PRUNE_FROM", 0)
    monkeypatch.setattr(bm25, "PRUNE_PER_K", 0)
    rows = [{"id": str(i), "text": f"alpha{i % 11} beta{i % 7} gamma{i % 3} delta" + " delta" * (i % 4)}
            for i in range(400)]
    r = bm25_index(tmp_path, rows)
    _, tmax, tmin, ascending = r._stats
    data, indices, indptr = np.asarray(r._data), np.asarray(r._indices), np.asarray(r._indptr)
    want_max, want_min = bm25.term_bounds(data, indptr)
    assert ascending.all() and tmax.tolist() == want_max.tolist() and tmin.tolist() == want_min.tolist()
    for t in range(len(indptr) - 1):
        col = indices[indptr[t] : indptr[t + 1]]
        assert (np.diff(col) > 0).all() and (len(col) == 0 or data[indptr[t] : indptr[t + 1]].max() == tmax[t])

    queries = ["alpha3 beta2 gamma1", "delta alpha5", "beta4 gamma0", "alpha1"]
    want = r.search_rows(queries, k=5)
    ids = {w: r.model.vocab_dict[w] for w in ("beta4", "alpha5")}
    r._data, r._indices = data.copy(), indices.copy()
    lo, hi = indptr[ids["beta4"]], indptr[ids["beta4"] + 1]
    r._indices[lo:hi], r._data[lo:hi] = r._indices[lo:hi][::-1].copy(), r._data[lo:hi][::-1].copy()  # out of order
    lo = indptr[ids["alpha5"]]
    r._data[lo] = -r._data[lo]  # a negative score
    r._stats, r.counts = None, dict.fromkeys(r.counts, 0)  # bounds computed again as queries need them
    got = r.search_rows(queries, k=5)
    assert r.counts["queries_pruned"] == 2 and r._stats[3][ids["beta4"]] == 0 and r._stats[2][ids["alpha5"]] < 0
    for q, (g, w), ref in zip(queries, zip(got, want), [r.scores(r.query_term_ids(x)) for x in queries]):
        if q != "delta alpha5":  # its score changed with the negated posting: compared with the dense sum
            assert g[0].tolist() == w[0].tolist() and g[1].tolist() == w[1].tolist(), q
        want_rows, want_scores = bm25.top_rows(ref, 5)
        assert g[0].tolist() == want_rows.tolist() and g[1].tolist() == want_scores.tolist(), q

    r._data = data.astype(np.float64)  # a float64 index (bm25s can save one): numpy ranks it, as exact as ever
    r.counts = dict.fromkeys(r.counts, 0)
    for q, (g_rows, g_scores) in zip(queries, r.search_rows(queries, k=5)):
        want_rows, want_scores = bm25.top_rows(r.scores(r.query_term_ids(q)), 5)
        assert g_rows.tolist() == want_rows.tolist() and g_scores.tolist() == want_scores.tolist(), q
    assert r.counts["queries"] == 0  # the compiled kernels were not used

    path = tmp_path / "idx" / "bm25" / bm25.STATS_FILE
    with np.load(path) as f:
        np.savez(path, max=f["max"][:-1], min=f["min"][:-1], ascending=f["ascending"][:-1])
    with pytest.raises(IndexFileError, match=bm25.STATS_FILE):
        load_index(tmp_path / "idx")
    path.unlink()  # an index without the file (an older build): bounds computed as queries need them
    r = load_index(tmp_path / "idx")
    assert r._stats is None and [x[0].tolist() for x in r.search_rows(queries, k=5)] == [w[0].tolist() for w in want]
    assert r._stats[0].sum() == len({t for q in queries for t in r.query_term_ids(q)})


@pytest.mark.parametrize("seed", range(6))
def test_pruned_ranking_equals_the_dense_sum_on_random_corpora(tmp_path, monkeypatch, seed):
    """Random corpora (Zipf words, repeated words, short and long passages, duplicates: ties), random
    queries (repeated and absent words), k 1-40, windows of 1-4,096 passages, weak terms summed never /
    as by default / always, 1 or 16 seed postings: the pruned kernel gives the dense sum's top-k."""
    from sleuth.retrieval import bm25, bm25_kernel

    _numba_or_skip("numba")
    monkeypatch.setattr(bm25, "PRUNE_FROM", 0)
    monkeypatch.setattr(bm25, "PRUNE_PER_K", 0)
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(60)]
    p = 1.0 / np.arange(1, 61) ** 1.1
    p /= p.sum()
    rows = []
    for i in range(int(rng.integers(150, 400))):
        words = rng.choice(vocab, size=int(rng.integers(1, 30)), p=p).tolist()
        rows.append({"id": str(i), "text": " ".join(words)})
        if rng.random() < 0.1:  # a duplicate passage: equal scores
            rows.append({"id": f"{i}b", "text": " ".join(words)})
    r = bm25_index(tmp_path, rows)
    queries = [" ".join(rng.choice(vocab, size=int(rng.integers(1, 9)), p=p[::-1] / p.sum()).tolist())
               + (" zzzabsent" if rng.random() < 0.2 else "") for _ in range(25)]
    want = {k: [bm25.top_rows(r.scores(r.query_term_ids(q)), k) for q in queries] for k in (1, 3, 7, 40)}
    for window, ratio, seeds in [(1, 2.0, 16), (3, 0.0, 1), (64, 2.0, 16), (64, 1e9, 16), (4096, 0.0, 16)]:
        monkeypatch.setattr(bm25_kernel, "WINDOW", window)
        monkeypatch.setattr(bm25_kernel, "SCAN_RATIO", ratio)
        monkeypatch.setattr(bm25_kernel, "SEEDS", seeds)
        for k, ref in want.items():
            r.counts = dict.fromkeys(r.counts, 0)
            for q, (rows_k, scores_k), (w_rows, w_scores) in zip(queries, r.search_rows(queries, k), ref):
                assert rows_k.tolist() == w_rows.tolist(), (q, k, window, ratio, seeds)
                assert scores_k.tolist() == w_scores.tolist(), (q, k, window, ratio, seeds)
            assert r.counts["queries_pruned"] == len(queries)


def test_bm25s_is_imported_with_jax_kept_off_the_gpu(tmp_path, monkeypatch):
    """bm25s' import runs a JAX top-k when JAX is installed, and JAX on a GPU maps 75% of its memory at once
    (59.4 of 79.2 GiB on an H100: the GPU recipe's out-of-memory). Sleuth imports it with JAX on the CPU, not
    preallocating, unless the user said otherwise. A stub ``jax`` package records what JAX would read."""
    stub = tmp_path / "stub" / "jax"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "import json, os, pathlib\n"
        f"pathlib.Path({str(tmp_path / 'seen.json')!r}).write_text(json.dumps("
        "{k: os.environ.get(k) for k in ('JAX_PLATFORMS', 'XLA_PYTHON_CLIENT_PREALLOCATE')}))\n")
    (stub / "lax.py").write_text("def top_k(x, k):\n    return x[:k], list(range(k))\n")
    code = "from sleuth.retrieval.bm25 import import_bm25s; import_bm25s()"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "stub"), str(Path(__file__).resolve().parents[2])])
    for user, expected in (({}, {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
                           ({"JAX_PLATFORMS": "cuda"}, {"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})):
        (tmp_path / "seen.json").unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-c", code], env={**env, **user}, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads((tmp_path / "seen.json").read_text()) == expected  # bm25s imported JAX, as set
