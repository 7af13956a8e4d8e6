"""The LLM-judge metric against a loopback OpenAI-compatible stub (127.0.0.1 only): verdicts,
the API key from the environment, failures counted and never raised, a server that is down."""

import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sleuth.eval.judge import LLMJudge
from sleuth.eval.metrics import summarize
from sleuth.retrieval.serve_cli import ServerThread

pytestmark = pytest.mark.component


def _stub(seen: list):
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append((request.headers.get("authorization"), body))
        user = body["messages"][-1]["content"]
        pred = user.split("Predicted answer: ", 1)[1].split("\n", 1)[0]
        if pred == "Berlin":
            return JSONResponse({"error": "overloaded"}, status_code=500)
        reply = {"Paris": "Yes.", "Rome": "no", "Madrid": "perhaps"}[pred]
        return {"choices": [{"message": {"role": "assistant", "content": reply}}]}

    return app


def _row(qid, src, answer):
    return {"id": qid, "data_source": src, "question": "What is the capital of France?",
            "golden_answers": ["Paris"], "answer": answer, "em": float(answer == "Paris"), "f1": 0.0,
            "cover_em": 0.0, "searches": 0, "turns": 1, "retrieval_hit": 0.0, "tokens": 1,
            "sampled_tokens": 1, "stop_reason": "answered"}


@pytest.fixture(scope="module")
def server():
    seen: list = []
    with ServerThread(_stub(seen)) as srv:
        yield srv, seen


def test_judge_verdicts_failures_and_key(server, monkeypatch):
    srv, seen = server
    seen.clear()
    monkeypatch.setenv("SLEUTH_JUDGE_API_KEY", "sk-test")
    judge = LLMJudge(srv.url + "/v1", "judge-model", retries=1, max_workers=2)
    rows = [_row("a", "nq", "Paris"), _row("b", "nq", "Rome"), _row("c", "hotpotqa", "Berlin"),
            _row("d", "hotpotqa", "Madrid"), _row("e", "hotpotqa", None)]
    judge.judge_rows(rows)
    assert [r["judge"] for r in rows] == [1.0, 0.0, None, None, 0.0]  # 500 and "perhaps" fail; no answer = 0
    assert judge.failures == 2
    # requests: Paris, Rome, Madrid once each; Berlin twice (retries=1); none for the missing answer
    assert len(seen) == 5
    assert all(auth == "Bearer sk-test" for auth, _ in seen)
    assert {b["model"] for _, b in seen} == {"judge-model"}
    s = summarize(rows)
    # judged rows: a=1, b=0, e=0 -> 1/3; failures c, d
    assert s["judge"] == pytest.approx(1 / 3) and s["judge_failures"] == 2
    assert s["by_source"]["nq"]["judge"] == 0.5 and s["by_source"]["hotpotqa"]["judge_failures"] == 2
    judge.close()


def test_judge_on_a_server_that_is_down_counts_failures():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2, retries=0)
    rows = [_row("a", "nq", "Paris"), _row("b", "nq", "Rome")]
    judge.judge_rows(rows)
    assert [r["judge"] for r in rows] == [None, None]
    assert judge.failures == 2 and "failed" in judge.last_error


def test_judge_rejects_a_non_http_url():
    with pytest.raises(ValueError, match="--judge-url must be an http"):
        LLMJudge("127.0.0.1:8000", "m")
