"""``rollout.format: search_r1_fewshot``: Search-R1's instruction, one worked example, the question; everything
but the prompt is Search-R1's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.config import Config, RewardConfig
from sleuth.config_file import ConfigError, apply_overrides
from sleuth.reward import build_reward, is_valid_format
from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION, get_format
from sleuth.types import ActionKind, Passage, Question

pytestmark = pytest.mark.unit

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
Q = Question(id="q1", text="who sang the song you got a friend in me", golden_answers=["Randy Newman"])
HEAD = SEARCH_R1_INSTRUCTION[:SEARCH_R1_INSTRUCTION.index("Question: ")]


def _shot(prompt: str) -> tuple[str, str]:
    """The example's question line and its turns (what a policy would have written) out of a prompt."""
    body = prompt[len(HEAD):]
    question_line, _, rest = body.partition("\n")
    turns, _, _ = rest.rpartition("\n\nQuestion: ")
    return question_line, turns


def test_the_prompt_is_search_r1s_instruction_an_example_then_the_question():
    prompt = get_format("search_r1_fewshot").user_content(Q)
    assert prompt.startswith(HEAD) and HEAD.endswith("For example, <answer> Beijing </answer>. ")
    assert prompt.endswith("\n\nQuestion: who sang the song you got a friend in me?\n")  # Search-R1's "?" added
    question_line, turns = _shot(prompt)
    assert question_line == "Question: in which country is the city of timbuktu?"
    assert turns == ("<think> I need to find where the city of Timbuktu is. </think>\n"
                     "<search> timbuktu city country </search>\n\n"
                     '<information>Doc 1(Title: "Timbuktu") Timbuktu is an ancient city in Mali, near the Niger River, '
                     "on the southern edge of the Sahara.</information>\n\n"
                     "<think> The passage says that Timbuktu is a city in Mali. </think>\n<answer> Mali </answer>")


def test_the_example_is_a_valid_search_r1_sequence_whose_observation_is_the_rollouts():
    """Read as a response, the example passes Search-R1's format check and earns Search-R1's full reward for its
    gold; its observation is byte for byte what the rollout appends after a search for its query."""
    fmt = get_format("search_r1_fewshot")
    _, turns = _shot(fmt.user_content(Q))
    assert is_valid_format(turns)
    assert build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2))(turns, ["Mali"]) == 1.0
    first_turn = turns[:turns.index("</search>") + len("</search>")]
    action = fmt.parse_action(first_turn)
    assert action.kind is ActionKind.SEARCH and action.queries == ["timbuktu city country"]
    passage = Passage(id="x", title="Timbuktu", text="Timbuktu is an ancient city in Mali, near the Niger River, on "
                                                      "the southern edge of the Sahara.")
    assert first_turn + get_format("search_r1").render_observation([("timbuktu city country", [passage])]) in turns
    assert fmt.extract_answer(turns) == "Mali"


def test_parsing_observations_and_messages_are_search_r1s():
    fewshot, plain = get_format("search_r1_fewshot"), get_format("search_r1")
    for turn in ("<think> x </think>\n<search> randy newman </search>", "<answer> Randy Newman </answer>",
                 "<search>  </search>", "no tag at all", "<search> query </search>"):
        assert fewshot.parse_action(turn) == plain.parse_action(turn), turn
    passages = [Passage(id="1", title="A", text="a b"), Passage(id="2", title="B", text="c")]
    assert fewshot.render_observation([("q", passages)]) == plain.render_observation([("q", passages)])
    assert fewshot.render_invalid() == plain.render_invalid() and fewshot.stop_sequences == plain.stop_sequences
    assert fewshot.render_error("down") == plain.render_error("down")


def test_the_config_takes_it_and_a_typo_is_refused_naming_it():
    assert apply_overrides(Config(), ["rollout.format=search_r1_fewshot"]).rollout.format == "search_r1_fewshot"
    with pytest.raises(ConfigError, match="search_r1_fewshot"):  # the error lists the choices, this one among them
        apply_overrides(Config(), ["rollout.format=search_r1_fewshots"])


