"""``sleuth reward score`` end to end on Search-R1 transcript fixtures, and its input errors."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.cli import main

pytestmark = pytest.mark.component

FIXTURES = Path(__file__).parents[1] / "fixtures"
TRANSCRIPTS = FIXTURES / "reward_searchr1_transcripts.jsonl"
VERL_ROWS = FIXTURES / "reward_verl_rows.jsonl"

# Per row of reward_searchr1_transcripts.jsonl: (em, cover_em, f1), hand-derived:
#   litm_2593  'Sun Tzu'                      1 1 1
#   litm_242   'Randy Newman.' (2nd gold)     1 1 1
#   litm_1520  'actor Freddie Highmore'       0 1 0.8   (P 2/3, R 1)
#   test_0     no answer (truncated)          0 0 0
#   litm_509   '1981' after the invalid msg   1 1 1
#   5ab6..ea   'No' vs 'no'                   1 1 1
#   5a75..98   'Columbia University'          0 0 0
#   litm_1127  'and' (invalid-action message) 0 0 0
#   litm_483   'Road/Track'                   1 1 1
#   litm_2477  last answer 'Lysander'         0 0 0
#   5ab6..eb   'no, they are not' vs 'no'     0 1 0     (yes/no rule)
#   litm_974   '' (empty answer)              0 0 0
#   5a87..00   'Suicide Squad (2016 film)'    0 1 2/3   (P 2/4, R 1)
# n = 13, em = 5/13, cover_em = 8/13, f1 = (5 + 0.8 + 2/3)/13 = 6.4667/13, one row without answer.
EXPECTED = {"n": 13, "em": 5 / 13, "cover_em": 8 / 13, "f1": (5.8 + 2 / 3) / 13, "no_answer": 1}


def run_json(capsys, *argv) -> dict:
    assert main(["reward", "score", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1])


def assert_means(got: dict, expected: dict) -> None:
    assert got["n"] == expected["n"] and got["no_answer"] == expected["no_answer"]
    for key in ("em", "cover_em", "f1"):
        assert got[key] == pytest.approx(expected[key], abs=1e-6), key


def test_score_transcripts(capsys):
    assert_means(run_json(capsys, "--input", str(TRANSCRIPTS)), EXPECTED)


def test_human_table_without_json(capsys):
    assert main(["reward", "score", "--input", str(TRANSCRIPTS)]) == 0
    out = capsys.readouterr().out
    assert "0.3846" in out and "0.6154" in out and "0.4974" in out
    assert not out.strip().splitlines()[-1].startswith("{")


def test_dotted_answers_field_and_string_target(capsys):
    # verl rows: target ['Sun Tzu'] vs 'sun tzu' (1 1 1); target '1981' (a string) vs 'In 1981'
    # (0 1 2/3); no answer (0 0 0) -> em 1/3, cover 2/3, f1 (1 + 2/3)/3 = 5/9
    got = run_json(capsys, "--input", str(VERL_ROWS), "--answers-field", "reward_model.ground_truth.target")
    assert_means(got, {"n": 3, "em": 1 / 3, "cover_em": 2 / 3, "f1": 5 / 9, "no_answer": 1})


def test_several_files_totals_and_by_file(capsys, tmp_path):
    first4 = tmp_path / "first4.jsonl"
    first4.write_text("".join(TRANSCRIPTS.read_text(encoding="utf-8").splitlines(True)[:4]), encoding="utf-8")
    got = run_json(capsys, "--input", str(TRANSCRIPTS), "--input", str(first4))
    # first 4 rows: em 1+1+0+0 = 2, cover 1+1+1+0 = 3, f1 1+1+0.8+0 = 2.8, one without answer
    part = {"n": 4, "em": 2 / 4, "cover_em": 3 / 4, "f1": 2.8 / 4, "no_answer": 1}
    assert_means(got["by_file"][str(TRANSCRIPTS)], EXPECTED)
    assert_means(got["by_file"][str(first4)], part)
    total = {"n": 17, "em": 7 / 17, "cover_em": 11 / 17, "f1": (5.8 + 2 / 3 + 2.8) / 17, "no_answer": 2}
    assert_means(got, total)


def test_group_by_data_source(capsys):
    got = run_json(capsys, "--input", str(TRANSCRIPTS), "--group-by", "data_source")
    # hotpotqa rows: 'No' (1 1 1), Columbia (0 0 0), 'no, they are not' (0 1 0), Suicide Squad (0 1 2/3)
    hotpot = {"n": 4, "em": 1 / 4, "cover_em": 3 / 4, "f1": (1 + 2 / 3) / 4, "no_answer": 0}
    assert_means(got["by_group"]["hotpotqa"], hotpot)
    assert got["by_group"]["nq"]["n"] == 9 and got["by_group"]["nq"]["em"] == pytest.approx(4 / 9, abs=1e-6)


def test_no_answer_as_reproduces_search_r1_fallback(capsys, tmp_path):
    f = tmp_path / "beijing.jsonl"
    rows = [{"response": "<think>The capital is", "golden_answers": ["Beijing"]},
            {"response": "<think>t</think><answer>Shanghai</answer>", "golden_answers": "Beijing"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert run_json(capsys, "--input", str(f))["em"] == 0.0
    # Search-R1 scores a response without an answer on its prompt's example 'Beijing': 1 of 2 rows
    assert run_json(capsys, "--input", str(f), "--no-answer-as", "Beijing")["em"] == 0.5


BAD_ROWS = [
    ('{"response": "<answer>x</answer>", "golden_answers": ["x"]}\n{not json\n', ":2: not valid JSON"),
    ('{"golden_answers": ["x"]}\n', ":1: missing field 'response'"),
    ('{"response": "r", "golden_answers": 42}\n', ":1: field 'golden_answers' must be a string or a non-empty list"),
    ('{"response": "r", "golden_answers": ["x", 7]}\n', ":1: field 'golden_answers' must be a string"),
    ('{"response": "r", "golden_answers": []}\n', "got an empty list"),
    ('{"response": null, "golden_answers": ["x"]}\n', ":1: field 'response' must be a string"),
    ('\n["a list"]\n', ":2: expected a JSON object, got list"),
    ("\n\n", "no rows to score"),
    (b'{"response": "\xff", "golden_answers": ["x"]}\n', ":1: not UTF-8 text (invalid start byte); reward score reads JSON"),
]


@pytest.mark.parametrize("content, message", BAD_ROWS)
def test_bad_rows_exit_2_naming_file_line_field(capsys, tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    assert main(["reward", "score", "--input", str(f), "--json"]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and message in err, err


def test_missing_dotted_field_names_where_it_stopped(capsys):
    args = ["reward", "score", "--input", str(VERL_ROWS), "--answers-field", "reward_model.truth.target"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{VERL_ROWS}:1: missing field 'reward_model.truth.target' (no key 'truth' under 'reward_model'" in err


def test_missing_file_and_duplicate_input(capsys, tmp_path):
    assert main(["reward", "score", "--input", str(tmp_path / "nope.jsonl")]) == 2
    assert "input file not found" in capsys.readouterr().err
    assert main(["reward", "score", "--input", str(TRANSCRIPTS), "--input", str(TRANSCRIPTS)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_parquet_and_directory_inputs_say_what_reward_score_reads(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"response": "<answer>x</answer>", "golden_answers": ["x"]}]), table)
    assert main(["reward", "score", "--input", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"{table}: is a parquet file; reward score reads JSON Lines" in err and "one JSON object per line" in err
    assert main(["reward", "score", "--input", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--input {tmp_path} is a directory; give a JSON Lines file" in err and "not found" not in err


def test_installed_console_script(tmp_path):
    exe = Path(sys.executable).with_name("sleuth")
    exe = exe if exe.exists() else shutil.which("sleuth")
    if exe is None:
        pytest.skip("the sleuth console script is not installed next to this Python")
    proc = subprocess.run(
        [str(exe), "reward", "score", "--input", str(TRANSCRIPTS), "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert_means(json.loads(proc.stdout.strip().splitlines()[-1]), EXPECTED)
