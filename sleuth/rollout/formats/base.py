"""Protocol formats: how a question becomes a prompt, how a policy turn becomes an action, and
how retrieved passages become an observation.

One object per format. The rollout loop only talks to this interface:

    fmt.user_content(question)            -> str   the instruction + question (user message / raw prompt)
    fmt.system_prompt                     -> str | None
    fmt.stop_sequences                    -> list[str]  stop generation *during* decoding on these
    fmt.parse_action(turn_text)           -> Action  (search with queries / answer / invalid)
    fmt.render_observation(results)       -> str   injected text for one search turn
    fmt.render_invalid()                  -> str   the corrective message for an invalid turn
    fmt.render_error(message)             -> str   observation when retrieval failed
    fmt.extract_answer(response_text)     -> str | None  (for rewards: the last answer in a response)

``results`` is a list with one entry per executed query: ``(query, passages)``.

Optional attributes (read with ``getattr(fmt, name, default)``; not part of the Protocol so that
test doubles need not define them):

    fmt.generation_prefix  -> str   text the assistant turn starts with, injected after the chat
                                    template's generation prompt ("<think>" for R1-Searcher chat)
    fmt.tools              -> list  JSON schemas for ``apply_chat_template(..., tools=...)`` when
                                    ``tool_messages`` is True (the ``tool_call`` format)
    fmt.search_turn(query, thought) -> str   a policy turn that searches, and
    fmt.answer_turn(answer, thought) -> str  one that answers: how ``sleuth sft`` writes the policy's
                                    turns of a synthesized transcript (``search_r1``, ``tool_call``)
    fmt.example            -> WorkedExample | None  a demonstration the prompt puts before the question
                                    (``search_r1_fewshot``); the no-search and RAG baselines show it
                                    in their own form (eval's ``NoSearchFormat``, ``RagFormat``)
    fmt.examples           -> tuple[WorkedExample, ...]  several, in order (``search_r1_fewshot3``); read
                                    both through :func:`worked_examples`
    fmt.reasks             -> bool  True: the observation asks the row's question again after the passages
                                    (``search_r1_fewshot3_reask``): ``render_observation(results, question)``

Parsing rules shared by every format (each departs from its paper's code only where noted):

* The *first complete* action in a turn wins: the leftmost opening tag that has its closing tag
  (the same rule as Search-R1's ``re.search(r"<(search|answer)>(.*?)</\\1>")``). Generation stops
  at the first closing tag, so two actions in one turn only appear in text that was not generated
  with the stop sequences (pasted transcripts, backends without stop strings).
* An opening tag without its closing tag is not an action; a turn with no complete action is
  INVALID with a reason naming the unclosed tag.
* Text inside observation blocks that the *policy* wrote itself (``<information>`` for Search-R1,
  ``<|begin_of_documents|>`` for R1-Searcher, ``<tool_response>`` for tool calls; an unclosed one
  runs to the end of the turn) is ignored, so a policy cannot fake a search result holding an answer.
* Queries and answers are stripped of surrounding whitespace; an empty query is INVALID.

This module holds the interface, the registry and the parsing helpers every format shares; each
format lives in its own module of this package (``search_r1``, ``r1_searcher``, ``tool_call``) and
registers itself with :func:`register`; the package's ``__init__`` imports them all.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sleuth.errors import ConfigError
from sleuth.types import Action, Passage, Question


@dataclass(frozen=True)
class WorkedExample:
    """One demonstration a prompt shows before the question, for base models (which continue text rather than
    follow an instruction): a question, a search for ``query`` that returns ``passage``, and the answer, with the
    thought before each turn; ``direct_thought`` is the thought of the no-search baseline's demonstration (no
    passage read)."""

    question: str
    search_thought: str
    query: str
    passage: Passage
    answer_thought: str
    direct_thought: str
    answer: str


def worked_examples(fmt) -> tuple[WorkedExample, ...]:
    """The demonstrations ``fmt``'s prompt shows before the question, in order: ``fmt.examples``, else
    ``fmt.example`` alone, else none."""
    many = getattr(fmt, "examples", None)
    if many:
        return tuple(many)
    one = getattr(fmt, "example", None)
    return (one,) if one is not None else ()


@runtime_checkable
class ProtocolFormat(Protocol):
    name: str
    system_prompt: str | None
    stop_sequences: list[str]
    tool_messages: bool  # True: observations go in as chat "tool" messages (JSON tool-call format)

    def user_content(self, question: Question) -> str: ...

    def parse_action(self, turn_text: str) -> Action: ...

    def render_observation(self, results: list[tuple[str, list[Passage]]]) -> str: ...

    def render_invalid(self) -> str: ...

    def render_error(self, message: str) -> str: ...

    def extract_answer(self, response_text: str) -> str | None: ...


FORMATS: dict[str, type] = {}
"""The protocols: name -> class."""
PROMPT_VARIANTS: dict[str, type] = {}
"""Names of a registered protocol with another prompt (same tags, parsing and observations), e.g.
``search_r1_tiny``, the embedded tiny model's short Search-R1 prompt."""


