"""Search-R1 rewards: the EM reward and the v0.3 format/retrieval composite, hand-computed."""

import json
from pathlib import Path

import pytest

from sleuth.config import RewardConfig
from sleuth.reward import REWARD_KINDS, build_reward, f1_reward
from sleuth.reward.search_r1 import cover_em_reward, em_reward, format_reward, stage1_reward

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parents[1] / "fixtures" / "reward_searchr1_transcripts.jsonl"
ROWS = {r["id"]: r for r in map(json.loads, FIXTURE.read_text(encoding="utf-8").splitlines())}

LAMBDAS = dict(structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1)

SEARCH = "<think>t</think><search>q</search>\n\n<information>Doc 1 Paris is the capital.</information>\n\n"


def test_em_reward():
    assert em_reward("<think>t</think><answer> paris </answer>", ["Paris"]) == 1.0
    assert em_reward("<answer>Rome</answer>", ["Paris"], format_score=0.1) == 0.1  # answer, wrong
    assert em_reward("<think>Paris", ["Paris"], format_score=0.1) == 0.0  # no answer at all
    assert em_reward("<answer>The Paris</answer>", "Paris", score=2.0) == 2.0  # bare-string gold
    assert cover_em_reward("<answer>Paris, France</answer>", ["Paris"]) == 1.0
    assert cover_em_reward("<answer>France</answer>", ["Paris"], format_score=0.1) == 0.1


@pytest.mark.parametrize(
    "response, expected",
    [
        # valid + exact match -> score = 1
        ("<think>t</think><answer>Paris</answer>", 1.0),
        # invalid (no think) + exact match -> score - lambda_f = 1 - 0.2 = 0.8
        ("<answer>Paris</answer>", 0.8),
        # valid + wrong, no information block -> lambda_f = 0.2
        ("<think>t</think><answer>Rome</answer>", 0.2),
        # valid + wrong + gold in retrieved block -> lambda_f + lambda_r = 0.3
        (SEARCH + "<think>u</think><answer>Rome</answer>", 0.3),
        # invalid + wrong (the hit is not looked at when the format is invalid) -> final = 0.1
        (SEARCH + "<answer>Rome</answer>", 0.1),
        # invalid + no answer -> 0
        (SEARCH + "<think>u", 0.0),
    ],
)
def test_format_reward_branches(response, expected):
    assert format_reward(response, ["Paris"], **LAMBDAS) == pytest.approx(expected)


def test_format_reward_score_and_defaults():
    # invalid + exact with score = 2: 2 - 0.2 = 1.8
    assert format_reward("<answer>Paris</answer>", "Paris", score=2.0, **LAMBDAS) == pytest.approx(1.8)
    # all lambdas 0 (Search-R1's defaults): reduces to plain EM
    assert format_reward(SEARCH + "<think>u</think><answer>Rome</answer>", ["Paris"]) == 0.0
    assert format_reward("<answer>Paris</answer>", ["Paris"]) == 1.0


# Hand-derived per fixture row with lambda_f = 0.2, final = 0.1, lambda_r = 0.1:
#   (valid?, answer, exact?, gold in an <information> block?) -> reward
FIXTURE_REWARDS = {
    "litm_2593": 1.0,  # valid, 'Sun Tzu' exact
    "litm_242": 1.0,  # valid, 'Randy Newman.' exact (2nd gold)
    "litm_1520": 0.3,  # valid, 'actor Freddie Highmore' wrong, gold in block -> 0.2 + 0.1
    "test_0": 0.0,  # truncated: think tags unbalanced, no answer
    "litm_509": 0.8,  # invalid (text between tags), '1981' exact -> 1 - 0.2
    "5ab6f0c25542995eadef00ea": 1.0,  # valid, 'No' exact
    "5a7571135542992d0ec05f98": 0.3,  # valid, wrong, 'new york city' in block 2
    "litm_1127": 0.1,  # invalid, answer 'and' (from the invalid-action message) wrong -> final
    "litm_483": 0.8,  # invalid (<answer> tag inside <information>), 'Road/Track' exact
    "litm_2477": 0.1,  # invalid (two answers), last 'Lysander' wrong -> final
    "5ab6f0c25542995eadef00eb": 0.3,  # valid, wrong; gold 'no' is a substring of 'now' in block
    "litm_974": 0.3,  # valid, empty answer wrong, 'lew brown' in block
    "5a87d8215542994775f60800": 0.3,  # valid, 'Suicide Squad (2016 film)' not exact, gold in block
}


