"""Corpus store: both row schemas, lookups by row and id, bad rows, duplicates."""

import hashlib
import json

import pytest

from sleuth.retrieval.corpus import CorpusError, CorpusStore, ingest_jsonl, parse_row

pytestmark = pytest.mark.unit


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_parse_row_both_schemas():
    assert parse_row('{"id": "a", "contents": "\\"Paris\\"\\nCapital of France."}', "f:1") == (
        "a", "Paris", "Capital of France.")
    # unquoted title, integer id
    assert parse_row('{"id": 7, "contents": "Paris\\nCapital."}', "f:1") == ("7", "Paris", "Capital.")
    assert parse_row('{"id": "b", "title": "Rome", "text": " Capital of Italy. "}', "f:1") == (
        "b", "Rome", "Capital of Italy.")
    assert parse_row('{"id": "c", "text": "no title"}', "f:1") == ("c", "", "no title")


@pytest.mark.parametrize("line, fragment", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"contents": "x\\ny"}', "missing or empty 'id'"),
    ('{"id": "", "text": "y"}', "missing or empty 'id'"),
    ('{"id": "a", "body": "y"}', "'contents' field or a string 'text'"),
    ('{"id": "a", "text": "y', r"\(Unterminated string starting at column 21\)"),  # not "at at"
])
def test_parse_row_errors_name_the_line(line, fragment):
    with pytest.raises(CorpusError, match=fragment) as e:
        parse_row(line, "corpus.jsonl:12")
    assert "corpus.jsonl:12" in str(e.value)


def test_ingest_and_lookup(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "p0", "contents": '"Paris"\nParis is the capital of France.'},
        "",  # blank lines are ignored
        {"id": "p1", "title": "Rome", "text": "Rome is the capital of Italy."},
        {"id": 2, "contents": "Berlin\nBerlin is the capital of Germany."},
    ])
    stats = ingest_jsonl(src, tmp_path / "store", show_progress=False)
    assert (stats.n_passages, stats.n_skipped) == (3, 0)
    assert stats.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    store = CorpusStore(tmp_path / "store")
    assert len(store) == 3 and store.fingerprint() == stats.sha256
    assert store.get(0).title == "Paris" and store.get(0).text == "Paris is the capital of France."
    assert store.get_by_id("p1").title == "Rome"
    assert store.row_of("2") == 2 and store.row_of("p0") == 0
    got = store.get_many([2, 0], [1.5, 0.5])
    assert [(p.id, p.score) for p in got] == [("2", 1.5), ("p0", 0.5)]
    with pytest.raises(KeyError, match="p9"):
        store.row_of("p9")
    with pytest.raises(IndexError):
        store.get(3)
    assert [t for _, ts in store.iter_texts(batch_rows=2) for t in ts][1] == "Rome\nRome is the capital of Italy."


def test_lookup_by_id_many_rows(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": f"id{i}", "text": f"t{i}"} for i in range(20000)])
    ingest_jsonl(src, tmp_path / "s", show_progress=False)  # > one Arrow batch (8192 rows)
    store = CorpusStore(tmp_path / "s")
    for i in (0, 8191, 8192, 12345, 19999):
        assert store.row_of(f"id{i}") == i and store.get(i).text == f"t{i}"


def test_bad_row_is_an_error_naming_file_and_line(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, "{oops", {"id": "b", "text": "y"}])
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: not valid JSON") as e:
        ingest_jsonl(src, tmp_path / "s", show_progress=False)
    assert "--skip-bad for sleuth index build, skip_bad=True in Python" in str(e.value)
    assert not (tmp_path / "s" / "passages.arrow").exists()  # no half-written store left


def test_skip_bad_counts_and_reports(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, "{oops", {"id": "b"}, {"id": "c", "text": "z"}])
    stats = ingest_jsonl(src, tmp_path / "s", skip_bad=True, show_progress=False)
    assert (stats.n_passages, stats.n_skipped) == (2, 2)
    assert "c.jsonl:2" in stats.skipped_examples[0] and "c.jsonl:3" in stats.skipped_examples[1]
    assert [CorpusStore(tmp_path / "s").get(i).id for i in range(2)] == ["a", "c"]


def test_duplicate_ids_are_an_error(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl",
                      [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "a", "text": "z"}])
    with pytest.raises(CorpusError, match=r"duplicate passage id 'a' on lines 1 and 3"):
        ingest_jsonl(src, tmp_path / "s", show_progress=False)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        ingest_jsonl(tmp_path / "nope.jsonl", tmp_path / "s", show_progress=False)
    with pytest.raises(CorpusError, match="holds no passages"):
        ingest_jsonl(write_jsonl(tmp_path / "e.jsonl", [""]), tmp_path / "s", show_progress=False)
    with pytest.raises(CorpusError, match="not a corpus store"):
        CorpusStore(tmp_path / "elsewhere")


def test_invalid_utf8_names_line(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_bytes(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "\xff"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: not valid UTF-8"):
        ingest_jsonl(src, tmp_path / "s", show_progress=False)


def test_skip_bad_with_only_bad_lines_says_how_many(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", ["{oops", "", {"id": "b"}, "[1]"])
    with pytest.raises(CorpusError, match=r"all 3 non-blank lines were skipped as bad, e\.g\. .*c\.jsonl:1"):
        ingest_jsonl(src, tmp_path / "s", skip_bad=True, show_progress=False)


def test_directory_and_binary_files_are_not_corpora(tmp_path):
    with pytest.raises(CorpusError, match=r"corpus .* is a directory; give the path of a corpus file in JSON Lines"):
        ingest_jsonl(tmp_path, tmp_path / "s", show_progress=False)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"id": ["1"], "contents": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(CorpusError, match=r"c\.parquet is a Parquet file, but a corpus must be JSON Lines \(one \{\"id\""):
        ingest_jsonl(tmp_path / "c.parquet", tmp_path / "s", skip_bad=True, show_progress=False)
    (tmp_path / "b.jsonl").write_bytes(b'{"id": "a"\x00\x01}\n')
    with pytest.raises(CorpusError, match=r"b\.jsonl is a binary file"):
        ingest_jsonl(tmp_path / "b.jsonl", tmp_path / "s", show_progress=False)


def test_damaged_store_is_an_index_file_error(tmp_path):
    from sleuth.retrieval.base import IndexFileError

    ingest_jsonl(write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}]), tmp_path / "s", show_progress=False)
    (tmp_path / "s" / "id_rows.npy").write_bytes(b"12345678")
    with pytest.raises(IndexFileError, match=r"id_rows\.npy is not a valid \.npy array"):
        CorpusStore(tmp_path / "s")
    (tmp_path / "s" / "passages.arrow").write_bytes(b"12345678")
    with pytest.raises(IndexFileError, match=r"cannot read .*passages\.arrow \(ArrowInvalid: File is too small"):
        CorpusStore(tmp_path / "s")
