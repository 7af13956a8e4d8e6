"""``evaluate`` with a scripted policy and an in-memory retriever: exact rows, batching, the
no-search baseline; the on-disk retrieval cache against the retriever it wraps."""

import dataclasses

import pytest

from sleuth.config import RolloutConfig
from sleuth.eval.evaluate import DiskCachedRetriever, evaluate
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.formats import get_format
from sleuth.types import Passage, Question
from tests.helpers.tiny import ScriptedBackend, tiny_tokenizer

pytestmark = pytest.mark.component

CORPUS = [
    Passage("p1", "Paris", "Paris is the capital and largest city of France."),
    Passage("p2", "Rome", "Rome is the capital of Italy."),
    Passage("p3", "Berlin", "Berlin is a city on the Spree."),
]
QUESTIONS = [
    Question("nq/test/1", "What is the capital of France", ["Paris"], "nq"),
    Question("nq/test/2", "What is the capital of Italy", ["Rome"], "nq"),
    Question("hotpotqa/dev/3", "Which city is the capital of France", ["paris", "Paris, France"], "hotpotqa"),
]
SCRIPT = ["<think> I should search. </think>\n<search> capital of France </search>",
          "<think> Found it. </think>\n<answer> Paris </answer>"]
CFG = RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_context_tokens=2048, use_chat_template=False)


class Counting:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return self.inner.search(queries, k)


def _run(batch_size, retriever=None, **kw):
    tok = tiny_tokenizer()
    retriever = retriever or InMemoryRetriever(CORPUS)
    return evaluate(None, tok, QUESTIONS, get_format("search_r1"), retriever, CFG, topk=1,
                    batch_size=batch_size, backend=ScriptedBackend(tok, SCRIPT), **kw)


def test_rows_and_summary_are_exact():
    batches = []
    summary, rows = _run(2, on_batch=batches.append)
    assert [len(b) for b in batches] == [2, 1]  # appended per finished batch
    assert [r["id"] for r in rows] == [q.id for q in QUESTIONS]
    # every row: one search (top-1 = the Paris passage), then the answer "Paris"
    assert [r["em"] for r in rows] == [1.0, 0.0, 1.0]
    assert [r["retrieval_hit"] for r in rows] == [1.0, 0.0, 1.0]  # "Rome" is not in the Paris passage
    assert all(r["searches"] == 1 and r["turns"] == 2 and r["stop_reason"] == "answered" for r in rows)
    turns = rows[0]["turns_detail"]
    assert turns[0]["query"] == "capital of France" and turns[0]["titles"] == ["Paris"]
    assert turns[0]["passage_ids"] == ["p1"]
    assert turns[1] == {"text": turns[1]["text"], "action": "answer", "answer": "Paris"}
    assert "<information>" in rows[0]["response"]
    # summary: micro EM 2/3; nq (1 + 0) / 2, hotpotqa 1; macro (0.5 + 1) / 2
    assert summary["em"] == pytest.approx(2 / 3)
    assert summary["by_source"]["nq"]["em"] == 0.5 and summary["by_source"]["hotpotqa"]["em"] == 1.0
    assert summary["macro"]["em"] == pytest.approx(0.75)
    assert summary["perf"]["questions_per_s"] > 0


def test_batch_size_does_not_change_rows():
    _, one = _run(1)
    _, three = _run(3)
    assert one == three


def test_retrieval_is_batched_and_deduplicated_per_round():
    retr = Counting(InMemoryRetriever(CORPUS))
    _run(3, retriever=retr)
    assert retr.calls == [["capital of France"]]  # 3 rows, one round, one distinct query


def _searches_for_italy(seen: list):
    """A scripted policy that searches on the Italy question and answers Paris elsewhere, recording contexts."""
    def script(context, turn):
        seen.append(context)
        return SCRIPT[0] if "Italy" in context else "<answer> Paris </answer>"

    return script


