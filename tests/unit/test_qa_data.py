"""QA data: FlashRAG jsonl / JSON list / Search-R1 parquet in, Search-R1 parquet out; errors name the input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sleuth.data.qa import QADataError, load_hub, load_questions
from sleuth.data.searchr1_parquet import write_searchr1_parquet
from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION, get_format, normalize_question
from sleuth.types import Question

pytestmark = pytest.mark.unit

SHARED = Path(__file__).parents[2] / ".." / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside the checkout")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def naive_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- real files --------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("name, n", [("nq", 200), ("hotpotqa", 200), ("2wikimultihopqa", 200), ("musique", 100)])
def test_shared_dev_files_match_a_naive_reader(name, n):
    path = SHARED / "dev" / f"{name}.jsonl"
    qs = load_questions(path, split="dev")
    rows = naive_jsonl(path)
    assert len(qs) == len(rows) == n
    for q, row in zip(qs, rows):
        assert q.id == f"{name}/dev/{row['id']}"
        assert q.text == row["question"]  # raw text; formats normalise
        assert q.golden_answers == tuple(row["golden_answers"])
        assert q.data_source == row["data_source"] == name
        assert q.meta["row_id"] == row["id"]
    assert len({q.id for q in qs}) == n


@needs_shared
def test_shared_dev_ids_are_unique_across_files():
    ids = [q.id for f in sorted((SHARED / "dev").glob("*.jsonl")) for q in load_questions(f, split="dev")]
    assert len(ids) == len(set(ids)) == 700


@needs_shared
def test_flashrag_fixture_rows_without_data_source():
    path = SHARED / "fixtures" / "flashrag_nq_test.jsonl"
    labelled = load_questions(path, data_source="nq", split="test")
    assert len(labelled) == 17
    first = labelled[0]
    assert (first.id, first.data_source) == ("nq/test/test_0", "nq")
    assert first.text == "who got the first nobel prize in physics"
    assert first.golden_answers == ("Wilhelm Conrad Röntgen",)
    default = load_questions(path)  # no label: the file stem is both source and split
    assert default[0].id == "flashrag_nq_test/flashrag_nq_test/test_0"


@needs_shared
def test_limit_and_source_filter_on_real_file():
    path = SHARED / "dev" / "hotpotqa.jsonl"
    assert [q.meta["row_id"] for q in load_questions(path, limit=3)] == [r["id"] for r in naive_jsonl(path)[:3]]
    with pytest.raises(QADataError, match=r"no rows with data_source 'nq'.*\['hotpotqa'\]"):
        load_questions(path, data_source="nq")


@needs_shared
def test_limit_takes_the_first_n_of_each_source_of_a_merged_file(tmp_path):
    """Search-R1's merged test.parquet is ordered by data source (NQ rows, then the next dataset,
    ...): every question limit (`sleuth eval --limit`, `train.eval_limit`, `data.limit`) takes the
    first N rows of each source, in file order, not N rows of NQ only. Real rows, merged the same way."""
    from argparse import Namespace

    from sleuth.build import load_eval_questions, load_questions_for
    from sleuth.config import Config
    from sleuth.eval.cli import load_eval_questions as eval_command_questions

    names = ("nq", "hotpotqa", "musique")
    parts = {n: load_questions(SHARED / "dev" / f"{n}.jsonl", split="test", limit=20) for n in names}
    merged = write_searchr1_parquet([q for n in names for q in parts[n]], tmp_path / "test.parquet", split="test")
    expected = [q.id for n in names for q in parts[n][:3]]  # nq 0-2, hotpotqa 0-2, musique 0-2
    assert [q.id for q in load_questions(merged, limit=3)] == expected
    assert [q.id for q in eval_command_questions(Namespace(data=[str(merged)], limit=3))] == expected
    cfg = Config()
    cfg.data.eval_files = [str(merged)]
    cfg.train.eval_limit = 3
    assert [q.id for q in load_eval_questions(cfg)] == expected
    cfg.data.limit = 2  # the training files' limit, the same rule
    assert [q.id for q in load_questions_for([str(merged)], cfg)] == [q.id for n in names for q in parts[n][:2]]
    # the kept rows keep the file's order; one source behaves as a plain cut of the file
    assert [q.id for q in load_questions(merged, limit=25)] == [q.id for n in names for q in parts[n]]
    assert [q.id for q in load_questions(merged, data_source="hotpotqa", limit=2)] == [q.id for q in parts["hotpotqa"][:2]]


# --- formats -----------------------------------------------------------------------------------


def test_json_list_and_string_answers(tmp_path):
    path = tmp_path / "mini.json"
    rows = [
        {"id": "a", "question": "Who wrote Hamlet?", "golden_answers": "William Shakespeare"},
        {"id": 7, "question": "How many sides does a hexagon have?", "golden_answers": [6, "six"], "data_source": "toy"},
        {"question": "What is the capital of France?", "golden_answers": ["Paris"]},
    ]
    path.write_text(json.dumps(rows))
    qs = load_questions(path, split="dev")
    assert [q.id for q in qs] == ["mini/dev/a", "toy/dev/7", "mini/dev/2"]  # no id: the row position
    assert qs[0].golden_answers == ("William Shakespeare",)  # a bare string is one answer
    assert qs[1].golden_answers == ("6", "six")


def test_data_source_filter_keeps_unlabelled_rows(tmp_path):
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"id": "1", "question": "q1", "golden_answers": ["a"], "data_source": "nq"},
            {"id": "1", "question": "q2", "golden_answers": ["b"], "data_source": "hotpotqa"},
            {"id": "2", "question": "q3", "golden_answers": ["c"]},
        ],
    )
    assert [q.id for q in load_questions(path)] == ["nq/mixed/1", "hotpotqa/mixed/1", "mixed/mixed/2"]
    assert [q.id for q in load_questions(path, data_source="nq")] == ["nq/mixed/1", "nq/mixed/2"]
    # the limit is per data source (here nq, hotpotqa and the unlabelled rows' file stem)
    assert [q.text for q in load_questions(path, limit=1)] == ["q1", "q2", "q3"]
    assert load_questions(path, limit=0) == []


def _searchr1_reference_rows() -> list[dict]:
    """Rows as Search-R1's nq_search.py process_fn writes them (question normalised in place)."""
    examples = [("test_0", "who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"]),
                ("test_1", "when is the next deadpool movie being released", ["May 18, 2018"])]
    rows = []
    for idx, (rid, question, answers) in enumerate(examples):
        question = question.strip()
        if question[-1] != "?":
            question += "?"
        prefix = SEARCH_R1_INSTRUCTION.format(question=question)
        rows.append({
            "id": rid, "question": question, "golden_answers": answers,
            "data_source": "nq",
            "prompt": [{"role": "user", "content": prefix}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "test", "index": idx},
        })
    return rows


