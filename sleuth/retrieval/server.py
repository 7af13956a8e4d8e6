"""A retrieval HTTP service that speaks Search-R1's ``/retrieve`` contract, around any Retriever.

Contract (``search_r1/search/retrieval_server.py``): ``POST /retrieve`` with
``{"queries": [str, ...], "topk": int | null, "return_scores": bool}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}``, one list per
query, or bare documents ``[[{"id", "contents"}, ...], ...]`` when ``return_scores`` is false
(Search-R1's own server crashes on that path; here it works). ``contents`` is wiki-18's
``"Title"\\ntext``. Also ``GET /health`` (no auth) and ``GET /stats``.

Where this departs from Search-R1's server: inputs are checked (types, sizes, empty queries) and
rejected with a 4xx that says what to fix; ``POST /retrieve`` takes ``Content-Type:
application/json`` only (415 otherwise: a web page cannot send that header to another origin
without a CORS preflight, which this server never grants, so a page cannot drive a tokenless
loopback server); a body that does not arrive within ``body_timeout_s`` gets 408; a client that
closes the connection before its body is read is counted in ``/stats`` (``client_disconnects``)
and not logged; an optional bearer token; a server-side LRU cache bounded by entries and by
(approximate) bytes (``sleuth serve --cache-mb``, default 256); searches run off the event loop
(threadpool), and with ``batching`` on, queries from concurrent requests are merged into one
retriever call by a greedy micro-batcher: at most ``batch_workers`` retriever calls run at once;
requests that arrive while they are busy queue and go together in the next call (no added wait
at low load). ``batch_workers=1`` means the retriever need not be thread-safe; 2 lets
numpy/faiss/arrow code that releases the GIL use a second core.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from sleuth.retrieval.base import Retriever
from sleuth.types import Passage

log = logging.getLogger(__name__)

USAGE = 'send {"queries": ["..."], "topk": 3, "return_scores": true}'


@dataclass
class ServerLimits:
    """What one request may ask for, and the server's cache/batching knobs."""

    max_queries: int = 1024
    """Queries in one request (more -> 413)."""
    max_query_chars: int = 2048
    """Characters in one query (more -> 413)."""
    max_topk: int = 100
    """Largest topk (more -> 422)."""
    default_topk: int = 3
    """topk used when a request sends null (Search-R1's --topk)."""
    max_body_bytes: int = 8 * 2**20
    """Request body size (more -> 413)."""
    cache_size: int = 10000
    """LRU entries of (query, k) -> passages; 0 disables the cache."""
    cache_bytes: int = 256 * 2**20
    """Approximate memory the cache may hold (``sleuth serve --cache-mb``); 0 disables the cache."""
    body_timeout_s: float = 30.0
    """Seconds a client has to send its whole request body (slower -> 408)."""
    batching: bool = True
    """Merge queries of concurrent requests into one retriever call."""
    max_batch_queries: int = 2048
    """Most unique queries merged into one retriever call."""
    batch_workers: int = 2
    """Retriever calls in flight at once when batching (1: the retriever need not be thread-safe)."""

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_query_chars", "max_topk", "max_body_bytes", "max_batch_queries",
                     "batch_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"server limit {name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"default topk {self.default_topk} must be between 1 and max_topk={self.max_topk}")
        if self.cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {self.cache_size}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes (--cache-mb) must be >= 0, got {self.cache_bytes}")
        if not self.body_timeout_s > 0:
            raise ValueError(f"body_timeout_s (--body-timeout) must be > 0 seconds, got {self.body_timeout_s}")


class ServerStats:
    """Counters for ``GET /stats``. Latency percentiles cover the last 10,000 requests."""

    def __init__(self, window: int = 10000):
        self.started = time.monotonic()
        self.requests = self.queries = self.errors = self.server_errors = self.cache_hits = 0
        self.batches = self.batched_queries = 0
        self.client_disconnects = 0
        self.latencies_s: deque[float] = deque(maxlen=window)

    def snapshot(self) -> dict:
        """A JSON-ready dict; queries_per_s is averaged since the server started."""
        uptime = time.monotonic() - self.started
        lat = sorted(self.latencies_s)

        def pct(p: float) -> float | None:  # nearest rank
            return round(1000 * lat[max(0, math.ceil(p / 100 * len(lat)) - 1)], 3) if lat else None

        return {
            "uptime_s": round(uptime, 3),
            "requests": self.requests,
            "queries": self.queries,
            "queries_per_s": round(self.queries / uptime, 2) if uptime > 0 else 0.0,
            "errors": self.errors,  # every 4xx and 5xx answer of /retrieve
            "server_errors": self.server_errors,  # the 5xx among them (retriever failures)
            "cache_hits": self.cache_hits,
            "client_disconnects": self.client_disconnects,  # clients gone before their body was read
            "retriever_calls": self.batches,
            "mean_batch_queries": round(self.batched_queries / self.batches, 2) if self.batches else 0.0,
            "latency_ms": {"p50": pct(50), "p90": pct(90), "p99": pct(99)},
        }


