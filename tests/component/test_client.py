"""RemoteRetriever over loopback HTTP: equivalence with the retriever it fronts, cache and dedup,
retries with backoff against a flaky stub, no retry on 4xx, server down, timeouts, bad answers."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from fastapi import FastAPI, Request, Response

from sleuth.retrieval.base import RetrievalError, Retriever
from sleuth.retrieval.client import RemoteRetriever, parse_result, retrieve_url, search_url
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.retrieval.serve_cli import ServerThread
from sleuth.retrieval.server import make_app
from sleuth.types import Passage

pytestmark = pytest.mark.component

EXAMPLE_CORPUS = Path(__file__).resolve().parents[3] / "shared/data/fixtures/searchr1_example_corpus.jsonl"
TOY = [
    Passage("p0", "Paris", "Paris is the capital of France."),
    Passage("p1", "Berlin", "Berlin is the capital of Germany."),
    Passage("p2", "Rome", "Rome is the capital of Italy."),
]
OK_BODY = {"result": [[{"document": {"id": "p0", "contents": '"Paris"\nParis is the capital.'}, "score": 2.5}]]}


class Stub:
    """A /retrieve endpoint that plays a script of (status, body, delay_s) answers, then repeats
    the last one; records the JSON bodies it received."""

    def __init__(self, script):
        self.script, self.received = list(script), []
        self.app = FastAPI()

        @self.app.post("/retrieve")
        async def retrieve(request: Request) -> Response:
            self.received.append(json.loads(await request.body()))
            status, body, delay = self.script[min(len(self.received), len(self.script)) - 1]
            await asyncio.sleep(delay)
            content = body if isinstance(body, str) else json.dumps(body)
            return Response(content, status_code=status, media_type="application/json")


def stub_client(script, **kw) -> tuple[ServerThread, Stub, RemoteRetriever]:
    stub = Stub(script)
    st = ServerThread(stub.app).start()
    client = RemoteRetriever(st.url, **({"backoff_s": 0.01} | kw))
    delays: list[float] = []
    client._sleep = delays.append  # record backoff instead of sleeping
    client.delays = delays
    return st, stub, client


@pytest.fixture(scope="module")
def toy_server():
    with ServerThread(make_app(InMemoryRetriever(TOY))) as st:
        yield st


def test_remote_equals_the_retriever_it_fronts():
    if not EXAMPLE_CORPUS.is_file():
        pytest.skip(f"{EXAMPLE_CORPUS} not present")
    rows = [json.loads(line) for line in EXAMPLE_CORPUS.read_text().splitlines() if line.strip()]
    reference = InMemoryRetriever([Passage.from_contents(r["id"], r["contents"]) for r in rows])
    queries = ["lobbyist Genentech Roche", "Exploring Expedition ethnologist", "Habsburg fort wall"]
    with ServerThread(make_app(reference)) as st, RemoteRetriever(st.url) as remote:
        assert isinstance(remote, Retriever)
        assert remote.search(queries, 4) == reference.search(queries, 4)


def test_dedup_cache_blank_queries_and_stats(toy_server):
    with RemoteRetriever(toy_server.url + "/retrieve/") as r:
        got = r.search(["Paris", "Rome", " Paris ", "", "Paris"], 1)
        assert [[p.id for p in ps] for ps in got] == [["p0"], ["p2"], ["p0"], [], ["p0"]]
        # 2 unique non-blank queries sent in 1 request; " Paris " and the last "Paris" are repeats.
        assert (r.stats.requests, r.stats.queries_sent, r.stats.dedup_hits, r.stats.cache_hits) == (1, 2, 2, 0)
        again = r.search(["Rome", "Berlin"], 1)
        assert [ps[0].id for ps in again] == ["p2", "p1"]
        # Rome comes from the cache; only Berlin goes out.
        assert (r.stats.requests, r.stats.queries_sent, r.stats.cache_hits) == (2, 3, 1)
        r.search(["Rome"], 2)  # another k is another cache key
        assert r.stats.queries_sent == 4


def test_big_batches_are_split(toy_server):
    with RemoteRetriever(toy_server.url, max_queries_per_request=2, cache_size=0) as r:
        got = r.search(["Paris", "Rome", "Berlin", "France", "Italy"], 1)
    assert [ps[0].id for ps in got] == ["p0", "p2", "p1", "p0", "p2"]
    assert r.stats.requests == 3  # ceil(5 / 2)


def test_retries_5xx_with_exponential_backoff_then_succeeds():
    st, stub, r = stub_client([(503, {"detail": "busy"}, 0), (500, "oops", 0), (200, OK_BODY, 0)], retries=3)
    with st, r:
        got = r.search(["capital"], 1)
    assert got[0][0] == Passage.from_contents("p0", '"Paris"\nParis is the capital.', 2.5)
    assert (got[0][0].title, got[0][0].text) == ("Paris", "Paris is the capital.")
    assert len(stub.received) == 3 and r.stats.retries == 2
    assert r.delays == [0.01, 0.02]  # backoff_s * 2**i
    assert stub.received[0] == {"queries": ["capital"], "topk": 1, "return_scores": True}


def test_gives_up_after_retries_with_url_and_last_cause():
    st, stub, r = stub_client([(503, {"detail": "index loading"}, 0)], retries=2)
    with st, r, pytest.raises(RetrievalError) as e:
        r.search(["q"], 1)
    assert r.url in str(e.value) and "3 attempt" in str(e.value) and "index loading" in str(e.value)
    assert len(stub.received) == 3 and r.delays == [0.01, 0.02] and r.stats.errors == 1


def _fake_clock(r: RemoteRetriever) -> None:
    """The client's sleeps advance its clock (no real waiting)."""
    now = [0.0]
    r._clock = lambda: now[0]
    r._sleep = lambda s: (r.delays.append(s), now.__setitem__(0, now[0] + s))


