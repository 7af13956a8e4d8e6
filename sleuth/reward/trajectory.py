"""Scoring finished trajectories: the reward step of the RL loop and the answer scores eval shares.

* :func:`answer_scores`: EM / cover-EM / F1 of a trajectory's parsed answer. The one scorer behind
  the eval rows (``sleuth.eval.metrics.score_trajectory``) and the trainer's ``reward/em`` and
  ``reward/f1``, so the two always agree.
* :func:`assign_rewards`: the reward step. Applies a reward function (``(response, golds) ->
  float``, see :func:`sleuth.reward.build_reward`) to every trajectory, stores each result in
  ``traj.reward`` (where the advantages and ``samples.jsonl`` read it) and returns them in order.
* :func:`reward_metrics`: the step's ``reward/*`` metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sleuth.records import segment_roles
from sleuth.reward.metrics import AnswerScores, Golds, score_prediction
from sleuth.reward.tags import is_valid_format
from sleuth.types import Trajectory


def answer_scores(traj: Trajectory) -> AnswerScores:
    """EM, cover-EM and F1 of the parsed answer (all 0.0 when the trajectory has none)."""
    return score_prediction(traj.answer, traj.question.golden_answers)


def reward_text(traj: Trajectory, *, read_corrective: bool = True) -> str:
    """The text a reward reads: the response (``traj.response_text``), or with ``read_corrective`` False the
    response without the invalid-action messages the environment injected (``reward.read_corrective``)."""
    if read_corrective:
        return traj.response_text
    return "".join(s.text for s, role in zip(traj.segments[1:], segment_roles(traj)) if role != "corrective")


def assign_rewards(trajs: Sequence[Trajectory], reward_fn: Callable[[str, Golds], float], *,
                   search_cost: float = 0.0, read_corrective: bool = True) -> list[float]:
    """``reward_fn(response_text, golden_answers)`` of each trajectory (:func:`reward_text`), less ``search_cost``
    per search it executed (``reward.search_cost``), stored in ``traj.reward`` and returned (in the order of
    ``trajs``)."""
    rewards = [float(reward_fn(reward_text(t, read_corrective=read_corrective), t.question.golden_answers))
               - search_cost * t.num_searches for t in trajs]  # x - 0.0 is x: no cost changes nothing
    for t, r in zip(trajs, rewards):
        t.reward = r
    return rewards


def reward_metrics(trajs: Sequence[Trajectory], rewards: Sequence[float]) -> dict[str, float]:
    """``reward/mean`` and ``reward/std`` of ``rewards``; ``reward/em``, ``reward/f1`` (of
    :func:`answer_scores`) and ``reward/format`` (share of well-formed responses), means over
    ``trajs``."""
    n = max(len(trajs), 1)
    scores = [answer_scores(t) for t in trajs]
    return {
        "reward/mean": sum(rewards) / n,
        "reward/em": sum(s.em for s in scores) / n,
        "reward/f1": sum(s.f1 for s in scores) / n,
        "reward/format": sum(float(is_valid_format(t.response_text)) for t in trajs) / n,
        "reward/std": float(np.std(rewards)) if rewards else 0.0,
    }
