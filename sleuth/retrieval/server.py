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
import time

from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

from sleuth.retrieval.base import Retriever
from sleuth.retrieval.search_service import SearchService, ServerLimits, ServerStats
from sleuth.types import Passage

log = logging.getLogger(__name__)

USAGE = 'send {"queries": ["..."], "topk": 3, "return_scores": true}'


class RetrieveRequest(BaseModel):
    """The Search-R1 request body. Strict: ``"3"`` is not a topk and ``1`` is not a bool."""

    model_config = ConfigDict(strict=True, extra="ignore")
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


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
                results = await asyncio.wait_for(service.search(req.queries, k), limits.request_timeout_s)
            except TimeoutError:  # answered now; the retriever call already running finishes in its thread
                stats.timeouts += 1
                raise HTTPException(504, f"the search of {len(req.queries)} queries took longer than "
                                         f"{limits.request_timeout_s:g} s (--request-timeout); send fewer queries "
                                         "per request") from None
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