def test_searchr1_parquet_with_flashrag_columns(tmp_path):
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(_searchr1_reference_rows()), path)
    qs = load_questions(path)
    assert [q.id for q in qs] == ["nq/test/test_0", "nq/test/test_1"]
    assert qs[0].text == "who got the first nobel prize in physics?"
    assert qs[0].golden_answers == ("Wilhelm Conrad Röntgen",)
    assert load_questions(path, split="dev")[1].id == "nq/dev/test_1"


def test_searchr1_parquet_question_recovered_from_prompt(tmp_path):
    rows = _searchr1_reference_rows()
    for r in rows:  # Search-R1 files written without the FlashRAG columns
        del r["id"], r["question"], r["golden_answers"]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    qs = load_questions(path)
    assert [q.id for q in qs] == ["nq/test/0", "nq/test/1"]  # row id from extra_info.index
    assert [q.text for q in qs] == [
        "who got the first nobel prize in physics?",
        "when is the next deadpool movie being released?",
    ]
    assert qs[1].golden_answers == ("May 18, 2018",)


def test_parquet_prompt_without_question_marker_is_an_error(tmp_path):
    rows = _searchr1_reference_rows()[:1]
    del rows[0]["question"]
    rows[0]["prompt"] = [{"role": "user", "content": "no marker here"}]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(QADataError, match=r"bad.parquet: row 0: field 'prompt'"):
        load_questions(path)