PASSAGE_OVERHEAD_BYTES = 200
"""Memory of a cached ``Passage`` besides its strings: the object, its attribute dict, the score,
the list slot (measured ~190 bytes on CPython 3.11)."""


def result_nbytes(key: tuple[str, int], passages: list[Passage]) -> int:
    """Approximate memory of one cache entry: its strings' sizes plus a fixed overhead per passage."""
    n = sys.getsizeof(key[0]) + 64 + PASSAGE_OVERHEAD_BYTES * len(passages)
    for p in passages:
        n += sys.getsizeof(p.id) + sys.getsizeof(p.title) + sys.getsizeof(p.text)
        if p.raw_contents is not None:
            n += sys.getsizeof(p.raw_contents)
    return n


class ResultCache:
    """LRU map of ``(query, k) -> passages`` bounded by entries and by approximate bytes
    (:func:`result_nbytes`); either bound 0 disables it. Used from the event loop only (no lock).
    An entry larger than the whole byte budget is not kept."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.nbytes = 0
        self._data: OrderedDict[tuple[str, int], tuple[list[Passage], int]] = OrderedDict()

    def get(self, key: tuple[str, int]) -> list[Passage] | None:
        item = self._data.get(key)
        if item is None:
            return None
        self._data.move_to_end(key)
        return item[0]

    def put(self, key: tuple[str, int], passages: list[Passage]) -> None:
        size = result_nbytes(key, passages)
        if self.max_entries <= 0 or size > self.max_bytes:
            return
        old = self._data.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self._data[key] = (passages, size)
        self.nbytes += size
        while len(self._data) > self.max_entries or self.nbytes > self.max_bytes:
            self.nbytes -= self._data.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._data)


class RetrieveRequest(BaseModel):
    """The Search-R1 request body. Strict: ``"3"`` is not a topk and ``1`` is not a bool."""

    model_config = ConfigDict(strict=True, extra="ignore")
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class SearchService:
    """Cache + (optional) micro-batcher in front of a retriever. Used from the event loop only."""

    def __init__(self, retriever: Retriever, limits: ServerLimits, stats: ServerStats):
        self.retriever = retriever
        self.limits = limits
        self.stats = stats
        self.cache = ResultCache(limits.cache_size, limits.cache_bytes)
        self._pending: deque[tuple[list[str], int, asyncio.Future]] = deque()
        self._workers: set[asyncio.Task] = set()

    @property
    def queued(self) -> int:
        """Requests waiting for the next retriever call."""
        return len(self._pending)

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Results for ``queries`` (cache first, then one retriever call for the unique misses)."""
        out: list[list[Passage] | None] = [None] * len(queries)
        missing: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            hit = self.cache.get((q, k))
            if hit is not None:
                out[i] = hit
            else:
                missing.setdefault(q, []).append(i)
        self.stats.cache_hits += len(queries) - sum(len(v) for v in missing.values())
        if missing:
            unique = list(missing)
            if self.limits.batching:
                found = await self._enqueue(unique, k)
            else:
                found = await self._call(unique, k)
            for q, passages in zip(unique, found):
                self.cache.put((q, k), passages)
                for i in missing[q]:
                    out[i] = passages
        return out  # type: ignore[return-value]

    async def _call(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One retriever call in the threadpool, checked for the one-list-per-query promise."""
        result = await run_in_threadpool(self.retriever.search, queries, k)
        if len(result) != len(queries):
            raise RuntimeError(f"retriever returned {len(result)} lists for {len(queries)} queries")
        self.stats.batches += 1
        self.stats.batched_queries += len(queries)
        return result

    async def _enqueue(self, queries: list[str], k: int) -> list[list[Passage]]:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((queries, k, fut))
        if len(self._workers) < self.limits.batch_workers:
            self._workers.add(asyncio.create_task(self._drain()))
        return await fut

    async def _drain(self) -> None:
        """Take everything queued (up to max_batch_queries), one retriever call per k; repeat.
        The worker leaves the set in the same step that sees the queue empty (no await between),
        so a request queued later always finds a free worker slot."""
        try:
            while self._pending:
                taken, n, cap = [], 0, self.limits.max_batch_queries
                while self._pending and (not taken or n + len(self._pending[0][0]) <= cap):
                    item = self._pending.popleft()
                    taken.append(item)
                    n += len(item[0])
                by_k: dict[int, list[tuple[list[str], int, asyncio.Future]]] = {}
                for item in taken:
                    by_k.setdefault(item[1], []).append(item)
                for k, items in by_k.items():
                    await self._run_group(items, k)
        finally:
            self._workers.discard(asyncio.current_task())

    async def _run_group(self, items: list[tuple[list[str], int, asyncio.Future]], k: int) -> None:
        """One call for the union of the items' queries; on failure, each item alone (so one bad
        request cannot fail its neighbours)."""
        unique = list(dict.fromkeys(q for qs, _, _ in items for q in qs))
        try:
            found = dict(zip(unique, await self._call(unique, k)))
        except Exception as e:  # noqa: BLE001 - handed to the waiting requests
            if len(items) == 1:
                if not items[0][2].done():
                    items[0][2].set_exception(e)
                return
            for item in items:
                await self._run_group([item], k)
            return
        for qs, _, fut in items:
            if not fut.done():  # the client may have gone away
                fut.set_result([found[q] for q in qs])


def encode_result(results: list[list[Passage]], return_scores: bool) -> bytes:
    """The Search-R1 response body."""

    def doc(p: Passage) -> dict:
        return {"id": p.id, "contents": p.contents}

    if return_scores:
        body = [[{"document": doc(p), "score": None if p.score is None else float(p.score)} for p in ps]
                for ps in results]
    else:
        body = [[doc(p) for p in ps] for ps in results]
    return json.dumps({"result": body}, ensure_ascii=False).encode("utf-8")


def _describe(err: ValidationError) -> str:
    """A one-line, human-readable summary of a pydantic error."""
    parts = []
    for e in err.errors(include_url=False):
        if e["type"] == "json_invalid":
            return f"request body is not valid JSON ({e['msg']}); {USAGE}"
        loc = ".".join(str(x) for x in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts) + f"; {USAGE}"


def validate(req: RetrieveRequest, limits: ServerLimits) -> int:
    """Check a parsed request against the limits; return the topk to use."""
    if not req.queries:
        raise HTTPException(422, f"queries is an empty list; {USAGE}")
    if len(req.queries) > limits.max_queries:
        raise HTTPException(
            413, f"{len(req.queries)} queries in one request; the limit is {limits.max_queries}: split the batch"
        )
    for i, q in enumerate(req.queries):
        if not q.strip():
            raise HTTPException(422, f"queries[{i}] is empty; send non-empty query strings")
        if len(q) > limits.max_query_chars:
            raise HTTPException(
                413, f"queries[{i}] has {len(q)} characters; the limit is {limits.max_query_chars}"
            )
    k = limits.default_topk if req.topk is None else req.topk
    if not 1 <= k <= limits.max_topk:
        raise HTTPException(422, f"topk={k} is out of range; it must be between 1 and {limits.max_topk}")
    return k


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON. Browsers send ``text/plain`` or form types to another
    origin without asking it first; ``application/json`` needs a CORS preflight that is never granted."""
    got = request.headers.get("content-type", "")
    if got.split(";")[0].strip().lower() != "application/json":
        raise HTTPException(415, f"Content-Type must be application/json, got {got or 'none'!r}; "
                                 f"send the JSON body with 'Content-Type: application/json' ({USAGE})")


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes (also when it
    comes chunked, without a Content-Length), and with 408 when all of it has not arrived within
    ``timeout_s`` seconds. A client that hangs up mid-body raises starlette's ``ClientDisconnect``."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise HTTPException(413, f"body of {size} bytes; the limit is {limit}")

    async def read() -> bytes:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise HTTPException(413, f"body larger than the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise HTTPException(408, f"the request body did not arrive within {timeout_s:g} s; "
                                 "send the whole body at once") from None


