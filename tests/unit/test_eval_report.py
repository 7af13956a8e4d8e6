"""Eval aggregation, the comparison report and the published numbers, against hand-computed values."""

import json

import pytest

from sleuth.eval.metrics import EvalPerf, summarize
from sleuth.eval.report import (
    DATASETS,
    comparison_table,
    load_published,
    recorded_prompt_mode,
    render_report,
    results_document,
    setting_differences,
)

pytestmark = pytest.mark.unit


def _row(src, em, f1, cover, searches, stop="answered", judge="absent"):
    row = {"id": f"{src}/{em}/{f1}/{searches}", "data_source": src, "em": em, "f1": f1, "cover_em": cover,
           "searches": searches, "turns": searches + 1, "retrieval_hit": 1.0 if searches else 0.0,
           "tokens": 10 * (searches + 1), "sampled_tokens": 5, "stop_reason": stop}
    if judge != "absent":
        row["judge"] = judge
    return row


ROWS = [
    _row("nq", 1.0, 1.0, 1.0, 2, judge=1.0),
    _row("nq", 0.0, 0.5, 1.0, 0, judge=None),  # a judge failure
    _row("hotpotqa", 0.0, 0.0, 0.0, 1, stop="max_turns", judge=0.0),
]


def test_summarize_hand_computed():
    s = summarize(ROWS)
    assert s["n"] == 3
    assert s["em"] == pytest.approx(1 / 3)  # (1 + 0 + 0) / 3 questions (micro)
    assert s["f1"] == pytest.approx(0.5)  # (1 + 0.5 + 0) / 3
    assert s["cover_em"] == pytest.approx(2 / 3)  # (1 + 1 + 0) / 3
    assert s["searches"] == pytest.approx(1.0)  # (2 + 0 + 1) / 3
    assert s["turns"] == pytest.approx(2.0)  # (3 + 1 + 2) / 3
    assert s["tokens"] == pytest.approx(20.0)  # (30 + 10 + 20) / 3
    assert s["stop_reasons"] == {"answered": pytest.approx(2 / 3), "max_turns": pytest.approx(1 / 3)}
    nq, hp = s["by_source"]["nq"], s["by_source"]["hotpotqa"]
    assert (nq["n"], nq["em"], nq["f1"], nq["searches"]) == (2, 0.5, 0.75, 1.0)  # (1+0)/2, (1+.5)/2, (2+0)/2
    assert (hp["n"], hp["em"], hp["cover_em"]) == (1, 0.0, 0.0)
    # macro = mean over sources: em (0.5 + 0) / 2, cover (1 + 0) / 2
    assert s["macro"]["em"] == pytest.approx(0.25)
    assert s["macro"]["cover_em"] == pytest.approx(0.5)
    # judge: mean over judged rows (1.0, 0.0) = 0.5, the failure is counted, not scored
    assert s["judge"] == pytest.approx(0.5) and s["judge_failures"] == 1
    assert nq["judge"] == 1.0 and nq["judge_failures"] == 1
    assert hp["judge"] == 0.0 and hp["judge_failures"] == 0


def test_summarize_without_judge_has_no_judge_keys():
    s = summarize([{k: v for k, v in r.items() if k != "judge"} for r in ROWS])
    assert "judge" not in s and "judge" not in s["by_source"]["nq"]


OURS = {"model": "tiny", "corpus": "wiki_dev.jsonl", "retriever": "bm25", "topk": 3, "max_turns": 4}
PUB = {
    "sources": {"paper": {"citation": "A paper", "url": "http://x", "verified_via": "read"}},
    "entries": [
        {"method": "M1", "model": "Qwen", "algorithm": "PPO", "source": "paper", "table": "Table 9",
         "setting": {"corpus": "wiki-18", "retriever": "e5", "topk": 3, "max_turns": 4},
         "scores": {"nq": 0.4, "hotpotqa": 0.2, "popqa": 0.6, "avg": 0.35}},
        {"method": "Same", "model": "tiny", "source": "paper",
         "setting": {"corpus": "wiki_dev.jsonl", "retriever": "bm25", "topk": 3, "max_turns": 4},
         "scores": {"nq": 0.1, "avg": 0.1}},
    ],
}


