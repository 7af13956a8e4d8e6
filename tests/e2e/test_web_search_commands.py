"""Web search from the commands: ``sleuth eval --web serper`` and ``sleuth train`` with
``retrieval.kind: web`` read their passages from a search API (a loopback stand-in answering in
Serper's JSON shape, reached through ``--web-base-url`` / ``retrieval.web_base_url``), the key from
``SERPER_API_KEY``; without the key each command stops with one line naming the variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sleuth.cli import main
from sleuth.retrieval.serve_cli import ServerThread

pytestmark = pytest.mark.e2e
KEY = "k-test"
TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def serper():
    app, seen = FastAPI(), []

    @app.post("/search")
    async def search(request: Request):
        body = await request.json()
        seen.append(body)
        if request.headers.get("x-api-key") != KEY:
            return JSONResponse({"message": "Unauthorized."}, 403)
        return {"organic": [{"title": f"Stub page {i}", "link": f"https://stub.example/{i}",
                             "snippet": f"The stub's answer to {body['q']} is Paris.", "position": i + 1}
                            for i in range(body["num"])]}

    with ServerThread(app) as server:
        yield server.url, seen


@pytest.fixture
def qa(tmp_path):
    """Four of the toy world's test questions."""
    from sleuth.build import load_split
    from sleuth.config import Config

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"id": q.id, "question": q.text, "golden_answers": list(q.golden_answers)})
                            + "\n" for q in load_split("world:test", Config())[:4]))
    return path


def test_eval_uses_the_web_api(serper, qa, tmp_path, monkeypatch, capsys):
    url, seen = serper
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    before = len(seen)
    rc = main(["eval", "--model", "tiny", "--web", "serper", "--web-base-url", url, "--data", str(qa),
               "--out", str(tmp_path / "eval"), "--max-turns", "1", "--json"])
    assert rc == 0
    assert [b["q"] for b in seen[before:]][:1] == ["sleuth start-up check"]  # the probe went to the API
    assert "serper web search" in (tmp_path / "eval" / "report.md").read_text()
    # (the untrained tiny model answers these at greedy without searching; the train test samples searches)


def test_train_searches_the_web_api(serper, tmp_path, monkeypatch):
    url, seen = serper
    monkeypatch.setenv("SERPER_API_KEY", KEY)
    before = len(seen)
    rc = main(["train", "--config", TINY, "--out", str(tmp_path / "run"), "--json",
               "--set", "retrieval.kind=web", "--set", f"retrieval.web_base_url={url}",
               "--set", "train.total_steps=1", "--set", "train.questions_per_step=8", "--set", "train.eval_limit=1",
               "--set", "train.save_every=0"])
    assert rc == 0
    queries = [b["q"] for b in seen[before:]]  # the untrained tiny model, sampling, searches now and then
    assert "sleuth start-up check" in queries and len(queries) > 1  # the probe, then the rollouts' searches
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert step["rollout/searches_mean"] > 0 and step["rollout/failed_search_trajectories"] == 0


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_missing_key_is_one_line_naming_the_variable(command, qa, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    argv = (["eval", "--model", "tiny", "--web", "serper", "--data", str(qa), "--out", str(tmp_path / "e")]
            if command == "eval" else
            ["train", "--config", TINY, "--out", str(tmp_path / "r"), "--set", "retrieval.kind=web"])
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("sleuth: error:") and "SERPER_API_KEY" in last and "Traceback" not in err, err