def test_a_server_that_answered_before_is_waited_for_up_to_retry_for_s():
    """Mid-run (the server has answered before), failures are retried with capped backoff for up to
    ``retry_for_s`` seconds; a server that never answered fails after ``retries`` (the start-up
    check stays quick)."""
    busy = (503, {"detail": "restarting"}, 0)
    st, stub, r = stub_client([(200, OK_BODY, 0)] + [busy] * 5 + [(200, OK_BODY, 0)], retries=2,
                              retry_for_s=30.0, backoff_s=1.0)
    _fake_clock(r)
    with st, r:
        assert r.search(["first"], 1)[0][0].id == "p0"
        assert r.search(["second"], 1)[0][0].id == "p0"  # 5 failures over 23 s, then it is back
    assert r.delays == [1.0, 2.0, 4.0, 8.0, 8.0] and len(stub.received) == 7

    st, stub, r = stub_client([(200, OK_BODY, 0), busy], retries=2, retry_for_s=30.0, backoff_s=1.0)
    _fake_clock(r)
    with st, r:
        r.search(["first"], 1)
        with pytest.raises(RetrievalError, match=r"failed after 7 attempt\(s\) over 31 s: HTTP 503: restarting"):
            r.search(["second"], 1)
    assert r.delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # backoff capped at 8 s; gave up once 30 s had passed

    st, stub, r = stub_client([busy], retries=2, retry_for_s=30.0, backoff_s=1.0)
    _fake_clock(r)
    with st, r, pytest.raises(RetrievalError, match=r"failed after 3 attempt\(s\): HTTP 503"):
        r.search(["never answered"], 1)
    assert r.delays == [1.0, 2.0]


def test_429_is_retried_but_other_4xx_are_not():
    st, stub, r = stub_client([(429, {"detail": "slow down"}, 0), (200, OK_BODY, 0)])
    with st, r:
        assert r.search(["q"], 1)[0][0].id == "p0"
    st, stub, r = stub_client([(422, {"detail": "topk=1000 is out of range"}, 0)])
    with st, r, pytest.raises(RetrievalError, match="HTTP 422: topk=1000 is out of range"):
        r.search(["q"], 1)
    assert len(stub.received) == 1 and r.delays == []


