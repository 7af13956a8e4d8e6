"""Hybrid retrieval: reciprocal-rank fusion (RRF) of BM25 and dense results.

RRF (Cormack, Clarke & Buettcher, SIGIR 2009): a passage's fused score is
``sum over retrievers of 1 / (rrf_k + rank)`` with 1-based ranks, over each retriever's top
``fetch_k`` list; passages missing from a list get nothing from it. ``rrf_k = 60`` is the
paper's constant (it damps the weight of the very first ranks). Only ranks are used, so BM25 and
cosine scores need no calibration. Ties break by the best single rank, then by corpus row.
"""

from __future__ import annotations

import numpy as np

from sleuth.retrieval.base import IndexFileError
from sleuth.retrieval.bm25 import check_k
from sleuth.types import Passage

RRF_K = 60


def rrf_fuse(ranked_lists: list[np.ndarray], k: int, rrf_k: int = RRF_K) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ranked row lists (best first) into ``(rows_K, scores_K)`` by RRF, best first."""
    score: dict[int, float] = {}
    best_rank: dict[int, int] = {}
    for rows in ranked_lists:
        for rank, row in enumerate(rows.tolist(), start=1):
            score[row] = score.get(row, 0.0) + 1.0 / (rrf_k + rank)
            best_rank[row] = min(best_rank.get(row, rank), rank)
    order = sorted(score, key=lambda r: (-score[r], best_rank[r], r))[:k]
    return np.asarray(order, dtype=np.int64), np.asarray([score[r] for r in order], dtype=np.float64)


class HybridRetriever:
    """RRF of a BM25 and a dense retriever sharing one corpus store (satisfies ``Retriever``).

    Each side contributes its top ``max(k, fetch_k)`` rows. Empty queries return ``[]`` (both sides
    return nothing); a query with no BM25 term still gets its dense results.
    """

    def __init__(self, bm25, dense, *, rrf_k: int = RRF_K, fetch_k: int = 50):
        if bm25.store is not dense.store and len(bm25.store) != len(dense.store):
            raise IndexFileError("hybrid retrieval needs BM25 and dense indexes over the same corpus")
        self.bm25, self.dense, self.store = bm25, dense, bm25.store
        self.rrf_k, self.fetch_k = rrf_k, fetch_k

    def search_rows(self, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        check_k(k)
        n = max(k, self.fetch_k)
        sparse = self.bm25.search_rows(queries, n)
        dense = self.dense.search_rows(queries, n)
        return [rrf_fuse([s[0], d[0]], k, self.rrf_k) for s, d in zip(sparse, dense)]

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list of at most ``k`` passages (best first, RRF scores) per query."""
        return [self.store.get_many(rows, scores) for rows, scores in self.search_rows(queries, k)]