def make_app(retriever: Retriever, *, token: str | None = None, limits: ServerLimits | None = None) -> FastAPI:
    """Build the FastAPI app serving ``retriever``. ``token`` turns on bearer auth for
    ``/retrieve`` and ``/stats``."""
    limits = limits or ServerLimits()
    stats = ServerStats()
    service = SearchService(retriever, limits, stats)
    app = FastAPI(title="sleuth retrieval", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.stats, app.state.service, app.state.limits = stats, service, limits

    def check_auth(request: Request) -> None:
        if token is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            raise HTTPException(
                401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/stats")
    async def get_stats(request: Request) -> dict:
        check_auth(request)
        return stats.snapshot() | {"cache_entries": len(service.cache), "cache_bytes": service.cache.nbytes}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        t0 = time.perf_counter()
        stats.requests += 1
        try:
            check_auth(request)
            check_content_type(request)
            try:
                body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
            except ClientDisconnect:  # nobody to answer, and nothing to log: count it for /stats
                stats.client_disconnects += 1
                return Response(status_code=400)
            try:
                req = RetrieveRequest.model_validate_json(body)
            except ValidationError as e:
                status = 400 if any(x["type"] == "json_invalid" for x in e.errors()) else 422
                raise HTTPException(status, _describe(e)) from None
            k = validate(req, limits)
            try:
                results = await service.search(req.queries, k)
            except Exception as e:  # noqa: BLE001 - a 500 that names the cause, and keep serving
                log.exception("retriever failed")
                raise HTTPException(500, f"retriever failed: {type(e).__name__}: {e}") from None
        except HTTPException as e:
            stats.errors += 1
            stats.server_errors += e.status_code >= 500
            raise
        stats.queries += len(req.queries)
        stats.latencies_s.append(time.perf_counter() - t0)
        return Response(encode_result(results, req.return_scores), media_type="application/json")

    return app
