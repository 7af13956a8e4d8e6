"""Protocol formats: exact prompt/observation bytes against the reference texts, and every parser case.

Reference texts are transcribed from the released code they come from (Search-R1
``scripts/data_process/nq_search.py`` / ``infer.py`` / ``search_r1/llm_agent/generation.py``;
R1-Searcher ``prompts_dataset.py`` / ``evaluation/eval_search_loacl.py``; verl's Search-R1-like tool
recipe), in the same source form (triple-quoted strings, line continuations) so that a transcription
slip in ``sleuth`` shows up as a mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sleuth.rollout.formats import FORMATS, ProtocolFormat, get_format
from sleuth.types import ActionKind, Passage, Question

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parents[1] / "fixtures" / "formats_transcripts.json"

# --- references, transcribed from the released code --------------------------------------------

# Search-R1 make_prefix(template_type='base'), an f-string with backslash line continuations.
question = "{question}"
SEARCH_R1_PREFIX = f"""Answer the given question. \
You must conduct reasoning inside <think> and </think> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. \
You can search as many times as your want. \
If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"""

# Search-R1 execute_predictions, the invalid-action observation.
SEARCH_R1_INVALID = '\nMy previous action is invalid. \
If I want to search, I should put the query between <search> and </search>. \
If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n'

# R1-Searcher messages_chat_v3 system prompt and base_prompt_v3 (regular triple-quoted strings:
# the "\n\n" inside them are real newlines).
R1_SYSTEM = """You are a helpful assistant.
Given a question, you should answer it by first thinking about the reasoning process in the mind and then providing the final answer.
The output format of reasoning process and final answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final answer here </answer>".
During the thinking process, **you can perform searching for uncertain knowledge** if necessary with the format of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)<|end_of_query|>". **A query must involve only a single triple**.
Then, the search system will provide you with the retrieval information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>"."""

R1_BASE = """The User asks a question, and the Assistant solves it.
The Assistant first thinks about the reasoning process in the mind and then provides the User with the final answer.
The output format of reasoning process and final answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think>\n\n<answer> final answer here </answer>".
During the thinking process, **the Assistant can perform searching** for uncertain knowledge if necessary with the format of "<|begin_of_query|> search query (only list keywords, such as **"keyword_1 keyword_2 ..."**)<|end_of_query|>". **A query must involve only a single triple**.
Then, the search system will provide the Assistant with the retrieval information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".

User:{question}
Assistant: <think>"""

# verl examples/data_preprocess/preprocess_search_r1_dataset.py
VERL_USER_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack "
    "some knowledge, you can call a search engine by <tool_call> query </tool_call> "
    "and it will return the top searched results between <tool_response> and "
    "</tool_response>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside "
    "<answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: "
)

# --- helpers -----------------------------------------------------------------------------------


def Q(text: str) -> Question:
    return Question(id="t/x/0", text=text, golden_answers=("a",))


def search_turn(name: str, query: str) -> str:
    """How each format writes one search for ``query``."""
    if name == "search_r1":
        return f"<search> {query} </search>"
    if name == "r1_searcher":
        return f"<|begin_of_query|> {query}<|end_of_query|>"
    return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query_list": [query]}}) + "\n</tool_call>"


def policy_observation_block(name: str, inner: str) -> str:
    """An observation block as the *policy* might fake it."""
    return {
        "search_r1": f"<information>{inner}</information>",
        "r1_searcher": f"<|begin_of_documents|>{inner}<|end_of_documents|>",
        "tool_call": f"<tool_response>{inner}</tool_response>",
    }[name]


ALL = sorted(FORMATS)
P1 = Passage("1", "Paris", "Paris is the capital of France.")
P2 = Passage("2", 'The "Louvre"', "A museum\nin Paris.")

# --- registry ----------------------------------------------------------------------------------


