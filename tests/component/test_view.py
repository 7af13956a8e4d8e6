"""``sleuth view``'s server side: the JSONL index (torn lines, growth, rewrites), filters, paging,
compare and pairs, the read-only and loopback guards, path traversal; no browser (see
tests/browser for the page itself)."""

import json
import socket
import time

import pytest
from fastapi.testclient import TestClient

from sleuth.cli import main
from sleuth.view.app import create_app
from sleuth.view.store import Filter, JsonlIndex, Source, ViewError, normalize

pytestmark = pytest.mark.component


def sample(step, k, *, source="nq", stop="answered", reward=1.0, answer="Paris", golds=("Paris",), queries=("q",),
           question=None):
    return {"step": step, "question_id": f"{source}/dev/{k}", "question": question or f"question {k} about {source}",
            "golden_answers": list(golds), "data_source": source, "sample_index": 0, "stop_reason": stop,
            "answer": answer, "reward": reward, "em": float(answer in golds), "f1": float(answer in golds),
            "searches": len(queries), "queries": list(queries), "passage_ids": [["p1"]] * len(queries),
            "turns_detail": [], "prompt": {"n_tokens": 3, "text": "P"},
            "segments": [{"kind": "sampled", "role": "sampled", "n_tokens": 2, "text": "<answer> x </answer>"}]}


def write_jsonl(path, rows, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


@pytest.fixture()
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [sample(1, 0), sample(1, 1, source="hotpotqa", stop="max_turns", reward=0.0, answer=None),
            sample(2, 0, answer="Rome", reward=0.2, queries=("capital of france", "paris")),
            sample(2, 2, source="hotpotqa", stop="invalid_action", reward=0.0, answer=None, queries=())]
    write_jsonl(run / "samples.jsonl", rows)
    write_jsonl(run / "metrics.jsonl", [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.1}])
    (run / "config.yaml").write_text("model:\n  name_or_path: tiny\n")
    return run


def client(*dirs, **kw):
    sources = [Source(d) for d in dirs]
    for s in sources:
        s.poke()
        s.samples.wait(60)
        s.metrics.wait(60)
    return TestClient(create_app(sources, **kw), base_url="http://127.0.0.1:8765")


def test_index_skips_a_torn_last_line_until_it_is_complete_and_counts_bad_lines(tmp_path):
    path = tmp_path / "samples.jsonl"
    whole = json.dumps(sample(3, 9))
    write_jsonl(path, [sample(1, 0)], tail="not json\n" + whole[:25])
    idx = JsonlIndex(path)
    idx.refresh()
    assert len(idx) == 1 and idx.skipped == 1 and idx.torn_tail
    with open(path, "a") as f:  # the writer finishes the line, then appends one more
        f.write(whole[25:] + "\n" + json.dumps(sample(4, 1)) + "\n")
    idx.refresh()
    assert len(idx) == 3 and not idx.torn_tail and idx.skipped == 1
    assert idx.read(1) == normalize(sample(3, 9)) and idx.cols.step == [1, 3, 4]
    assert idx.cols.by_qid == {"nq/dev/0": [0], "nq/dev/9": [1], "nq/dev/1": [2]}
    write_jsonl(path, [sample(7, 5)])  # rewritten shorter (a resumed run truncated its log): indexed again
    idx.refresh()
    assert len(idx) == 1 and idx.generation == 1 and idx.cols.step == [7]
    with pytest.raises(IndexError):
        idx.read(1)
    # replaced by a longer file under the same name (written beside, then renamed over it): indexed again
    write_jsonl(tmp_path / "new.jsonl", [sample(1, 0, question="x" * 50), sample(2, 1), sample(3, 2)])
    (tmp_path / "new.jsonl").replace(path)
    idx.refresh()
    assert idx.generation == 2 and idx.cols.step == [1, 2, 3] and idx.read(0)["question"] == "x" * 50


def test_index_reads_across_chunk_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr("sleuth.view.store.CHUNK_BYTES", 7)  # every line spans several reads
    rows = [sample(i, i, question="é" * (i * 3)) for i in range(20)]
    write_jsonl(tmp_path / "s.jsonl", rows)
    idx = JsonlIndex(tmp_path / "s.jsonl")
    idx.refresh()
    assert [idx.read(i)["question"] for i in range(20)] == [r["question"] for r in rows]


