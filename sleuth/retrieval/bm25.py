"""Sparse retrieval: BM25 on ``bm25s`` with PyStemmer (English stemmer) and English stopwords.

Defaults follow Search-R1's BM25 (Pyserini/Lucene): the Lucene variant with ``k1=0.9``, ``b=0.4``.
The indexed text of a passage is its title line followed by its body. The index is saved with
``bm25s`` (a sparse CSC score matrix) and loaded with ``mmap=True``.

Query behaviour (documented choices):

* a query with no indexable term (empty, only stopwords, or only words absent from the corpus)
  returns an empty list, and is counted in ``BM25Retriever.num_empty_queries``;
* only passages that share a term with the query are returned, so a result may hold fewer than
  ``k`` passages; ``k`` larger than the corpus is allowed (at most the corpus is returned);
* ``k < 1`` is a ``ValueError``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sleuth.retrieval.base import IndexFileError, index_file_error
from sleuth.retrieval.corpus import CorpusStore, progress_bar
from sleuth.types import Passage

PARAMS_FILE = "sleuth_bm25.json"
STATS_FILE = "sleuth_term_stats.npz"  # per term: largest and smallest score, passages ascending (for pruning)
PRUNE_FROM, PRUNE_PER_K = 200_000, 20_000  # the compiled kernel prunes from max(this, k x that) passages
SPARSE_SHARE = 8  # a query touching fewer than 1/8 of the passages scores only those (see search_rows)


@dataclass
class BM25Params:
    """BM25 scoring and tokenisation settings (stored beside the index)."""

    method: str = "lucene"
    """bm25s variant: lucene | robertson | atire | bm25l | bm25+."""
    k1: float = 0.9
    b: float = 0.4
    stopwords: str = "en"
    """bm25s stopword list name ('en'), or '' for none."""
    stemmer: str = "english"
    """PyStemmer algorithm name, or '' for no stemming."""


def check_k(k: int) -> None:
    """Reject ``k < 1`` with a clear message (shared by every retriever here)."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def import_bm25s():
    """bm25s, imported so that it takes no GPU memory. Its import runs a JAX top-k whenever JAX is installed
    (bm25s/selection.py), and JAX on a GPU maps 75% of the device's memory at its first use: on an H100 the
    GPU recipe found 59.4 of 79.2 GiB taken outside PyTorch from the moment the retriever was built and ran
    out of memory in its first update (docs/benchmarks.md, GPU check). So JAX, if present, is told to run on
    the CPU and not to preallocate (``JAX_PLATFORMS``, ``XLA_PYTHON_CLIENT_PREALLOCATE``), unless the user
    set them; Sleuth's own searches never use JAX. JAX reads the platform when it is imported: in a process that
    imported JAX before, only the preallocation setting can still take effect."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s
    import bm25s.tokenization

    return bm25s


def _make_tokenizer(params: BM25Params):
    import Stemmer

    bm25s = import_bm25s()

    stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None
    return bm25s.tokenization.Tokenizer(stopwords=params.stopwords or None, stemmer=stemmer)


NUMBA = importlib.util.find_spec("numba") is not None  # the compiled kernel (sleuth.retrieval.bm25_kernel)


def top_rows(scores_N: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the ``k`` largest positive scores, best first (ties: lower row first)."""
    pos = np.flatnonzero(scores_N > 0)
    if len(pos) > k:  # above the k-th largest score, then the lowest rows at it (argpartition breaks ties anyhow)
        vals = scores_N[pos]
        edge = np.partition(vals, len(vals) - k)[len(vals) - k]
        above = pos[vals > edge]
        pos = np.concatenate([above, pos[vals == edge][: k - len(above)]])
    order = np.lexsort((pos, -scores_N[pos]))
    rows = pos[order]
    return rows, scores_N[rows]