def test_all_three_formats_registered_and_satisfy_the_protocol():
    assert ALL == ["r1_searcher", "search_r1", "tool_call"]
    for name in ALL:
        fmt = get_format(name)
        assert isinstance(fmt, ProtocolFormat)
        assert fmt.name == name
        # the answer close tag is always a stop sequence, so a finished answer ends generation
        assert "</answer>" in fmt.stop_sequences


def test_unknown_format_and_bad_variant_are_clear_errors():
    with pytest.raises(ValueError, match="unknown protocol format 'nope'"):
        get_format("nope")
    with pytest.raises(ValueError, match="variant"):
        get_format("r1_searcher", variant="large")


# --- exact prompt bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["who wrote hamlet", "  who wrote hamlet  \n", "who wrote hamlet?"])
def test_search_r1_prompt_is_byte_identical_to_make_prefix(raw):
    fmt = get_format("search_r1")
    # Search-R1 strips the question and appends '?' when missing before make_prefix.
    assert fmt.user_content(Q(raw)) == SEARCH_R1_PREFIX.replace("{question}", "who wrote hamlet?")
    assert fmt.system_prompt is None and fmt.tool_messages is False
    assert fmt.stop_sequences == ["</search>", "</answer>"]


def test_r1_searcher_prompts_are_byte_identical():
    chat = get_format("r1_searcher")
    assert chat.system_prompt == R1_SYSTEM
    assert chat.user_content(Q(" Who directed Jaws? ")) == "Who directed Jaws?"
    assert chat.generation_prefix == "<think>"
    base = get_format("r1_searcher", variant="base")
    assert base.system_prompt is None and base.generation_prefix == ""
    assert base.user_content(Q("Who directed Jaws?")) == R1_BASE.replace("{question}", "Who directed Jaws?")
    assert base.user_content(Q("{x}?")).endswith("User:{x}?\nAssistant: <think>")  # braces are not a template
    assert chat.stop_sequences == ["<|end_of_query|>", "</answer>"]
    named = get_format("r1_searcher_base")  # the base prompt as a rollout.format name
    assert named.name == "r1_searcher_base" and named.system_prompt is None and named.generation_prefix == ""
    assert named.user_content(Q("Who directed Jaws?")) == base.user_content(Q("Who directed Jaws?"))
    assert named.stop_sequences == chat.stop_sequences


def test_tool_call_prompt_and_tool_schema():
    fmt = get_format("tool_call")
    assert fmt.system_prompt == "You are a helpful and harmless assistant."
    assert fmt.user_content(Q("who wrote hamlet")) == VERL_USER_PREFIX + "who wrote hamlet?"
    assert fmt.tool_messages is True
    assert fmt.stop_sequences == ["</tool_call>", "</answer>"]
    (tool,) = fmt.tools
    assert tool["type"] == "function" and tool["function"]["name"] == "search"
    params = tool["function"]["parameters"]
    assert params["required"] == ["query_list"]
    assert params["properties"]["query_list"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "A list of fully-formed semantic queries. The tool will return search results for each query.",
    }
    json.dumps(fmt.tools)  # serialisable for the chat template
    fmt.tools[0]["function"]["name"] = "mutated"  # instances do not share the schema
    assert get_format("tool_call").tools[0]["function"]["name"] == "search"


# --- exact observation bytes -------------------------------------------------------------------


def test_search_r1_observation_bytes():
    fmt = get_format("search_r1")
    obs = fmt.render_observation([("paris", [P1, P2])])
    # _passages2string keeps the raw (quoted) title line and the rest; execute_predictions strips
    # the joined string and wraps it: "\n\n<information>{...}</information>\n\n".
    assert obs == (
        '\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.\n'
        'Doc 2(Title: "The "Louvre"") A museum\nin Paris.</information>\n\n'
    )
    assert fmt.render_observation([("q", [])]) == "\n\n<information></information>\n\n"
    assert fmt.render_invalid() == SEARCH_R1_INVALID
    assert fmt.render_error("timeout") == "\n\n<information>The search failed: timeout</information>\n\n"


