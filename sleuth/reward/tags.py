"""Reading a Search-R1 response: the final answer, the format check and the retrieval hit.

All functions take the *response*: the text after the prompt (policy turns and injected
``<information>`` blocks), never the prompt, and never depend on a chat template.

How this departs from Search-R1 (``verl/utils/reward_score/qa_em*.py``) and why the numbers agree:

* **Answer extraction.** Search-R1's reward manager decodes prompt + response and
  ``extract_solution`` returns the last ``<answer>(.*?)</answer>`` match, or None when there are
  at most one. Its instruction already holds *two* complete pairs ("provide the answer inside
  ``<answer> and </answer>``" and "For example, ``<answer> Beijing </answer>``"), so on real
  transcripts that guard never fires: when the response holds an answer, the last match is the
  response's last answer, exactly what we return from the response alone; when it holds none,
  Search-R1 scores the prompt's example ``Beijing`` and we return None (score 0). So on a
  response without an answer the two differ only when a gold normalises to ``beijing`` (EM) or
  to a substring of it (cover-EM), or (F1) holds the token ``beijing``;
  ``sleuth reward score --no-answer-as Beijing`` reproduces Search-R1 there too.
  Like Search-R1 we do not skip ``<information>`` blocks: a passage that quotes
  ``<answer>…</answer>`` counts, and so does the ``<answer> and </answer>`` inside the
  invalid-action message.
* **Format check.** Search-R1's ``is_valid_sequence`` first looks for ``<|im_start|>assistant``
  (Qwen's chat template) and fails without it; we run the same state machine directly on the
  response, so base models and other templates are judged by the same rule.
* **Retrieval hit.** Search-R1 scans prompt + response for ``<information>`` blocks, and its
  instruction contains the pair ``<information> and </information>``; so there a gold whose
  normalised form is a substring of ``"and"`` (``""``, ``"A"``, ``"D"``, ``"N"``, ``"and"`` …)
  is always a "hit". We scan the response only; for every other gold the two agree.
"""

from __future__ import annotations

import re

from sleuth.reward.metrics import Golds, as_answer_list, normalize_answer

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_TAG_NAMES = ("think", "search", "information", "answer")
_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")
_TAGS = frozenset(f"<{slash}{name}>" for name in _TAG_NAMES for slash in ("", "/"))

# (tag, state it is allowed in) -> next state; the Search-R1 v0.3 sequence
#   start -> think -> (search -> information -> think)* -> answer -> end
_TRANSITIONS = {
    ("<think>", "start"): "in_think",
    ("<think>", "information"): "in_think",
    ("</think>", "in_think"): "after_think",
    ("<search>", "after_think"): "in_search",
    ("</search>", "in_search"): "after_search",
    ("<information>", "after_search"): "in_information",
    ("</information>", "in_information"): "information",
    ("<answer>", "after_think"): "in_answer",
    ("</answer>", "in_answer"): "end",
}
_INSIDE = frozenset({"in_think", "in_search", "in_information", "in_answer"})
_BETWEEN = frozenset({"start", "after_think", "after_search", "information"})


def extract_answer(response: str) -> str | None:
    """The stripped content of the last complete ``<answer>…</answer>`` in the response, or None."""
    matches = _ANSWER.findall(response)
    return matches[-1].strip() if matches else None


def information_blocks(response: str) -> list[str]:
    """The stripped contents of every complete ``<information>…</information>`` block, in order."""
    return [m.strip() for m in _INFORMATION.findall(response)]


def search_calls(response: str) -> list[str]:
    """The stripped queries of every complete ``<search>…</search>``, in order."""
    return [m.strip() for m in _SEARCH.findall(response)]


def check_format(response: str) -> tuple[bool, str]:
    """Search-R1 v0.3 ``is_valid_sequence`` over the response: ``(valid, reason)``.

    Valid means: every tag balanced; the tags follow
    ``<think>…</think> (<search>…</search> <information>…</information> <think>…</think>)*
    <answer>…</answer>`` (an ``<information>`` block only right after a search); nothing but
    whitespace between tags; and the response ends with ``</answer>`` (only whitespace after it).
    """
    for name in _TAG_NAMES:
        opened, closed = response.count(f"<{name}>"), response.count(f"</{name}>")
        if opened != closed:
            return False, f"mismatch in {name} tags: {opened} opening vs {closed} closing"
    state = "start"
    for part in _SPLIT.split(response):
        if not part.strip():
            continue
        if part in _TAGS:
            nxt = _TRANSITIONS.get((part, state))
            if nxt is None:
                return False, f"unexpected tag {part} in state {state}"
            state = nxt
        elif state in _BETWEEN:
            return False, f"unexpected text {part.strip()[:40]!r} between tags (state {state})"
        elif state not in _INSIDE:
            return False, f"unexpected text {part.strip()[:40]!r} after the answer"
    if state != "end":
        return False, f"incomplete sequence, ended in state {state}"
    return True, "valid"


def is_valid_format(response: str) -> bool:
    """True when :func:`check_format` accepts the response."""
    return check_format(response)[0]


# What a re-asking prompt variant (``rollout.format: search_r1_fewshot3_reask``) writes inside an observation after
# its passages, followed by the question: not passage text, so no retrieval hit is read from it.
REASK = "\n\nQuestion: "


def answer_in_texts(texts: list[str], golden_answers: Golds) -> bool:
    """True when some normalised gold answer is a substring of some normalised text (a text's re-asked question,
    from :data:`REASK` on, not read)."""
    golds = [normalize_answer(g) for g in as_answer_list(golden_answers)]
    for text in texts:
        norm = normalize_answer(text.partition(REASK)[0])
        if any(g in norm for g in golds):
            return True
    return False


def retrieval_hit(response: str, golden_answers: Golds) -> bool:
    """Search-R1 ``is_retrieval_correct``: a gold answer appears in a retrieved
    ``<information>`` block of the response (both normalised; substring match)."""
    return answer_in_texts(information_blocks(response), golden_answers)
