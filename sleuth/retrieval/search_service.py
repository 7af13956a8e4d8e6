"""What sits behind the retrieval server's routes (:mod:`sleuth.retrieval.server`): the limits a
request must keep (:class:`ServerLimits`), the counters of ``GET /stats`` (:class:`ServerStats`),
and the cache + greedy micro-batcher in front of the retriever (:class:`SearchService`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from sleuth.errors import ConfigError
from sleuth.retrieval.base import Retriever
from sleuth.retrieval.result_cache import ResultCache
from sleuth.types import Passage


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
    request_timeout_s: float = 25.0
    """Seconds a request's search may take (longer -> 504, which tells the client to send fewer queries per
    request: ``RemoteRetriever`` then splits; below its default 30 s timeout so the client hears it)."""
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
                raise ConfigError(f"server limit {name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ConfigError(f"default topk {self.default_topk} must be between 1 and max_topk={self.max_topk}")
        if self.cache_size < 0:
            raise ConfigError(f"cache_size must be >= 0, got {self.cache_size}")
        if self.cache_bytes < 0:
            raise ConfigError(f"cache_bytes (--cache-mb) must be >= 0, got {self.cache_bytes}")
        if not self.body_timeout_s > 0:
            raise ConfigError(f"body_timeout_s (--body-timeout) must be > 0 seconds, got {self.body_timeout_s}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s (--request-timeout) must be > 0 seconds, "
                              f"got {self.request_timeout_s}")



class ServerStats:
    """Counters for ``GET /stats``. Latency percentiles cover the last 10,000 requests."""

    def __init__(self, window: int = 10000):
        self.started = time.monotonic()
        self.requests = self.queries = self.errors = self.server_errors = self.cache_hits = 0
        self.batches = self.batched_queries = 0
        self.client_disconnects = 0
        self.timeouts = 0
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
            "timeouts": self.timeouts,  # requests answered 504: their search outlasted --request-timeout
            "client_disconnects": self.client_disconnects,  # clients gone before their body was read
            "retriever_calls": self.batches,
            "mean_batch_queries": round(self.batched_queries / self.batches, 2) if self.batches else 0.0,
            "latency_ms": {"p50": pct(50), "p90": pct(90), "p99": pct(99)},
        }


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