def test_format_reward_on_fixture_transcripts():
    assert set(FIXTURE_REWARDS) == set(ROWS)
    for rid, expected in FIXTURE_REWARDS.items():
        got = format_reward(ROWS[rid]["response"], ROWS[rid]["golden_answers"], **LAMBDAS)
        assert got == pytest.approx(expected), rid


INVALID_ACTION = ("\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
                  "</search>. If I want to give the final answer, I should put the answer between <answer> and "
                  "</answer>. Let me try again.\n")


@pytest.mark.parametrize(
    "response, expected, without_answer_term",
    [
        # a search answered, a valid sequence, the gold covered: 1 + 0.5 + 0.5; without the answer term 0.5 + 0.5
        (SEARCH + "<think>u</think><answer>Paris, France</answer>", 2.0, 1.0),
        # the same, a wrong answer: -1 + 0.5 + 0.5 = 0
        (SEARCH + "<think>u</think><answer>Rome</answer>", 0.0, 1.0),
        # a valid sequence with no search: -1 + 0 + 0.5
        ("<think>t</think><answer>Rome</answer>", -0.5, 0.5),
        # a search answered, then no think before the answer (invalid sequence), gold covered: 1 + 0.5 + 0
        (SEARCH + "<answer>Paris</answer>", 1.5, 0.5),
        # a search with no information back (cut off): no search term; no answer: -1
        ("<think>t</think><search>q</search>", -1.0, 0.0),
        # two searches, one answered: unbalanced, no search term; invalid; no answer
        (SEARCH + "<think>u</think><search>r</search>", -1.0, 0.0),
        # invalid actions: the injected message's `<answer> and </answer>` is a wrong answer in an invalid sequence
        ("Answer </answer>" + INVALID_ACTION, -1.0, 0.0),
    ],
)
def test_search_r1_stage1_reward_by_hand(response, expected, without_answer_term):
    assert stage1_reward(response, ["Paris"]) == pytest.approx(expected)
    assert stage1_reward(response, ["Paris"], answer_term=False) == pytest.approx(without_answer_term)
    assert build_reward(RewardConfig(kind="search_r1_stage1"))(response, ["Paris"]) == pytest.approx(expected)


def test_build_reward_kinds():
    resp = SEARCH + "<think>u</think><answer>Paris, France</answer>"
    gold = ["Paris"]
    # em: 'paris france' != 'paris' -> 0; cover: 'paris' in it -> 1;
    # f1: P = 1/2, R = 1 -> 2/3; v03 with lambda_f 0.2, lambda_r 0.1: valid, wrong, hit -> 0.3
    cfg = RewardConfig(kind="em")
    assert build_reward(cfg)(resp, gold) == 0.0
    assert build_reward(RewardConfig(kind="cover_em"))(resp, gold) == 1.0
    assert build_reward(RewardConfig(kind="f1"))(resp, gold) == pytest.approx(2 / 3)
    v03 = RewardConfig(kind="search_r1_v03", format_score=0.2, retrieval_score=0.1, final_format_score=0.1)
    assert build_reward(v03)(resp, gold) == pytest.approx(0.3)
    for kind in REWARD_KINDS:  # every advertised kind builds and returns a float
        assert isinstance(build_reward(RewardConfig(kind=kind))(resp, gold), float)
    with pytest.raises(ValueError, match="unknown reward.kind 'bleu'"):
        build_reward(RewardConfig(kind="bleu"))