def _baseline_run(**kw):
    """A baseline eval (``no_search`` or ``rag``) of the scripted policy: ``(contexts, retriever, summary, rows)``."""
    tok, seen = tiny_tokenizer(), []
    retr = Counting(InMemoryRetriever(CORPUS))
    summary, rows = evaluate(None, tok, QUESTIONS, get_format("search_r1"), retr, CFG, topk=1, batch_size=3,
                             backend=ScriptedBackend(tok, _searches_for_italy(seen)), **kw)
    return seen, retr, summary, rows


def test_no_search_never_calls_the_retriever_and_stops_a_search():
    seen, retr, summary, rows = _baseline_run(no_search=True)
    assert retr.calls == []
    assert all("no search engine is available" in c for c in seen)  # the direct-answer prompt
    assert [r["stop_reason"] for r in rows] == ["answered", "max_turns", "answered"]
    assert rows[1]["searches"] == 0 and rows[1]["answer"] is None
    assert rows[1]["turns_detail"][0]["executed"] is False
    assert summary["stop_reasons"]["max_turns"] == pytest.approx(1 / 3)


def test_disk_cache_returns_what_the_retriever_returns(tmp_path):
    inner = Counting(InMemoryRetriever(CORPUS))
    db = tmp_path / "cache.sqlite"
    cached = DiskCachedRetriever(inner, db, "fp-1")
    queries = ["capital of France", "Italy", "capital of France"]
    expected = InMemoryRetriever(CORPUS).search(queries, 2)
    assert cached.search(queries, 2) == expected
    assert inner.calls == [["capital of France", "Italy"]]  # misses only, de-duplicated
    assert (cached.hits, cached.misses) == (0, 2)
    cached.close()
    # a new process (new object, same file): served from disk, scores and raw contents intact
    again = DiskCachedRetriever(inner, db, "fp-1")
    raw = dataclasses.replace(CORPUS[0], raw_contents='"Paris"\nParis is ...')
    assert again.search(["Italy", "capital of France"], 2) == expected[1::-1]
    assert inner.calls == [["capital of France", "Italy"]]
    assert again.hits == 2
    # another k or another index fingerprint is a miss
    again.search(["Italy"], 1)
    DiskCachedRetriever(inner, db, "fp-2").search(["Italy"], 2)
    assert inner.calls[1:] == [["Italy"], ["Italy"]]
    # raw contents survive the round trip (the Search-R1 renderer prints them byte for byte)
    store = DiskCachedRetriever(type("R", (), {"search": lambda self, q, k: [[raw]]})(), db, "fp-raw")
    store.search(["x"], 1)
    assert DiskCachedRetriever(inner, db, "fp-raw").search(["x"], 1) == [[raw]]


def test_disk_cache_does_not_store_failures(tmp_path):
    class Down:
        def search(self, queries, k):
            raise RuntimeError("server down")

    cached = DiskCachedRetriever(Down(), tmp_path / "c.sqlite", "fp")
    with pytest.raises(RuntimeError):
        cached.search(["q"], 1)
    inner = Counting(InMemoryRetriever(CORPUS))
    DiskCachedRetriever(inner, tmp_path / "c.sqlite", "fp").search(["q"], 1)
    assert inner.calls == [["q"]]


