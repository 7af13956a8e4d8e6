"""BM25 top-k compiled with numba (``pip install 'sleuth[fast]'``); ``BM25Retriever.search_rows``
uses it when numba is installed and imports this module only then.

:func:`top_many` ranks a share of a batch of queries in one call without the GIL, so the retriever
runs it on its worker threads exactly as it runs the numpy path. For each query it adds every term's
postings into the thread's score buffer in the query's term order (the numpy path's float32 sums,
bit for bit), listing each posting's row with no test in the loop (a branch there, to list a row
only once, made the kernel 5x slower: it mispredicts on every other posting), then reads the listed
rows once each (a row listed again reads 0 after its first reading, which resets it) and keeps the
``k`` best positive scores: higher score first, the lower row first among equal scores (the order
of ``bm25.top_rows``). One pass over the postings and one over the rows they touch, with no
temporary arrays; the numpy path gathers, scatters, concatenates, partitions and sorts.

Pruning was built and measured here too (MaxScore-style, term at a time: read the most valuable
terms' postings first, stop once what is left cannot lift an untouched passage into the top k,
then look the other terms up for the remaining candidates in their sorted postings, exact scores
at the end): at 2M generated passages it read 17% of the postings but ran at 289 queries/s against
481 for this kernel (2 threads, top-3), since right after stopping nearly every touched passage is
still a candidate; it was left out.

numba compiles on first use (a few seconds; cached on disk where numba can write).
"""

from __future__ import annotations

import numba
import numpy as np


def _jit(fn):
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # no cache directory numba can use: compile in memory only
        return numba.njit(nogil=True)(fn)


@_jit
def _keep(q, r, s, k, m, out_rows, out_scores):
    """Offer row ``r`` with score ``s`` to query ``q``'s best ``m`` (of at most ``k``); the new ``m``."""
    if m == k:
        if s < out_scores[q, m - 1] or (s == out_scores[q, m - 1] and r > out_rows[q, m - 1]):
            return m
        pos = m - 1
    else:
        pos = m
        m += 1
    while pos > 0 and (out_scores[q, pos - 1] < s or (out_scores[q, pos - 1] == s and out_rows[q, pos - 1] > r)):
        out_scores[q, pos] = out_scores[q, pos - 1]
        out_rows[q, pos] = out_rows[q, pos - 1]
        pos -= 1
    out_scores[q, pos] = s
    out_rows[q, pos] = r
    return m


@_jit
def _top_many(data, indices, indptr, terms, starts, queries, k, buf, touched, out_rows, out_scores, out_n):
    for qi in range(queries.shape[0]):
        q = queries[qi]
        nt = 0
        for j in range(starts[q], starts[q + 1]):
            t = terms[j]
            for p in range(indptr[t], indptr[t + 1]):
                r = indices[p]
                touched[nt] = r
                nt += 1
                buf[r] += data[p]
        m = 0
        for i in range(nt):
            r = touched[i]
            s = buf[r]
            if s > 0:
                buf[r] = 0
                if m < k or s >= out_scores[q, m - 1]:
                    m = _keep(q, r, s, k, m, out_rows, out_scores)
            elif s != 0:  # a negative sum (Robertson idf): reset it too
                buf[r] = 0
        out_n[q] = m


def pack_terms(term_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The queries' term ids flat, with each query's start (``starts[q]:starts[q+1]``)."""
    starts = np.zeros(len(term_ids) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(t) for t in term_ids])
    terms = np.fromiter((t for ts in term_ids for t in ts), dtype=np.int64, count=int(starts[-1]))
    return terms, starts


def top_many(data, indices, indptr, terms, starts, queries, k, buf, postings, out_rows, out_scores, out_n) -> None:
    """Rank ``queries`` (indices into ``starts``) into ``out_rows[q, :out_n[q]]`` / ``out_scores``.

    ``buf``: a zero float32 score buffer over the passages, left zero; ``postings``: the most postings
    any of these queries reads (sizes the list of touched rows)."""
    touched = np.empty(max(int(postings), 1), dtype=np.int64)
    _top_many(data, indices, indptr, terms, starts, np.asarray(queries, dtype=np.int64), k, buf, touched,
              out_rows, out_scores, out_n)