def test_wrong_token_is_not_retried():
    with ServerThread(make_app(InMemoryRetriever(TOY), token="t0k")) as st:
        with RemoteRetriever(st.url, token="t0k") as good:
            assert good.search(["Rome"], 1)[0][0].id == "p2"
        with RemoteRetriever(st.url, token="nope") as bad, pytest.raises(RetrievalError, match="HTTP 401") as e:
            bad.search(["Rome"], 1)
        assert bad.stats.requests == 1
        assert "$SLEUTH_RETRIEVAL_TOKEN" in str(e.value)  # says how to send the token


def test_server_down_is_a_retrieval_error_naming_the_url():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RemoteRetriever(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.001) as r:
        with pytest.raises(RetrievalError) as e:
            r.search(["anything"], 3)
        with pytest.raises(RetrievalError):
            r.health()
    assert f"http://127.0.0.1:{port}/retrieve" in str(e.value) and "cannot connect" in str(e.value)
    assert r.stats.retries == 2 and r.stats.requests == 0


def test_timeout_is_a_retrieval_error():
    st, stub, r = stub_client([(200, OK_BODY, 0.6)], timeout_s=0.2, retries=1)
    with st, r, pytest.raises(RetrievalError, match="timed out"):
        r.search(["slow"], 1)
    assert len(stub.received) == 2


@pytest.mark.parametrize(
    "body,words",
    [
        ("<html>not json</html>", "non-JSON"),
        ({"results": []}, "no 'result' list"),
        ({"result": [[], []]}, "2 lists for 1 queries"),
        ({"result": [[{"document": {"id": "x"}}]]}, "without 'contents'"),
        ({"result": ["oops"]}, "not a list"),
        ({"result": [[{"id": "1", "contents": 5}]]}, r"result\[0\]\[0\]: 'contents' must be a string, got int 5"),
        ({"result": [[{"document": {"id": "1", "title": ["T"], "text": "x"}}]]}, "'title' must be a string"),
        ({"result": [[{"document": {"id": "1", "contents": "x"}, "score": "high"}]]},
         "'score' must be a number, got 'high'"),
        ({"result": [[{"document": {"id": "1", "contents": "x"}, "score": True}]]}, "'score' must be a number"),
    ],
)
def test_malformed_answers_are_retrieval_errors(body, words):
    st, stub, r = stub_client([(200, body, 0)])
    with st, r, pytest.raises(RetrievalError, match=words) as e:
        r.search(["q"], 1)
    assert str(e.value).startswith(r.url)


def test_parse_bare_documents_and_string_scores():
    bare = {"result": [[{"id": "7", "contents": '"Title"\nBody text'}], []]}
    got = parse_result(bare, 2, "u")
    assert got == [[Passage.from_contents("7", '"Title"\nBody text')], []]
    assert (got[0][0].title, got[0][0].text, got[0][0].score) == ("Title", "Body text", None)
    odd = {"result": [[{"document": {"id": 3, "title": "T", "text": "x"}, "score": "1.5"}]]}
    assert parse_result(odd, 1, "u") == [[Passage("3", "T", "x", 1.5)]]
    unscored = {"result": [[{"document": {"id": 4, "title": None, "text": "y"}, "score": None}]]}
    assert parse_result(unscored, 1, "u") == [[Passage("4", "", "y", None)]]


def test_retrieve_url_and_bad_arguments(toy_server):
    assert retrieve_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/retrieve"
    assert retrieve_url("http://127.0.0.1:8000/retrieve") == "http://127.0.0.1:8000/retrieve"
    with pytest.raises(ValueError, match="must look like"):
        retrieve_url("127.0.0.1:8000")
    with RemoteRetriever(toy_server.url) as r:
        with pytest.raises(ValueError, match="k must be"):
            r.search(["q"], 0)
        with pytest.raises(TypeError):
            r.search("a bare string", 1)
        assert r.health() == {"status": "ok"}


