"""BM25 top-k compiled with numba, when numba is installed (``pip install 'sleuth[fast]'``).

:func:`top_many` ranks a share of a batch of queries in one call without the GIL, so
``BM25Retriever.search_rows`` runs it on its worker threads exactly as it runs the numpy path. For
each query it adds the terms' postings into the thread's score buffer in the query's term order (the
same float32 additions, in the same order, as the numpy path: the same scores bit for bit), notes the
passages it touches, then reads each touched passage once, keeps the ``k`` best positive scores
(higher score first, the lower row first among equal scores: the order of ``bm25.top_rows``) and sets
the buffer back to zero. One pass over the postings and one over the touched passages, with no
temporary arrays: the numpy path gathers, scatters, concatenates, partitions and sorts.

numba compiles the kernel on first use (a few seconds; cached on disk by numba where it can write)."""

from __future__ import annotations

import importlib.util

import numpy as np


def available() -> bool:
    """Whether the compiled kernel can be used: numba is installed (imported on first use, ~1 s)."""
    return importlib.util.find_spec("numba") is not None


def _top_many_py(data, indices, indptr, terms, starts, queries, k, buf, touched, out_rows, out_scores, out_n):
    for qi in range(queries.shape[0]):
        q = queries[qi]
        nt = 0
        for j in range(starts[q], starts[q + 1]):
            t = terms[j]
            for p in range(indptr[t], indptr[t + 1]):
                r = indices[p]
                if buf[r] == 0:  # first touch (or a sum back at 0: listed again, read once below)
                    touched[nt] = r
                    nt += 1
                buf[r] += data[p]
        m = 0
        for i in range(nt):
            r = touched[i]
            s = buf[r]
            buf[r] = 0
            if not s > 0:
                continue
            if m == k:
                if s < out_scores[q, m - 1] or (s == out_scores[q, m - 1] and r > out_rows[q, m - 1]):
                    continue
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
        out_n[q] = m


_compiled = None


def _kernel():
    global _compiled
    if _compiled is None:
        import numba  # optional dependency (sleuth[fast]): the numpy path serves without it

        try:
            _compiled = numba.njit(nogil=True, cache=True)(_top_many_py)
        except RuntimeError:  # no cache directory numba can use: compile in memory only
            _compiled = numba.njit(nogil=True)(_top_many_py)
    return _compiled


def pack_terms(term_ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The queries' term ids flat, with each query's start (``starts[q]:starts[q+1]``)."""
    starts = np.zeros(len(term_ids) + 1, dtype=np.int64)
    starts[1:] = np.cumsum([len(t) for t in term_ids])
    terms = np.fromiter((t for ts in term_ids for t in ts), dtype=np.int64, count=int(starts[-1]))
    return terms, starts


def top_many(data, indices, indptr, terms, starts, queries, k, buf, postings, out_rows, out_scores, out_n,
             compiled: bool = True) -> None:
    """Rank ``queries`` (indices into ``starts``) into ``out_rows[q, :out_n[q]]`` / ``out_scores``.

    ``buf``: a zero float32 score buffer over the passages, left zero; ``postings``: the most postings
    any of these queries reads (sizes the touched list). ``compiled=False`` runs the same code as
    Python (slow; the tests compare it)."""
    touched = np.empty(max(int(postings), 1), dtype=np.int64)
    fn = _kernel() if compiled else _top_many_py
    fn(data, indices, indptr, terms, starts, np.asarray(queries, dtype=np.int64), k, buf, touched,
       out_rows, out_scores, out_n)