def test_setting_differences_names_each_key():
    diffs = setting_differences(OURS, PUB["entries"][0]["setting"] | {"model": "Qwen"})
    assert diffs == ["model: ours tiny vs Qwen", "corpus: ours wiki_dev.jsonl vs wiki-18", "retriever: ours bm25 vs e5"]
    assert setting_differences(OURS, PUB["entries"][1]["setting"] | {"model": "tiny"}) == []


def test_comparison_table_layout_and_values():
    lines, notes = comparison_table(summarize(ROWS), OURS, PUB["entries"])
    # paper column order, only datasets someone has: NQ, PopQA (published only), HotpotQA
    assert lines[0] == "| Method | NQ | PopQA | HotpotQA | Avg | Avg (ours) |"
    ours = lines[2].split(" | ")
    assert ours[1:] == ["50.0", "–", "0.0", "25.0", "25.0 |"]  # nq em 0.5, hotpotqa 0, macro 0.25
    m1 = lines[3]
    assert "†1" in m1 and "[paper Table 9]" in m1
    # Avg (ours) of M1 = mean over our datasets (nq 0.4, hotpotqa 0.2) = 30.0; its own avg 35.0
    assert m1.endswith("| 40.0 | 60.0 | 20.0 | 35.0 | 30.0 |")
    assert "†" not in lines[4]  # same setting: no mark; it lacks hotpotqa so no Avg (ours)
    assert lines[4].endswith("| 10.0 | – | – | 10.0 | – |")
    assert len(notes) == 1 and notes[0].startswith("1. M1 Qwen PPO: model: ours tiny vs Qwen")


def test_render_report_and_results_document():
    s = summarize(ROWS)
    s.perf = EvalPerf(seconds=2.0, questions_per_s=1.5, generate_s=1.0, retrieve_s=0.5)
    md = render_report(s, OURS | {"format": "search_r1"}, PUB)
    assert md.startswith("# Evaluation: tiny\n\nExact match (EM, %), greedy decoding.")
    sampled = render_report(s, OURS | {"greedy": False, "samples": 8, "temperature": 0.7}, None)
    assert "Exact match (EM, %), sampled at temperature 0.7, mean over 8 samples a question." in sampled
    one = render_report(s, OURS | {"greedy": False, "samples": 1, "temperature": 1.0}, None)
    assert "Exact match (EM, %), sampled at temperature 1." in one and "greedy" not in one
    assert "| prompts |" not in md  # not known: no row
    cut = render_report(s, OURS | {"greedy": False, "samples": 2, "temperature": 1.0, "top_p": 0.9, "top_k": 50}, None)
    assert "sampled at temperature 1, top-p 0.9, top-k 50, mean over 2 samples a question." in cut
    with_rollout = OURS | {"rollout": {"use_chat_template": True}}
    rows = render_report(s, with_rollout, None, prompts="plain text (why)").splitlines()
    assert rows[rows.index('| rollout | {"use_chat_template": true} |') + 1] == "| prompts | plain text (why) |"
    assert results_document(s, OURS, None, prompt_mode="p")["prompt_mode"] == "p"
    assert "prompt_mode" not in results_document(s, OURS, None)
    assert "| n per source | hotpotqa 1, nq 2 (total 3) |" in md
    assert "| judge | judge failures |" in md
    assert "**paper**: A paper" in md
    doc = results_document(s, OURS, PUB)
    assert doc["published"][0]["differences"][0] == "model: ours tiny vs Qwen"
    assert doc["published"][1]["differences"] == []
    json.dumps(doc)  # serialisable


def test_published_numbers_are_consistent():
    doc = load_published()
    assert doc["entries"], "published.json has no entries"
    for e in doc["entries"]:
        assert e["source"] in doc["sources"], e
        assert e["metric"] == "em"
        scores = e["scores"]
        assert set(scores) == set(DATASETS) | {"avg"}
        # the source's own avg must be the mean of its 7 columns (to its 3-digit rounding)
        assert sum(scores[d] for d in DATASETS) / 7 == pytest.approx(scores["avg"], abs=0.0015), e
        assert all(0.0 <= v <= 1.0 for v in scores.values())
    # one anchor figure checked by hand against the source: 7B Search-R1-base (PPO) avg EM 0.431
    anchor = [e for e in doc["entries"] if e["method"] == "Search-R1-base" and e["model"] == "Qwen2.5-7B"
              and e["algorithm"] == "PPO"]
    assert anchor and anchor[0]["scores"]["avg"] == 0.431 and anchor[0]["scores"]["nq"] == 0.480


