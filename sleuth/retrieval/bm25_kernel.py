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

:func:`top_many_pruned` returns the same rows and scores reading far fewer postings (MaxScore
pruning over windows of passages; ``BM25Retriever`` uses it from 200k passages and 20k per result
asked). The query's terms are ordered by their largest score (:func:`term_stats`, or saved by the
build); the passages are taken ``WINDOW`` rows at a time, in order. In each window the weakest terms, whose largest scores
together cannot lift a passage past the k-th best score found so far, are not summed: every passage
that can still enter holds one of the others. Those others' postings are added into a small buffer
(no test per posting), as are the weak terms with few postings against theirs (``SCAN_RATIO``:
summing costs less than looking them up); a passage of the strong terms whose sum plus the
unsummed terms' most could still beat the k-th score is looked up in those terms (galloping through
their sorted postings, strongest first, dropped as soon as what is left cannot lift it), and a
passage still alive is scored exactly: every term looked up, summed in the query's term order as
:func:`top_many` sums, so scores are bit for bit the same. The k-th score starts from the exact
scores of the passages holding the two strongest terms' best ``SEEDS`` postings. Bounds keep a
relative slack of 1e-4, far more than float32 sums in another order differ; passages are visited in
ascending order and enter the top k only with a strictly higher score, so among equal scores the
lower row stays (as in :func:`top_many`).

Measured on 2M generated passages (``bench/retrieval_scale.py``: 2 threads, top-3, the dev
questions): 1,575 queries/s against 542 for :func:`top_many` (docs/retrieval_at_scale.md). Tried before, and slower than :func:`top_many`: pruning term at a time
(most valuable terms first, 289 against 481 q/s: right after it stops nearly every touched passage
is still a candidate), and document at a time over the whole corpus without windows (a cursor per
term, the next passage the least of them: 464 against 441, the per-passage tests cost as much as
the postings they save). What made the windowed version fast: a buffer of ``WINDOW`` passages
that stays in the core's cache, candidates read from the strong terms' postings only, and summing
weak terms with few postings rather than looking them up.

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


@_jit
def term_stats(data, indices, indptr, terms, known, tmax, tmin, tsorted) -> None:
    """For each of ``terms`` not yet ``known``: its largest and smallest score and whether its passages
    are listed in ascending order (what :func:`top_many_pruned` needs). Unknown terms read as
    ``tmax`` +inf, ``tmin`` -inf and unsorted, which stop pruning rather than make it wrong, so a
    thread that reads a term's entries while another fills them is safe."""
    for j in range(terms.shape[0]):
        t = terms[j]
        if known[t]:
            continue
        lo, hi = indptr[t], indptr[t + 1]
        mx, mn, ok = -np.inf, np.inf, 1
        for p in range(lo, hi):
            v = data[p]
            mx, mn = max(mx, v), min(mn, v)
            if p > lo and indices[p] <= indices[p - 1]:
                ok = 0
        if hi > lo:
            tmax[t], tmin[t] = mx, mn
        else:
            tmax[t], tmin[t] = 0.0, 0.0
        tsorted[t] = ok
        known[t] = 1


@_jit
def _seek(indices, p, end, row):
    """The first position at or after ``p`` (before ``end``) whose row is >= ``row`` (galloping search)."""
    stop = min(p + 16, end)  # a short gap, the usual one: step through it
    while p < stop and indices[p] < row:
        p += 1
    if p < stop or p >= end or indices[p] >= row:
        return p
    lo, step = p, 1  # indices[lo] < row: gallop
    hi = p + 1
    while hi < end and indices[hi] < row:
        lo = hi
        step *= 2
        hi = lo + step
    hi = min(hi, end)
    while hi - lo > 1:  # indices[lo] < row <= indices[hi] (or hi == end)
        mid = (lo + hi) // 2
        if indices[mid] < row:
            lo = mid
        else:
            hi = mid
    return hi


