"""Small pure pieces of evaluation: path parsing, judge verdicts, the no-search prompt, resume files,
turn records."""

import json

import pytest

from sleuth.data.prepare import dataset_and_split
from sleuth.errors import UserError
from sleuth.eval.evaluate import DIRECT_INSTRUCTION, NoSearchFormat
from sleuth.records import PASSAGE_TEXT_LIMIT, prompt_record, segment_records, segment_roles, turn_records
from sleuth.eval.judge import JudgeError, chat_url, parse_verdict
from sleuth.eval.report import check_setting, read_finished
from sleuth.rollout.formats import get_format
from sleuth.types import Question, SearchOutcome, Segment, StopReason, Trajectory, Turn

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path, default, expected", [
    ("FlashRAG_datasets/nq/test.jsonl", "test", ("nq", "test")),
    ("FlashRAG_datasets/hotpotqa/dev.jsonl", "test", ("hotpotqa", "dev")),
    ("shared/data/dev/2wikimultihopqa.jsonl", "test", ("2wikimultihopqa", "dev")),
    ("fixtures/flashrag_nq_test.jsonl", "train", ("flashrag_nq", "test")),
    ("data/popqa.parquet", "test", ("popqa", "test")),  # no split named: the default
    ("data/popqa.parquet", "train", ("popqa", "train")),
])  # fmt: skip
def test_dataset_and_split(path, default, expected):
    assert dataset_and_split(path, default) == expected


def test_judge_verdicts_and_url():
    assert parse_verdict("Yes.") == 1.0
    assert parse_verdict("no, it is not") == 0.0
    assert parse_verdict("Incorrect") == 0.0
    assert parse_verdict("The answer is correct") == 1.0
    with pytest.raises(JudgeError):
        parse_verdict("maybe")
    assert chat_url("http://127.0.0.1:9/v1/") == "http://127.0.0.1:9/v1/chat/completions"
    assert chat_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_no_search_format_changes_only_the_prompt():
    base = get_format("search_r1")
    fmt = NoSearchFormat(base)
    q = Question("q/1", "who wrote hamlet", ["Shakespeare"])
    assert fmt.user_content(q) == DIRECT_INSTRUCTION.format(question="who wrote hamlet?")
    assert "<search>" not in fmt.user_content(q)
    assert fmt.stop_sequences == base.stop_sequences
    assert fmt.parse_action("<answer> x </answer>").answer == "x"
    assert fmt.name == "search_r1+no_search" and fmt.system_prompt is None
    tool = NoSearchFormat(get_format("tool_call"))  # no system prompt or tool schema describing search
    assert get_format("tool_call").system_prompt and tool.system_prompt is None and tool.tools is None
    assert tool.tool_messages is True  # everything else is the wrapped format's


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_read_finished_drops_a_half_written_last_line(tmp_path, capsys):
    path = _write(tmp_path / "t.jsonl", '{"id": "a", "em": 1}\n{"id": "b", "em": 0}\n{"id": "c", "e')
    rows = read_finished(path)
    assert sorted(rows) == ["a", "b"]
    assert path.read_text() == '{"id": "a", "em": 1}\n{"id": "b", "em": 0}\n'  # rewritten without it
    assert "half-written last line 3" in capsys.readouterr().err


def test_read_finished_completes_a_whole_last_line_without_newline(tmp_path):
    path = _write(tmp_path / "t.jsonl", '{"id": "a"}\n{"id": "b"}')
    assert sorted(read_finished(path)) == ["a", "b"]
    assert path.read_text().endswith('{"id": "b"}\n')  # the next append starts on its own line