def test_load_published_rejects_an_incomplete_entry(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"entries": [{"method": "x"}]}))
    with pytest.raises(ValueError, match="entry 0 has no 'model'"):
        load_published(path)


# --- a baseline beside this run (sleuth eval --baseline DIR) ----------------------------------

BASE_ROWS = [  # the baseline on the same 3 questions: nq worse, hotpotqa better
    _row("nq", 0.0, 0.5, 0.0, 0),
    _row("nq", 0.0, 0.0, 0.0, 0),
    _row("hotpotqa", 1.0, 1.0, 1.0, 0),
]
SEARCH = {"model": "m", "no_search": False, "retriever": "bm25", "topk": 3, "max_turns": 4, "corpus": "c.jsonl"}
DIRECT = {"model": "m", "no_search": True, "retriever": "none", "topk": None, "max_turns": 0, "corpus": "none"}


def test_baseline_table_hand_computed():
    from sleuth.eval.baseline import baseline_table

    lines = baseline_table(summarize(ROWS), summarize(BASE_ROWS), "search", "no search")
    assert lines[0] == ("| Source | n | EM search | EM no search | Δ EM | F1 search | F1 no search | Δ F1 |")
    assert lines[2:] == [
        # ours nq: EM (1+0)/2 = 50, F1 (1+.5)/2 = 75; baseline nq: EM 0, F1 (.5+0)/2 = 25
        "| NQ | 2 | 50.0 | 0.0 | +50.0 | 75.0 | 25.0 | +50.0 |",
        # ours hotpotqa 0 / 0; baseline 1 / 1
        "| HotpotQA | 1 | 0.0 | 100.0 | -100.0 | 0.0 | 100.0 | -100.0 |",
        # macro = mean of the two sources: ours EM (50+0)/2 = 25, F1 (75+0)/2 = 37.5;
        # baseline EM (0+100)/2 = 50, F1 (25+100)/2 = 62.5
        "| Avg (macro) | 3 | 25.0 | 50.0 | -25.0 | 37.5 | 62.5 | -25.0 |",
        # micro = mean over the 3 questions: ours EM 1/3, F1 1.5/3; baseline EM 1/3, F1 1.5/3 -> no change
        "| All (micro) | 3 | 33.3 | 33.3 | 0.0 | 50.0 | 50.0 | 0.0 |",
    ]
    # two runs of the same kind (two checkpoints, both searching) are told apart as this run / baseline
    same = baseline_table(summarize(ROWS), summarize(BASE_ROWS), "search", "search")
    assert same[0].startswith("| Source | n | EM this run | EM baseline | Δ EM |")


def test_baseline_in_report_and_results_document():
    from sleuth.eval.baseline import setting_label

    s, b = summarize(ROWS), summarize(BASE_ROWS)
    baseline = {"dir": "/runs/direct", "setting": DIRECT, "summary": b}
    md = render_report(s, SEARCH, None, baseline)
    assert "## Beside the baseline: search vs no search" in md
    assert "Baseline: **no search (direct answer)**, model m, from `/runs/direct`" in md
    assert "This run: **search (bm25, top-3, <=4 searches)**" in md
    # the baseline's setting is named where it differs
    assert "no_search: True (this run False); corpus: 'none' (this run 'c.jsonl')" in md
    assert "| NQ | 2 | 50.0 | 0.0 | +50.0 |" in md
    assert md.index("## Beside the baseline") < md.index("## Setting")
    assert "Beside the baseline" not in render_report(s, SEARCH, None)
    doc = results_document(s, SEARCH, None, baseline, question_ids=["a", "b", "c"])
    fig = doc["baseline"]
    assert fig["label"] == setting_label(DIRECT, long=True) == "no search (direct answer)"
    assert fig["summary"]["em"] == pytest.approx(1 / 3) and fig["summary"]["by_source"]["nq"]["f1"] == 0.25
    # delta = ours - baseline: nq EM 0.5 - 0, hotpotqa F1 0 - 1, macro EM 0.25 - 0.5, micro EM 1/3 - 1/3
    assert fig["delta"]["by_source"]["nq"]["em"] == 0.5 and fig["delta"]["by_source"]["hotpotqa"]["f1"] == -1.0
    assert fig["delta"]["macro"]["em"] == pytest.approx(-0.25) and fig["delta"]["em"] == pytest.approx(0.0)
    assert doc["question_ids"] == ["a", "b", "c"]
    json.dumps(doc)
    assert "baseline" not in results_document(s, SEARCH, None)


