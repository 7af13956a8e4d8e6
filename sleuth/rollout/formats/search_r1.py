"""The Search-R1 format (arXiv 2503.09516): ``<search>`` / ``<answer>`` tags, passages in
``<information>`` blocks; its short-prompt variant for the embedded tiny model; and its few-shot variants for
base models (Search-R1's instruction followed by worked examples: one, three, three that restate their question,
three whose observations ask the question again)."""

from __future__ import annotations

from dataclasses import replace

from sleuth.reward.tags import REASK
from sleuth.rollout.formats.base import (
    WorkedExample,
    first_complete_tag,
    last_tag_content,
    no_action_reason,
    normalize_question,
    register,
    register_prompt_variant,
    remove_blocks,
    worked_examples,
)
from sleuth.types import Action, ActionKind, Passage, Question

# ---------------------------------------------------------------------------------------------

# Byte-identical to the instruction Search-R1's released checkpoints were trained with
# (PeterGriffinJin/Search-R1, scripts/data_process/nq_search.py make_prefix and infer.py; note the
# original "as your want" typo, kept on purpose).
SEARCH_R1_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> "
    "and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)

# Verbatim from search_r1/llm_agent/generation.py execute_predictions.
SEARCH_R1_INVALID = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

_SEARCH_R1_TAGS = (("search", "<search>", "</search>"), ("answer", "<answer>", "</answer>"))


def render_passages_search_r1(passages: list[Passage]) -> str:
    """``Doc i(Title: <title>) <text>`` lines, as Search-R1's ``_passages2string``: the title is the
    raw first line of the passage's ``contents`` (quoted as in wiki-18), the text the rest."""
    lines = []
    for i, p in enumerate(passages, 1):
        title, _, text = p.contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


@register
class SearchR1Format:
    """``<think>``/``<search>``/``<information>``/``<answer>`` tags, Search-R1's exact texts.

    Parsing departs from Search-R1 in two documented ways: text inside ``<information>`` blocks that
    the policy wrote itself is ignored, and an empty query is an invalid action (Search-R1 would
    send an empty string to the retriever). With several queries in one observation (never the
    case for this format's parser) their passage lists are concatenated, each numbered from 1.
    """

    name = "search_r1"
    system_prompt: str | None = None
    example: WorkedExample | None = None
    stop_sequences = ["</search>", "</answer>"]
    tool_messages = False
    generation_prefix = ""

    def user_content(self, question: Question) -> str:
        return SEARCH_R1_INSTRUCTION.format(question=normalize_question(question.text))

    def parse_action(self, turn_text: str) -> Action:
        text = remove_blocks(turn_text, "<information>", "</information>")
        found = first_complete_tag(text, _SEARCH_R1_TAGS)
        if found is None:
            return Action(ActionKind.INVALID, error=no_action_reason(text, _SEARCH_R1_TAGS))
        kind, content = found[0], found[1].strip()
        if kind == "answer":
            return Action(ActionKind.ANSWER, answer=content)
        if not content:
            return Action(ActionKind.INVALID, error="empty search query")
        return Action(ActionKind.SEARCH, queries=[content])

    reasks = False  # True: the observation ends with the question asked again (search_r1_fewshot3_reask)

    def render_observation(self, results: list[tuple[str, list[Passage]]], question: str | None = None) -> str:
        body = "".join(render_passages_search_r1(passages) for _, passages in results).strip()
        if self.reasks and question is not None:
            body += f"{REASK}{normalize_question(question)}"
        return f"\n\n<information>{body}</information>\n\n"

    def render_invalid(self) -> str:
        return SEARCH_R1_INVALID

    def render_error(self, message: str) -> str:
        return f"\n\n<information>The search failed: {message}</information>\n\n"

    def extract_answer(self, response_text: str) -> str | None:
        text = remove_blocks(response_text, "<information>", "</information>")
        return last_tag_content(text, "<answer>", "</answer>")

    def search_turn(self, query: str, thought: str) -> str:
        """A policy turn that reasons, then searches (what ``sleuth sft`` writes)."""
        return f"<think> {thought} </think>\n<search> {query} </search>"

    def answer_turn(self, answer: str, thought: str) -> str:
        """A policy turn that reasons, then answers."""
        return f"<think> {thought} </think>\n<answer> {answer} </answer>"


TINY_INSTRUCTION = "Answer the question. Search for facts if you must. Question: {question}\n"


@register_prompt_variant
class TinySearchR1Format(SearchR1Format):
    """Search-R1 tags and observations with the short :data:`TINY_INSTRUCTION` prompt (the
    embedded tiny model's, ``rollout.format: search_r1_tiny``)."""

    name = "search_r1_tiny"

    def user_content(self, question: Question) -> str:
        return TINY_INSTRUCTION.format(question=normalize_question(question.text))


# A worked example written for Sleuth (its passage is ours, not Wikipedia's; no question of the shipped train or
# dev files mentions Timbuktu). Its query is words of its question, not the instruction's placeholder ``query``.
FEWSHOT_EXAMPLE = WorkedExample(
    question="in which country is the city of timbuktu?",
    search_thought="I need to find where the city of Timbuktu is.",
    query="timbuktu city country",
    passage=Passage(id="example-1", title="Timbuktu",
                    text="Timbuktu is an ancient city in Mali, near the Niger River, on the southern edge of the "
                         "Sahara."),
    answer_thought="The passage says that Timbuktu is a city in Mali.",
    direct_thought="Timbuktu is a city in Mali.",
    answer="Mali",
)