def test_f1_reward_no_answer_is_zero():
    assert f1_reward("<think>Paris</think>", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    "response, expected",
    [
        # valid, hit, "Paris, France": F1 2/3 (P 1/2, R 1) -> 2/3 * 1 + 1/3 * 0.3 = 0.7667
        (SEARCH + "<think>u</think><answer>Paris, France</answer>", 2 / 3 + 0.3 / 3),
        # valid, no hit, "the city of Paris" -> tokens 'city of paris' (article dropped): P 1/3, R 1, F1 1/2
        # -> 0.5 * 1 + 0.5 * 0.2 = 0.6
        ("<think>t</think><answer>the city of Paris</answer>", 0.6),
        # invalid (no think), "Paris, France": 2/3 * (1 - 0.2) + 1/3 * 0.1 = 0.5667
        ("<answer>Paris, France</answer>", 2 / 3 * 0.8 + 0.1 / 3),
        # the v0.3 branches where EM and F1 agree: exact (1 / 0.8), no shared word (0.3 / 0.1), no answer (0)
        ("<think>t</think><answer>Paris</answer>", 1.0),
        ("<answer>paris</answer>", 0.8),
        (SEARCH + "<think>u</think><answer>Rome</answer>", 0.3),
        (SEARCH + "<answer>Rome</answer>", 0.1),
        (SEARCH + "<think>u", 0.0),
    ],
)
def test_format_reward_with_f1_answers_by_hand(response, expected):
    assert format_reward(response, ["Paris"], answer_metric="f1", **LAMBDAS) == pytest.approx(expected)
    cfg = RewardConfig(kind="search_r1_v03", format_score=0.2, retrieval_score=0.1, final_format_score=0.1,
                       answer_metric="f1")
    assert build_reward(cfg)(response, ["Paris"]) == pytest.approx(expected)


def test_format_reward_f1_counts_an_exact_match_whole():
    # gold "The" normalises to nothing: EM holds ("" == ""), token F1 would be 0; the exact match pays in full
    assert format_reward("<think>t</think><answer>a</answer>", ["The"], answer_metric="f1", **LAMBDAS) == 1.0
    with pytest.raises(ValueError, match=r"answer_metric must be one of \['em', 'f1'\], got 'bleu'"):
        format_reward("<think>t</think><answer>a</answer>", ["The"], answer_metric="bleu")


@pytest.mark.parametrize(
    "response, expected",
    [
        # a search answered by passages: the v0.3 branches unchanged (valid + hit 0.3, invalid + wrong 0.1, exact 1)
        (SEARCH + "<think>u</think><answer>Rome</answer>", 0.3),
        (SEARCH + "<answer>Rome</answer>", 0.1),
        (SEARCH + "<think>u</think><answer>Paris</answer>", 1.0),
        # no search: a wrong answer earns nothing, valid (0.2 without the option) or not (0.1 without it)
        ("<think>t</think><answer>Rome</answer>", 0.0),
        ("<answer>Rome</answer>", 0.0),
        # no search, exact match: the answer is paid as v0.3 pays it (valid 1, invalid 1 - 0.2)
        ("<think>t</think><answer>Paris</answer>", 1.0),
        ("<answer>Paris</answer>", 0.8),
        # a search whose <information> never came back (invalid, 0.1 without the option) is no search answered
        ("<think>t</think><search>q</search><think>u</think><answer>Rome</answer>", 0.0),
    ],
)
def test_format_reward_requires_search_by_hand(response, expected):
    assert format_reward(response, ["Paris"], requires_search=True, **LAMBDAS) == pytest.approx(expected)
    cfg = RewardConfig(kind="search_r1_v03", format_score=0.2, retrieval_score=0.1, final_format_score=0.1,
                       format_requires_search=True)
    assert build_reward(cfg)(response, ["Paris"]) == pytest.approx(expected)


def test_format_reward_requires_search_with_f1_answers():
    # no search, "Paris, France" (F1 2/3), valid: 2/3 * 1 + 1/3 * 0 (the wrong branch pays nothing) = 2/3
    response = "<think>t</think><answer>Paris, France</answer>"
    assert format_reward(response, ["Paris"], requires_search=True, answer_metric="f1", **LAMBDAS) == \
        pytest.approx(2 / 3)
    # with a search and a hit: as without the option, 2/3 * 1 + 1/3 * 0.3
    assert format_reward(SEARCH + "<think>u</think><answer>Paris, France</answer>", ["Paris"], requires_search=True,
                         answer_metric="f1", **LAMBDAS) == pytest.approx(2 / 3 + 0.1)


