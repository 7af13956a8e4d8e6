"""The retrieval server over real loopback HTTP: Search-R1 contract, bad-request matrix, auth,
limits, cache, micro-batching and concurrency."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.retrieval.search_service import ServerLimits
from sleuth.retrieval.serve_cli import ServerThread, bind_socket
from sleuth.retrieval.server import make_app
from sleuth.types import Passage

pytestmark = pytest.mark.component

EXAMPLE_CORPUS = Path(__file__).resolve().parents[3] / "shared/data/fixtures/searchr1_example_corpus.jsonl"

# Toy corpus whose right answers are obvious.
TOY = [
    Passage("p0", "Paris", "Paris is the capital of France."),
    Passage("p1", "Berlin", "Berlin is the capital of Germany."),
    Passage("p2", "Rome", "Rome is the capital of Italy."),
]


class RecordingRetriever:
    """InMemory over TOY that records each call and can be told to fail or to wait."""

    def __init__(self, fail_on: str | None = None, gate: threading.Event | None = None):
        self.inner = InMemoryRetriever(TOY)
        self.calls: list[list[str]] = []
        self.fail_on, self.gate = fail_on, gate

    def search(self, queries, k):
        self.calls.append(list(queries))
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail_on in queries:
            raise RuntimeError(f"cannot search {self.fail_on!r}")
        return self.inner.search(queries, k)


@pytest.fixture(scope="module")
def server():
    """One server for the read-only tests (small limits, so the limit tests stay cheap)."""
    limits = ServerLimits(max_queries=8, max_query_chars=50, max_topk=5, default_topk=2, max_body_bytes=4096)
    with ServerThread(make_app(InMemoryRetriever(TOY), limits=limits)) as st:
        yield st


def wait_queued(app, n, timeout_s=10.0):
    """Wait until ``n`` requests sit in the micro-batcher's queue."""
    deadline = time.monotonic() + timeout_s
    while app.state.service.queued < n:
        assert time.monotonic() < deadline, "requests never reached the batch queue"
        time.sleep(0.005)


# One client for the whole module (creating an httpx.Client loads the CA bundle: ~0.15 s).
HTTP = httpx.Client(timeout=30)


JSON = {"content-type": "application/json"}


def post(url, body, **kw):
    if isinstance(body, (bytes, str)):  # raw bodies are declared JSON unless a test says otherwise
        return HTTP.post(url + "/retrieve", content=body, **{"headers": JSON} | kw)
    return HTTP.post(url + "/retrieve", json=body, **kw)