def register(cls: type) -> type:
    FORMATS[cls.name] = cls
    return cls


def register_prompt_variant(cls: type) -> type:
    PROMPT_VARIANTS[cls.name] = cls
    return cls


def format_names() -> list[str]:
    """Every name ``get_format`` builds (``rollout.format``'s choices)."""
    return sorted({**FORMATS, **PROMPT_VARIANTS})


def get_format(name: str, **options) -> ProtocolFormat:
    """Build a protocol format by name (``search_r1``, ``r1_searcher``, ``tool_call``, or a prompt
    variant such as ``search_r1_tiny``).

    ``options`` go to the format's constructor (e.g. ``variant="base"`` for ``r1_searcher``).
    """
    cls = FORMATS.get(name) or PROMPT_VARIANTS.get(name)
    if cls is None:
        raise ConfigError(f"unknown protocol format {name!r}; choose one of {format_names()}")
    return cls(**options)


# ---------------------------------------------------------------------------------------------
# Tag helpers shared by the formats
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _block_pattern(open_tag: str, close_tag: str) -> re.Pattern:
    return re.compile(re.escape(open_tag) + r".*?(?:" + re.escape(close_tag) + r"|\Z)", re.DOTALL)


def remove_blocks(text: str, open_tag: str, close_tag: str) -> str:
    """Drop every ``open_tag … close_tag`` block from ``text`` (an unclosed one runs to the end)."""
    return _block_pattern(open_tag, close_tag).sub("", text)


@functools.lru_cache(maxsize=64)
def _action_pattern(tags: tuple[tuple[str, str, str], ...]) -> re.Pattern:
    alternatives = [
        re.escape(open_tag) + f"(?P<{name}>.*?)" + re.escape(close_tag) for name, open_tag, close_tag in tags
    ]
    return re.compile("|".join(alternatives), re.DOTALL)


def first_complete_tag(text: str, tags: tuple[tuple[str, str, str], ...]) -> tuple[str, str] | None:
    """``(name, raw content)`` of the leftmost complete tag pair in ``text``, or None.

    ``tags`` holds ``(name, open_tag, close_tag)`` triples; names must be valid regex group names.
    """
    m = _action_pattern(tags).search(text)
    if m is None:
        return None
    name = m.lastgroup
    return name, m.group(name)


def no_action_reason(text: str, tags: tuple[tuple[str, str, str], ...]) -> str:
    """Why ``text`` holds no complete action: names the first unclosed opening tag, if any."""
    opened = [(text.find(o), o, c) for _, o, c in tags if o in text]
    if opened:
        _, open_tag, close_tag = min(opened)
        return f"unclosed {open_tag} tag (no {close_tag} after it)"
    wanted = " or ".join(f"{o}…{c}" for _, o, c in tags)
    return f"no complete {wanted} in the turn"


def last_tag_content(text: str, open_tag: str, close_tag: str) -> str | None:
    """Content of the last complete ``open_tag … close_tag`` pair in ``text`` (stripped), or None."""
    matches = list(re.finditer(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), text, re.DOTALL))
    return matches[-1].group(1).strip() if matches else None


def normalize_question(text: str) -> str:
    """Search-R1's question preprocessing: strip, then append '?' when missing."""
    text = text.strip()
    if text and not text.endswith("?"):
        text += "?"
    return text


# ---------------------------------------------------------------------------------------------
# Search-R1 tags
