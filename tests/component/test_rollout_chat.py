"""Chat templates: the incrementally built token sequence equals what the template produces."""

import re

import pytest

from sleuth.config import RolloutConfig
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.rollout.chat import ChatRenderer, prompt_mode
from sleuth.rollout.formats import get_format
from sleuth.rollout.loop import run_rollouts
from sleuth.types import Action, ActionKind, Passage, Question, StopReason
from tests.helpers.tiny import ScriptedBackend, tiny_tokenizer

pytestmark = pytest.mark.component

Q = Question("hq/7", "Who wrote Hamlet", ("William Shakespeare",))
CORPUS = [Passage("d1", "Hamlet", "Hamlet is a tragedy written by William Shakespeare.")]
CALL = '<tool_call>{"query": "who wrote Hamlet"}</tool_call>'
ANSWER = "<answer> William Shakespeare </answer>"


class ToolFormat:
    """A minimal tool-message format (test double of the JSON tool-call format)."""

    name = "test_tool"
    system_prompt = "You are a helpful assistant."
    stop_sequences = ["</tool_call>", "</answer>"]
    tool_messages = True

    def user_content(self, question):
        return f"Answer with the search tool. Question: {question.text}?"

    def parse_action(self, turn_text):
        if m := re.search(r"<answer>(.*?)</answer>", turn_text, re.DOTALL):
            return Action(ActionKind.ANSWER, answer=m.group(1).strip())
        if m := re.search(r'<tool_call>\{"query": "(.*?)"\}</tool_call>', turn_text):
            return Action(ActionKind.SEARCH, queries=[m.group(1)])
        return Action(ActionKind.INVALID, error="no action")

    def render_observation(self, results):
        return " | ".join(p.text for _, ps in results for p in ps)

    def render_invalid(self):
        return "\nInvalid, try again.\n"

    def render_error(self, message):
        return f"error: {message}"

    def extract_answer(self, text):
        return None


@pytest.fixture(scope="module")
def chat_tok():
    return tiny_tokenizer(chat_template=True)


def rollout(tok, fmt, turns, **kw):
    cfg = RolloutConfig(group_size=1, max_turns=2, use_chat_template=True, **kw)
    trajs, _ = run_rollouts([Q], ScriptedBackend(tok, turns), tok, fmt, InMemoryRetriever(CORPUS), cfg, k=1)
    return trajs[0]


def template_ids(tok, messages, **kw):
    return tok(tok.apply_chat_template(messages, tokenize=False, **kw), add_special_tokens=False)["input_ids"]