# --- writing -----------------------------------------------------------------------------------


def test_write_searchr1_parquet_matches_reference_schema_and_round_trips(tmp_path):
    reference = _searchr1_reference_rows()
    questions = [
        Question(id=f"nq/test/{r['id']}", text=r["question"].rstrip("?"), golden_answers=r["golden_answers"],
                 data_source="nq", meta={"row_id": r["id"]})
        for r in reference
    ]
    path = write_searchr1_parquet(questions, tmp_path / "out" / "test.parquet", split="test")
    written = pq.read_table(path)
    assert written.to_pylist() == reference  # same values, same key order as Search-R1's rows
    assert written.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info",
                                    "id", "question", "golden_answers"]
    back = load_questions(path)
    assert [q.id for q in back] == [q.id for q in questions]
    assert [q.golden_answers for q in back] == [q.golden_answers for q in questions]
    fmt = get_format("search_r1")
    assert [fmt.user_content(q) for q in back] == [fmt.user_content(q) for q in questions]
    assert [q.text for q in back] == [normalize_question(q.text) for q in questions]


@needs_shared
def test_round_trip_real_questions_through_parquet(tmp_path):
    qs = load_questions(SHARED / "dev" / "musique.jsonl", split="dev", limit=25)
    back = load_questions(write_searchr1_parquet(qs, tmp_path / "m.parquet", split="dev"))
    assert [(q.id, q.golden_answers, q.data_source) for q in back] == [
        (q.id, q.golden_answers, q.data_source) for q in qs
    ]


def test_write_with_tool_call_format_puts_system_message_first(tmp_path):
    fmt = get_format("tool_call")
    q = Question(id="toy/x/1", text="Who wrote Hamlet", golden_answers=("Shakespeare",), data_source="toy")
    row = pq.read_table(write_searchr1_parquet([q], tmp_path / "t.parquet", fmt, split="x")).to_pylist()[0]
    assert row["prompt"] == [
        {"role": "system", "content": fmt.system_prompt},
        {"role": "user", "content": fmt.user_content(q)},
    ]
    assert load_questions(tmp_path / "t.parquet")[0].text == "Who wrote Hamlet?"


def test_write_nothing_is_an_error(tmp_path):
    with pytest.raises(QADataError, match="no questions to write"):
        write_searchr1_parquet([], tmp_path / "e.parquet")


# --- errors name file, line and field ----------------------------------------------------------

GOOD = {"id": "1", "question": "q", "golden_answers": ["a"]}


