"""The R1-Searcher protocol (Song et al. 2025, arXiv 2503.05592; RUCAIBox/R1-Searcher).

The policy searches with ``<|begin_of_query|> keywords <|end_of_query|>`` and receives documents in
``<|begin_of_documents|> … <|end_of_documents|>``; the answer goes in ``<answer>…</answer>``.

Texts follow R1-Searcher's released code:

* ``variant="chat"`` (default, for instruct models behind a chat template): the system prompt of
  ``messages_chat_v3`` in ``train/.../prompts_dataset.py``, the bare question as the user message,
  and ``"<think>"`` appended after the generation prompt (exposed as ``generation_prefix``).
* ``variant="base"`` (for base models, use with ``rollout.use_chat_template=False``): the
  ``base_prompt_v3`` completion prompt ending in ``"Assistant: <think>"``, no system prompt.
* Observation: R1-Searcher appends ``"<|end_of_query|>\\n\\n<|begin_of_documents|>\\n" + docs +
  "<|end_of_documents|>\\n\\n"`` with one ``"({i}){doc}\\n"`` line per document, or ``"None"`` when
  nothing came back. Our turn already ends with ``<|end_of_query|>`` (stop strings are sampled
  tokens), so the observation starts at ``"\\n\\n<|begin_of_documents|>"``.
* Query clean-up as in ``evaluation/eval_search_loacl.py``: ``"`` and ``'`` and ``...`` removed, tabs
  become spaces; we also collapse whitespace runs, so ``"a\\tb  c"`` is the one query ``"a b c"``.

Departures (documented): R1-Searcher's documents are raw lines of its own TSV corpus
(``Title: <title> Text: <text>``); we render each passage as ``Title: <title> Text: <text>`` with the
unquoted title, as FlashRAG's R1-Searcher pipeline does. R1-Searcher has no corrective message (it
ends the sample); ours mirrors Search-R1's with this format's tags. Its ``<|end_of_query|>``
is kept byte-for-byte as sampled (R1-Searcher strips the turn before appending it).
"""

from __future__ import annotations

import re

from sleuth.rollout.formats.base import (
    first_complete_tag,
    last_tag_content,
    no_action_reason,
    register,
    register_prompt_variant,
    remove_blocks,
)
from sleuth.types import Action, ActionKind, Passage, Question

BEGIN_QUERY, END_QUERY = "<|begin_of_query|>", "<|end_of_query|>"
BEGIN_DOCS, END_DOCS = "<|begin_of_documents|>", "<|end_of_documents|>"

# messages_chat_v3 system prompt (R1-Searcher, chat models such as Llama-3.1-8B-Instruct).
R1_SEARCHER_SYSTEM = (
    "You are a helpful assistant.\n"
    "Given a question, you should answer it by first thinking about the reasoning process in the mind "
    "and then providing the final answer.\n"
    "The output format of reasoning process and final answer are enclosed within <think> </think> and "
    '<answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n'
    '<answer> final answer here </answer>".\n'
    "During the thinking process, **you can perform searching for uncertain knowledge** if necessary "
    'with the format of "<|begin_of_query|> search query (only list keywords, such as '
    '**"keyword_1 keyword_2 ..."**)<|end_of_query|>". **A query must involve only a single triple**.\n'
    "Then, the search system will provide you with the retrieval information with the format of "
    '"<|begin_of_documents|> ...search results... <|end_of_documents|>".'
)

# base_prompt_v3 (R1-Searcher, base models such as Qwen-2.5-7B-Base); ``{question}`` is filled in.
R1_SEARCHER_BASE_PROMPT = (
    "The User asks a question, and the Assistant solves it.\n"
    "The Assistant first thinks about the reasoning process in the mind and then provides the User "
    "with the final answer.\n"
    "The output format of reasoning process and final answer are enclosed within <think> </think> and "
    '<answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n'
    '<answer> final answer here </answer>".\n'
    "During the thinking process, **the Assistant can perform searching** for uncertain knowledge if "
    'necessary with the format of "<|begin_of_query|> search query (only list keywords, such as '
    '**"keyword_1 keyword_2 ..."**)<|end_of_query|>". **A query must involve only a single triple**.\n'
    "Then, the search system will provide the Assistant with the retrieval information with the "
    'format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\n'
    "User:{question}\nAssistant: <think>"
)