def _results_dir(tmp_path, ids, data, by_source_n=None):
    """A baseline directory whose results.json covers nq 2, hotpotqa 1 (or ``by_source_n``)."""
    rows = [_row(src, 0.0, 0.0, 0.0, 0) for src in ["nq"] * 2 + ["hotpotqa"]]
    summary = summarize(rows).to_dict()  # as a results.json holds it
    for src, n in (by_source_n or {}).items():
        summary["by_source"][src]["n"] = n
    doc = {"setting": DIRECT | {"data": data}, "summary": summary}
    if ids is not None:
        doc["question_ids"] = ids
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "results.json").write_text(json.dumps(doc))
    return tmp_path


def test_load_baseline_accepts_the_same_questions_and_names_what_differs(tmp_path):
    from sleuth.errors import UserError
    from sleuth.eval.baseline import load_baseline
    from sleuth.types import Question

    qs = [Question("nq/1", "q", ["a"], "nq"), Question("nq/2", "q", ["a"], "nq"),
          Question("hp/3", "q", ["a"], "hotpotqa")]
    data = ["/d/nq.jsonl", "/d/hotpotqa.jsonl"]
    same = _results_dir(tmp_path / "same", ["hp/3", "nq/2", "nq/1"], ["/elsewhere/nq.jsonl", "/e/hotpotqa.jsonl"])
    got = load_baseline(same, qs, data)  # same ids (order and file location do not matter)
    assert got["setting"]["no_search"] is True and got["summary"]["n"] == 3 and got["dir"] == str(same.resolve())
    other = _results_dir(tmp_path / "other", ["nq/1", "nq/9"], ["/d/nq.jsonl"])
    with pytest.raises(UserError) as e:
        load_baseline(other, qs, data)
    msg = str(e.value)
    assert "was run on different data" in msg
    assert "data files: this run ['nq.jsonl', 'hotpotqa.jsonl'], baseline ['nq.jsonl']" in msg
    assert "2 of this run's 3 questions are not in the other run (e.g. hp/3, nq/2)" in msg
    assert "1 of the baseline's 2 questions are not in the other run (e.g. nq/9)" in msg
    # a results.json without question ids: compared by the count per source
    old = _results_dir(tmp_path / "old", None, data, by_source_n={"nq": 5})
    with pytest.raises(UserError, match="nq: this run 2 questions, baseline 5"):
        load_baseline(old, qs, data)
    assert load_baseline(_results_dir(tmp_path / "old_ok", None, data), qs, data)["summary"]["n"] == 3


def test_load_baseline_bad_directories(tmp_path):
    from sleuth.errors import UserError
    from sleuth.eval.baseline import load_baseline

    with pytest.raises(UserError, match=r"no results.json there; give the --out directory of a finished"):
        load_baseline(tmp_path, [], [])
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(UserError, match="not a results.json written by `sleuth eval`"):
        load_baseline(tmp_path, [], [])
    (tmp_path / "results.json").write_text(json.dumps({"setting": {}, "summary": {"n": 1}}))
    with pytest.raises(UserError, match=r"its summary lacks \['em', 'f1', 'by_source', 'macro'\]"):
        load_baseline(tmp_path, [], [])


def test_recorded_prompt_mode_reads_an_earlier_results_json(tmp_path):
    assert recorded_prompt_mode(tmp_path) is None  # no results.json
    (tmp_path / "results.json").write_text(json.dumps({"prompt_mode": "plain text (x)"}))
    assert recorded_prompt_mode(tmp_path) == "plain text (x)"
    for bad in ("{not json", "[1, 2]", json.dumps({"prompt_mode": 3}), json.dumps({})):
        (tmp_path / "results.json").write_text(bad)
        assert recorded_prompt_mode(tmp_path) is None, bad
