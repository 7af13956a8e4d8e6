"""``sleuth data filter``: a gold answer in the top-k passages retrieved with the question (BM25 over a tiny
corpus; every expectation below worked out by hand from the corpus), the rows written as read, no file
overwritten, clear errors."""

import json

import pytest

from sleuth.data.answer_filter import answer_found
from sleuth.data.qa import load_questions
from sleuth.types import Passage, Question
from tests.helpers.cli import cli_runner

pytestmark = pytest.mark.component

CORPUS = [
    {"id": "fr", "contents": '"France"\nParis is the capital of France and its largest city.'},
    {"id": "jp", "title": "Japan", "text": "Tokyo is the capital of Japan."},
    {"id": "fuji", "title": "Mount Fuji", "text": "The tallest mountain of the country, 3,776 m high."},
    {"id": "wine", "title": "Bordeaux", "text": "Wine from the south west of France is famous."},
]
QUESTIONS = [  # (id, question, golds, found in the top 1, found in the top 2)
    ("q1", "what is the capital of France", ["Paris"], True, True),
    ("q2", "who wrote moby dick", ["Herman Melville"], False, False),
    ("q3", "what is the capital of Japan", ["Kyoto", "Tokyo"], True, True),  # the second gold
    ("q4", "which mountain is 3,776 m high", ["Mount Fuji"], True, True),  # in the title only
    ("q5", "wine of the south west of France", ["capital"], False, True),  # in the 2nd passage only
]


@pytest.fixture
def run(monkeypatch, capsys):
    return cli_runner(monkeypatch, capsys, ["sleuth.data.cli"])


@pytest.fixture
def files(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": g, "data_source": "nq",
                                      "note": f"kept as read {i}"}) + "\n"
                          for i, q, g, _, _ in QUESTIONS))  # fmt: skip
    return corpus, qa


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("k, column", [(1, 3), (2, 4)])
def test_found_in_the_top_k_as_worked_out(run, files, tmp_path, k, column):
    corpus, qa = files
    rc, out, _ = run("data", "filter", "--data", qa, "--corpus", corpus, "--topk", k, "--out", tmp_path / "kept.jsonl",
                     "--missed", tmp_path / "missed.jsonl", "--json")
    assert rc == 0, out
    want = [row[0] for row in QUESTIONS if row[column]]
    kept, missed = _rows(tmp_path / "kept.jsonl"), _rows(tmp_path / "missed.jsonl")
    assert [r["id"] for r in kept] == want
    assert [r["id"] for r in missed] == [row[0] for row in QUESTIONS if not row[column]]
    assert all(r["note"] == f"kept as read {r['id']}" for r in kept + missed)  # every field kept
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["n"] == 5 and summary["found"] == len(want) and summary["kept"] == len(want)
    assert summary["by_source"] == {"nq": {"n": 5, "found": len(want)}}
    assert f"nq: the answer in the top {k} for {len(want)} of 5 questions" in out
    assert len(load_questions(tmp_path / "kept.jsonl")) == len(want)  # the written file loads as QA data


def test_answer_found_reads_the_title_and_only_the_top_k():
    class Fixed:  # a retriever that returns these passages whatever the query
        def search(self, queries, k):
            return [[Passage("a", "Herman Melville", "An American writer."),
                     Passage("b", "", "Moby-Dick is a novel by Herman Melville.")]
                    for _ in queries]  # fmt: skip

    q = [Question(id="q", text="who wrote moby dick", golden_answers=("Herman Melville",), data_source="nq"),
         Question(id="r", text="who wrote moby dick", golden_answers=("novel",), data_source="nq")]
    assert answer_found(q, Fixed(), 1) == [True, False]  # the title holds Melville; "novel" is 2nd only
    assert answer_found(q, Fixed(), 2) == [True, True]


def test_never_overwrites_and_clear_errors(run, files, tmp_path):
    corpus, qa = files
    existing = tmp_path / "kept.jsonl"
    existing.write_text("mine\n")
    rc, _, err = run("data", "filter", "--data", qa, "--corpus", corpus, "--out", existing)
    assert rc == 2 and "exists" in err and existing.read_text() == "mine\n"
    rc, _, err = run("data", "filter", "--data", qa, "--out", tmp_path / "new.jsonl")
    assert rc == 2 and "--corpus FILE, --index DIR or --retriever-url URL (got 0" in err
    rc, _, err = run("data", "filter", "--data", qa, "--corpus", corpus, "--out", tmp_path / "a.jsonl",
                     "--missed", tmp_path / "a.jsonl")
    assert rc == 2 and "same file" in err
    rc, _, err = run("data", "filter", "--data", qa, "--corpus", corpus, "--out", tmp_path / "a.parquet")
    assert rc == 2 and "ending in .jsonl" in err and not (tmp_path / "a.parquet").exists()
    rc, _, err = run("data", "filter", "--data", tmp_path / "none.jsonl", "--corpus", corpus)
    assert rc == 2 and "none.jsonl" in err and "no such QA file" in err
    assert not (tmp_path / "new.jsonl").exists()


def test_limit_counts_per_source(run, files, tmp_path):
    corpus, qa = files
    rc, out, _ = run("data", "filter", "--data", qa, "--corpus", corpus, "--topk", 1, "--limit", 2, "--json")
    assert rc == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["found"] == 1 and "out" not in summary  # q1 found, q2 not
