"""``sleuth serve``: argument errors, and a real process serving a BM25 index built on the fly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sleuth.cli import main
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.client import RemoteRetriever

pytestmark = pytest.mark.component

ROWS = [
    {"id": "p0", "contents": '"Paris"\nParis is the capital of France.'},
    {"id": "p1", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "p2", "contents": '"Rome"\nRome is the capital of Italy.'},
]


def test_cli_does_not_import_the_server_stack_and_shares_the_token_variable():
    code = ("import sys, argparse, sleuth.retrieval.serve_cli as m; "
            "m.register(argparse.ArgumentParser().add_subparsers()); "
            "print(any(m.split('.')[0] in ('httpx', 'fastapi', 'uvicorn') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    from sleuth.retrieval import client, serve_cli

    assert serve_cli.TOKEN_ENV == client.TOKEN_ENV


def test_argument_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["serve"]) == 2
    assert "--index DIR" in capsys.readouterr().err
    assert main(["serve", "--index", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "--index", str(tmp_path), "--topk", "0"]) == 2
    assert "default topk" in capsys.readouterr().err
    assert main(["serve", "--index", str(tmp_path), "--body-timeout", "0"]) == 2
    assert "--body-timeout) must be > 0" in capsys.readouterr().err
    assert main(["serve", "--index", str(tmp_path), "--cache-mb", "-1"]) == 2
    assert "--cache-mb) must be >= 0" in capsys.readouterr().err
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(ROWS[0]) + "\n")
    assert main(["serve", "--corpus", str(corpus), "--query-prefix", "query: "]) == 2
    assert "--query-prefix/--passage-prefix apply to a dense --index" in capsys.readouterr().err


def test_serve_a_corpus_over_loopback_with_a_token(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = os.environ | {"SLEUTH_RETRIEVAL_TOKEN": "tok", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sleuth", "serve", "--corpus", str(corpus), "--port", "0",
         "--cache-mb", "16", "--body-timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()  # "serving Search-R1 /retrieve at http://127.0.0.1:PORT/retrieve ..."
        assert "http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" at ")[1].split()[0]
        deadline = time.monotonic() + 30
        with RemoteRetriever(url, token="tok", retries=0) as r:
            while True:  # the URL is printed just before uvicorn starts listening
                try:
                    got = r.search(["capital of Italy", "Berlin"], 2)
                    break
                except RetrievalError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        assert got[0][0].id == "p2" and got[0][0].title == "Rome" and got[1][0].id == "p1"
        assert isinstance(got[0][0].score, float) and got[0][0].score > got[0][1].score
        with RemoteRetriever(url, retries=0) as anonymous, pytest.raises(RetrievalError, match="401"):
            anonymous.search(["Rome"], 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