def build_bm25(store: CorpusStore, out_dir: str | Path, params: BM25Params | None = None,
               show_progress: bool = True, batch_rows: int = 8192) -> dict:
    """Build the BM25 index of ``store`` into ``out_dir`` by streaming, in bm25s' file format.

    bm25s' own ``index`` holds every passage's token ids as Python lists (about 55 GB at wiki-18's
    21M passages); this build never does. Pass 1 tokenises ``batch_rows`` passages at a time with
    bm25s' tokenizer and writes each passage's distinct ``(term, count)`` pairs to a temporary file,
    counting document frequencies and lengths. Pass 2 reads the pairs back, a batch at a time,
    computes each pair's score exactly as bm25s does (the same formulas, in the same precision),
    and writes them into the term-major (CSC) arrays, opened as memory-mapped ``.npy`` files of
    their final size. Peak memory: one batch of pairs, the vocabulary, and per-term counters.
    """
    bm25s = import_bm25s()
    params = params or BM25Params()
    if params.method not in ("lucene", "robertson", "atire"):
        return _build_bm25_in_memory(store, out_dir, params, show_progress)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _make_tokenizer(params)
    model = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
    tmp = out_dir / ".pairs.tmp"
    n_docs, total_len, nnz = len(store), 0, 0
    df = np.zeros(1024, dtype=np.int64)
    chunks: list[int] = []  # pairs per batch, in file order
    lengths = np.zeros(n_docs, dtype=np.int32)
    try:
        with progress_bar(show_progress) as progress, open(tmp, "wb") as f:
            task = progress.add_task("bm25 tokenize", total=n_docs)
            for first, texts in store.iter_texts(batch_rows):
                ids = tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
                lens = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
                lengths[first : first + len(ids)] = lens
                total_len += int(lens.sum())
                flat = np.fromiter((t for x in ids for t in x), dtype=np.int64, count=int(lens.sum()))
                doc = np.repeat(np.arange(len(ids), dtype=np.int64), lens)
                keys, tf = np.unique(doc << 32 | flat, return_counts=True)  # sorted by (passage, term)
                terms = (keys & 0xFFFFFFFF).astype(np.int32)
                counts = np.bincount(terms)  # passages of this batch holding each term
                if len(counts) > len(df):  # the vocabulary grew: room for twice as many terms
                    df = np.concatenate([df, np.zeros(max(len(counts), 2 * len(df)) - len(df), dtype=np.int64)])
                df[: len(counts)] += counts
                np.stack([(keys >> 32).astype(np.int32) + first, terms, tf.astype(np.int32)]).T.tofile(f)
                chunks.append(len(keys))
                nnz += len(keys)
                progress.advance(task, len(texts))
        vocab = dict(tokenizer.get_vocab_dict())
        n_vocab = len(vocab)
        df = df[:n_vocab]
        avg_len = total_len / n_docs if n_docs else 0.0  # = np.mean of the lengths (an exact integer sum)
        idf_fn = bm25s.scoring._select_idf_scorer(model.idf_method)
        idf = np.zeros(n_vocab, dtype=np.float32)
        for t in np.flatnonzero(df):
            idf[t] = idf_fn(int(df[t]), N=n_docs)
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        data = np.lib.format.open_memmap(out_dir / "data.csc.index.npy", mode="w+", dtype=np.float32, shape=(nnz,))
        indices = np.lib.format.open_memmap(out_dir / "indices.csc.index.npy", mode="w+", dtype=np.int32,
                                            shape=(nnz,))  # fmt: skip
        fill = indptr[:-1].copy()  # next free slot of each term's column
        pairs = np.memmap(tmp, dtype=np.int32, mode="r", shape=(nnz, 3))
        lo = 0
        with progress_bar(show_progress) as progress:
            task = progress.add_task("bm25 score", total=nnz)
            for n in chunks:
                doc, term, tf = (np.asarray(c) for c in pairs[lo : lo + n].T)
                lo += n
                # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf), in float64, times the float32 idf
                norm = params.k1 * ((1 - params.b) + params.b * lengths[doc].astype(np.float64) / avg_len)
                tfc = _TFC[params.method](tf.astype(np.float32).astype(np.float64), norm, params.k1)
                score = (idf[term].astype(np.float64) * tfc).astype(np.float32)
                order = np.argsort(term, kind="stable")  # by term, passages ascending within a term
                term_o = term[order]
                first_of = np.r_[0, np.flatnonzero(np.diff(term_o)) + 1]  # where each term's run starts
                sizes = np.diff(np.r_[first_of, len(term_o)])
                slot = fill[term_o] + np.arange(len(term_o)) - np.repeat(first_of, sizes)
                indices[slot], data[slot] = doc[order], score[order]
                fill[term_o[first_of]] += sizes  # each term once
                progress.advance(task, n)
        del pairs
        data.flush()
        indices.flush()
        tmax, tmin = term_bounds(data, indptr)
        del data, indices
        np.save(out_dir / "indptr.csc.index.npy", indptr)
        # each term's passages were written in ascending order (by term, passages ascending within a batch)
        np.savez(out_dir / STATS_FILE, max=tmax, min=tmin, ascending=np.ones(n_vocab, dtype=np.uint8))
    finally:
        tmp.unlink(missing_ok=True)
    if "" not in vocab:  # as bm25s' index(): an empty token after the vocabulary (no column of its own)
        vocab[""] = max(vocab.values(), default=-1) + 1
    (out_dir / "vocab.index.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "params.index.json").write_text(json.dumps({
        "k1": model.k1, "b": model.b, "delta": model.delta, "method": model.method, "idf_method": model.idf_method,
        "dtype": model.dtype, "int_dtype": model.int_dtype, "num_docs": n_docs, "version": bm25s.__version__,
        "backend": model.backend}, indent=4))  # fmt: skip
    (out_dir / PARAMS_FILE).write_text(json.dumps(asdict(params), indent=2))
    return {"bm25": asdict(params), "bm25_vocab_size": len(vocab)}