@pytest.mark.parametrize(
    "lines, pattern",
    [
        ([GOOD, '{"id": "2", "question": "q2", "golden_answers": ["b"]'], r"bad.jsonl:2: bad JSON"),
        ([GOOD, '["not", "an", "object"]'], r"bad.jsonl:2: expected a JSON object"),
        ([GOOD, {"id": "2", "golden_answers": ["a"]}], r"bad.jsonl:2: missing field 'question'"),
        ([{"id": "2", "question": "  ", "golden_answers": ["a"]}], r"bad.jsonl:1: field 'question' must be"),
        ([{"id": "2", "question": "q"}], r"bad.jsonl:1: missing field 'golden_answers'"),
        ([{"id": "2", "question": "q", "golden_answers": 5}], r"bad.jsonl:1: field 'golden_answers' must be"),
        ([{"id": "2", "question": "q", "golden_answers": [{"a": 1}]}], r"bad.jsonl:1: field 'golden_answers' holds"),
        ([{"id": "2", "question": "q", "golden_answers": []}], r"bad.jsonl:1: field 'golden_answers' is empty"),
        ([{"question": "q", "golden_answers": ["a"], "data_source": 3}], r"bad.jsonl:1: field 'data_source'"),
        ([], r"bad.jsonl: empty file"),
        (["", "   "], r"bad.jsonl: empty file"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, lines, pattern):
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(QADataError, match=pattern):
        load_questions(path)


def test_duplicate_ids_name_both_rows(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [GOOD, {**GOOD, "id": "2"}, {**GOOD, "question": "other"}])
    with pytest.raises(QADataError, match=r"duplicate question id 'dup/dup/1': .*dup.jsonl:1 and .*dup.jsonl:3"):
        load_questions(path)


def test_bad_files(tmp_path):
    with pytest.raises(QADataError, match="no such QA file"):
        load_questions(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("id,question\n")
    with pytest.raises(QADataError, match="unknown QA file type '.csv'"):
        load_questions(tmp_path / "x.csv")
    (tmp_path / "obj.json").write_text('{"question": "q"}')
    with pytest.raises(QADataError, match="expected a JSON list"):
        load_questions(tmp_path / "obj.json")
    (tmp_path / "broken.json").write_text('[{"question": "q",\n "golden_answers": ]')
    with pytest.raises(QADataError, match=r"broken.json:2: bad JSON"):
        load_questions(tmp_path / "broken.json")
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(QADataError, match="not a readable parquet file"):
        load_questions(tmp_path / "fake.parquet")
    assert issubclass(QADataError, ValueError)  # the CLI prints ValueErrors without a traceback


def test_non_utf8_text_names_file_line_and_says_utf8(tmp_path):
    latin1 = '{"id": "2", "question": "café?", "golden_answers": ["x"]}'.encode("latin-1")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + latin1 + b"\n")
    with pytest.raises(QADataError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9 at column 29\).*must be UTF-8"):
        load_questions(path)
    listed = tmp_path / "latin1.json"
    listed.write_bytes(b"[" + json.dumps(GOOD).encode() + b",\n" + latin1 + b"]")
    with pytest.raises(QADataError, match=r"latin1.json:2: not UTF-8 text \(byte 0xe9 at column 29\)"):
        load_questions(listed)


def test_a_directory_is_named_as_one_with_the_qa_files_in_it(tmp_path):
    with pytest.raises(QADataError, match=r"is a directory, not a QA file; give a .jsonl, .json or .parquet file$"):
        load_questions(tmp_path)
    write_jsonl(tmp_path / "nq.jsonl", [GOOD])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(QADataError, match=r"is a directory, .*\(found in it: nq.jsonl\)$"):
        load_questions(tmp_path)


# --- hub (never online in tests) ---------------------------------------------------------------


def test_load_hub_offline_error_is_clear(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'RUC-NLPIR/FlashRAG_datasets' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(QADataError, match=r"could not load RUC-NLPIR/FlashRAG_datasets/nq .*offline"):
        load_hub("nq", "test")


def test_load_hub_builds_questions_from_rows(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load(repo, name):
        calls.append((repo, name))
        return {"test": [{"id": "test_0", "question": "who got the first nobel prize in physics",
                          "golden_answers": ["Wilhelm Conrad Röntgen"]}]}

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    (q,) = load_hub("nq", "test")
    assert calls == [("RUC-NLPIR/FlashRAG_datasets", "nq")]
    assert (q.id, q.data_source, q.golden_answers) == ("nq/test/test_0", "nq", ("Wilhelm Conrad Röntgen",))
    with pytest.raises(QADataError, match="no split 'dev'"):
        load_hub("nq", "dev")


def test_load_hub_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(QADataError, match=r"needs the 'datasets' package"):
        load_hub("nq", "test")