def test_tool_messages_equal_the_template_token_for_token(chat_tok):
    fmt = ToolFormat()
    t = rollout(chat_tok, fmt, [CALL, ANSWER])
    assert t.stop_reason is StopReason.ANSWERED
    messages = [
        {"role": "system", "content": fmt.system_prompt},
        {"role": "user", "content": fmt.user_content(Q)},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "Hamlet is a tragedy written by William Shakespeare."},
        {"role": "assistant", "content": ANSWER},
    ]
    full = template_ids(chat_tok, messages)
    # the template closes the last assistant message with "<|im_end|>\n"; the policy stopped at
    # </answer> (a stop string) and never sampled those tokens
    closing = chat_tok("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert full[-len(closing) :] == closing
    assert t.token_ids == full[: -len(closing)]
    # mask: exactly the two assistant contents are trained
    trained = [tok for s in t.segments if s.trained for tok in s.token_ids]
    assert trained == chat_tok(CALL + ANSWER, add_special_tokens=False)["input_ids"]
    # the injected tool delta closes the assistant message and opens the next one
    assert t.segments[2].text.startswith("<|im_end|>\n<|im_start|>tool\n")
    assert t.segments[2].text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_eos_sampled_by_the_policy_is_not_repeated_in_the_delta(chat_tok):
    fmt = ToolFormat()
    fmt.stop_sequences = ["</answer>"]  # the call turn now ends with the policy's own <|im_end|>
    t = rollout(chat_tok, fmt, [CALL + "<|eos|>", ANSWER])
    assert t.segments[1].token_ids[-1] == chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert t.segments[1].trained and t.num_searches == 1
    messages = [
        {"role": "system", "content": fmt.system_prompt},
        {"role": "user", "content": fmt.user_content(Q)},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": CORPUS[0].text},
        {"role": "assistant", "content": ANSWER},
    ]
    closing = chat_tok("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert t.token_ids == template_ids(chat_tok, messages)[: -len(closing)]


def test_in_message_format_continues_the_assistant_text(chat_tok):
    fmt = get_format("search_r1")
    search = "<search> who wrote Hamlet </search>"
    t = rollout(chat_tok, fmt, [search, ANSWER])
    prompt = chat_tok.apply_chat_template(
        [{"role": "user", "content": fmt.user_content(Q)}], tokenize=False, add_generation_prompt=True
    )
    obs = fmt.render_observation([("who wrote Hamlet", CORPUS)])
    assert t.segments[0].text == prompt
    assert chat_tok.decode(t.token_ids) == prompt + search + obs + ANSWER
    assert t.segments[2].token_ids == chat_tok(obs, add_special_tokens=False)["input_ids"]


def test_raw_prompt_without_template_or_when_disabled(chat_tok):
    fmt = get_format("search_r1")
    assert not ChatRenderer(tiny_tokenizer(), fmt, True).uses_template  # no template on the tokenizer
    r = ChatRenderer(chat_tok, fmt, use_chat_template=False)
    ids, text = r.prompt(Q)
    assert text == fmt.user_content(Q) and "<|im_start|>" not in text
    assert ids == chat_tok(text)["input_ids"]
    # how an eval's report.md says the prompts were written (rollout.use_chat_template is what was asked)
    assert prompt_mode(chat_tok) == "the tokenizer's chat template"
    assert prompt_mode(tiny_tokenizer()) == "plain text (the tokenizer has no chat template)"
    assert prompt_mode(chat_tok, False) == "plain text (rollout.use_chat_template is false)"


def test_generation_prefix_and_system_prompt_are_used(chat_tok):
    class Prefixed(ToolFormat):
        generation_prefix = "<think>"

    ids, text = ChatRenderer(chat_tok, Prefixed()).prompt(Q)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n<think>")
    delta_ids, delta = ChatRenderer(chat_tok, Prefixed()).observation_ids("result")
    assert delta == "<|im_end|>\n<|im_start|>tool\nresult<|im_end|>\n<|im_start|>assistant\n<think>"


def test_template_without_tool_support_gives_a_clear_error():
    tok = tiny_tokenizer(chat_template=True)
    renderer = ChatRenderer(tok, ToolFormat())
    renderer.tokenizer = _NoToolTemplate(tok)
    with pytest.raises(ValueError, match="use_chat_template=false"):
        renderer.observation_ids("x")


class _NoToolTemplate:
    def __init__(self, tok):
        self.tok = tok

    def apply_chat_template(self, messages, **kw):
        if any(m["role"] == "tool" for m in messages):
            raise RuntimeError("Conversation roles must alternate user/assistant")
        return self.tok.apply_chat_template(messages, **kw)


def test_a_tokenizer_without_a_template_gets_plain_prompts_said_once(monkeypatch, capsys):
    """A base model (no chat template): the instruction is the prompt's plain prefix, and the note that says
    so is printed once however many renderers the run builds (one per rollout)."""
    from sleuth.rollout import chat
    from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION, get_format
    from sleuth.types import Question
    from tests.helpers.tiny import tiny_tokenizer

    monkeypatch.setattr(chat, "_SAID_PLAIN", set())
    tok = tiny_tokenizer(chat_template=False)
    q = Question("q1", "What is the capital of France", ("Paris",))
    texts = [chat.ChatRenderer(tok, get_format("search_r1")).prompt(q)[1] for _ in range(3)]
    assert texts[0] == texts[2] and texts[0].startswith(SEARCH_R1_INSTRUCTION.split("{")[0][:40])
    assert capsys.readouterr().err.count("has no chat template: prompts are plain text") == 1
    chat.ChatRenderer(tok, get_format("search_r1"), use_chat_template=False)  # asked for: no note
    assert capsys.readouterr().err == ""