def test_search_url_one_shot(toy_server):
    got = search_url(toy_server.url, ["Berlin Germany"], 2)
    assert [p.id for p in got[0]] == ["p1", "p0"]


def test_from_config_and_env_token(monkeypatch):
    from sleuth.config import RetrievalConfig

    with pytest.raises(ValueError, match="retrieval.url"):
        RemoteRetriever.from_config(RetrievalConfig(kind="url"))
    monkeypatch.setenv("SLEUTH_RETRIEVAL_TOKEN", "envtok")
    with ServerThread(make_app(InMemoryRetriever(TOY), token="envtok")) as st:
        cfg = RetrievalConfig(kind="url", url=st.url + "/retrieve", timeout_s=5.0, retries=0, cache_size=7)
        with RemoteRetriever.from_config(cfg) as r:
            assert (r.timeout_s, r.retries, r._cache.size) == (5.0, 0, 7)
            assert r.search(["Rome"], 1)[0][0].id == "p2"
        assert search_url(st.url, ["Paris"], 1)[0][0].id == "p0"  # token from the environment


def test_shared_by_threads(toy_server):
    from concurrent.futures import ThreadPoolExecutor

    words = ["Paris", "Berlin", "Rome"] * 10
    with RemoteRetriever(toy_server.url, cache_size=0) as r, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda w: r.search([w, "capital " + w], 1), words))
    assert [g[0][0].id for g in got] == [{"Paris": "p0", "Berlin": "p1", "Rome": "p2"}[w] for w in words]


class GatedRetriever:
    """Answers batches of at most ``fast`` queries at once; larger ones block until ``gate`` is set."""

    def __init__(self, fast: int):
        import threading

        self.inner, self.fast, self.gate, self.sizes = InMemoryRetriever(TOY), fast, threading.Event(), []

    def search(self, queries, k):
        self.sizes.append(len(queries))
        if len(queries) > self.fast:
            assert self.gate.wait(timeout=600)  # a hang guard: the test opens the gate when it is done
        return self.inner.search(queries, k)


def test_server_answers_504_when_a_search_outlasts_request_timeout_and_the_client_splits():
    from sleuth.retrieval.search_service import ServerLimits

    slow = GatedRetriever(fast=2)
    app = make_app(slow, limits=ServerLimits(request_timeout_s=0.5, batching=False))
    try:
        with ServerThread(app) as st:
            import httpx

            resp = httpx.post(retrieve_url(st.url), json={"queries": ["Paris", "Rome", "Berlin"], "topk": 1},
                              timeout=60)
            assert resp.status_code == 504 and "took longer than 0.5 s (--request-timeout)" in resp.text
            stats_url = retrieve_url(st.url).removesuffix("/retrieve") + "/stats"
            assert httpx.get(stats_url, timeout=60).json()["timeouts"] == 1
            with RemoteRetriever(st.url, cache_size=0, timeout_s=60) as r:
                got = r.search(["Paris", "Rome", "Berlin", "France", "Italy"], 1)
                assert [ps[0].id for ps in got] == ["p0", "p2", "p1", "p0", "p2"]
                assert r.stats.splits == 2 and r._request_size == 2  # 5 -> 2 + 3, 3 -> 1 + 2
                before = r.stats.splits
                r.search(["Tokyo", "Paris capital", "Rome city", "Berlin wall"], 1)
                assert r.stats.splits == before  # later rounds keep to the size that fitted
    finally:
        slow.gate.set()


def test_a_client_read_timeout_splits_a_multi_query_request():
    slow = GatedRetriever(fast=2)
    try:
        with ServerThread(make_app(slow)) as st, RemoteRetriever(st.url, cache_size=0, timeout_s=5, retries=0) as r:
            got = r.search(["Paris", "Rome", "Berlin", "Italy"], 1)  # 4 queries time out; 2 + 2 answer
            assert [ps[0].id for ps in got] == ["p0", "p2", "p1", "p2"] and r.stats.splits == 1
    finally:
        slow.gate.set()