def test_scored_response_has_search_r1_shape(server):
    r = post(server.url, {"queries": ["capital of France", "Rome Italy"], "topk": 2, "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(x) == 2 for x in result)
    top = result[0][0]
    assert set(top) == {"document", "score"} and set(top["document"]) == {"id", "contents"}
    assert top["document"] == {"id": "p0", "contents": '"Paris"\nParis is the capital of France.'}
    # "capital of France" hits p0 on capital+of+france = 3 terms (InMemory counts term occurrences).
    assert top["score"] == 3.0
    assert result[1][0]["document"]["id"] == "p2"


def test_bare_documents_when_scores_off_and_default_topk(server):
    # Search-R1's own server crashes on return_scores=false; here it returns bare documents.
    r = post(server.url, {"queries": ["Berlin"], "topk": None, "return_scores": False})
    assert r.status_code == 200
    docs = r.json()["result"][0]
    assert len(docs) == 2  # default_topk=2
    assert docs[0] == {"id": "p1", "contents": '"Berlin"\nBerlin is the capital of Germany.'}
    # return_scores defaults to false, topk to the server default.
    assert post(server.url, {"queries": ["Berlin"]}).json()["result"][0] == docs


def test_server_matches_the_retriever_on_the_real_example_corpus():
    """Equivalence with the reference: the retriever called directly."""
    if not EXAMPLE_CORPUS.is_file():
        pytest.skip(f"{EXAMPLE_CORPUS} not present")
    rows = [json.loads(line) for line in EXAMPLE_CORPUS.read_text().splitlines() if line.strip()]
    retriever = InMemoryRetriever([Passage.from_contents(r["id"], r["contents"]) for r in rows])
    queries = ["lobbyist for Genentech", "United States Exploring Expedition", "Portuguese fort"]
    want = retriever.search(queries, 3)
    with ServerThread(make_app(retriever)) as st:
        got = post(st.url, {"queries": queries, "topk": 3, "return_scores": True}).json()["result"]
    assert [[d["document"]["id"] for d in ds] for ds in got] == [[p.id for p in ps] for ps in want]
    assert [[d["score"] for d in ds] for ds in got] == [[p.score for p in ps] for ps in want]
    by_id = {r["id"]: r["contents"] for r in rows}
    assert all(d["document"]["contents"] == by_id[d["document"]["id"]] for ds in got for d in ds)


BAD_REQUESTS = [
    # (body, status, words the message must hold)
    (b"this is not json", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b"[1, 2]", 422, "object"),
    (b'{"topk": 2}', 422, "queries"),
    (b'{"queries": "capital"}', 422, "queries"),
    (b'{"queries": [1, 2]}', 422, "queries.0"),
    (b'{"queries": ["a"], "topk": "3"}', 422, "topk"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 422, "return_scores"),
    (b'{"queries": []}', 422, "empty list"),
    (b'{"queries": ["ok", "   "]}', 422, "queries[1] is empty"),
    (b'{"queries": ["a"], "topk": 0}', 422, "between 1 and 5"),
    (b'{"queries": ["a"], "topk": 1000000}', 422, "between 1 and 5"),
    (json.dumps({"queries": ["a"] * 9}).encode(), 413, "limit is 8"),
    (json.dumps({"queries": ["a" * 51]}).encode(), 413, "limit is 50"),
    (json.dumps({"queries": ["a"] * 10000}).encode(), 413, "limit is 4096"),  # body size
]


@pytest.mark.parametrize("body,status,words", BAD_REQUESTS, ids=[f"{i}-{b[:20]!r}" for i, (b, _, _) in enumerate(BAD_REQUESTS)])
def test_bad_request_matrix_is_4xx_with_a_readable_message(server, body, status, words):
    r = post(server.url, body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]
    # ... and the server keeps serving.
    assert post(server.url, {"queries": ["Paris"], "topk": 1}).status_code == 200


def test_chunked_body_over_the_limit_is_413(server):
    def chunks():  # no Content-Length: the server must count as it reads
        yield b'{"queries": ['
        for _ in range(2000):
            yield b'"aaaa", '
        yield b'"a"]}'

    r = HTTP.post(server.url + "/retrieve", content=chunks(), headers=JSON)
    assert r.status_code == 413 and "limit of 4096 bytes" in r.json()["detail"]
    assert post(server.url, {"queries": ["Paris"], "topk": 1}).status_code == 200


def test_wrong_method_and_path(server):
    assert HTTP.get(server.url + "/retrieve").status_code == 405
    assert HTTP.post(server.url + "/nope", json={}).status_code == 404


def test_health_and_stats_count_requests_errors_and_cache_hits():
    with ServerThread(make_app(InMemoryRetriever(TOY))) as st:
        assert HTTP.get(st.url + "/health").json() == {"status": "ok"}
        post(st.url, {"queries": ["Paris", "Paris", "Rome"], "topk": 1})  # Paris twice in one request
        post(st.url, {"queries": ["Paris"], "topk": 1})  # cached
        post(st.url, {"queries": ["Paris"], "topk": 2})  # other k: not cached
        post(st.url, b"garbage")
        s = HTTP.get(st.url + "/stats").json()
    assert (s["requests"], s["queries"], s["errors"]) == (4, 5, 1)
    # Hits: only the second request's Paris; the repeat inside request 1 is deduplicated, not cached.
    assert s["cache_hits"] == 1 and s["cache_entries"] == 3
    assert s["retriever_calls"] == 2  # request 1 (Paris, Rome) and request 3; request 2 was cached
    assert s["latency_ms"]["p50"] > 0 and s["latency_ms"]["p50"] <= s["latency_ms"]["p99"]
    assert s["queries_per_s"] > 0


def test_bearer_token_guards_retrieve_and_stats_not_health():
    with ServerThread(make_app(InMemoryRetriever(TOY), token="s3cret")) as st:
        body = {"queries": ["Paris"], "topk": 1}
        r = post(st.url, body)
        assert r.status_code == 401 and "Bearer" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert post(st.url, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert post(st.url, body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert HTTP.get(st.url + "/stats").status_code == 401
        assert HTTP.get(st.url + "/health").status_code == 200


def test_retriever_failure_is_a_500_that_names_it_and_spares_batched_neighbours():
    retriever = RecordingRetriever(fail_on="poison")
    with ServerThread(make_app(retriever)) as st:
        r = post(st.url, {"queries": ["poison"], "topk": 1})
        assert r.status_code == 500 and "cannot search 'poison'" in r.json()["detail"]
        assert post(st.url, {"queries": ["Paris"], "topk": 1}).status_code == 200
        stats = HTTP.get(st.url + "/stats").json()
    assert (stats["errors"], stats["server_errors"], stats["requests"]) == (1, 1, 2)


def test_micro_batcher_merges_concurrent_requests_into_one_call():
    gate = threading.Event()
    retriever = RecordingRetriever(gate=gate)
    with ServerThread(make_app(retriever, limits=ServerLimits(batch_workers=1))) as st:
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(post, st.url, {"queries": ["Paris"], "topk": 1})
            while not retriever.calls:  # the first call is now blocked inside the retriever
                time.sleep(0.005)
            # These queue up while the first call runs.
            rest = [pool.submit(post, st.url, {"queries": [q, "Rome"], "topk": 1}) for q in ("Berlin", "Italy", "Rome")]
            wait_queued(st.app, 3)
            gate.set()
            responses = [first.result()] + [f.result() for f in rest]
    assert all(r.status_code == 200 for r in responses)
    assert [r.json()["result"][0][0]["id"] for r in responses] == ["p0", "p1", "p2", "p2"]
    # Second call: the union of the three queued requests, each unique query once.
    assert retriever.calls[0] == ["Paris"]
    assert len(retriever.calls) == 2 and sorted(retriever.calls[1]) == ["Berlin", "Italy", "Rome"]


def test_two_batch_workers_run_two_calls_then_merge_the_queue():
    gate = threading.Event()
    retriever = RecordingRetriever(gate=gate)
    with ServerThread(make_app(retriever, limits=ServerLimits(batch_workers=2))) as st:
        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(post, st.url, {"queries": ["Paris"], "topk": 1})]
            deadline = time.monotonic() + 10
            while not retriever.calls:  # the first worker holds "Paris" (else both would merge)
                assert time.monotonic() < deadline
                time.sleep(0.005)
            futures.append(pool.submit(post, st.url, {"queries": ["Berlin"], "topk": 1}))
            while len(retriever.calls) < 2:  # both workers are inside the retriever at once
                assert time.monotonic() < deadline
                time.sleep(0.005)
            futures += [pool.submit(post, st.url, {"queries": [q], "topk": 1}) for q in ("Rome", "Italy")]
            wait_queued(st.app, 2)
            assert len(retriever.calls) == 2  # the queue waits for a free worker
            gate.set()
            assert [f.result().json()["result"][0][0]["id"] for f in futures] == ["p0", "p1", "p2", "p2"]
    assert len(retriever.calls) == 3 and sorted(retriever.calls[2]) == ["Italy", "Rome"]


def test_small_responses_do_not_wait_for_delayed_acks():
    """The listening socket must say IPPROTO_TCP, or asyncio skips TCP_NODELAY and every small
    response stalls ~40 ms (Nagle + delayed ACK)."""
    sock = bind_socket()
    assert sock.proto == socket.IPPROTO_TCP
    sock.close()
    # (the latency effect itself is measured by bench/server.py, not asserted here)


def test_failed_batch_falls_back_to_per_request_calls():
    gate = threading.Event()
    retriever = RecordingRetriever(fail_on="poison", gate=gate)
    with ServerThread(make_app(retriever, limits=ServerLimits(batch_workers=1))) as st:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(post, st.url, {"queries": ["Paris"], "topk": 1})
            while not retriever.calls:
                time.sleep(0.005)
            bad = pool.submit(post, st.url, {"queries": ["poison"], "topk": 1})
            good = pool.submit(post, st.url, {"queries": ["Rome"], "topk": 1})
            wait_queued(st.app, 2)
            gate.set()
            assert first.result().status_code == 200
            assert bad.result().status_code == 500
            assert good.result().status_code == 200
    assert good.result().json()["result"][0][0]["id"] == "p2"


@pytest.mark.parametrize("batching", [True, False])
def test_fifty_concurrent_clients_zero_failures(batching):
    retriever = InMemoryRetriever(TOY)
    with ServerThread(make_app(retriever, limits=ServerLimits(batching=batching, cache_size=0))) as st:
        queries = [f"capital {w} {i}" for i, w in enumerate(["France", "Germany", "Italy"] * 17)][:50]

        async def run_all():
            limits = httpx.Limits(max_connections=50)
            async with httpx.AsyncClient(timeout=30, limits=limits) as c:
                body = [{"queries": [q], "topk": 1, "return_scores": True} for q in queries]
                return await asyncio.gather(*(c.post(st.url + "/retrieve", json=b) for b in body))

        responses = asyncio.run(run_all())
        stats = HTTP.get(st.url + "/stats").json()
    assert [r.status_code for r in responses] == [200] * 50
    want = [ps[0].id for ps in retriever.search(queries, 1)]
    assert [r.json()["result"][0][0]["document"]["id"] for r in responses] == want
    assert stats["requests"] == 50 and stats["errors"] == 0


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_body_not_declared_json_is_415_and_never_searched(content_type):
    """What a web page may send to another origin without a CORS preflight is refused, so a page
    cannot drive a tokenless loopback server (CSRF)."""
    retriever = RecordingRetriever()
    with ServerThread(make_app(retriever)) as st:
        headers = {} if content_type is None else {"content-type": content_type}
        r = HTTP.post(st.url + "/retrieve", content=b'{"queries": ["Paris"]}', headers=headers)
        assert r.status_code == 415, r.text
        assert "Content-Type must be application/json" in r.json()["detail"]
        assert repr(content_type or "none") in r.json()["detail"]
        assert retriever.calls == []
        for ok in ("application/json; charset=utf-8", "Application/JSON"):
            r = HTTP.post(st.url + "/retrieve", content=b'{"queries": ["Paris"], "topk": 1}',
                          headers={"content-type": ok})
            assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "p0"
        assert HTTP.get(st.url + "/stats").json()["errors"] == 1


class UvicornRecords(logging.Handler):
    """Collects what uvicorn logs (its loggers do not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        logging.getLogger("uvicorn.error").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("uvicorn.error").removeHandler(self)


def raw_request(port: int, head_extra: bytes, body: bytes) -> socket.socket:
    """A loopback connection that sent a /retrieve request head and ``body`` (maybe partial)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)  # timeout: a hang guard only
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + head_extra + b"\r\n" + body)
    return sock


def wait_stats(url, key, want, timeout_s=10.0):
    """Poll /stats until ``key`` reaches ``want`` (bounded); return the last snapshot."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = HTTP.get(url + "/stats").json()
        if s[key] >= want or time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def test_client_hanging_up_mid_body_is_counted_quietly():
    with ServerThread(make_app(InMemoryRetriever(TOY))) as st, UvicornRecords() as logged:
        for _ in range(3):
            raw_request(st.port, b"Content-Length: 1000\r\n", b'{"queries": ["Par').close()
        s = wait_stats(st.url, "client_disconnects", 3)
        assert post(st.url, {"queries": ["Paris"], "topk": 1}).status_code == 200  # still serving
    assert s["client_disconnects"] == 3 and s["errors"] == 0 and s["server_errors"] == 0
    assert [r.getMessage() for r in logged.records if r.levelno >= logging.WARNING] == []


def test_slow_body_is_answered_408():
    limits = ServerLimits(body_timeout_s=0.3)
    with ServerThread(make_app(InMemoryRetriever(TOY), limits=limits)) as st:
        sock = raw_request(st.port, b"Content-Length: 100\r\n", b'{"queries": ')  # and nothing more
        reply = b""
        with sock:
            while b"}" not in reply:  # the JSON error body ends with '}'
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert b"did not arrive within 0.3 s" in reply
        assert HTTP.get(st.url + "/stats").json()["errors"] == 1
        assert post(st.url, {"queries": ["Paris"], "topk": 1}).status_code == 200
    with pytest.raises(ValueError, match="--body-timeout"):
        ServerLimits(body_timeout_s=0)


class BigRetriever:
    """k passages of ~10 KB per query; counts calls."""

    def __init__(self):
        self.calls = 0

    def search(self, queries, k):
        self.calls += 1
        return [[Passage(f"{q}-{i}", f"T {q}", "x" * 10_000 + q) for i in range(k)] for q in queries]


def test_cache_is_bounded_in_bytes_not_only_entries():
    """topk=100 requests filled a 10,000-entry cache with 1.8 GB; the byte bound holds whatever k is."""
    retriever = BigRetriever()
    limits = ServerLimits(cache_size=10_000, cache_bytes=200_000)  # ~4 entries of 5 x 10 KB
    with ServerThread(make_app(retriever, limits=limits)) as st:
        for i in range(30):
            assert post(st.url, {"queries": [f"q{i}"], "topk": 5}).status_code == 200
        s = HTTP.get(st.url + "/stats").json()
        assert 0 < s["cache_bytes"] <= 200_000 and 0 < s["cache_entries"] < 30
        calls = retriever.calls
        post(st.url, {"queries": ["q29"], "topk": 5})  # the newest entry is kept
        assert retriever.calls == calls
        post(st.url, {"queries": ["q0"], "topk": 5})  # the oldest was evicted
        assert retriever.calls == calls + 1
        post(st.url, {"queries": ["huge"], "topk": 50})  # ~500 KB: larger than the budget, not kept
        s = HTTP.get(st.url + "/stats").json()
        assert s["cache_bytes"] <= 200_000 and s["cache_entries"] > 0
    with pytest.raises(ValueError, match="--cache-mb"):
        ServerLimits(cache_bytes=-1)


def test_cache_byte_estimate_tracks_real_memory():
    """The estimate is what the cached passages really keep alive, within a factor of 1.5."""
    import gc
    import tracemalloc

    from sleuth.retrieval.result_cache import ResultCache

    cache = ResultCache(max_entries=10**6, max_bytes=2**40)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(500):
            q = f"query number {i}"
            cache.put((q, 5), [Passage(f"id{i}-{j}", f"Title {i} {j}", f"text {i} {j} " * 40, 1.5)
                               for j in range(5)])
        real = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(cache) == 500
    assert real / 1.5 <= cache.nbytes <= real * 1.5, (cache.nbytes, real)
