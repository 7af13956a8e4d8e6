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

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sleuth.retrieval.base import IndexFileError, index_file_error
from sleuth.retrieval.corpus import CorpusStore, progress_bar
from sleuth.types import Passage

PARAMS_FILE = "sleuth_bm25.json"


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


def _make_tokenizer(params: BM25Params):
    import bm25s.tokenization
    import Stemmer

    stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None
    return bm25s.tokenization.Tokenizer(stopwords=params.stopwords or None, stemmer=stemmer)


def top_rows(scores_N: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the ``k`` largest positive scores, best first (ties: lower row first)."""
    pos = np.flatnonzero(scores_N > 0)
    if len(pos) > k:
        part = np.argpartition(-scores_N[pos], k - 1)[:k]
        pos = pos[part]
    order = np.lexsort((pos, -scores_N[pos]))
    rows = pos[order]
    return rows, scores_N[rows]


def build_bm25(store: CorpusStore, out_dir: str | Path, params: BM25Params | None = None,
               show_progress: bool = True) -> dict:
    """Tokenise the store in batches, build the bm25s index, save it to ``out_dir``."""
    import bm25s

    params = params or BM25Params()
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
        import bm25s

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
        tok = _make_tokenizer(self.params)
        self._split, self._stop = tok.splitter, set(tok.stopwords or ())
        self._stem = tok.stemmer
        self.num_empty_queries = 0

    def query_term_ids(self, query: str) -> list[int]:
        """Token ids of a query (lower, split, drop stopwords, stem, keep in-vocabulary terms)."""
        words = [w for w in self._split(query.lower()) if w not in self._stop]
        stems = [self._stem(w) for w in words] if self._stem else words
        vocab = self.model.vocab_dict
        return [vocab[s] for s in stems if s and s in vocab]

    def search_rows(self, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows_K, scores_K)`` per query, best first; empty arrays for queries with no term."""
        check_k(k)
        out = []
        for q in queries:
            term_ids = self.query_term_ids(q)
            if not term_ids:
                self.num_empty_queries += 1
                out.append((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)))
                continue
            out.append(top_rows(self.scores(term_ids), k))
        return out

    def scores(self, term_ids: list[int]) -> np.ndarray:
        """[N] BM25 scores of every passage for a query's term ids (repeated terms count again).

        Sums the precomputed CSC columns of the terms. Same result as bm25s' ``get_scores_from_ids``
        but with a fancy-indexed add (a column holds each row once) instead of ``np.add.at``.
        """
        s = self.model.scores
        data, indices, indptr = s["data"], s["indices"], s["indptr"]
        scores_N = np.zeros(s["num_docs"], dtype=np.float32)
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
        rows, scores = self.model.retrieve([term_ids], k=min(k, len(self.store)), show_progress=False)
        return [self.store.get(int(r), float(s)) for r, s in zip(rows[0], scores[0]) if s > 0]