@_jit
def _score(data, indices, indptr, terms, a, n, row):
    """Passage ``row``'s score for the query ``terms[a:a+n]``, summed in the query's order."""
    s = np.float32(0.0)
    for j in range(n):
        t = terms[a + j]
        e = indptr[t + 1]
        p = _seek(indices, indptr[t], e, row)
        if p < e and indices[p] == row:
            s += data[p]
    return s


@_jit
def _first_bound(data, indices, indptr, terms, a, n, order, k, seeds):
    """A score the k-th best passage reaches: the k-th best exact score among the passages holding the
    ``seeds`` highest-scoring postings of each of the query's two strongest terms (0 if fewer than k)."""
    rows = np.full(2 * seeds, -1, dtype=np.int64)
    got = 0
    for i in range(max(0, n - 2), n):
        t = terms[a + order[i]]
        best = np.full(seeds, -1.0, dtype=np.float32)  # this term's best scores, descending, and their rows
        brow = np.full(seeds, -1, dtype=np.int64)
        for p in range(indptr[t], indptr[t + 1]):
            v = data[p]
            if v > best[seeds - 1]:
                x = seeds - 1
                while x > 0 and best[x - 1] < v:
                    best[x], brow[x] = best[x - 1], brow[x - 1]
                    x -= 1
                best[x], brow[x] = v, indices[p]
        for x in range(seeds):
            if brow[x] >= 0:
                rows[got] = brow[x]
                got += 1
    rows = np.unique(rows[:got])
    if rows.shape[0] < k:
        return 0.0
    sc = np.empty(rows.shape[0], dtype=np.float32)
    for x in range(rows.shape[0]):
        sc[x] = _score(data, indices, indptr, terms, a, n, rows[x])
    sc.sort()
    return float(sc[rows.shape[0] - k])


