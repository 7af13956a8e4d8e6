"""Prompts and injected text as token ids, with or without the tokenizer's chat template.

Two ways a trajectory grows, both token-in/token-out (policy tokens are never re-tokenised):

* **In-message** (Search-R1, R1-Searcher, and every format without a chat template): the whole
  search/observe loop lives inside one assistant message, as in the papers. Observations,
  corrective messages and the final nudge are plain text appended after the sampled tokens:
  ``tokenizer(text, add_special_tokens=False)``.
* **Tool messages** (formats with ``tool_messages = True``, behind a chat template): an
  observation is a ``{"role": "tool"}`` message. Its token ids are the *delta* the template
  produces after the assistant's text: we render ``[user, assistant(SENTINEL), tool(text)]`` with
  ``add_generation_prompt=True`` and keep what follows the sentinel (the assistant message's closing
  tokens, the tool message, the next generation prompt, then ``fmt.generation_prefix``). When the
  policy already closed its message with a sampled eos (``<|im_end|>``), that text is not repeated.
  Corrective messages and the nudge stay in-message text in both modes.

Equivalence: for ChatML-like templates the ids built this way equal
``apply_chat_template(whole conversation)`` token for token whenever the sampled turns tokenise
to themselves (tested). Two documented differences: (1) the sampled tokens are kept as sampled,
so a re-tokenisation of the same text may merge differently at a turn boundary (text equal,
ids not); (2) templates that rewrite earlier assistant turns (e.g. Qwen3 dropping old
``<think>`` blocks) render history differently from what the policy saw while generating; we keep
what the policy saw.
"""

from __future__ import annotations

import sys

from sleuth.errors import ModelError
from sleuth.types import Passage, Question

SENTINEL = "SLEUTHSENTINEL9a7e"


_SAID_PLAIN: set[str] = set()


def _say_plain_once(tokenizer) -> None:
    """A tokenizer without a chat template (a base model): prompts are plain text, said once per tokenizer."""
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    if name not in _SAID_PLAIN:
        _SAID_PLAIN.add(name)
        print(f"note: the tokenizer of {name} has no chat template: prompts are plain text, the format's "
              "instruction as their prefix (as Search-R1 prompts base models)", file=sys.stderr, flush=True)


def uses_chat_template(tokenizer, use_chat_template: bool = True) -> bool:
    """Whether prompts go through the tokenizer's chat template: asked for and the tokenizer has one."""
    return bool(use_chat_template and getattr(tokenizer, "chat_template", None))


def prompt_mode(tokenizer, use_chat_template: bool = True) -> str:
    """How prompts are written, in words (an eval's ``report.md``: ``rollout.use_chat_template`` is what was asked)."""
    if uses_chat_template(tokenizer, use_chat_template):
        return "the tokenizer's chat template"
    why = "the tokenizer has no chat template" if use_chat_template else "rollout.use_chat_template is false"
    return f"plain text ({why})"


class ChatRenderer:
    """Builds prompt ids and injected-text ids for one (tokenizer, format) pair."""

    def __init__(self, tokenizer, fmt, use_chat_template: bool = True):
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.uses_template = uses_chat_template(tokenizer, use_chat_template)
        if use_chat_template and not self.uses_template:
            _say_plain_once(tokenizer)
        self.tool_messages = bool(getattr(fmt, "tool_messages", False))
        self.generation_prefix = getattr(fmt, "generation_prefix", "") or ""
        self.tools = getattr(fmt, "tools", None) if self.tool_messages else None

    def encode(self, text: str) -> list[int]:
        """Token ids of injected text (no BOS/EOS added; special-token strings are recognised)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _template(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as e:  # jinja errors: a template without tool support, a bad template
            roles = [m["role"] for m in messages]
            raise ModelError(
                f"the tokenizer's chat template failed on roles {roles}: {e}; use a model whose "
                "template supports them or set rollout.use_chat_template=false"
            ) from e

    def prompt(self, question: Question) -> tuple[list[int], str]:
        """The prompt for one question: ids (BOS as the tokenizer adds it) and text."""
        user = self.fmt.user_content(question)
        system = getattr(self.fmt, "system_prompt", None)
        if self.uses_template:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": user}
            ]
            text = self._template(messages, add_generation_prompt=True) + self.generation_prefix
            return self.encode(text), text
        text = (f"{system}\n\n" if system else "") + user + self.generation_prefix
        return list(self.tokenizer(text)["input_ids"]), text

    def render_observation(self, results: list[tuple[str, list[Passage]]], question: str | None = None) -> str:
        """The format's observation text (raw variant for tool formats without a template); a format that
        re-asks (``fmt.reasks``) is given the question."""
        raw = getattr(self.fmt, "render_raw_observation", None)
        if self.tool_messages and not self.uses_template and raw is not None:
            return raw(results)
        if getattr(self.fmt, "reasks", False):
            return self.fmt.render_observation(results, question)
        return self.fmt.render_observation(results)

    def observation_ids(self, text: str, last_token: int | None = None) -> tuple[list[int], str]:
        """Ids and text to append for an observation (or retrieval error) after a policy turn."""
        if not (self.tool_messages and self.uses_template):
            return self.encode(text), text
        messages = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": SENTINEL},
            {"role": "tool", "content": text},
        ]
        rendered = self._template(messages, add_generation_prompt=True)
        if SENTINEL not in rendered:
            raise ModelError("the chat template dropped the assistant message; cannot compute the tool delta")
        delta = rendered.split(SENTINEL, 1)[1] + self.generation_prefix
        if last_token is not None:
            closing = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if closing and delta.startswith(closing):  # the policy closed its message itself
                delta = delta[len(closing) :]
        return self.encode(delta), delta

    def text_ids(self, text: str) -> tuple[list[int], str]:
        """Ids for in-message injected text (corrective message, final nudge)."""
        return self.encode(text), text