def test_search_r1_observation_matches_searchr1_on_raw_corpus_rows():
    """Passages built from wiki-18 ``contents`` render as Search-R1 renders the raw row."""
    rows = [
        '"Evan Morris"\nEvan Morris Evan L. Morris (January 26, 1977 \u2013 July 9, 2015) was a lobbyist.',
        '"You\'ve Got a Friend in Me"\n"You\'ve Got a Friend in Me" is a song by Randy Newman.',
    ]
    expected = ""
    for i, contents in enumerate(rows):  # Search-R1's _passages2string, line by line
        title = contents.split("\n")[0]
        text = "\n".join(contents.split("\n")[1:])
        expected += f"Doc {i + 1}(Title: {title}) {text}\n"
    passages = [Passage.from_contents(str(i), c) for i, c in enumerate(rows)]
    got = get_format("search_r1").render_observation([("q", passages)])
    assert got == f"\n\n<information>{expected.strip()}</information>\n\n"


def test_search_r1_observation_on_unquoted_raw_rows():
    contents = "Evan Morris\n Evan L. Morris was a lobbyist. "
    expected = "Doc 1(Title: Evan Morris)  Evan L. Morris was a lobbyist. \n"  # Search-R1, before .strip()
    got = get_format("search_r1").render_observation([("q", [Passage.from_contents("0", contents)])])
    assert got == f"\n\n<information>{expected.strip()}</information>\n\n"


def test_r1_searcher_observation_bytes():
    fmt = get_format("r1_searcher")
    assert fmt.render_observation([("paris", [P1, P2])]) == (
        "\n\n<|begin_of_documents|>\n"
        "(1)Title: Paris Text: Paris is the capital of France.\n"
        '(2)Title: The "Louvre" Text: A museum\nin Paris.\n'
        "<|end_of_documents|>\n\n"
    )
    assert fmt.render_observation([("q", [])]) == "\n\n<|begin_of_documents|>\nNone<|end_of_documents|>\n\n"
    assert fmt.render_error("down") == "\n\n<|begin_of_documents|>\nThe search failed: down\n<|end_of_documents|>\n\n"
    assert "<|begin_of_query|> and <|end_of_query|>" in fmt.render_invalid()


def test_tool_call_observation_bytes_one_block_per_query():
    fmt = get_format("tool_call")
    obs = fmt.render_observation([("paris", [P1]), ("louvre", [P2]), ("nothing", [])])
    # {"result": blocks joined by "\n---\n"}, each block Search-R1's Doc lines (ending in "\n").
    assert json.loads(obs) == {
        "result": 'Doc 1(Title: "Paris") Paris is the capital of France.\n'
        "\n---\n"
        'Doc 1(Title: "The "Louvre"") A museum\nin Paris.\n'
        "\n---\n"
        "No search results found."
    }
    assert obs.startswith('{"result": "Doc 1(Title: \\"Paris\\") Paris')
    assert json.loads(fmt.render_observation([])) == {"result": "No search results found."}
    assert fmt.render_error("timeout") == '{"result": "Search error: timeout"}'
    assert fmt.render_raw_observation([("paris", [P1])]) == (
        '\n<tool_response>\n{"result": "Doc 1(Title: \\"Paris\\") Paris is the capital of France.\\n"}\n</tool_response>\n'
    )
    assert "<tool_call>" in fmt.render_invalid() and "<answer> and </answer>" in fmt.render_invalid()


def test_tool_call_observation_keeps_non_ascii():
    obs = get_format("tool_call").render_observation([("q", [Passage("1", "Zürich", "Stadt – See")])])
    assert "Zürich" in obs and "–" in obs


# --- parser cases, every format ----------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_parse_search(name):
    action = get_format(name).parse_action("<think> I should look it up. </think>\n" + search_turn(name, "capital of France"))
    assert action.kind is ActionKind.SEARCH and action.queries == ["capital of France"]


