"""JSON tool calls (Qwen2.5 / Hermes style) for a ``search`` tool taking a list of queries.

The policy writes ``<tool_call>{"name": "search", "arguments": {"query_list": [...]}}</tool_call>``
(Hermes: one JSON object between the tags) and answers in ``<answer>…</answer>``. Results come back
as chat ``"tool"`` messages, which Qwen/Hermes chat templates wrap in ``<tool_response>…</tool_response>``.

Texts follow verl's Search-R1-like tool recipe (``examples/data_preprocess/preprocess_search_r1_dataset.py``
and ``verl/tools/utils/search_r1_like_utils.py``): system prompt ``"You are a helpful and harmless
assistant."``, the Search-R1 instruction reworded for ``<tool_call>``/``<tool_response>``, the
``search(query_list)`` schema, and one tool message per call holding ``{"result": ...}`` with the
per-query ``Doc i(Title: …) …`` blocks joined by ``"\\n---\\n"`` (each query's results in the order
of ``query_list``).

How the rollout uses it (``tool_messages = True``): pass ``fmt.tools`` to
``tokenizer.apply_chat_template(messages, tools=fmt.tools, ...)``; send ``render_observation(results)``
(and ``render_error(message)``) as the content of one ``{"role": "tool"}`` message. Without a chat
template, ``render_raw_observation(results)`` gives the same content wrapped in the tags.

Departures (documented): the result JSON keeps non-ASCII characters (verl escapes them, which costs
tokens); the question is normalised as in Search-R1 (strip, append '?'); ``arguments`` may also be a
JSON-encoded string (OpenAI style); every query must be a non-empty string.
"""

from __future__ import annotations

import copy
import json

from sleuth.rollout.formats.base import (
    first_complete_tag,
    last_tag_content,
    no_action_reason,
    normalize_question,
    register,
    remove_blocks,
)
from sleuth.rollout.formats.search_r1 import render_passages_search_r1
from sleuth.types import Action, ActionKind, Passage, Question

TOOL_CALL_SYSTEM = "You are a helpful and harmless assistant."

# verl's DEFAULT_USER_CONTENT_PREFIX (the question follows "Question: " directly).
TOOL_CALL_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack "
    "some knowledge, you can call a search engine by <tool_call> query </tool_call> "
    "and it will return the top searched results between <tool_response> and "
    "</tool_response>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: "
)

SEARCH_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the web for relevant information based on the given query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "A list of fully-formed semantic queries. The tool will return search "
                    "results for each query.",
                }
            },
            "required": ["query_list"],
        },
    },
}

TOOL_CALL_INVALID = (
    "\nMy previous action is invalid. "
    'If I want to search, I should call the search tool as <tool_call>{"name": "search", '
    '"arguments": {"query_list": ["query"]}}</tool_call>. '
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

NO_RESULTS = "No search results found."
_TAGS = (("call", "<tool_call>", "</tool_call>"), ("answer", "<answer>", "</answer>"))


def parse_search_call(payload: str) -> Action:
    """Validate the JSON between ``<tool_call>`` tags; a SEARCH action or INVALID with the reason."""

    def invalid(why: str) -> Action:
        return Action(ActionKind.INVALID, error=f"tool call: {why}")

    try:
        call = json.loads(payload)
    except json.JSONDecodeError as e:
        return invalid(f"malformed JSON ({e.msg} at char {e.pos})")
    if not isinstance(call, dict):
        return invalid(f"expected a JSON object, got {type(call).__name__}")
    if call.get("name") != "search":
        return invalid(f"unknown tool {call.get('name')!r}; the only tool is 'search'")
    args = call.get("arguments")
    if isinstance(args, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return invalid(f"malformed JSON in 'arguments' ({e.msg})")
    if not isinstance(args, dict):
        return invalid("'arguments' must be an object holding 'query_list'")
    queries = args.get("query_list")
    if queries is None:
        return invalid("missing 'query_list' in arguments")
    if not isinstance(queries, list) or not queries:
        return invalid("'query_list' must be a non-empty list of strings")
    cleaned = []
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            return invalid(f"query_list[{i}] is {type(q).__name__}, not a string")
        if not q.strip():
            return invalid(f"query_list[{i}] is empty")
        cleaned.append(q.strip())
    return Action(ActionKind.SEARCH, queries=cleaned)


@register
class ToolCallFormat:
    """``<tool_call>`` JSON with ``search(query_list)``; results as chat tool messages."""

    name = "tool_call"
    system_prompt: str | None = TOOL_CALL_SYSTEM
    stop_sequences = ["</tool_call>", "</answer>"]
    tool_messages = True
    generation_prefix = ""

    def __init__(self) -> None:
        self.tools = [copy.deepcopy(SEARCH_TOOL_SCHEMA)]

    def user_content(self, question: Question) -> str:
        return TOOL_CALL_INSTRUCTION + normalize_question(question.text)

    def parse_action(self, turn_text: str) -> Action:
        text = remove_blocks(turn_text, "<tool_response>", "</tool_response>")
        found = first_complete_tag(text, _TAGS)
        if found is None:
            return Action(ActionKind.INVALID, error=no_action_reason(text, _TAGS))
        kind, content = found
        if kind == "answer":
            return Action(ActionKind.ANSWER, answer=content.strip())
        return parse_search_call(content.strip())

    def render_observation(self, results: list[tuple[str, list[Passage]]]) -> str:
        """Content of the tool message: ``{"result": per-query blocks joined by "\\n---\\n"}``."""
        blocks = [render_passages_search_r1(passages) or NO_RESULTS for _, passages in results]
        return json.dumps({"result": "\n---\n".join(blocks) or NO_RESULTS}, ensure_ascii=False)

    def render_raw_observation(self, results: list[tuple[str, list[Passage]]]) -> str:
        """The observation as plain text for prompts built without a chat template."""
        return f"\n<tool_response>\n{self.render_observation(results)}\n</tool_response>\n"

    def render_invalid(self) -> str:
        return TOOL_CALL_INVALID

    def render_error(self, message: str) -> str:
        return json.dumps({"result": f"Search error: {message}"}, ensure_ascii=False)

    def extract_answer(self, response_text: str) -> str | None:
        text = remove_blocks(response_text, "<tool_response>", "</tool_response>")
        return last_tag_content(text, "<answer>", "</answer>")

    def search_turn(self, query: str, thought: str) -> str:
        """A policy turn that reasons, then calls the search tool (what ``sleuth sft`` writes)."""
        call = json.dumps({"name": "search", "arguments": {"query_list": [query]}}, ensure_ascii=False)
        return f"<think> {thought} </think>\n<tool_call>{call}</tool_call>"

    def answer_turn(self, answer: str, thought: str) -> str:
        """A policy turn that reasons, then answers."""
        return f"<think> {thought} </think>\n<answer> {answer} </answer>"
