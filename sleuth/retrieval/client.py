"""A Retriever over HTTP: talks to any Search-R1-compatible ``/retrieve`` endpoint.

``RemoteRetriever`` keeps one connection pool (httpx), retries connect errors, timeouts, 5xx and
429 with exponential backoff (never other 4xx: those are our bug, and retrying cannot fix them),
keeps an LRU cache of ``(query, k) -> passages``, and sends each distinct query of a batch once
(a GRPO group asks near-identical queries), at most ``max_queries_per_request`` per request. A
request of several queries that times out (the client's read timeout, or ``sleuth serve``'s 504
after ``--request-timeout``) is not retried as it was: it is sent again as two halves, and later
requests keep to the smaller size, so that a large round never outlasts the timeout. Failures
become :class:`~sleuth.retrieval.base.RetrievalError` naming the URL and the cause.

Empty or blank queries are answered locally with no passages and never sent.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Hashable
from urllib.parse import urlsplit

import httpx

from sleuth.errors import ConfigError
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.retry import send_with_retries
from sleuth.types import Passage

TOKEN_ENV = "SLEUTH_RETRIEVAL_TOKEN"
"""Environment variable holding the bearer token (read by ``sleuth serve``, ``sleuth search --url``
and ``from_config``)."""
AUTH_HINT = (f"the server wants its bearer token: set ${TOKEN_ENV} (or pass --token to sleuth search) "
             "to the token it was started with (sleuth serve --token)")


def env_token(token: str | None = None) -> str | None:
    """``token``, else ``$SLEUTH_RETRIEVAL_TOKEN``, else None."""
    return token or os.environ.get(TOKEN_ENV) or None


class LRUCache:
    """A small thread-safe LRU map. ``size`` 0 disables it (``get`` always misses)."""

    def __init__(self, size: int):
        self.size = int(size)
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


def retrieve_url(url: str) -> str:
    """Normalise a server address: ``http://host:port`` or ``…/retrieve`` -> ``…/retrieve``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"retrieval URL {url!r} must look like http://127.0.0.1:8000/retrieve")
    url = url.rstrip("/")
    return url if parts.path.rstrip("/").endswith("/retrieve") else url + "/retrieve"


def parse_result(data: Any, n: int, url: str) -> list[list[Passage]]:
    """Turn a Search-R1 response (scored or bare documents) into passages; check its shape."""
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or len(result) != n:
        got = f"{len(result)} lists" if isinstance(result, list) else "no 'result' list"
        raise RetrievalError(f"{url} answered {got} for {n} queries; is it a Search-R1 /retrieve endpoint?")
    out = []
    for i, entries in enumerate(result):
        if not isinstance(entries, list):
            raise RetrievalError(f"{url}: result[{i}] is not a list of documents")
        out.append([_passage(entry, f"{url}: result[{i}][{j}]") for j, entry in enumerate(entries)])
    return out