@pytest.mark.parametrize(
    ("response", "both", "answer_only"),
    [
        # a search answered (with a hit): as v0.3 pays it, right 1, wrong 0.2 + 0.1
        (SEARCH + "<think>u</think><answer>Paris</answer>", 1.0, 1.0),
        (SEARCH + "<think>u</think><answer>Rome</answer>", 0.0 + 0.3, 0.3),
        # no search, right: paid as a wrong answer; with format_requires_search the wrong branch pays 0, without
        # it v0.3's wrong branches: valid 0.2, invalid final_format_score 0.1
        ("<think>t</think><answer>Paris</answer>", 0.0, 0.2),
        ("<answer>Paris</answer>", 0.0, 0.1),
        # a search whose <information> never came back is no search answered: its right answer is withheld too
        ("<think>t</think><search>q</search><think>u</think><answer>Paris</answer>", 0.0, 0.1),
    ],
)
def test_format_reward_answer_requires_search_by_hand(response, both, answer_only):
    kw = dict(LAMBDAS, answer_requires_search=True)
    assert format_reward(response, ["Paris"], requires_search=True, **kw) == pytest.approx(both)
    assert format_reward(response, ["Paris"], **kw) == pytest.approx(answer_only)
    cfg = RewardConfig(kind="search_r1_v03", format_score=0.2, retrieval_score=0.1, final_format_score=0.1,
                       format_requires_search=True, answer_requires_search=True)
    assert build_reward(cfg)(response, ["Paris"]) == pytest.approx(both)


def test_exact_match_after_a_search_only():
    """Both options and no shaped terms: 1 for an exact match after a search answered, 0 for anything else."""
    fn = build_reward(RewardConfig(kind="search_r1_v03", format_requires_search=True, answer_requires_search=True))
    assert fn(SEARCH + "<think>u</think><answer>Paris</answer>", ["Paris"]) == 1.0
    assert fn(SEARCH + "<think>u</think><answer>Rome</answer>", ["Paris"]) == 0.0
    assert fn("<think>t</think><answer>Paris</answer>", ["Paris"]) == 0.0
    # F1 answers: without a search the share of the way to "right" leads nowhere (right is paid as wrong, 0)
    assert format_reward("<think>t</think><answer>Paris, France</answer>", ["Paris"], requires_search=True,
                         answer_requires_search=True, answer_metric="f1") == 0.0
    assert format_reward(SEARCH + "<think>u</think><answer>Paris, France</answer>", ["Paris"], requires_search=True,
                         answer_requires_search=True, answer_metric="f1") == pytest.approx(2 / 3)


def test_settings_a_kind_never_reads_are_named_in_a_warning():
    """search_r1_v03's coefficients and options set for another kind (a staged recipe's first stage, or a typo'd
    kind) are named in one warning, not silently dropped; their defaults, and search_r1_v03 itself, warn nothing."""
    import warnings

    from sleuth.reward import V03_ONLY, ignored_settings

    assert all(hasattr(RewardConfig(), k) for k in V03_ONLY) and len(V03_ONLY) == 6
    assert all(ignored_settings(RewardConfig(kind=k)) == [] for k in REWARD_KINDS)  # defaults: nothing to name
    cfg = RewardConfig(kind="search_r1_stage1", format_score=0.2, format_requires_search=True)
    assert ignored_settings(cfg) == ["reward.format_score=0.2", "reward.format_requires_search=True"]
    with pytest.warns(UserWarning, match=r"search_r1_stage1 ignores reward.format_score=0.2, "
                                         r"reward.format_requires_search=True"):
        fn = build_reward(cfg)
    assert fn("<answer> Paris </answer>", ["Paris"]) == stage1_reward("<answer> Paris </answer>", ["Paris"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2, answer_metric="f1",
                                  format_requires_search=True))
        build_reward(RewardConfig(kind="em"))
    assert ignored_settings(RewardConfig(kind="f1", answer_metric="f1")) == ["reward.answer_metric=f1"]