def test_normalize_fills_what_older_logs_lack():
    old = {"step": 1, "question_id": "hotpotqa/dev/3", "question": "q", "golden_answers": ["The Beatles"],
           "answer": "beatles", "queries": ["a", "b"], "reward": 0.2}
    row = normalize(old)
    assert row["data_source"] == "hotpotqa" and row["em"] == 1.0 and row["f1"] == 1.0 and row["searches"] == 2
    row = normalize({"id": "x", "answer": None, "golden_answers": ["y"]})  # an eval row without scores
    assert row["question_id"] == "x" and row["data_source"] == "unknown" and row["em"] == 0.0 and row["searches"] == 0


def test_filters_select_by_each_field(run_dir):
    idx = JsonlIndex(run_dir / "samples.jsonl")
    idx.refresh()
    c, n = idx.cols, len(idx)
    assert Filter().matches(c, n) == [0, 1, 2, 3]
    assert Filter(data_source="hotpotqa").matches(c, n) == [1, 3]
    assert Filter(stop_reason="max_turns").matches(c, n) == [1]
    assert Filter(step_min=2).matches(c, n) == [2, 3] and Filter(step_max=1).matches(c, n) == [0, 1]
    assert Filter(reward_min=0.1, reward_max=0.5).matches(c, n) == [2]
    assert Filter(em=1.0).matches(c, n) == [0] and Filter(em=0.0).matches(c, n) == [1, 2, 3]
    assert Filter(searches_min=2).matches(c, n) == [2] and Filter(searches_max=0).matches(c, n) == [3]
    assert Filter(text="CAPITAL of").matches(c, n) == [2]  # a query, any case
    assert Filter(text="question 2").matches(c, n) == [3]  # a question
    assert Filter(question_id="nq/dev/0").matches(c, n) == [0, 2]
    assert Filter(data_source="nq", em=0.0).matches(c, n) == [2]
    assert Filter().matches(c, 2) == [0, 1]  # only the rows indexed so far


def test_api_pages_filters_and_reads_records(run_dir):
    api = client(run_dir)
    info = api.get("/api/info").json()["sources"][0]
    assert info["kind"] == "run" and info["samples"] == 4 and info["metric_rows"] == 2 and info["indexed"]
    assert info["facets"] == {"data_sources": {"nq": 2, "hotpotqa": 2},
                              "stop_reasons": {"answered": 2, "max_turns": 1, "invalid_action": 1}, "steps": [1, 2]}
    assert "name_or_path: tiny" in info["config"]
    page = api.get("/api/samples", params={"limit": 3}).json()
    assert page["total"] == 4 and [r["i"] for r in page["rows"]] == [3, 2, 1]  # newest first
    page = api.get("/api/samples", params={"limit": 3, "offset": 3}).json()
    assert [r["i"] for r in page["rows"]] == [0]
    page = api.get("/api/samples", params={"order": "oldest", "data_source": "hotpotqa", "em": 0}).json()
    assert [(r["i"], r["stop_reason"]) for r in page["rows"]] == [(1, "max_turns"), (3, "invalid_action")]
    assert api.get("/api/samples", params={"q": "paris"}).json()["total"] == 1
    record = api.get("/api/sample", params={"i": 2}).json()["record"]
    assert record["answer"] == "Rome" and record["queries"] == ["capital of france", "paris"]
    assert api.get("/api/sample", params={"i": 4}).status_code == 404
    assert api.get("/api/sample", params={"src": 1}).status_code == 404
    assert api.get("/api/samples", params={"limit": 0}).status_code == 422
    assert api.get("/api/samples", params={"limit": 501}).status_code == 422
    metrics = api.get("/api/metrics", params={"since": 1}).json()
    assert metrics["rows"] == [{"step": 2, "reward/mean": 0.1}] and metrics["next"] == 2


def test_a_growing_run_is_picked_up(run_dir):
    api = client(run_dir)
    with open(run_dir / "samples.jsonl", "a") as f:
        f.write(json.dumps(sample(3, 5)) + "\n")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "reward/mean": 0.9}) + "\n")
    deadline = time.monotonic() + 60  # a hang guard: each request pokes the indexer, which runs on a thread
    while True:
        total = api.get("/api/samples").json()["total"]
        rows = api.get("/api/metrics", params={"since": 2}).json()["rows"]
        if (total == 5 and rows) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert total == 5 and rows == [{"step": 3, "reward/mean": 0.9}]
    assert api.get("/api/info").json()["sources"][0]["facets"]["data_sources"] == {"nq": 3, "hotpotqa": 2}