def test_read_finished_rejects_a_bad_middle_line(tmp_path):
    path = _write(tmp_path / "t.jsonl", '{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(UserError, match=r"t.jsonl:2: not a trajectory row"):
        read_finished(path)
    assert read_finished(tmp_path / "missing.jsonl") == {}


def test_read_finished_leaves_rows_with_failed_searches_to_retry(tmp_path):
    """A row whose search failed (as earlier versions stored them) is not done: the rerun retries
    it; a retried row stored after it counts, whatever the order."""
    path = _write(tmp_path / "t.jsonl", '{"id": "a", "retrieval_errors": 0}\n{"id": "b", "retrieval_errors": 2}\n'
                                        '{"id": "c", "retrieval_errors": 1}\n{"id": "c", "retrieval_errors": 0}\n'
                                        '{"id": "d"}\n{"id": "e", "retrieval_errors": 1}')
    assert sorted(read_finished(path)) == ["a", "c", "d"]
    assert read_finished(path)["c"] == {"id": "c", "retrieval_errors": 0}
    assert path.read_text().count("\n") == 6  # the file keeps its lines (the last one completed)


def test_failed_searches_are_counted_per_question_and_the_retry_is_explained():
    from sleuth.eval.cli import budget_warnings
    from sleuth.eval.metrics import summarize
    from sleuth.eval.report import render_report

    def row(qid, errors):
        return {"id": qid, "data_source": "nq", "em": 0.0, "f1": 0.0, "cover_em": 0.0, "searches": 1, "turns": 2,
                "retrieval_hit": 0.0, "tokens": 10, "sampled_tokens": 5, "stop_reason": "answered",
                "retrieval_errors": errors}

    summary = summarize([row("a", 2), row("b", 0), row("c", 1)])
    assert (summary["retrieval_errors"], summary["retrieval_error_questions"]) == (3, 2)
    (warning,) = budget_warnings(summary)
    assert warning.startswith("3 searches failed in 2 questions") and "rerun with the same --out" in warning
    md = render_report(summary, {"model": "m"}, None)
    assert "**3 searches failed** in 2 questions" in md and "rerun the same command (same `--out`)" in md
    assert "searches failed" not in render_report(summarize([row("b", 0)]), {"model": "m"}, None)


def test_check_setting_records_then_refuses_a_different_one(tmp_path):
    out = tmp_path / "ev"
    check_setting(out, {"model": "a", "topk": 3})
    assert json.loads((out / "setting.json").read_text()) == {"model": "a", "topk": 3}
    check_setting(out, {"model": "a", "topk": 3})  # same: fine
    with pytest.raises(UserError, match=r"different setting(.|\n)*topk: recorded 3, now 5"):
        check_setting(out, {"model": "a", "topk": 5})


def test_turn_records_pair_searches_with_executed_queries():
    fmt = get_format("search_r1")
    q = Question("q/1", "capital of France", ["Paris"])
    segs = [
        Segment.injected([1], "PROMPT"),
        Segment.sampled([2], [-0.1], "<think>hm</think><search> france capital </search>"),
        Segment.injected([3], "<information>Doc 1(Title: Paris) ...</information>"),
        Segment.sampled([4], [-0.1], "<search> again </search>"),  # final round: not executed
    ]
    # the rollout loop records each turn as it handles it: the first search executed, the second not
    long = "x" * (PASSAGE_TEXT_LIMIT + 5)
    executed = SearchOutcome([["p1", "p2"]], [["Paris", "France"]], segs[2].text,
                             texts=[["Paris is the capital.", long]])
    traj = Trajectory(q, 0, segs, stop_reason=StopReason.MAX_TURNS, queries=["france capital"],
                      passage_ids=[["p1", "p2"]], num_turns=2, num_searches=1,
                      turns=[Turn(segs[1].text, fmt.parse_action(segs[1].text), search=executed),
                             Turn(segs[3].text, fmt.parse_action(segs[3].text))])
    turns = turn_records(traj)
    assert turns[0] == {"text": segs[1].text, "action": "search", "query": "france capital",
                        "passage_ids": ["p1", "p2"], "titles": ["Paris", "France"],
                        "searches": [{"query": "france capital", "passages": [
                            {"id": "p1", "title": "Paris", "text": "Paris is the capital."},
                            {"id": "p2", "title": "France", "text": "x" * PASSAGE_TEXT_LIMIT}]}]}
    assert turns[1] == {"text": segs[3].text, "action": "search", "query": "again", "executed": False}
    assert segment_records(traj, 6) == [
        {"kind": "sampled", "role": "sampled", "n_tokens": 1, "text": segs[1].text[:6]},
        {"kind": "injected", "role": "information", "n_tokens": 1, "text": segs[2].text[:6]},
        {"kind": "sampled", "role": "sampled", "n_tokens": 1, "text": segs[3].text[:6]}]
    assert prompt_record(traj, 3) == {"n_tokens": 1, "text": "PRO"}


def test_segment_roles_come_from_the_turn_before_each_injection():
    """An observation follows an executed search (``search_error`` when it failed), the corrective
    message an invalid turn, and whatever else is injected (a nudge, also one before any turn) is a
    nudge: read from the turns, never from the text."""
    fmt = get_format("search_r1")
    q = Question("q/1", "capital of France", ["Paris"])
    texts = ["<search> a </search>", "<search> b </search>", "nonsense", "<answer> Paris </answer>"]
    segs = [Segment.injected([1], "PROMPT"), Segment.injected([1], "nudge first"),
            Segment.sampled([2], [-0.1], texts[0]), Segment.injected([3], "<information>made up</information>"),
            Segment.injected([3], "final nudge"),
            Segment.sampled([2], [-0.1], texts[1]), Segment.injected([3], "error text"),
            Segment.sampled([2], [-0.1], texts[2]), Segment.injected([3], "<information>looks like one</information>"),
            Segment.sampled([2], [-0.1], texts[3])]
    ok = SearchOutcome([["p1"]], [["Paris"]], "obs")
    failed = SearchOutcome([[]], [[]], "err", error="ConnectionError: refused")
    turns = [Turn(texts[0], fmt.parse_action(texts[0]), search=ok), Turn(texts[1], fmt.parse_action(texts[1]), search=failed),
             Turn(texts[2], fmt.parse_action(texts[2])), Turn(texts[3], fmt.parse_action(texts[3]))]
    traj = Trajectory(q, 0, segs, turns=turns)
    assert segment_roles(traj) == ["nudge", "sampled", "information", "nudge", "sampled", "search_error",
                                   "sampled", "corrective", "sampled"]
    assert turn_records(traj)[1]["error"] == "ConnectionError: refused"
    assert turn_records(traj)[1]["searches"] == [{"query": "b", "passages": []}]


def test_default_format(tmp_path, monkeypatch):
    from sleuth.eval.defaults import resolve_run_defaults

    def default_format(model):
        args = _flags(model)
        resolve_run_defaults(args)
        return args.format

    assert default_format("tiny") == "search_r1_tiny"  # the embedded model's short prompt
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("rollout:\n  format: r1_searcher\n")
    assert default_format("Qwen/Qwen2.5-3B-Instruct") == "search_r1"  # a hub name never reads ./config.yaml
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002" / "policy"
    ckpt.mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("rollout:\n  format: tool_call\n")
    assert default_format(str(tmp_path / "run")) == "tool_call"  # a run dir
    assert default_format(str(ckpt.parent)) == "tool_call"  # a checkpoint inside it


def _flags(model, **given):
    """The eval/ask flags as argparse leaves them when none of the budget flags is given."""
    import argparse

    base = dict(model=model, format=None, topk=None, max_turns=None, max_tokens_per_turn=None,
                max_context_tokens=None, set=[])
    return argparse.Namespace(**{**base, **given})


def test_a_run_is_evaluated_with_the_budget_it_was_trained_with(tmp_path, capsys):
    from sleuth.eval.common import rollout_config
    from sleuth.eval.defaults import resolve_run_defaults

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000040").mkdir(parents=True)
    (run / "config.yaml").write_text(
        "retrieval:\n  topk: 1\nrollout:\n  format: search_r1_tiny\n  max_turns: 2\n  max_tokens_per_turn: 40\n"
        "  max_obs_tokens: 128\n  max_context_tokens: 512\n  use_chat_template: false\n  temperature: 0.7\n"
        "  max_invalid: 0\n  final_nudge: \"\\nAnswer now: <answer>\"\n")
    args = _flags(str(run / "checkpoints" / "step_000040"))
    taken = resolve_run_defaults(args)
    assert (args.format, args.topk, args.max_turns, args.max_tokens_per_turn, args.max_context_tokens) == \
        ("search_r1_tiny", 1, 2, 40, 512)
    assert "temperature" not in taken  # sampling settings are not budgets: eval stays greedy
    assert "topk 1" in capsys.readouterr().err  # the user sees what was taken from the run
    rcfg = rollout_config(args)
    assert (rcfg.max_obs_tokens, rcfg.use_chat_template, rcfg.max_turns) == (128, False, 2)
    assert (rcfg.max_invalid, rcfg.final_nudge) == (0, "\nAnswer now: <answer>")  # the protocol it trained in

    # a flag given wins over the run; --set wins over what the run gave to --set-only keys
    args = _flags(str(run), topk=5, max_turns=0, set=["rollout.max_obs_tokens=64"])
    resolve_run_defaults(args)
    rcfg = rollout_config(args)
    assert (args.topk, rcfg.max_turns, rcfg.max_obs_tokens, rcfg.max_tokens_per_turn) == (5, 0, 64, 40)


@pytest.mark.parametrize("given, expected", [([], "hf"), (["--set", "rollout.backend=hf_static"], "hf_static"),
                                             (["--backend", "hf", "--set", "rollout.backend=hf_static"], "hf")])
def test_the_backend_is_the_flag_else_the_set_else_hf(given, expected):
    from sleuth.cli import build_parser
    from sleuth.eval.cli import generation_backend
    from sleuth.eval.common import protocol
    from sleuth.eval.defaults import resolve_run_defaults

    args = build_parser().parse_args(["eval", "--model", "Qwen/Qwen2.5-3B-Instruct", "--data", "q.jsonl",
                                      "--out", "o", *given])
    resolve_run_defaults(args)
    assert generation_backend(args, protocol(args)[0]) == expected


def test_other_models_get_the_built_in_budget_and_tiny_the_demos(tmp_path, monkeypatch):
    from sleuth.eval.common import rollout_config
    from sleuth.eval.defaults import resolve_run_defaults
    from sleuth.toy.recipe import demo_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("retrieval:\n  topk: 1\n")  # never read for a hub name
    args = _flags("Qwen/Qwen2.5-3B-Instruct")
    assert resolve_run_defaults(args) == {}
    rcfg = rollout_config(args)
    assert (args.format, args.topk, args.max_turns, rcfg.max_tokens_per_turn, rcfg.use_chat_template) == \
        ("search_r1", 3, 4, 500, True)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.yaml").write_text("rollout: [unclosed\n")  # not a run's config: ignored
    args = _flags(str(tmp_path / "broken"))
    assert resolve_run_defaults(args) == {} and args.topk == 3
    demo = demo_config("tiny", steps=1, seed=0, fmt="search_r1_tiny")
    args = _flags("tiny")
    resolve_run_defaults(args)
    assert (args.topk, args.max_turns, args.max_tokens_per_turn) == \
        (demo.retrieval.topk, demo.rollout.max_turns, demo.rollout.max_tokens_per_turn) == (1, 2, 40)


@pytest.mark.parametrize("given, message", [
    (dict(topk=0), "--topk must be >= 1, got 0"),
    (dict(max_turns=-1), "--max-turns must be >= 0, got -1"),
    (dict(max_tokens_per_turn=0), "--max-tokens-per-turn must be >= 1, got 0"),
    (dict(batch_size=0), "--batch-size must be >= 1, got 0"),
])
def test_budget_flags_out_of_range_name_the_flag(given, message):
    from sleuth.eval.defaults import resolve_run_defaults

    with pytest.raises(UserError, match=message):
        resolve_run_defaults(_flags("Qwen/Qwen2.5-3B-Instruct", **given))


def test_ask_refuses_a_question_that_is_not_utf8():
    from sleuth.eval.ask import ask_one

    undecodable = b"caf\xe9 who?".decode("utf-8", errors="surrogateescape")  # how argv keeps such bytes
    with pytest.raises(ValueError, match="is not valid UTF-8 text"):
        ask_one(undecodable, None, None, None, None, None, topk=1)


def test_eval_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    from sleuth.cli import main

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "1", "question": "who?", "golden_answers": ["x"]}) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p1", "contents": '"T"\nbody'}) + "\n")
    taken = tmp_path / "taken"
    taken.write_text("a file")
    assert main(["eval", "--model", "tiny", "--data", str(qa), "--corpus", str(corpus), "--out", str(taken)]) == 2
    assert f"--out {taken} is a file, not a directory" in capsys.readouterr().err
    assert taken.read_text() == "a file"


def test_budget_warnings_when_the_budget_decided_the_questions():
    from sleuth.eval.cli import budget_warnings

    assert budget_warnings({"stop_reasons": {"answered": 0.9, "context_full": 0.1}}) == []
    (warning,) = budget_warnings({"stop_reasons": {"answered": 0.5, "context_full": 0.5}})
    assert warning.startswith("50% of trajectories stopped at context_full; --max-context-tokens")


def test_failed_searches_and_judge_calls_are_warned():
    from sleuth.eval.cli import budget_warnings

    warnings = budget_warnings({"stop_reasons": {}, "retrieval_errors": 3, "judge_failures": 2})
    assert [w.split(" ", 2)[:2] for w in warnings] == [["3", "searches"], ["2", "LLM-judge"]]