def term_bounds(data: np.ndarray, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each term's largest and smallest score (0 for a term without postings), one pass over ``data``."""
    n_terms = len(indptr) - 1
    tmax, tmin = np.zeros(n_terms, dtype=np.float32), np.zeros(n_terms, dtype=np.float32)
    held = np.flatnonzero(np.diff(indptr) > 0)
    if len(held):  # the held terms' columns are back to back, so reduceat spans each column exactly
        tmax[held] = np.maximum.reduceat(data, indptr[held])
        tmin[held] = np.minimum.reduceat(data, indptr[held])
    return tmax, tmin


_TFC = {  # bm25s' term-frequency components (tf, k1 * ((1 - b) + b * l_d / l_avg), k1), in float64
    "lucene": lambda tf, norm, k1: tf / (norm + tf),
    "robertson": lambda tf, norm, k1: tf / (norm + tf),
    "atire": lambda tf, norm, k1: tf * (k1 + 1) / (tf + norm),
}


def _build_bm25_in_memory(store: CorpusStore, out_dir: str | Path, params: BM25Params, show_progress: bool) -> dict:
    """bm25s' own ``index`` (every passage's token ids in memory): the BM25L / BM25+ variants, whose
    non-occurrence terms the streaming build does not compute."""
    bm25s = import_bm25s()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _make_tokenizer(params)
    ids: list[list[int]] = []
    with progress_bar(show_progress) as progress:
        task = progress.add_task("bm25 tokenize", total=len(store))
        for _, texts in store.iter_texts():
            ids.extend(tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False))
            progress.advance(task, len(texts))
    model = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
    model.index((ids, tokenizer.get_vocab_dict()), show_progress=show_progress)
    model.save(str(out_dir), show_progress=False)
    (out_dir / PARAMS_FILE).write_text(json.dumps(asdict(params), indent=2))
    return {"bm25": asdict(params), "bm25_vocab_size": len(model.vocab_dict)}