def test_the_baselines_show_the_example_in_their_own_form():
    """`--no-search` and `--rag` keep their instructions; the example goes before the question as each baseline
    would answer it (directly; from its passage), so a base model's baselines are prompted as its search runs are.
    A format without an example keeps the zero-shot prompts."""
    from sleuth.eval.evaluate import DIRECT_INSTRUCTION, NoSearchFormat
    from sleuth.eval.rag import RagFormat

    fewshot, plain = get_format("search_r1_fewshot"), get_format("search_r1")
    assert NoSearchFormat(fewshot).user_content(Q) == (
        DIRECT_INSTRUCTION[:DIRECT_INSTRUCTION.index("Question: ")]
        + "Question: in which country is the city of timbuktu?\n<think> Timbuktu is a city in Mali. </think>\n"
          "<answer> Mali </answer>\n\nQuestion: who sang the song you got a friend in me?\n")
    assert NoSearchFormat(plain).user_content(Q) == DIRECT_INSTRUCTION.format(
        question="who sang the song you got a friend in me?")
    passages = plain.render_observation([("q", [Passage(id="1", title="Toy Story", text="Randy Newman sang it.")])])
    rag = RagFormat(fewshot, {"q1": passages}).user_content(Q)
    assert rag.startswith("Answer the given question using the passages below") and rag.endswith(
        '.\n\n<information>Doc 1(Title: "Timbuktu") Timbuktu is an ancient city in Mali, near the Niger River, on '
        "the southern edge of the Sahara.</information>\n\nQuestion: in which country is the city of timbuktu?\n"
        "<think> The passage says that Timbuktu is a city in Mali. </think>\n<answer> Mali </answer>\n\n"
        '<information>Doc 1(Title: "Toy Story") Randy Newman sang it.</information>\n\n'
        "Question: who sang the song you got a friend in me?\n")
    assert "Timbuktu" not in RagFormat(plain, {"q1": passages}).user_content(Q)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside the checkout")
def test_no_shipped_question_is_the_examples():
    """The examples' topics are in no train or dev question (else a dev question would be answered in its prompt)."""
    files = sorted((SHARED / "train").glob("*.jsonl")) + sorted((SHARED / "dev").glob("*.jsonl"))
    assert files
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                question = row["question"].lower()
                assert "timbuktu" not in question and "Mali" not in row["golden_answers"], path
                assert "pearl earring" not in question and "vermeer" not in question, path  # search_r1_fewshot3's
                assert "penicillin" not in question, path


def test_the_verbatim_variant_searches_for_its_question_as_written():
    """``search_r1_fewshot_verbatim``: the same prompt but the example's thought and query (its question, as
    written); still a valid sequence that earns the full reward, parsed as a search for that text; the baselines'
    prompts (which show no query) and everything else are ``search_r1_fewshot``'s."""
    from sleuth.eval.evaluate import NoSearchFormat
    from sleuth.eval.rag import RagFormat

    verbatim, fewshot = get_format("search_r1_fewshot_verbatim"), get_format("search_r1_fewshot")
    question_line, turns = _shot(verbatim.user_content(Q))
    assert question_line == "Question: in which country is the city of timbuktu?"
    head, tail = turns.split("</think>\n", 1)
    assert head == "<think> I will search for the question. "
    assert tail.startswith("<search> in which country is the city of timbuktu? </search>\n\n<information>Doc 1")
    assert tail.partition("</search>")[2] == _shot(fewshot.user_content(Q))[1].partition("</search>")[2]
    assert is_valid_format(turns) and verbatim.extract_answer(turns) == "Mali"
    assert build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2))(turns, ["Mali"]) == 1.0
    first = verbatim.parse_action(turns[:turns.index("</search>") + len("</search>")])
    assert first.kind is ActionKind.SEARCH and first.queries == ["in which country is the city of timbuktu?"]
    assert NoSearchFormat(verbatim).user_content(Q) == NoSearchFormat(fewshot).user_content(Q)
    passages = fewshot.render_observation([("q", [Passage(id="1", title="Toy Story", text="Randy Newman sang it.")])])
    assert RagFormat(verbatim, {"q1": passages}).user_content(Q) == RagFormat(fewshot, {"q1": passages}).user_content(Q)
    assert apply_overrides(Config(), ["rollout.format=search_r1_fewshot_verbatim"]).rollout.format == verbatim.name