def _cli_world(tmp_path, monkeypatch):
    """The tiny test model in ``tmp_path/model`` and the corpus file (returned); the BM25 cache under tmp_path."""
    import json

    from tests.helpers.tiny import tiny_model

    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))  # the on-the-fly BM25 index goes here
    tok = tiny_tokenizer()
    tiny_model(tok, seed=0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n" for p in CORPUS))
    return corpus


def test_eval_cli_search_beside_no_search_baseline(tmp_path, monkeypatch, capsys):
    """Both passes of ``sleuth eval`` with the tiny test model on four questions: the no-search
    baseline, then the search run with ``--baseline``; the report and results.json put the
    baseline's figures (as recorded in its directory) beside this run's."""
    import json

    from sleuth.cli import main

    corpus = _cli_world(tmp_path, monkeypatch)
    data = tmp_path / "qa.jsonl"
    sources = ["nq", "nq", "hotpotqa", "hotpotqa"]
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q.text, "golden_answers": q.golden_answers,
                                        "data_source": src}) + "\n"
                            for i, (q, src) in enumerate(zip(QUESTIONS + QUESTIONS[:1], sources))))  # fmt: skip
    base = ["eval", "--model", str(tmp_path / "model"), "--data", str(data), "--corpus", str(corpus), "--topk", "1",
            "--max-turns", "1", "--max-tokens-per-turn", "12", "--set", "rollout.max_obs_tokens=48", "--no-cache"]
    direct, search = tmp_path / "direct", tmp_path / "search"
    assert main(base + ["--no-search", "--out", str(direct)]) == 0
    # make the baseline's columns recognisable: mark its nq rows right and rewrite its results
    # (a rerun with every question done loads no model and re-reads the rows)
    rows = [json.loads(x) for x in (direct / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["searches"] == 0 for r in rows)
    for r in rows:
        r.update({"em": 1.0, "f1": 1.0} if r["data_source"] == "nq" else {})
    (direct / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(base + ["--no-search", "--out", str(direct)]) == 0
    capsys.readouterr()
    assert main(base + ["--baseline", str(direct), "--out", str(search), "--json"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ours = json.loads((search / "results.json").read_text())
    theirs = json.loads((direct / "results.json").read_text())
    assert ours["setting"]["no_search"] is False and theirs["setting"]["no_search"] is True
    fig = ours["baseline"]
    assert fig["dir"] == str(direct.resolve()) and fig["label"] == "no search (direct answer)"
    assert fig["summary"]["by_source"]["nq"]["em"] == 1.0 == theirs["summary"]["by_source"]["nq"]["em"]
    assert fig["summary"]["em"] == theirs["summary"]["em"] == line["baseline"]["em"]
    nq_ours = ours["summary"]["by_source"]["nq"]["em"]
    assert nq_ours < 1.0  # the random-weight model does not answer both right, so the columns differ
    assert fig["delta"]["by_source"]["nq"]["em"] == pytest.approx(nq_ours - 1.0)
    macro_f1 = ours["summary"]["macro"]["f1"] - theirs["summary"]["macro"]["f1"]
    assert fig["delta"]["macro"]["f1"] == pytest.approx(macro_f1)
    report = (search / "report.md").read_text()
    assert "## Beside the baseline: search vs no search" in report
    assert "| Source | n | EM search | EM no search | Δ EM | F1 search | F1 no search | Δ F1 |" in report
    assert f"| NQ | 2 | {100 * nq_ours:.1f} | 100.0 | {100 * (nq_ours - 1):+.1f} |" in report
    assert "no_search: True (this run False)" in report
    # paired by question: the baseline's nq rows are all right, so every nq difference is <= 0 and its
    # interval ends at or below 0; the same figures in results.json, the --json line and report.md
    paired = fig["paired"]
    assert paired == line["baseline"]["paired"] and paired["overall"]["n"] == 4 and paired["unpaired"] == 0
    nq = paired["by_source"]["nq"]
    assert nq["em_diff"] == pytest.approx(nq_ours - 1.0) and nq["em_ci95"][1] <= 0.0 and nq["gained"] == 0
    assert nq["lost"] == round(2 * (1 - nq_ours))
    assert "Paired by question: this run − baseline" in report and "| All | 4 |" in report
    # other questions (--limit 1: one per data source), or the eval's own directory, are refused before
    # any model loads
    assert main(base + ["--limit", "1", "--baseline", str(direct), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "was run on different data" in err and "2 of the baseline's 4 questions are not in the other run" in err
    assert not (tmp_path / "x").exists()
    assert main(base + ["--baseline", str(search), "--out", str(search)]) == 2
    assert "is this eval's own --out" in capsys.readouterr().err


def test_rag_puts_the_questions_passages_in_the_prompt_and_answers_once():
    """--rag: one search per question, its text the query, before the rollout; the top-k passages in the
    prompt (rendered as an observation, cut to max_obs_tokens); no search turn is executed."""
    from sleuth.eval.rag import RAG_INSTRUCTION, rag_passages
    from sleuth.rollout.formats import normalize_question

    seen, retr, summary, rows = _baseline_run(rag=True)
    tok = tiny_tokenizer()
    assert retr.calls == [[normalize_question(q.text) for q in QUESTIONS]]  # once, before the rollout
    assert len(seen) == 3 and all(RAG_INSTRUCTION.split(";")[0] in c for c in seen)
    assert "Paris is the capital and largest city of France." in seen[0] and "Rome is the capital" in seen[1]
    assert [r["stop_reason"] for r in rows] == ["answered", "max_turns", "answered"]  # the search is not run
    assert [r["searches"] for r in rows] == [0, 0, 0] and rows[1]["turns_detail"][0]["executed"] is False
    assert summary["em"] == pytest.approx(2 / 3)
    cut = rag_passages(QUESTIONS[:1], InMemoryRetriever(CORPUS), get_format("search_r1"), tok, k=3, max_tokens=8)
    assert len(tok(cut["nq/test/1"], add_special_tokens=False)["input_ids"]) <= 8 + 4  # the cut, then "\n\n"
    with pytest.raises(ValueError, match="two baselines"):
        _run(3, no_search=True, rag=True)


def test_eval_cli_rag_baseline_beside_the_search_run(tmp_path, monkeypatch, capsys):
    import json

    from sleuth.cli import main

    corpus = _cli_world(tmp_path, monkeypatch)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q.text, "golden_answers": q.golden_answers,
                                        "data_source": q.data_source}) + "\n" for i, q in enumerate(QUESTIONS)))
    base = ["eval", "--model", str(tmp_path / "model"), "--data", str(data), "--corpus", str(corpus), "--topk", "2",
            "--max-turns", "1", "--max-tokens-per-turn", "8", "--set", "rollout.max_obs_tokens=48", "--no-cache"]
    assert main(base + ["--rag", "--no-search", "--out", str(tmp_path / "x")]) == 2
    assert "--rag and --no-search are two baselines" in capsys.readouterr().err
    assert main(base + ["--rag", "--out", str(tmp_path / "rag")]) == 0
    rag = json.loads((tmp_path / "rag" / "results.json").read_text())
    assert rag["setting"]["rag"] is True and rag["setting"]["max_turns"] == 0 and rag["setting"]["topk"] == 2
    plain = "plain text (the tokenizer has no chat template)"  # the test tokenizer has none
    assert rag["prompt_mode"] == plain and f"| prompts | {plain} |" in (tmp_path / "rag" / "report.md").read_text()
    assert '"use_chat_template": true' in (tmp_path / "rag" / "report.md").read_text()  # asked, beside what it became
    rows = [json.loads(x) for x in (tmp_path / "rag" / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["searches"] == 0 and "<information>" in r["prompt"]["text"] for r in rows)
    assert main(base + ["--baseline", str(tmp_path / "rag"), "--out", str(tmp_path / "search")]) == 0
    report = (tmp_path / "search" / "report.md").read_text()
    assert "## Beside the baseline: search vs RAG" in report and "RAG (bm25, top-2 in the prompt)" in report
    (tmp_path / "rag" / "report.md").unlink()
    capsys.readouterr()
    assert main(base + ["--rag", "--out", str(tmp_path / "rag")]) == 0  # every question done: no model loads
    assert "3 questions, 3 already done" in capsys.readouterr().err
    assert f"| prompts | {plain} |" in (tmp_path / "rag" / "report.md").read_text()  # as the first run recorded
