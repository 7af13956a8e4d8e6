"""The typed eval summary: fields, the results.json layout of ``to_dict`` (keys and their order as
written before the summary was typed), the read-only mapping view; and the reward step's scorer
shared with eval."""

import json

import pytest

from sleuth.eval.metrics import EvalPerf, EvalSummary, SourceSummary, score_trajectory, summarize
from sleuth.reward.trajectory import answer_scores, assign_rewards, reward_metrics
from sleuth.types import Question, Segment, StopReason, Trajectory

pytestmark = pytest.mark.unit

FIGURES = ["n", "em", "cover_em", "f1", "searches", "turns", "retrieval_hit", "tokens", "sampled_tokens",
           "stop_reasons"]


def _row(qid, src, em, judge="absent", errors=0):
    row = {"id": qid, "data_source": src, "em": em, "f1": em, "cover_em": em, "searches": 1, "turns": 2,
           "retrieval_hit": 1.0, "tokens": 10, "sampled_tokens": 5, "stop_reason": "answered",
           "retrieval_errors": errors}
    if judge != "absent":
        row["judge"] = judge
    return row


def test_summary_is_typed_and_writes_the_results_json_layout():
    s = summarize([_row("a", "nq", 1.0), _row("b", "hotpotqa", 0.0, errors=2)])
    assert isinstance(s, EvalSummary) and isinstance(s.by_source["nq"], SourceSummary)
    assert (s.n, s.em, s.by_source["nq"].em, s.macro["em"], s.retrieval_errors) == (2, 0.5, 1.0, 0.5, 2)
    assert not s.judged and s.perf is None
    d = s.to_dict()
    assert list(d) == FIGURES + ["by_source", "macro", "retrieval_errors", "retrieval_error_questions"]
    assert list(d["by_source"]) == ["hotpotqa", "nq"] and list(d["by_source"]["nq"]) == FIGURES
    s.perf = EvalPerf(seconds=2.0, generate_s=1.0, retrieve_s=0.5, questions_per_s=1.0)
    assert list(s.to_dict())[-1] == "perf"
    assert list(s.to_dict()["perf"]) == ["seconds", "generate_s", "retrieve_s", "questions_per_s"]
    assert "ranks" in EvalPerf(ranks=2).to_dict()
    json.dumps(s.to_dict())


def test_judge_figures_are_there_only_when_judged():
    s = summarize([_row("a", "nq", 1.0, judge=1.0), _row("b", "nq", 0.0, judge=None), _row("c", "x", 0.0)])
    assert s.judged and (s.judge, s.judge_failures) == (1.0, 1)
    assert s.by_source["nq"].judged and not s.by_source["x"].judged
    d = s.to_dict()
    assert list(d)[-2:] == ["judge", "judge_failures"] and "judge" not in d["by_source"]["x"]
    all_failed = summarize([_row("a", "nq", 1.0, judge=None)])
    assert all_failed.judged and all_failed.judge is None and all_failed.to_dict()["judge"] is None


def test_the_mapping_view_reads_like_the_json_form():
    s = summarize([_row("a", "nq", 1.0)])
    assert s["em"] == s.em and s["by_source"]["nq"]["n"] == 1 and s.get("judge") is None
    assert "judge" not in s and "perf" not in s and set(s) == set(s.to_dict())
    with pytest.raises(KeyError):
        s["judge"]
    with pytest.raises(TypeError):
        s["em"] = 0.0  # read-only: set the attribute


def _traj(answer, response, golds=("Paris",)):
    q = Question("q/1", "capital of France?", golds, "nq")
    return Trajectory(q, 0, [Segment.injected([1], "P"), Segment.sampled([2], [-0.1], response)], answer=answer,
                      stop_reason=StopReason.ANSWERED)


def test_the_reward_step_and_eval_share_one_scorer():
    good = _traj("Paris", "<think>x</think>\n<answer> Paris </answer>")
    part = _traj("Paris France", "<answer> Paris France </answer>")
    none = _traj(None, "no tags at all")
    trajs = [good, part, none]
    for t in trajs:
        row, s = score_trajectory(t), answer_scores(t)
        assert (row["em"], row["cover_em"], row["f1"]) == (s.em, s.cover_em, s.f1)
    rewards = assign_rewards(trajs, lambda response, golds: float("Paris" in response))
    assert rewards == [1.0, 1.0, 0.0] == [t.reward for t in trajs]
    m = reward_metrics(trajs, rewards)
    assert m["reward/mean"] == pytest.approx(2 / 3) and m["reward/em"] == pytest.approx(1 / 3)
    assert m["reward/f1"] == pytest.approx((1 + 2 / 3) / 3)  # "paris france" vs "paris": P 1/2, R 1
    assert m["reward/std"] == pytest.approx((2 / 9) ** 0.5)
    assert m["reward/format"] == pytest.approx(1 / 3)  # only the first has <think> before <answer>
    assert reward_metrics([], [])["reward/std"] == 0.0


def test_a_search_cost_is_subtracted_per_executed_search():
    from sleuth.reward.trajectory import assign_rewards
    from sleuth.types import Question, Trajectory

    trajs = [Trajectory(question=Question(f"q{i}", "q", ("Paris",)), sample_index=0, segments=[], num_searches=n)
             for i, n in enumerate((0, 1, 3))]
    assert assign_rewards(trajs, lambda response, golds: 1.0, search_cost=0.1) == pytest.approx([1.0, 0.9, 0.7])
    assert [t.reward for t in trajs] == pytest.approx([1.0, 0.9, 0.7])
    assert assign_rewards(trajs, lambda response, golds: 1.0) == [1.0, 1.0, 1.0]
