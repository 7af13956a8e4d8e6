"""groups/*: the share of a step's groups that can teach anything, computed by hand on 3 groups."""

import pytest

from sleuth.train.groups import group_diagnostics
from sleuth.types import Question, Trajectory

pytestmark = pytest.mark.unit


def _t(qid: str, answer, queries=(), texts=()):
    q = Question(qid, f"question {qid}", ("Paris",))
    return Trajectory(question=q, sample_index=0, segments=[], answer=answer, queries=list(queries),
                      retrieved_text=list(texts))


def test_three_groups_by_hand():
    trajs = [
        # group a: one right, one wrong -> reward and EM variance, passes; queries "paris", "Paris " -> 1 distinct
        _t("a", "Paris", ["paris"], ["Paris is the capital."]), _t("a", "Rome", ["Paris "], ["Rome."]),
        # group b: both wrong, one truncated (no answer) -> rewards 0 and 0.2 differ, EM does not
        _t("b", "Lyon", ["france capital", "lyon"]), _t("b", None, ["capital"], ["Paris, France."]),
        # group c: both right, same reward -> no variance of either kind, passes
        _t("c", "paris"), _t("c", "Paris"),
    ]
    rewards = [1.0, 0.0, 0.0, 0.2, 1.0, 1.0]
    got = group_diagnostics(trajs, rewards)
    assert got == pytest.approx({
        "groups/count": 3.0,
        "groups/reward_variance_count": 2.0, "groups/reward_variance_share": 2 / 3,
        "groups/em_variance_count": 1.0, "groups/em_variance_share": 1 / 3,
        "groups/pass_at_g": 2 / 3,
        "groups/distinct_queries_mean": (1 + 3 + 0) / 3,
        "reward/em_given_answered": 3 / 5,  # Paris, Rome, Lyon, paris, Paris
        "reward/em_given_hit": 1 / 2,  # a's first (right) and b's truncated one read a passage holding Paris
    })


def test_no_answers_and_no_hits_give_zero_not_a_division_error():
    got = group_diagnostics([_t("a", None), _t("a", None)], [0.0, 0.0])
    assert got["reward/em_given_answered"] == got["reward/em_given_hit"] == 0.0
    assert got["groups/reward_variance_share"] == 0.0 and got["groups/pass_at_g"] == 0.0
    with pytest.raises(ValueError, match="2 trajectories but 1 rewards"):
        group_diagnostics([_t("a", None), _t("a", None)], [0.0])
