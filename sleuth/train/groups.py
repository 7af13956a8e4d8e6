"""Which of a step's groups can teach anything: the diagnostics every step logs (``groups/*``).

GRPO (and RLOO, Dr. GRPO) compares the samples of one question with each other: a group whose rewards
are all equal gets advantage 0 on every token and adds no policy gradient (only the KL and entropy
terms), yet pays for its logprob passes and its forward and backward. These figures say how much of a
step is such dead weight, and whether what is alive teaches reading or only answering:

* ``groups/count``; ``groups/reward_variance_share`` and ``_count``: groups whose rewards differ;
  ``groups/em_variance_share`` and ``_count``: groups whose exact match differs (right and wrong
  answers side by side);
* ``groups/pass_at_g``: share of groups with at least one exact match (pass@G of the step);
* ``groups/distinct_queries_mean``: distinct search queries (normalised) a group issued, over all
  its samples and turns;
* ``reward/em_given_answered``: exact match among trajectories that end with a parsed answer (how many
  do: ``rollout/answered_frac``); ``reward/em_given_hit``: exact match among trajectories whose
  retrieved passages hold a gold answer (the reading rate); 0 where the condition holds for none.

Groups are the questions (``Trajectory.group_id``); under torchrun every rank reports its own groups'
shares and the step's figure is their mean (ranks hold equal numbers of whole groups).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sleuth.reward.metrics import normalize_answer
from sleuth.reward.tags import answer_in_texts
from sleuth.reward.trajectory import answer_scores
from sleuth.types import Trajectory


def group_diagnostics(trajs: Sequence[Trajectory], rewards: Sequence[float]) -> dict[str, float]:
    """The ``groups/*`` figures and the answered / hit conditionals of one step's trajectories."""
    if len(trajs) != len(rewards):
        raise ValueError(f"{len(trajs)} trajectories but {len(rewards)} rewards")
    em = [answer_scores(t).em for t in trajs]
    by_group: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        by_group[t.group_id].append(i)
    n_groups = max(len(by_group), 1)
    reward_var = sum(len({rewards[i] for i in rows}) > 1 for rows in by_group.values())
    em_var = sum(len({em[i] for i in rows}) > 1 for rows in by_group.values())
    passed = sum(any(em[i] == 1.0 for i in rows) for rows in by_group.values())
    queries = [len({normalize_answer(q) for i in rows for q in trajs[i].queries}) for rows in by_group.values()]
    answered = [i for i, t in enumerate(trajs) if t.answer is not None]
    hit = [i for i, t in enumerate(trajs) if answer_in_texts(t.retrieved_text, t.question.golden_answers)]
    return {
        "groups/count": float(len(by_group)),
        "groups/reward_variance_count": float(reward_var),
        "groups/reward_variance_share": reward_var / n_groups,
        "groups/em_variance_count": float(em_var),
        "groups/em_variance_share": em_var / n_groups,
        "groups/pass_at_g": passed / n_groups,
        "groups/distinct_queries_mean": sum(queries) / n_groups,
        "reward/em_given_answered": sum(em[i] for i in answered) / len(answered) if answered else 0.0,
        "reward/em_given_hit": sum(em[i] for i in hit) / len(hit) if hit else 0.0,
    }