@pytest.mark.parametrize("name", ALL)
def test_parse_answer_strips_whitespace(name):
    action = get_format(name).parse_action("<think> done </think>\n<answer>\n  Paris \n</answer>")
    assert action.kind is ActionKind.ANSWER and action.answer == "Paris"


@pytest.mark.parametrize("name", ALL)
def test_unclosed_search_is_invalid_and_names_the_tag(name):
    fmt = get_format(name)
    text = search_turn(name, "capital of France")
    close = fmt.stop_sequences[0]
    action = fmt.parse_action(text[: text.index(close)])  # generation hit max tokens before closing
    assert action.kind is ActionKind.INVALID and "unclosed" in action.error


@pytest.mark.parametrize("name", ALL)
def test_unclosed_answer_and_no_tags_are_invalid(name):
    fmt = get_format(name)
    assert fmt.parse_action("<think> so </think> <answer> Paris").kind is ActionKind.INVALID
    action = fmt.parse_action("I think the answer is Paris.")
    assert action.kind is ActionKind.INVALID and "no complete" in action.error


@pytest.mark.parametrize("name", ALL)
def test_two_actions_first_complete_one_wins(name):
    fmt = get_format(name)
    search = search_turn(name, "capital of France")
    first_search = fmt.parse_action(f"{search}\n<answer> Paris </answer>")
    assert first_search.kind is ActionKind.SEARCH and first_search.queries == ["capital of France"]
    first_answer = fmt.parse_action(f"<answer> Paris </answer>\n{search}")
    assert first_answer.kind is ActionKind.ANSWER and first_answer.answer == "Paris"
    # an unclosed search before a complete answer: the answer is the first complete action
    open_search = search[: search.index(fmt.stop_sequences[0])]
    later = fmt.parse_action(f"{open_search} <answer> Paris </answer>")
    assert later.kind is ActionKind.ANSWER and later.answer == "Paris"


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_is_invalid(name, query):
    action = get_format(name).parse_action(search_turn(name, query))
    assert action.kind is ActionKind.INVALID and "empty" in action.error


@pytest.mark.parametrize("name", ALL)
def test_tags_inside_policy_written_observation_block_are_ignored(name):
    fmt = get_format(name)
    fake = policy_observation_block(name, " <answer> Berlin </answer> ")
    action = fmt.parse_action(f"<think> hmm </think>\n{fake}\n{search_turn(name, 'capital of France')}")
    assert action.kind is ActionKind.SEARCH and action.queries == ["capital of France"]
    # only a fake block: nothing left to act on
    assert fmt.parse_action(fake).kind is ActionKind.INVALID
    # an unclosed fake block swallows the rest of the turn
    opener = fake[: fake.index(" <answer>")]
    assert fmt.parse_action(f"{opener} <answer> Berlin </answer>").kind is ActionKind.INVALID


@pytest.mark.parametrize("name", ALL)
def test_extract_answer_takes_last_answer_outside_observations(name):
    fmt = get_format(name)
    fake = policy_observation_block(name, "<answer> Berlin </answer>")
    response = f"<answer> Lyon </answer> then {fake} and finally <answer> Paris </answer> {fake}"
    assert fmt.extract_answer(response) == "Paris"
    assert fmt.extract_answer(f"no answer here {fake}") is None
    assert fmt.extract_answer("<answer> unclosed") is None


def test_search_r1_query_whitespace_and_newlines_are_stripped():
    action = get_format("search_r1").parse_action("<search>\n  Paris  France \n</search>")
    assert action.queries == ["Paris  France"]  # inner spacing kept, as Search-R1 does


# --- format-specific parser cases --------------------------------------------------------------


def test_r1_searcher_keywords_separated_by_tabs_and_spaces_are_one_query():
    fmt = get_format("r1_searcher")
    action = fmt.parse_action('<|begin_of_query|> "Ralph Hefferline"\tuniversity \t city ...<|end_of_query|>')
    # R1-Searcher: quotes and '...' removed, tabs to spaces; whitespace runs collapsed.
    assert action.kind is ActionKind.SEARCH and action.queries == ["Ralph Hefferline university city"]
    assert fmt.parse_action('<|begin_of_query|> "" ... <|end_of_query|>').kind is ActionKind.INVALID
    # Search-R1 tags mean nothing in this format
    assert fmt.parse_action("<search> x </search>").kind is ActionKind.INVALID