def _passage(entry: Any, where: str) -> Passage:
    """One ``{"document": {...}, "score": s}`` or bare ``{...}`` document as a Passage; ``where``
    (URL and position) starts every error."""
    scored = isinstance(entry, dict) and "document" in entry
    doc = entry["document"] if scored else entry
    if not isinstance(doc, dict) or not ("contents" in doc or "text" in doc):
        raise RetrievalError(f"{where} holds a document without 'contents': {str(doc)[:200]}")
    for key in ("contents", "text", "title"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise RetrievalError(f"{where}: {key!r} must be a string, got {type(value).__name__} {str(value)[:50]}")
    score = _score(entry.get("score"), where) if scored else None
    pid = str(doc.get("id", ""))
    if isinstance(doc.get("contents"), str):
        return Passage.from_contents(pid, doc["contents"], score)
    return Passage(pid, doc.get("title") or "", doc["text"], score)


def _score(x: Any, where: str) -> float | None:
    """A score as a float (numbers and numeric strings); None when absent; an error otherwise."""
    if x is None:
        return None
    try:
        value = math.nan if isinstance(x, bool) else float(x)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise RetrievalError(f"{where}: 'score' must be a number, got {str(x)[:50]!r}")
    return value


@dataclass
class ClientStats:
    """What a RemoteRetriever did; ``as_dict()`` for metrics (``retrieval/…``)."""

    requests: int = 0  # HTTP requests answered (any status)
    queries_sent: int = 0  # queries that went over the wire
    cache_hits: int = 0  # queries answered from the LRU cache
    dedup_hits: int = 0  # repeats inside one batch, sent once
    retries: int = 0
    errors: int = 0  # search() calls that raised RetrievalError
    splits: int = 0  # requests that timed out (or got 504) and were sent again as two halves

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _TooSlow(Exception):
    """A multi-query request outlasted the timeout (client read timeout, or the server's 504)."""


class RemoteRetriever:
    """Retriever protocol over HTTP to a Search-R1-compatible server (e.g. ``sleuth serve``).

    ``url`` may be the server root or its ``/retrieve`` endpoint. Thread-safe. Returned passage
    objects may be shared with the cache: do not mutate them.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        cache_size: int = 10000,
        backoff_s: float = 0.25,
        max_queries_per_request: int = 512,
        retry_for_s: float = 0.0,
    ):
        if retries < 0 or timeout_s <= 0 or max_queries_per_request < 1:
            raise ValueError("need retries >= 0, timeout_s > 0 and max_queries_per_request >= 1")
        self.url = retrieve_url(url)
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.max_queries_per_request = max_queries_per_request
        self._request_size = max_queries_per_request  # lowered when a request times out (halved until one fits)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers)
        self._cache = LRUCache(cache_size)
        self._sleep: Callable[[float], None] = time.sleep  # replaced in tests
        self._clock: Callable[[], float] = time.monotonic  # replaced in tests
        # a server that has answered before is waited for (a restart, an overload) up to this long;
        # one that never answered (a wrong URL, a server not started) fails after ``retries``
        self.retry_for_s = retry_for_s
        self._answered = False
        self.stats = ClientStats()

    @classmethod
    def from_config(cls, cfg) -> "RemoteRetriever":
        """From a ``RetrievalConfig`` (kind=url); the token comes from ``$SLEUTH_RETRIEVAL_TOKEN``."""
        if not cfg.url:
            raise ConfigError("retrieval.url is not set: pass --set retrieval.url=http://127.0.0.1:8000/retrieve")
        return cls(cfg.url, token=env_token(), timeout_s=cfg.timeout_s,
                   retries=cfg.retries, cache_size=cfg.cache_size, retry_for_s=cfg.retry_for_s)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of at most ``k`` passages per query, in order."""
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise TypeError("queries must be a list of strings")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        out: list[list[Passage] | None] = [None] * len(queries)
        todo: dict[str, list[int]] = {}
        for i, raw in enumerate(queries):
            q = raw.strip()
            hit = self._cache.get((q, k)) if q else []
            if hit is not None:
                out[i] = list(hit)
                self.stats.cache_hits += bool(q)
                continue
            self.stats.dedup_hits += q in todo
            todo.setdefault(q, []).append(i)
        unique = list(todo)
        size = min(self.max_queries_per_request, self._request_size)
        pending = [unique[s : s + size] for s in range(0, len(unique), size)]
        while pending:
            chunk = pending.pop(0)
            try:
                found = self._post(chunk, k, split_if_slow=len(chunk) > 1)
            except _TooSlow:  # a request must finish within the timeout: halve it, and later ones too
                half = len(chunk) // 2
                self._request_size = min(self._request_size, len(chunk) - half)  # the larger half
                self.stats.splits += 1
                pending[:0] = [chunk[:half], chunk[half:]]
                continue
            for q, passages in zip(chunk, found):
                self._cache.put((q, k), passages)
                for i in todo[q]:
                    out[i] = list(passages)
        return out  # type: ignore[return-value]

    def _post(self, queries: list[str], k: int, split_if_slow: bool = False) -> list[list[Passage]]:
        payload = {"queries": queries, "topk": k, "return_scores": True}

        def send() -> httpx.Response:
            try:
                resp = self._http.post(self.url, json=payload)
            except httpx.ReadTimeout:  # the server is working on it: fewer queries will finish in time
                if split_if_slow:
                    raise _TooSlow() from None
                raise
            self.stats.requests += 1
            if resp.status_code == 504 and split_if_slow:  # `sleuth serve --request-timeout`
                raise _TooSlow()
            return resp

        def count_retry() -> None:
            self.stats.retries += 1

        try:
            resp = send_with_retries(
                send, url=self.url, retries=self.retries, backoff_s=self.backoff_s,
                sleep=self._sleep, on_retry=count_retry, auth_hint=AUTH_HINT,
                retry_for_s=self.retry_for_s if self._answered else 0.0, clock=self._clock,
            )
            self._answered = True
            self.stats.queries_sent += len(queries)
            try:
                data = resp.json()
            except ValueError:
                raise RetrievalError(f"{self.url} answered with non-JSON: {resp.text[:200]!r}") from None
            return parse_result(data, len(queries), self.url)
        except RetrievalError:
            self.stats.errors += 1
            raise

    def health(self) -> dict:
        """``GET /health`` of the server (raises RetrievalError when it is down)."""
        base = self.url[: -len("/retrieve")]
        resp = send_with_retries(lambda: self._http.get(base + "/health"), url=base, retries=0, backoff_s=0)
        return resp.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RemoteRetriever":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def search_url(
    url: str, queries: list[str], k: int, token: str | None = None, timeout_s: float = 30.0
) -> list[list[Passage]]:
    """One-shot search against a server (for ``sleuth search --url``); ``token`` defaults to
    ``$SLEUTH_RETRIEVAL_TOKEN``."""
    token = env_token(token)
    with RemoteRetriever(url, token=token, timeout_s=timeout_s, retries=1, cache_size=0) as r:
        return r.search(queries, k)