R1_SEARCHER_INVALID = (
    "\nMy previous action is invalid. "
    f"If I want to search, I should put the query between {BEGIN_QUERY} and {END_QUERY}. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

_TAGS = (("query", BEGIN_QUERY, END_QUERY), ("answer", "<answer>", "</answer>"))
_SPACES = re.compile(r"\s+")


def clean_query(raw: str) -> str:
    """R1-Searcher's query clean-up (quotes and '...' removed, tabs to spaces), whitespace collapsed."""
    q = raw.replace('"', "").replace("'", "").replace("...", "")
    return _SPACES.sub(" ", q).strip()


def render_documents(passages: list[Passage]) -> str:
    """``(i)Title: <title> Text: <text>`` lines, numbered from 1; ``"None"`` when there are none."""
    lines = [f"({i})Title: {p.title} Text: {p.text}\n" for i, p in enumerate(passages, 1)]
    return "".join(lines) or "None"


@register
class R1SearcherFormat:
    """``<|begin_of_query|>``/``<|begin_of_documents|>``/``<answer>`` tags, R1-Searcher's texts."""

    name = "r1_searcher"
    stop_sequences = [END_QUERY, "</answer>"]
    tool_messages = False

    def __init__(self, variant: str = "chat"):
        if variant not in ("chat", "base"):
            raise ValueError(f"r1_searcher variant must be 'chat' or 'base', got {variant!r}")
        self.variant = variant
        self.system_prompt: str | None = R1_SEARCHER_SYSTEM if variant == "chat" else None
        self.generation_prefix = "<think>" if variant == "chat" else ""

    def user_content(self, question: Question) -> str:
        text = question.text.strip()
        if self.variant == "chat":
            return text
        return R1_SEARCHER_BASE_PROMPT.replace("{question}", text)

    def parse_action(self, turn_text: str) -> Action:
        text = remove_blocks(turn_text, BEGIN_DOCS, END_DOCS)
        found = first_complete_tag(text, _TAGS)
        if found is None:
            return Action(ActionKind.INVALID, error=no_action_reason(text, _TAGS))
        kind, content = found
        if kind == "answer":
            return Action(ActionKind.ANSWER, answer=content.strip())
        query = clean_query(content)
        if not query:
            return Action(ActionKind.INVALID, error="empty search query")
        return Action(ActionKind.SEARCH, queries=[query])

    def render_observation(self, results: list[tuple[str, list[Passage]]]) -> str:
        passages = [p for _, ps in results for p in ps]
        return f"\n\n{BEGIN_DOCS}\n{render_documents(passages)}{END_DOCS}\n\n"

    def render_invalid(self) -> str:
        return R1_SEARCHER_INVALID

    def render_error(self, message: str) -> str:
        return f"\n\n{BEGIN_DOCS}\nThe search failed: {message}\n{END_DOCS}\n\n"

    def extract_answer(self, response_text: str) -> str | None:
        text = remove_blocks(response_text, BEGIN_DOCS, END_DOCS)
        return last_tag_content(text, "<answer>", "</answer>")


@register_prompt_variant
class R1SearcherBaseFormat(R1SearcherFormat):
    """R1-Searcher's tags with its prompt for base models (``rollout.format: r1_searcher_base``): the
    instruction, the question and ``Assistant: <think>`` as one plain text, no system prompt (its
    Qwen-2.5-7B-Base runs; use it with a model that has no chat template)."""

    name = "r1_searcher_base"

    def __init__(self):
        super().__init__(variant="base")