def test_compare_and_pairs_match_questions_across_directories(tmp_path, run_dir):
    base, trained = tmp_path / "base", tmp_path / "trained"
    for d, answers in ((base, ["Paris", "Rome", "Oslo"]), (trained, ["Rome", "Rome", "Paris"])):
        d.mkdir()
        write_jsonl(d / "trajectories.jsonl",
                    [{**sample(None, k, answer=a), "id": f"nq/dev/{k}", "step": None} for k, a in enumerate(answers)])
        (d / "results.json").write_text(json.dumps({"summary": {"em": 0.5, "by_source": {}}, "question_ids": ["x"],
                                                    "prompt_mode": "plain text"}))
    api = client(base, trained, run_dir)
    info = api.get("/api/info").json()["sources"]
    assert [s["kind"] for s in info] == ["eval", "eval", "run"]
    # the question list left out; the prompt mode kept (the setting tab shows it beside setting.json)
    assert info[0]["results"] == {"summary": {"em": 0.5, "by_source": {}}, "prompt_mode": "plain text"}
    (base / "results.json").write_text(json.dumps({"summary": {"em": 0.75, "by_source": {"nq": {}}}}))
    assert api.get("/api/info").json()["sources"][0]["results"]["summary"]["em"] == 0.75  # rewritten: read again
    out = api.get("/api/pairs", params={"a": 0, "b": 1}).json()
    assert (out["gained"], out["lost"], out["total"]) == (1, 1, 3)  # q2 gained, q0 lost
    changed = api.get("/api/pairs", params={"a": 0, "b": 1, "changed": True}).json()
    assert [(r["question_id"], r["a"]["em"], r["b"]["em"]) for r in changed["rows"]] == [
        ("nq/dev/0", 1.0, 0.0), ("nq/dev/2", 0.0, 1.0)]
    cmp = api.get("/api/compare", params={"qid": "nq/dev/0"}).json()
    assert [(s["name"], s["total"]) for s in cmp["sources"]] == [("base", 1), ("trained", 1), ("run", 2)]
    assert [r["step"] for r in cmp["sources"][2]["records"]] == [1, 2]  # the run's samples across steps
    assert [r["answer"] for r in cmp["sources"][0]["records"]] == ["Paris"]


def test_read_only_loopback_and_security_headers(run_dir):
    api = client(run_dir)
    page = api.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "unsafe-inline" not in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert api.get("/static/app.js").status_code == 200 and api.get("/static/style.css").status_code == 200
    for method in ("post", "put", "delete"):
        assert getattr(api, method)("/api/samples").status_code == 405
    evil = TestClient(api.app, base_url="http://evil.example:8765")  # a DNS-rebinding page's requests
    assert evil.get("/api/info").status_code == 400
    open_to_all = TestClient(create_app([Source(run_dir)], loopback_only=False), base_url="http://10.0.0.5:8765")
    assert open_to_all.get("/api/info").status_code == 200  # --host 0.0.0.0: the user chose the network


def _raw_get(port, target):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_nothing_outside_the_shipped_files_is_served(run_dir):
    """Raw request targets (no client normalises them): traversal in every spelling is a 404, and
    the run's own files are not served either (the API reads records by row number only)."""
    from sleuth.retrieval.serve_cli import ServerThread

    secret = run_dir.parent / "secret.txt"
    secret.write_text("SECRET")
    (run_dir / "other.txt").write_text("SECRET")
    with ServerThread(create_app([Source(run_dir)])) as server:
        for target in ("/static/../../secret.txt", "/static/..%2f..%2fsecret.txt", "/static/%2e%2e/%2e%2e/secret.txt",
                       "/../secret.txt", "/static//etc/passwd", "/static/app.js/../../other.txt", "/other.txt",
                       "/samples.jsonl", "/static/samples.jsonl", "/api/../secret.txt", "/%2e%2e/secret.txt"):
            status, body = _raw_get(server.port, target)
            assert status in (400, 404), (target, status)
            assert b"SECRET" not in body and b"root:" not in body, target
        status, body = _raw_get(server.port, "/static/app.js")
        assert status == 200 and b"createTextNode" in body


def test_view_command_refuses_what_it_cannot_open(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "holds none of metrics.jsonl" in err and "trajectories.jsonl" in err
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "empty"), "--port", "70000"]) == 2
    with pytest.raises(ViewError, match="not a directory"):
        Source(tmp_path / "missing")


def test_view_listens_on_loopback_by_default():
    from sleuth.cli import build_parser

    args = build_parser().parse_args(["view", "somewhere"])
    assert args.host == "127.0.0.1" and args.dirs == ["somewhere"]
