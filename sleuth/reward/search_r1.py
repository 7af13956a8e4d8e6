"""Search-R1's outcome rewards, reproduced branch for branch.

* :func:`em_reward` is ``verl/utils/reward_score/qa_em.py::compute_score_em`` (the reward of the
  paper's main runs): ``score`` for an exact match, ``format_score`` for a wrong answer, 0 when the
  response holds no answer. :func:`cover_em_reward` is its ``compute_score_subem`` sibling.
* :func:`format_reward` is the v0.3 composite ``qa_em_format.py::compute_score_em`` with the same
  parameter names (``structure_format_score`` = lambda_format, ``retrieval_score`` =
  lambda_retrieval). Its branches, with the values for lambda_f = 0.2, final_format_score = 0.1,
  lambda_r = 0.1 in brackets (``hit`` = a gold answer is in a retrieved block):

  - no answer,   valid format:   lambda_f + (lambda_r if hit)   [0.2 / 0.3]
  - no answer,   invalid format: 0                              [0]
  - exact match, valid format:   score                          [1]
  - exact match, invalid format: score - lambda_f               [0.8]
  - wrong,       valid format:   lambda_f + (lambda_r if hit)   [0.2 / 0.3]
  - wrong,       invalid format: final_format_score             [0.1]

  The retrieval hit is only looked at when the format is valid (as in Search-R1). The first
  branch is kept for fidelity but cannot fire: a valid response ends with an answer.
  ``answer_metric="f1"`` (not Search-R1's; ``reward.answer_metric: f1``) pays an answer by its token F1 ``a``
  instead of exact match: the reward moves from the wrong branch (``a`` = 0) to the exact-match branch (``a`` = 1)
  in proportion, ``a * score + (1 - a) * wrong``, so a sentence that holds the gold answer earns a part of the
  step to ``score`` and a shorter one more (R1-Searcher's stage 2 pays F1 for the same reason). An exact match
  counts 1, so with answers that are right or share no word with a gold one the two metrics pay alike.
  ``requires_search=True`` (not Search-R1's; ``reward.format_requires_search``) withholds the shaped terms
  (lambda_f, lambda_r, final_format_score) from a response that made no search answered by its ``<information>``
  block: it earns its answer only (an exact match as above, anything else 0), so a closed-book guess in good form
  no longer earns what a search does. ``answer_requires_search=True`` (not Search-R1's;
  ``reward.answer_requires_search``) pays such a response's right answer as a wrong one: with both options and the
  shaped terms at 0, the reward is 1 for an exact match after a search answered, else 0.
* :func:`stage1_reward` is not Search-R1's: R1-Searcher's stage-1 reward
  (:func:`sleuth.reward.r1_searcher.stage1_reward`) read in Search-R1's tags, for a first stage that pays a base
  model for calling the search engine in the format Search-R1's prompt teaches (``reward.kind:
  search_r1_stage1``).

Inputs are the *response* (see :mod:`sleuth.reward.tags` for why that equals Search-R1's
prompt + response on real transcripts) and the gold answers (a string or a list of strings).
One deliberate difference: a response without an answer is "no answer" here, while Search-R1
falls back to its instruction's example answer ``Beijing`` (which can only matter for a
question whose gold is Beijing).
"""

from __future__ import annotations

from sleuth.reward.metrics import Golds, as_answer_list, cover_em, exact_match, token_f1
from sleuth.reward.tags import extract_answer, information_blocks, is_valid_format, retrieval_hit, search_calls

ANSWER_METRICS = ("em", "f1")
"""What :func:`format_reward` judges an answer by (``reward.answer_metric``)."""


def em_reward(response: str, golden_answers: Golds, *, format_score: float = 0.0, score: float = 1.0) -> float:
    """Search-R1 ``qa_em.compute_score_em``: ``score`` if the extracted answer exactly matches a
    gold answer, ``format_score`` if an answer exists but is wrong, 0.0 if there is none."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    return score if exact_match(answer, golden_answers) else format_score


def cover_em_reward(
    response: str, golden_answers: Golds, *, format_score: float = 0.0, score: float = 1.0
) -> float:
    """Search-R1 ``qa_em.compute_score_subem``: as :func:`em_reward` with cover-EM."""
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    return score if cover_em(answer, golden_answers) else format_score


def format_reward(
    response: str,
    golden_answers: Golds,
    *,
    structure_format_score: float = 0.0,
    final_format_score: float = 0.0,
    retrieval_score: float = 0.0,
    score: float = 1.0,
    answer_metric: str = "em",
    requires_search: bool = False,
    answer_requires_search: bool = False,
) -> float:
    """Search-R1 v0.3 ``qa_em_format.compute_score_em`` (see the module table); ``answer_metric="f1"`` pays
    an answer its token F1's share of the way from the wrong branch to the exact-match one; ``requires_search``
    pays the shaped terms only to a response with a search answered (:func:`searched`), ``answer_requires_search``
    a right answer only to such a response (else it is paid as a wrong one)."""
    golds = as_answer_list(golden_answers)
    valid = is_valid_format(response)
    hit = valid and retrieval_hit(response, golds)
    shaped = structure_format_score + (retrieval_score if hit else 0.0)
    final = final_format_score
    if requires_search and not searched(response):
        shaped = final = 0.0
    answer = extract_answer(response)
    if answer is None:
        return shaped if valid else 0.0
    right, wrong = (score, shaped) if valid else (score - structure_format_score, final)
    if answer_requires_search and not searched(response):
        right = wrong
    if answer_metric not in ANSWER_METRICS:
        raise ValueError(f"answer_metric must be one of {list(ANSWER_METRICS)}, got {answer_metric!r}")
    if answer_metric == "em":
        return right if exact_match(answer, golds) else wrong
    a = 1.0 if exact_match(answer, golds) else token_f1(answer, golds)
    return a * right + (1.0 - a) * wrong


def searched(response: str) -> bool:
    """Whether the response made at least one search and every search got its ``<information>`` block back (the
    environment ran it): what ``requires_search`` and :func:`stage1_reward`'s search term ask for."""
    searches = len(search_calls(response))
    return searches >= 1 and searches == len(information_blocks(response))


def stage1_reward(response: str, golden_answers: Golds, *, answer_term: bool = True) -> float:
    """R1-Searcher's stage-1 terms in Search-R1's tags: +0.5 when the response made at least one search and
    every search got its ``<information>`` block back (the environment ran it), +0.5 when the whole response is
    Search-R1's valid sequence (:func:`sleuth.reward.tags.check_format`: think, searches, a final answer);
    with ``answer_term`` (R1-Searcher's released code) first +1 when the answer covers a gold (cover-EM),
    else -1, no answer included. Range [-1, 2]; [0, 1] without the answer term (the paper's prose). The
    invalid-action message holds ``<search> and </search>``: read (``reward.read_corrective: true``), it is a search
    with no ``<information>``, so such a response earns no search term."""
    reward = 0.0
    if answer_term:
        answer = extract_answer(response)
        reward = 1.0 if answer is not None and cover_em(answer, golden_answers) else -1.0
    if searched(response):
        reward += 0.5
    if is_valid_format(response):
        reward += 0.5
    return reward