def test_the_three_shot_variant_shows_three_valid_examples_then_the_question():
    """``search_r1_fewshot3``: the one-shot prompt's example, then two more in its form (a person, a year), each
    a valid sequence that earns the full reward for its own gold and whose observation is the rollout's; the
    baselines show all three in their own form, in order; a one-example format's prompts are unchanged."""
    from sleuth.eval.evaluate import NoSearchFormat
    from sleuth.eval.rag import RagFormat
    from sleuth.rollout.formats import worked_examples

    three, one = get_format("search_r1_fewshot3"), get_format("search_r1_fewshot")
    assert [ex.answer for ex in worked_examples(three)] == ["Mali", "Johannes Vermeer", "1928"]
    assert worked_examples(one) == (one.example,) and worked_examples(get_format("search_r1")) == ()
    prompt = three.user_content(Q)
    assert prompt.startswith(one.user_content(Q).rpartition("\n\nQuestion: ")[0] + "\n\nQuestion: who painted girl")
    assert prompt.endswith("<answer> 1928 </answer>\n\nQuestion: who sang the song you got a friend in me?\n")
    shots = prompt[len(HEAD):].rpartition("\n\nQuestion: ")[0].split("\n\n<think> The passage says")
    assert len(shots) == 4  # three examples: each ends with an answer thought after its observation
    plain = get_format("search_r1")
    for ex in worked_examples(three):
        turns = (plain.search_turn(ex.query, ex.search_thought) + plain.render_observation([(ex.query, [ex.passage])])
                 + plain.answer_turn(ex.answer, ex.answer_thought))
        assert f"Question: {ex.question}\n{turns}" in prompt
        assert is_valid_format(turns) and three.extract_answer(turns) == ex.answer
        assert build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2))(turns, [ex.answer]) == 1.0
    direct = NoSearchFormat(three).user_content(Q)
    assert direct.startswith(NoSearchFormat(one).user_content(Q).rpartition("\n\nQuestion: ")[0])
    assert direct.index("Johannes Vermeer") < direct.index("1928") < direct.index("you got a friend")
    passages = plain.render_observation([("q", [Passage(id="1", title="Toy Story", text="Randy Newman sang it.")])])
    rag = RagFormat(three, {"q1": passages}).user_content(Q)
    assert rag.startswith(RagFormat(one, {"q1": passages}).user_content(Q).partition('<information>Doc 1(Title: "Toy')[0])
    assert rag.endswith("<answer> 1928 </answer>" + passages + "Question: who sang the song you got a friend in me?\n")
    assert apply_overrides(Config(), ["rollout.format=search_r1_fewshot3"]).rollout.format == three.name


def test_the_restating_variant_restates_each_question_after_its_passage_and_keeps_the_baselines():
    """``search_r1_fewshot3_restate``: ``search_r1_fewshot3``'s prompt but for each example's thought after its
    observation, which restates the example's question before reading the passage; each example still a valid
    sequence earning the full reward; the no-search and RAG baselines' prompts are ``search_r1_fewshot3``'s."""
    from sleuth.eval.evaluate import NoSearchFormat
    from sleuth.eval.rag import RagFormat
    from sleuth.rollout.formats import worked_examples

    restate, three = get_format("search_r1_fewshot3_restate"), get_format("search_r1_fewshot3")
    assert worked_examples(restate) == worked_examples(three)
    prompt, before = restate.user_content(Q), three.user_content(Q)
    assert prompt != before
    assert prompt.count("<think> The question is: ") == 3
    assert prompt.replace("<think> The question is: who painted girl with a pearl earring? ", "<think> ") \
        .replace("<think> The question is: in which country is the city of timbuktu? ", "<think> ") \
        .replace("<think> The question is: in what year was penicillin discovered? ", "<think> ") == before
    plain = get_format("search_r1")
    for ex in worked_examples(restate):
        read = f"The question is: {ex.question} {ex.answer_thought}"
        turns = (plain.search_turn(ex.query, ex.search_thought) + plain.render_observation([(ex.query, [ex.passage])])
                 + plain.answer_turn(ex.answer, read))
        assert f"Question: {ex.question}\n{turns}" in prompt
        assert is_valid_format(turns) and restate.extract_answer(turns) == ex.answer
        assert build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2))(turns, [ex.answer]) == 1.0
    assert prompt.endswith("<answer> 1928 </answer>\n\nQuestion: who sang the song you got a friend in me?\n")
    assert NoSearchFormat(restate).user_content(Q) == NoSearchFormat(three).user_content(Q)
    passages = plain.render_observation([("q", [Passage(id="1", title="Toy Story", text="Randy Newman sang it.")])])
    assert RagFormat(restate, {"q1": passages}).user_content(Q) == RagFormat(three, {"q1": passages}).user_content(Q)
    assert apply_overrides(Config(), ["rollout.format=search_r1_fewshot3_restate"]).rollout.format == restate.name


