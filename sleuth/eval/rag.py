"""The retrieval-augmented baseline of Search-R1's tables (``sleuth eval --rag``): retrieve the top-k passages
with the question itself, put them in the prompt, answer once, no search turns.

It changes what ``--no-search`` changes (a prompt of its own, :class:`RagFormat` around the chosen format, so
stop strings, answer parsing and the chat template stay the same, with the format's worked example, if it has
one, shown with its passage; ``max_turns=0``, so a ``<search>`` the model writes is not executed and ends its row
unanswered), and adds the passages: one search per question before
the rollout, with the question's text as the query, through the same retriever (and retrieval cache) as the
search runs, rendered as the format renders an observation and cut to ``rollout.max_obs_tokens`` tokens.
"""

from __future__ import annotations

from sleuth.rollout.formats import normalize_question, worked_examples
from sleuth.types import Question

RAG_INSTRUCTION = (
    "Answer the given question using the passages below and your own knowledge; no search engine is available. "
    "You may reason inside <think> and </think> first, then give the final answer inside <answer> and </answer>, "
    "without detailed illustrations. For example, <answer> Beijing </answer>.{passages}Question: {question}\n"
)


class RagFormat:
    """Wraps a protocol format for the RAG baseline: only the prompt changes (no system prompt or tool schemas,
    which would describe the search tool); every other attribute is the wrapped format's."""

    def __init__(self, base, passages: dict[str, str]):
        self.base, self.passages = base, passages
        self.name = f"{base.name}+rag"
        self.system_prompt = None
        self.tools = None

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def user_content(self, question: Question) -> str:
        """:data:`RAG_INSTRUCTION` with the question's passages; with a format that shows a worked example
        (``search_r1_fewshot``), its passage, question and answer go first, as the search prompt shows them."""
        passages, text = self.passages[question.id], normalize_question(question.text)
        examples = worked_examples(self.base)
        if not examples:
            return RAG_INSTRUCTION.format(passages=passages, question=text)
        head = RAG_INSTRUCTION[:RAG_INSTRUCTION.index("{passages}")]
        shots = "".join(self.base.render_observation([(ex.query, [ex.passage])]) + f"Question: {ex.question}\n"
                        + self.base.answer_turn(ex.answer, ex.answer_thought) for ex in examples)
        return f"{head}{shots}{passages}Question: {text}\n"


def rag_passages(questions: list[Question], retriever, fmt, tokenizer, *, k: int, max_tokens: int) -> dict[str, str]:
    """``{question id: the rendered top-k passages}`` (the question's text as the query), each cut to
    ``max_tokens`` tokens of the tokenizer."""
    queries = [normalize_question(q.text) for q in questions]
    found = retriever.search(queries, k)
    out = {}
    for q, query, passages in zip(questions, queries, found):
        text = fmt.render_observation([(query, passages)])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            text = tokenizer.decode(ids[:max_tokens]) + "\n\n"
        out[q.id] = text
    return out