class BM25Retriever:
    """BM25 search over a saved index and its corpus store (satisfies ``Retriever``)."""

    def __init__(self, bm25_dir: str | Path, store: CorpusStore):
        bm25s = import_bm25s()

        bm25_dir = Path(bm25_dir)
        params_path = bm25_dir / PARAMS_FILE
        if not params_path.is_file():
            raise IndexFileError(f"{bm25_dir} holds no BM25 index ({PARAMS_FILE} is missing)")
        try:
            self.params = BM25Params(**json.loads(params_path.read_text()))
            self.model = bm25s.BM25.load(str(bm25_dir), mmap=True, show_progress=False)
        except (OSError, ValueError, TypeError, KeyError, EOFError) as e:
            raise index_file_error(bm25_dir, e) from None
        self.store = store
        if self.model.scores["num_docs"] != len(store):
            raise IndexFileError(f"{bm25_dir}: BM25 index has {self.model.scores['num_docs']} passages, "
                                 f"the corpus store {len(store)}")
        sc = self.model.scores  # plain ndarray views of the mapped files: slicing a np.memmap costs an object each
        self._data, self._indices, self._indptr = (np.asarray(sc[key]) for key in ("data", "indices", "indptr"))
        tok = _make_tokenizer(self.params)
        self._split, self._stop = tok.splitter, set(tok.stopwords or ())
        self._stem = tok.stemmer
        self.num_empty_queries = 0
        self.threads = min(4, os.cpu_count() or 1)  # worker threads for a batch of queries
        self.compiled = True  # rank with the numba kernel when numba is installed (same results, faster)
        self.pruned = True  # with it, MaxScore pruning from 200k passages (same results; bm25_kernel.top_many_pruned)
        self._stats = self._saved_stats(bm25_dir)  # per term: known, largest and smallest score, passages ascending
        self.counts = {"queries": 0, "queries_pruned": 0, "postings": 0, "postings_read": 0}
        """Compiled ranking so far: queries, those ranked with pruning, their postings and what it read."""
        self._local, self._lock = threading.local(), threading.Lock()

    def _saved_stats(self, bm25_dir: Path) -> tuple | None:
        """The build's per-term bounds (:data:`STATS_FILE`); None where the index has none (an older
        build, or bm25s' own), and then the kernel computes each term's on its first query."""
        path, n_terms = bm25_dir / STATS_FILE, len(self._indptr) - 1
        if not path.is_file():
            return None
        try:
            with np.load(path) as f:
                tmax, tmin, ascending = (np.ascontiguousarray(f[key]) for key in ("max", "min", "ascending"))
        except (OSError, ValueError, KeyError, EOFError) as e:
            raise index_file_error(bm25_dir, e) from None
        if not len(tmax) == len(tmin) == len(ascending) == n_terms:
            raise IndexFileError(f"{path}: bounds for {len(tmax)} terms, the index has {n_terms}; "
                                 f"rebuild the index or remove {STATS_FILE} (it is then computed as needed)")
        return (np.ones(n_terms, dtype=np.uint8), tmax.astype(np.float32), tmin.astype(np.float32),
                ascending.astype(np.uint8))

    def query_term_ids(self, query: str) -> list[int]:
        """Token ids of a query (lower, split, drop stopwords, stem, keep in-vocabulary terms)."""
        words = [w for w in self._split(query.lower()) if w not in self._stop]
        stems = [self._stem(w) for w in words] if self._stem else words
        vocab = self.model.vocab_dict
        return [vocab[s] for s in stems if s and s in vocab]

    def search_rows(self, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows_K, scores_K)`` per query, best first; empty arrays for queries with no term.

        The same rows and scores as summing every passage's score (:meth:`scores`) and taking the
        top ``k`` (:meth:`_top`); a batch is spread over ``threads`` worker threads, each with its
        own score buffer, ranked by the numba kernels when numba is installed and the scores are
        float32, as Sleuth builds them (:meth:`_compiled_ranker`, no GIL), or by numpy (which releases
        the GIL in the copies and selections that dominate)."""
        check_k(k)
        term_ids = [self.query_term_ids(q) for q in queries]
        self.num_empty_queries += sum(not t for t in term_ids)
        threads = max(1, min(self.threads, len(queries)))
        if self.compiled and NUMBA and self.model.nonoccurrence_array is None and self._data.dtype == np.float32:
            rank = self._compiled_ranker(term_ids, k)
        else:
            def rank(share: list[int]) -> list:
                buf = self._buffer()  # this worker thread's
                return [self._top(term_ids[i], k, buf) for i in share]
        shares = [list(range(i, len(queries), threads)) for i in range(threads)]
        if threads == 1:
            parts = [rank(shares[0])]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                parts = list(pool.map(rank, shares))
        out: list = [None] * len(queries)
        for share, part in zip(shares, parts):
            for i, r in zip(share, part):
                out[i] = r
        return out

    def _compiled_ranker(self, term_ids: list[list[int]], k: int):
        """A function that ranks a share of the batch (query positions) through the numba kernels in
        one call each without the GIL: the same rows and scores as :meth:`_top`. With ``pruned``, on a
        corpus of at least ``max(PRUNE_FROM, PRUNE_PER_K * k)`` passages, queries whose terms all have
        sorted postings and no negative score go to ``bm25_kernel.top_many_pruned``; the others, and
        every query on smaller corpora (where pruning gains little or loses: slower on 16k real passages
        at top-3 and on 200k generated ones at top-40), to ``bm25_kernel.top_many``."""
        from sleuth.retrieval import bm25_kernel  # lazy: imports numba (~1 s), only where the kernel is used

        terms, starts = bm25_kernel.pack_terms(term_ids)
        indptr = self._indptr
        postings = np.array([sum(int(indptr[t + 1] - indptr[t]) for t in ts) for ts in term_ids], dtype=np.int64)
        n_q = len(term_ids)
        rows_QK, scores_QK = np.zeros((n_q, k), dtype=np.int64), np.zeros((n_q, k), dtype=np.float32)
        found_Q, read_Q = np.zeros(n_q, dtype=np.int64), postings.copy()
        prune = np.zeros(n_q, dtype=bool)
        if self.pruned and len(self.store) >= max(PRUNE_FROM, PRUNE_PER_K * k):  # below, it gains little or loses
            with self._lock:
                if self._stats is None:  # computed per term as queries need them (unknown terms read as unsafe)
                    n_terms = len(indptr) - 1
                    self._stats = (np.zeros(n_terms, dtype=np.uint8), np.full(n_terms, np.inf, dtype=np.float32),
                                   np.full(n_terms, -np.inf, dtype=np.float32), np.zeros(n_terms, dtype=np.uint8))
            known, tmax, tmin, ascending = self._stats
            bm25_kernel.term_stats(self._data, self._indices, indptr, terms, known, tmax, tmin, ascending)
            ok_T = (ascending[terms] == 1) & (tmin[terms] >= 0)  # pruning is exact only for these terms
            prune = np.logical_and.reduceat(np.r_[ok_T, True], starts[:-1]) & (starts[1:] > starts[:-1])

        def rank(share: list[int]) -> list:
            pruned = [q for q in share if prune[q]]
            full = [q for q in share if not prune[q]]
            if pruned:
                bm25_kernel.top_many_pruned(self._data, self._indices, indptr, terms, starts, pruned, k,
                                            self._stats[1], len(self.store), rows_QK, scores_QK, found_Q, read_Q)
            if full:
                bm25_kernel.top_many(self._data, self._indices, indptr, terms, starts, full, k, self._buffer(),
                                     postings[full].max(initial=0), rows_QK, scores_QK, found_Q)
            with self._lock:
                for key, n in (("queries", len(share)), ("queries_pruned", len(pruned)),
                               ("postings", postings[share].sum()), ("postings_read", read_Q[share].sum())):
                    self.counts[key] += int(n)
            return [(rows_QK[q, : found_Q[q]].copy(), scores_QK[q, : found_Q[q]].copy()) for q in share]

        return rank

    def _buffer(self) -> np.ndarray:
        """This thread's zero score buffer (a server may search from several threads at once)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = np.zeros(self.model.scores["num_docs"], dtype=np.float32)
        return buf

    def _top(self, term_ids: list[int], k: int, buf_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One query's top ``k`` rows (those of ``top_rows(self.scores(term_ids), k)``, bit for bit);
        ``buf_N``: a zero score buffer, left zero. A query whose postings are few against the corpus
        ranks only the passages they touch (:meth:`_top_touched`); others the dense sum. (MaxScore
        pruning, tried: in numpy its candidate scoring cost more than it saved, at 200k and 2M.)"""
        if not term_ids:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        indptr = self._indptr
        postings = sum(int(indptr[t + 1] - indptr[t]) for t in term_ids)
        if self.model.nonoccurrence_array is None and postings * SPARSE_SHARE < self.model.scores["num_docs"]:
            return self._top_touched(term_ids, k, buf_N)
        return top_rows(self.scores(term_ids), k)

    def _top_touched(self, term_ids: list[int], k: int, buf_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sum the terms' postings into ``buf_N`` (query order) and rank the passages they touch."""
        data, indices, indptr = self._data, self._indices, self._indptr
        touched = []
        for t in term_ids:
            lo, hi = indptr[t], indptr[t + 1]
            rows = np.asarray(indices[lo:hi])
            buf_N[rows] += data[lo:hi]
            touched.append(rows)
        rows_P = touched[0] if len(touched) == 1 else np.concatenate(touched)  # a passage once per term it holds
        scores_P = buf_N[rows_P]
        buf_N[rows_P] = 0
        keep = k * len(touched)  # the best k passages hold at most this many entries
        if len(rows_P) > keep:  # entries at or above the keep-th largest score (ties at the edge kept)
            edge = np.partition(scores_P, len(scores_P) - keep)[len(scores_P) - keep]
            sel = np.flatnonzero(scores_P >= edge)
            rows_P, scores_P = rows_P[sel], scores_P[sel]
        order = np.argsort(rows_P, kind="stable")
        rows_P, scores_P = rows_P[order], scores_P[order]
        first = np.r_[True, rows_P[1:] != rows_P[:-1]]  # ascending rows, once each: ties go to the lower row
        pick, scores = top_rows(scores_P[first], k)
        return rows_P[first][pick].astype(np.int64), scores

    def scores(self, term_ids: list[int]) -> np.ndarray:
        """[N] BM25 scores of every passage for a query's term ids (repeated terms count again).

        Sums the precomputed CSC columns of the terms. Same result as bm25s' ``get_scores_from_ids``
        but with a fancy-indexed add (a column holds each row once) instead of ``np.add.at``.
        """
        data, indices, indptr = self._data, self._indices, self._indptr
        scores_N = np.zeros(self.model.scores["num_docs"], dtype=np.float32)
        for t in term_ids:
            lo, hi = indptr[t], indptr[t + 1]
            scores_N[indices[lo:hi]] += data[lo:hi]
        if self.model.nonoccurrence_array is not None:  # bm25l / bm25+: a constant for absent terms
            scores_N += self.model.nonoccurrence_array[term_ids].sum()
        return scores_N

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list of at most ``k`` passages (best first, BM25 scores) per query."""
        return [self.store.get_many(rows, scores) for rows, scores in self.search_rows(queries, k)]

    def search_bm25s_order(self, query: str, k: int) -> list[Passage]:
        """One query ranked by bm25s' own top-k, which orders passages of equal score its own way
        (:meth:`search` puts the lower row first). The same scores and passages otherwise; the toy
        world's pretraining transcripts were drawn with this order (:class:`sleuth.toy.corpus.WorldSearch`)."""
        check_k(k)
        term_ids = self.query_term_ids(query)
        if not term_ids:
            return []
        selection = "numba" if self.model.backend == "numba" else "numpy"  # never JAX's (import_bm25s)
        rows, scores = self.model.retrieve([term_ids], k=min(k, len(self.store)), show_progress=False,
                                          backend_selection=selection)
        return [self.store.get(int(r), float(s)) for r, s in zip(rows[0], scores[0]) if s > 0]