@register_prompt_variant
class FewShotSearchR1Format(SearchR1Format):
    """Search-R1's tags, observations and instruction, then one worked example before the question
    (``rollout.format: search_r1_fewshot``): the example question, a search turn with a query made of its words,
    its ``<information>`` block exactly as the rollout renders one, and an answer turn. For base models, which
    continue text rather than follow an instruction: Search-R1's instruction shows the search call only as
    ``<search> query </search>``, which a base model copies word for word (a search for "query"); the example shows
    a whole valid sequence with a real query. Everything else (parsing, rewards, the invalid-action message) is
    Search-R1's."""

    name = "search_r1_fewshot"
    example = FEWSHOT_EXAMPLE

    def user_content(self, question: Question) -> str:
        head, _, _ = SEARCH_R1_INSTRUCTION.partition("Question: {question}")
        shots = "\n\n".join(
            f"Question: {ex.question}\n" + self.search_turn(ex.query, ex.search_thought)
            + self.render_observation([(ex.query, [ex.passage])], ex.question)
            + self.answer_turn(ex.answer, self.read_thought(ex))
            for ex in worked_examples(self))
        return f"{head}{shots}\n\nQuestion: {normalize_question(question.text)}\n"

    def read_thought(self, ex: WorkedExample) -> str:
        """The thought an example writes after its ``<information>`` block, before its answer."""
        return ex.answer_thought


# The same example, its search the question as written: a base model copies the example's form (Gemma-3-270M under
# ``search_r1_fewshot`` wrote keyword lists, unrelated words, or ``timbuktu city country``), and a search for a
# question's own text is what ``sleuth eval --rag`` and ``sleuth data filter`` send.
VERBATIM_EXAMPLE = replace(FEWSHOT_EXAMPLE, search_thought="I will search for the question.",
                           query=FEWSHOT_EXAMPLE.question)


@register_prompt_variant
class VerbatimFewShotSearchR1Format(FewShotSearchR1Format):
    """``search_r1_fewshot`` whose example searches for its question as written
    (``rollout.format: search_r1_fewshot_verbatim``); its baselines' prompts (no search, RAG) are
    ``search_r1_fewshot``'s, which show no query."""

    name = "search_r1_fewshot_verbatim"
    example = VERBATIM_EXAMPLE


# Two more examples in the first one's form, with short answers of other kinds (a person, a year): on the selection
# set the base Gemma-3-270M, shown one example, put a sentence in its <answer> (docs/results.md, attempt 5). Their
# passages are ours; no question of the shipped train or dev files is about their topics.
MORE_EXAMPLES = (
    WorkedExample(
        question="who painted girl with a pearl earring?",
        search_thought="I need to find who painted Girl with a Pearl Earring.",
        query="girl with a pearl earring painter",
        passage=Passage(id="example-2", title="Girl with a Pearl Earring",
                        text="Girl with a Pearl Earring is an oil painting by the Dutch painter Johannes Vermeer, "
                             "dated around 1665."),
        answer_thought="The passage says that it was painted by Johannes Vermeer.",
        direct_thought="It was painted by Johannes Vermeer.",
        answer="Johannes Vermeer",
    ),
    WorkedExample(
        question="in what year was penicillin discovered?",
        search_thought="I need to find when penicillin was discovered.",
        query="penicillin discovered year",
        passage=Passage(id="example-3", title="Penicillin",
                        text="Penicillin was discovered in 1928 by the Scottish scientist Alexander Fleming at St "
                             "Mary's Hospital in London."),
        answer_thought="The passage says that penicillin was discovered in 1928.",
        direct_thought="Penicillin was discovered in 1928.",
        answer="1928",
    ),
)


@register_prompt_variant
class ThreeShotSearchR1Format(FewShotSearchR1Format):
    """``search_r1_fewshot`` with three worked examples (``rollout.format: search_r1_fewshot3``): its own, then
    :data:`MORE_EXAMPLES`, each a whole valid sequence ending in a short answer; the baselines show all three in
    their own form."""

    name = "search_r1_fewshot3"
    examples = (FEWSHOT_EXAMPLE, *MORE_EXAMPLES)


@register_prompt_variant
class RestatingThreeShotSearchR1Format(ThreeShotSearchR1Format):
    """``search_r1_fewshot3`` whose examples, after their ``<information>`` block, restate their question before
    reading the passage (``<think> The question is: who painted girl with a pearl earring? The passage says that
    ...``; ``rollout.format: search_r1_fewshot3_restate``). In ``search_r1_fewshot3`` the base Gemma-3-270M, its
    question some 300 tokens of passages back, wrote about the last passage whatever it was (docs/results.md,
    attempt 8); its RAG prompt, where the question comes right after the passages, is what it answered from. The
    baselines' prompts are ``search_r1_fewshot3``'s."""

    name = "search_r1_fewshot3_restate"

    def read_thought(self, ex: WorkedExample) -> str:
        return f"The question is: {ex.question} {ex.answer_thought}"


@register_prompt_variant
class ReaskingThreeShotSearchR1Format(ThreeShotSearchR1Format):
    """``search_r1_fewshot3`` whose observations end with the question asked again, inside the ``<information>``
    block after the passages (``...Doc 3(Title: ...) ...\n\nQuestion: who sang ...?</information>``;
    ``rollout.format: search_r1_fewshot3_reask``), the examples' too: after a search the policy reads the
    passages with its question right after them, as in the RAG baseline's prompt. The base Gemma-3-270M, its
    question some 300 tokens of passages back, wrote about the last passage whatever the question, and asked to
    restate its question (``search_r1_fewshot3_restate``) wrote an example's or an invented one (docs/results.md,
    attempt 8). The re-asked question is not passage text: no retrieval hit is read from it
    (``sleuth.reward.tags.REASK``). The baselines' prompts are ``search_r1_fewshot3``'s."""

    name = "search_r1_fewshot3_reask"
    reasks = True