def test_the_reasking_variant_asks_the_question_again_after_the_passages():
    """``search_r1_fewshot3_reask``: every observation, the examples' and the rollout's, ends with the question
    asked again inside its ``<information>`` block; each example still a valid sequence earning the full reward;
    no retrieval hit is read from the re-asked question (a gold named in it, as in a comparison question, is no
    hit); without a question the observation is ``search_r1_fewshot3``'s; the baselines' prompts are its too."""
    from sleuth.eval.evaluate import NoSearchFormat
    from sleuth.eval.rag import RagFormat
    from sleuth.reward import retrieval_hit
    from sleuth.reward.tags import REASK, answer_in_texts
    from sleuth.rollout.formats import worked_examples

    reask, three = get_format("search_r1_fewshot3_reask"), get_format("search_r1_fewshot3")
    assert reask.reasks and not three.reasks and worked_examples(reask) == worked_examples(three)
    toy = [("q", [Passage(id="1", title="Toy Story", text="Randy Newman sang it.")])]
    assert reask.render_observation(toy) == three.render_observation(toy)
    asked = reask.render_observation(toy, "who sang the song you got a friend in me")
    assert asked == ('\n\n<information>Doc 1(Title: "Toy Story") Randy Newman sang it.'
                     '\n\nQuestion: who sang the song you got a friend in me?</information>\n\n')
    assert REASK == "\n\nQuestion: "
    prompt = reask.user_content(Q)
    assert prompt.count("?</information>") == 3
    assert prompt.replace(f"{REASK}in which country is the city of timbuktu?</information>", "</information>") \
        .replace(f"{REASK}who painted girl with a pearl earring?</information>", "</information>") \
        .replace(f"{REASK}in what year was penicillin discovered?</information>", "</information>") \
        == three.user_content(Q)
    for ex in worked_examples(reask):
        turns = (reask.search_turn(ex.query, ex.search_thought)
                 + reask.render_observation([(ex.query, [ex.passage])], ex.question)
                 + reask.answer_turn(ex.answer, ex.answer_thought))
        assert f"Question: {ex.question}\n{turns}" in prompt
        assert is_valid_format(turns) and reask.extract_answer(turns) == ex.answer
        assert build_reward(RewardConfig(kind="search_r1_v03", format_score=0.2))(turns, [ex.answer]) == 1.0
    # which is older, A or B: the gold is in the question; a hit only when a passage holds it
    none = reask.render_observation([("q", [Passage(id="2", title="Zoo", text="Berlin hosts a zoo.")])],
                                    "which is older, randy newman or carole king")
    assert not answer_in_texts([none], ["Randy Newman"]) and answer_in_texts([asked], ["Randy Newman"])
    wrong = "<think> a </think>\n<search> q </search>" + none + "<think> b </think>\n<answer> Carole King </answer>"
    assert is_valid_format(wrong) and not retrieval_hit(wrong, ["Randy Newman"])
    cfg = RewardConfig(kind="search_r1_v03", format_score=0.2, retrieval_score=0.1)
    assert build_reward(cfg)(wrong, ["Randy Newman"]) == pytest.approx(0.2)
    assert NoSearchFormat(reask).user_content(Q) == NoSearchFormat(three).user_content(Q)
    passages = three.render_observation(toy)
    assert RagFormat(reask, {"q1": passages}).user_content(Q) == RagFormat(three, {"q1": passages}).user_content(Q)
    assert apply_overrides(Config(), ["rollout.format=search_r1_fewshot3_reask"]).rollout.format == reask.name
