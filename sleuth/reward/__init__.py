"""Rewards: answer normalisation, EM / cover-EM / F1, format and retrieval terms.

Modules, in the order a reader needs them:

* :mod:`sleuth.reward.metrics`: SQuAD normalisation, exact match, cover-EM, token F1.
* :mod:`sleuth.reward.tags`: the final answer of a response, the format check, the retrieval hit.
* :mod:`sleuth.reward.search_r1`: Search-R1's EM reward and v0.3 format/retrieval composite.
* :mod:`sleuth.reward.r1_searcher`: R1-Searcher's stage-1 and stage-2 rewards.
* :mod:`sleuth.reward.score_file`: scoring jsonl files of responses (``sleuth reward score``).
* :mod:`sleuth.reward.trajectory`: rewards and answer scores of finished trajectories (the RL
  loop's reward step, shared with eval).

Every reward is a pure function ``(response, golden_answers) -> float``; :func:`build_reward`
turns a :class:`sleuth.config.RewardConfig` into one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from sleuth.errors import ConfigError
from sleuth.reward import r1_searcher, search_r1
from sleuth.reward.metrics import (
    AnswerScores,
    Golds,
    as_answer_list,
    cover_em,
    exact_match,
    normalize_answer,
    score_prediction,
    token_f1,
)
from sleuth.reward.tags import check_format, extract_answer, is_valid_format, retrieval_hit

if TYPE_CHECKING:
    from sleuth.config import RewardConfig

RewardFn = Callable[[str, Golds], float]


def f1_reward(response: str, golden_answers: Golds) -> float:
    """Token F1 of the extracted answer (0.0 when the response holds no answer)."""
    return score_prediction(extract_answer(response), golden_answers).f1


REWARD_KINDS = ("em", "f1", "cover_em", "search_r1_v03", "search_r1_stage1", "r1_searcher_stage1", "r1_searcher_stage2")


def build_reward(cfg: "RewardConfig") -> RewardFn:
    """The reward function named by ``cfg.kind`` with the config's coefficients bound."""
    kinds: dict[str, RewardFn] = {
        "em": search_r1.em_reward,
        "f1": f1_reward,
        "cover_em": search_r1.cover_em_reward,
        "search_r1_v03": partial(
            search_r1.format_reward,
            structure_format_score=cfg.format_score,
            final_format_score=cfg.final_format_score,
            retrieval_score=cfg.retrieval_score,
            answer_metric=cfg.answer_metric,
            requires_search=cfg.format_requires_search,
            answer_requires_search=cfg.answer_requires_search,
        ),
        "search_r1_stage1": search_r1.stage1_reward,
        "r1_searcher_stage1": r1_searcher.stage1_reward,
        "r1_searcher_stage2": r1_searcher.stage2_reward,
    }
    if cfg.kind not in kinds:
        raise ConfigError(f"unknown reward.kind {cfg.kind!r}; choose one of {list(REWARD_KINDS)}")
    unread = ignored_settings(cfg)
    if unread:
        warnings.warn(f"reward.kind {cfg.kind} ignores {', '.join(unread)}: they are search_r1_v03's (a staged "
                      "recipe's first stage reads none of them; otherwise set reward.kind=search_r1_v03 or drop them)")
    return kinds[cfg.kind]


# Settings only search_r1_v03 reads (their defaults leave every other kind as it is).
V03_ONLY = ("format_score", "retrieval_score", "final_format_score", "answer_metric", "format_requires_search",
            "answer_requires_search")


def ignored_settings(cfg: "RewardConfig") -> list[str]:
    """The ``reward.*`` settings ``cfg`` sets away from their defaults that its kind never reads (``name=value``;
    none for search_r1_v03)."""
    if cfg.kind == "search_r1_v03":
        return []
    default = type(cfg)()
    return [f"reward.{k}={getattr(cfg, k)}" for k in V03_ONLY if getattr(cfg, k) != getattr(default, k)]


__all__ = [
    "AnswerScores",
    "REWARD_KINDS",
    "RewardFn",
    "as_answer_list",
    "build_reward",
    "check_format",
    "cover_em",
    "exact_match",
    "extract_answer",
    "f1_reward",
    "ignored_settings",
    "is_valid_format",
    "normalize_answer",
    "retrieval_hit",
    "score_prediction",
    "token_f1",
]
