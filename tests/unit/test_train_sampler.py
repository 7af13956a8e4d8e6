"""Question sampler cursor and the collapse watch."""

import pytest

from sleuth.train.sampler import CollapseWatch, QuestionSampler
from sleuth.types import Question

pytestmark = pytest.mark.unit


def _qs(n):
    return [Question(f"q{i}", f"question {i}", [str(i)]) for i in range(n)]


def test_sampler_epochs_cover_every_question_once():
    s = QuestionSampler(_qs(5), seed=3)
    first = [q.id for q in s.next(5)]
    second = [q.id for q in s.next(5)]
    assert sorted(first) == sorted(second) == [f"q{i}" for i in range(5)]
    assert s.state() == {"epoch": 1, "pos": 5, "deferred": []}


def test_sampler_resume_continues_identically():
    a = QuestionSampler(_qs(7), seed=1)
    a.next(4)
    state = a.state()
    expected = [q.id for q in a.next(5) + a.next(5)]  # crosses an epoch boundary
    b = QuestionSampler(_qs(7), seed=1)
    b.load_state(state)
    assert [q.id for q in b.next(5) + b.next(5)] == expected
    c = QuestionSampler(_qs(7), seed=1)  # resumed right after a draw that crossed the boundary
    c.next(4)
    c.next(5)
    d = QuestionSampler(_qs(7), seed=1)
    d.load_state(c.state())
    assert [q.id for q in d.next(5)] == [q.id for q in c.next(5)]


@pytest.mark.parametrize("seed", range(6))
def test_a_draw_across_an_epoch_boundary_never_repeats_a_question(seed):
    """10 questions, 4 per step (``data.limit=10``, ``questions_per_step=4``): step 3 crosses into a
    reshuffled epoch; it used to draw a question twice (the rollout refused the repeated id)."""
    s = QuestionSampler(_qs(10), seed=seed)
    steps = [[q.id for q in s.next(4)] for _ in range(10)]  # 40 draws = 4 epochs
    for ids in steps:
        assert len(set(ids)) == 4, ids
    flat = [i for ids in steps for i in ids]
    for epoch in range(4):  # every epoch still holds each question once
        assert sorted(flat[epoch * 10:(epoch + 1) * 10]) == sorted(q.id for q in _qs(10))
    with pytest.raises(ValueError, match="cannot draw 11 distinct questions from 10"):
        s.next(11)


def test_sampler_rejects_duplicate_ids_and_empty():
    with pytest.raises(ValueError, match="q0"):
        QuestionSampler(_qs(2) + _qs(1))
    with pytest.raises(ValueError, match="train_files"):
        QuestionSampler([])


def test_collapse_watch_needs_fall_and_jump():
    w = CollapseWatch(window=2, reward_drop=0.2, invalid_jump=0.2)
    # reward falls 0.8 -> 0.3 while the invalid rate rises 0.0 -> 0.5: flagged on the 4th step
    assert w.check(0.8, 0.0, 1.0) is None
    assert w.check(0.8, 0.0, 1.0) is None
    assert w.check(0.3, 0.5, 1.0) is None
    msg = w.check(0.3, 0.5, 1.0)
    assert msg is not None and "0.800 -> 0.300" in msg
    # the same fall with a flat invalid rate and entropy is not a collapse
    w2 = CollapseWatch(window=2)
    for r in (0.8, 0.8, 0.3, 0.3):
        out = w2.check(r, 0.1, 1.0)
    assert out is None
