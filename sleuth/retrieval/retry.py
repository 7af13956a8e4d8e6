"""One HTTP request with retries and backoff, shared by the Search-R1 client
(:mod:`sleuth.retrieval.client`) and the web search adapters (:mod:`sleuth.retrieval.web`)."""

from __future__ import annotations

import time
from typing import Callable

import httpx

from sleuth.retrieval.base import RetrievalError


def _detail(resp: httpx.Response) -> str:
    """The server's error message (``detail``, ``error`` or ``message``) or the start of the body."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("detail", "error", "message"):
            if data.get(key):
                return str(data[key])[:300]
    return resp.text[:300]


def send_with_retries(
    send: Callable[[], httpx.Response],
    *,
    url: str,
    retries: int,
    backoff_s: float,
    max_backoff_s: float = 8.0,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[], None] | None = None,
    auth_hint: str = "",
    retry_for_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> httpx.Response:
    """Call ``send`` until it answers < 400; retry transport errors, timeouts, 5xx and 429 up to
    ``retries`` times, and beyond that for as long as ``retry_for_s`` seconds have not passed since
    the first attempt, waiting ``backoff_s * 2**i`` (capped at ``max_backoff_s``) before retry i.
    Other 4xx raise at once. Every failure is a RetrievalError that names ``url``; ``auth_hint`` is
    added to a 401/403."""
    last = ""
    start = clock()
    attempt = -1
    while True:
        attempt += 1
        if attempt > retries and clock() - start >= retry_for_s:
            break
        if attempt:
            sleep(min(max_backoff_s, backoff_s * 2 ** (attempt - 1)))
            if on_retry:
                on_retry()
        try:
            resp = send()
        except httpx.TimeoutException as e:
            last = f"timed out ({type(e).__name__})"
            continue
        except httpx.TransportError as e:
            last = f"cannot connect ({type(e).__name__}: {e})"
            continue
        if resp.status_code >= 500 or resp.status_code == 429:
            last = f"HTTP {resp.status_code}: {_detail(resp)}"
            continue
        if resp.status_code >= 400:
            hint = f"; {auth_hint}" if auth_hint and resp.status_code in (401, 403) else ""
            raise RetrievalError(f"{url} rejected the request: HTTP {resp.status_code}: {_detail(resp)}{hint}")
        return resp
    waited = f" over {clock() - start:.0f} s" if retry_for_s else ""
    raise RetrievalError(f"{url} failed after {attempt} attempt(s){waited}: {last}")