@_jit
def _top_many_pruned(data, indices, indptr, terms, starts, queries, k, tmax, n_docs, acc, cand,
                     out_rows, out_scores, out_n, out_read, scan_ratio, seeds):
    window = acc.shape[0]
    for qi in range(queries.shape[0]):
        q = queries[qi]
        a = starts[q]
        n = starts[q + 1] - a
        bound = np.empty(n, dtype=np.float64)
        for j in range(n):
            bound[j] = tmax[terms[a + j]]
        order = np.argsort(bound)  # the query's terms by their largest score, ascending
        ub = np.empty(n, dtype=np.float64)  # ub[i]: the most terms order[0..i] can add together
        pos = np.empty(n, dtype=np.int64)  # scan position, by order
        wlo = np.empty(n, dtype=np.int64)  # where the window's postings start, by order
        end = np.empty(n, dtype=np.int64)
        look = np.empty(n, dtype=np.int64)  # lookup position, by query position
        end_q = np.empty(n, dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)  # a query position's place in order
        contrib = np.zeros(n, dtype=np.float32)  # a candidate's score from each weak term, by query position
        total = 0.0
        for i in range(n):
            total += bound[order[i]]
            ub[i] = total
            t = terms[a + order[i]]
            pos[i], end[i] = indptr[t], indptr[t + 1]
            look[order[i]], end_q[order[i]], rank[order[i]] = indptr[t], indptr[t + 1], i
        slack = 1.0 - max(1e-4, n * 2.4e-7)  # float32 sums in another order differ by far less
        m, read = 0, 0  # found; postings read and looked up
        thr = _first_bound(data, indices, indptr, terms, a, n, order, k, seeds) * slack  # what a passage must beat
        for w0 in range(0, n_docs, window):
            w1 = w0 + window
            ess = 0  # order[:ess] together cannot lift a passage past the k-th score: every passage that
            while ess < n and ub[ess] < thr:  # can holds one of order[ess:]
                ess += 1
            if ess == n:
                break
            scanned = 0
            for i in range(ess, n):
                scanned += end[i] - indptr[terms[a + order[i]]]
            ne = ess  # order[ne:] are summed; order[:ne] looked up for the candidates
            while ne > 0:  # a weak term with few postings against those scanned: summing it costs less
                d = end[ne - 1] - indptr[terms[a + order[ne - 1]]]  # than looking it up for every candidate
                if d > scan_ratio * scanned:
                    break
                ne -= 1
            rest = ub[ne - 1] if ne > 0 else 0.0
            for i in range(ne, n):  # the summed terms' postings in this window (any order)
                p0 = _seek(indices, pos[i], end[i], w0)
                p1 = _seek(indices, p0, end[i], w1)
                for p in range(p0, p1):
                    acc[indices[p] - w0] += data[p]
                read += p1 - p0
                wlo[i], pos[i] = p0, p1
            nc = 0
            for i in range(ess, n):  # candidates: passages of order[ess:] whose sum and the looked-up
                for p in range(wlo[i], pos[i]):  # terms' most could beat the k-th (listed once per term)
                    r = indices[p] - w0
                    if acc[r] + rest >= thr:
                        cand[nc] = r
                        nc += 1
            cs = np.sort(cand[:nc])
            for c in range(nc):
                r = cs[c]
                if c > 0 and r == cs[c - 1]:
                    continue
                part = acc[r]
                row = r + w0
                alive = True
                for i in range(ne - 1, -1, -1):  # the weak terms, strongest first, while they can lift it
                    if part + ub[i] < thr:
                        alive = False
                        break
                    j = order[i]
                    e = end_q[j]
                    p = _seek(indices, look[j], e, row)
                    look[j] = p
                    read += 1
                    if p < e and indices[p] == row:
                        contrib[j] = data[p]
                        part += data[p]
                if alive:  # its exact score: the others looked up, all summed in the query's term order
                    sc = np.float32(0.0)
                    for j in range(n):
                        if rank[j] < ne:
                            sc += contrib[j]
                        else:
                            e = end_q[j]
                            p = _seek(indices, look[j], e, row)
                            look[j] = p
                            read += 1
                            if p < e and indices[p] == row:
                                sc += data[p]
                    if sc > 0 and (m < k or sc > out_scores[q, m - 1]):
                        m = _keep(q, row, sc, k, m, out_rows, out_scores)
                        if m == k:
                            thr = max(thr, out_scores[q, k - 1] * slack)
                for i in range(ne):
                    contrib[order[i]] = 0
            for i in range(ne, n):
                for p in range(wlo[i], pos[i]):
                    acc[indices[p] - w0] = 0
        out_n[q] = m
        out_read[q] = read


WINDOW = 1 << 16  # passages summed at a time by top_many_pruned (a 256 KB float32 buffer: in the core's cache)
SCAN_RATIO = 2.0  # a weak term is summed when its postings are at most this many times the strong terms'
SEEDS = 16  # best postings of each of the two strongest terms whose passages set the first k-th score


def top_many_pruned(data, indices, indptr, terms, starts, queries, k, tmax, n_docs, out_rows, out_scores, out_n,
                    out_read) -> None:
    """As :func:`top_many`, with MaxScore pruning over windows of passages (the module's docstring):
    the same rows and scores. Needs every term of these queries with its passages in ascending order
    and no negative score, and ``tmax`` holding each term's largest score (:func:`term_stats`);
    ``n_docs``: the passages. ``out_read[q]``: the postings query ``q`` summed plus its lookups."""
    queries = np.asarray(queries, dtype=np.int64)
    df = np.minimum(indptr[terms + 1] - indptr[terms], WINDOW)  # each term's most postings in one window
    in_window = np.add.reduceat(np.r_[df, 0], starts[:-1])[queries] if len(terms) else np.zeros(1, np.int64)
    acc = np.zeros(WINDOW, dtype=np.float32)
    cand = np.empty(max(int(in_window.max(initial=0)), 1), dtype=np.int32)  # candidates of one window, listed per term
    _top_many_pruned(data, indices, indptr, terms, starts, queries, k, tmax, n_docs, acc, cand,
                     out_rows, out_scores, out_n, out_read, SCAN_RATIO, SEEDS)