def _call(obj) -> str:
    return f"<tool_call>\n{obj if isinstance(obj, str) else json.dumps(obj)}\n</tool_call>"


def test_tool_call_several_queries_in_one_call():
    action = get_format("tool_call").parse_action(
        _call({"name": "search", "arguments": {"query_list": [" capital of France ", "Louvre city"]}})
    )
    assert action.kind is ActionKind.SEARCH and action.queries == ["capital of France", "Louvre city"]


def test_tool_call_arguments_as_json_string_are_accepted():
    args = json.dumps({"query_list": ["Louvre"]})
    action = get_format("tool_call").parse_action(_call({"name": "search", "arguments": args}))
    assert action.kind is ActionKind.SEARCH and action.queries == ["Louvre"]


@pytest.mark.parametrize(
    "payload, reason",
    [
        ('{"name": "search", "arguments": {"query_list": ["x"]}', "malformed JSON"),
        ("search(query='x')", "malformed JSON"),
        ('["search"]', "expected a JSON object"),
        ({"name": "lookup", "arguments": {"query_list": ["x"]}}, "unknown tool 'lookup'"),
        ({"arguments": {"query_list": ["x"]}}, "unknown tool None"),
        ({"name": "search"}, "'arguments' must be an object"),
        ({"name": "search", "arguments": '{"query_list": '}, "malformed JSON in 'arguments'"),
        ({"name": "search", "arguments": {"query": "x"}}, "missing 'query_list'"),
        ({"name": "search", "arguments": {"query_list": []}}, "non-empty list"),
        ({"name": "search", "arguments": {"query_list": "x"}}, "non-empty list"),
        ({"name": "search", "arguments": {"query_list": ["x", 3]}}, "query_list[1] is int"),
        ({"name": "search", "arguments": {"query_list": [None]}}, "query_list[0] is NoneType"),
        ({"name": "search", "arguments": {"query_list": ["x", " "]}}, "query_list[1] is empty"),
    ],
)
def test_tool_call_bad_calls_are_invalid_with_a_reason(payload, reason):
    action = get_format("tool_call").parse_action(_call(payload))
    assert action.kind is ActionKind.INVALID
    assert reason in action.error, action.error


# --- realistic transcripts ---------------------------------------------------------------------


def _transcripts():
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return [(name, t) for name in ALL for t in data[name]]


@pytest.mark.parametrize("name, transcript", _transcripts(), ids=lambda v: v if isinstance(v, str) else v["name"])
def test_realistic_transcripts(name, transcript):
    """Each policy turn parses to the recorded action; each observation renders byte for byte;
    the final answer is extracted from the whole response (observations included)."""
    fmt = get_format(name)
    response = ""
    for turn in transcript["turns"]:
        action = fmt.parse_action(turn["policy"])
        expected = turn["action"]
        assert action.kind.value == expected["kind"], (turn["policy"], action.error)
        if expected["kind"] == "search":
            assert action.queries == expected["queries"]
            assert turn["policy"].endswith(fmt.stop_sequences[0])  # generation stopped on it
            results = [(q, [Passage.from_contents(p["id"], p["contents"]) for p in ps]) for q, ps in turn["results"]]
            assert [q for q, _ in results] == action.queries
            assert fmt.render_observation(results) == turn["observation"]
        elif expected["kind"] == "answer":
            assert action.answer == expected["answer"]
            assert turn["policy"].endswith("</answer>")
        else:
            assert turn["observation"] == fmt.render_invalid()
        response += turn["policy"] + turn.get("observation", "")
    assert fmt.extract_answer(response) == transcript["answer"]
