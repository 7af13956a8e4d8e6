"""``sleuth data prepare``: FlashRAG jsonl -> Search-R1 parquet, train merge and test/dev fallback,
unique ids, and errors that name the input."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sleuth.cli import main
from sleuth.data.qa import load_questions
from sleuth.rollout.formats import SEARCH_R1_INSTRUCTION

pytestmark = pytest.mark.component

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside the checkout")


def _flashrag(path: Path, rows: list[tuple[str, str, list[str]]]) -> Path:
    """FlashRAG rows carry no data_source: the dataset comes from the directory name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": a}) + "\n" for i, q, a in rows))
    return path


@pytest.fixture
def flashrag(tmp_path):
    root = tmp_path / "FlashRAG_datasets"
    return {
        "nq_train": _flashrag(root / "nq/train.jsonl", [("train_0", "who wrote hamlet", ["Shakespeare"]),
                                                        ("train_1", "capital of france", ["Paris"])]),
        "hp_train": _flashrag(root / "hotpotqa/train.jsonl", [("train_0", "a or b", ["a"])]),
        "nq_dev": _flashrag(root / "nq/dev.jsonl", [("dev_0", "dev question", ["x"])]),
        "nq_test": _flashrag(root / "nq/test.jsonl", [("test_0", "when", ["1990"]), ("test_1", "who", ["me"])]),
        "hp_dev": _flashrag(root / "hotpotqa/dev.jsonl", [("dev_0", "which", ["this"])]),
        "pop_test": _flashrag(root / "popqa/test.jsonl", [("test_0", "what", ["that"])]),
    }


def test_prepare_merges_train_and_falls_back_from_test_to_dev(flashrag, tmp_path, capsys):
    out = tmp_path / "out"
    f = {k: str(v) for k, v in flashrag.items()}
    code = main(["data", "prepare", "--train", f["nq_train"], f["hp_train"],
                 "--test", f["nq_dev"], f["nq_test"], f["hp_dev"], f["pop_test"], "--out", str(out), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["train"]["n"] == 3 and summary["test"]["n"] == 4
    # nq has a test file (dev is ignored), hotpotqa only dev, popqa test
    assert summary["test"]["chosen"] == {"nq": [f["nq_test"]], "hotpotqa": [f["hp_dev"]], "popqa": [f["pop_test"]]}
    assert summary["test"]["by_source"] == {"nq": 2, "hotpotqa": 1, "popqa": 1}
    # the nq dev file is left out, and the user is told so
    assert summary["notes"] == [f"nq: not using dev file {f['nq_dev']}: a test file of 'nq' is given (test, else dev)"]
    train = load_questions(out / "train.parquet")
    test = load_questions(out / "test.parquet")
    assert [q.id for q in train] == ["nq/train/train_0", "nq/train/train_1", "hotpotqa/train/train_0"]
    assert [q.id for q in test] == ["nq/test/test_0", "nq/test/test_1", "hotpotqa/test/dev_0", "popqa/test/test_0"]
    assert len({q.id for q in train + test}) == 7  # globally unique
    assert test[2].golden_answers == ("this",) and test[2].text == "which?"
    row = pq.read_table(out / "test.parquet").to_pylist()[0]  # Search-R1's schema and prompt
    assert row["data_source"] == "nq" and row["ability"] == "fact-reasoning"
    assert row["prompt"][0]["content"] == SEARCH_R1_INSTRUCTION.format(question="when?")
    assert row["reward_model"]["ground_truth"]["target"] == ["1990"]


def test_prepare_errors_name_the_input(flashrag, tmp_path, capsys):
    out = str(tmp_path / "out")
    # the same file twice under one flag
    assert main(["data", "prepare", "--test", str(flashrag["nq_test"]), str(flashrag["nq_test"]), "--out", out]) == 2
    assert f"--test names {flashrag['nq_test']} more than once" in capsys.readouterr().err
    # the same ids twice in the train merge
    twin = _flashrag(tmp_path / "copy/nq/train.jsonl", [("train_0", "again", ["y"])])
    assert main(["data", "prepare", "--train", str(flashrag["nq_train"]), str(twin), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "duplicate question id 'nq/train/train_0'" in err and str(twin) in err
    # a malformed line
    bad = tmp_path / "bad/nq/test.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n{"id": 2, "question": \n')
    assert main(["data", "prepare", "--test", str(bad), "--out", out]) == 2
    assert f"{bad}:2: bad JSON" in capsys.readouterr().err
    assert main(["data", "prepare", "--out", out]) == 2
    assert "nothing to prepare" in capsys.readouterr().err
    # not UTF-8, and a directory where a file belongs
    latin1 = tmp_path / "latin1/nq/test.jsonl"
    latin1.parent.mkdir(parents=True)
    latin1.write_bytes('{"id": "1", "question": "café?", "golden_answers": ["a"]}\n'.encode("latin-1"))
    assert main(["data", "prepare", "--test", str(latin1), "--out", out]) == 2
    assert f"{latin1}:1: not UTF-8 text" in capsys.readouterr().err
    assert main(["data", "prepare", "--train", str(latin1.parent), "--out", out]) == 2
    assert f"{latin1.parent}: is a directory, not a QA file" in capsys.readouterr().err


def test_prepare_out_that_is_a_file_is_refused(flashrag, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert main(["data", "prepare", "--train", str(flashrag["nq_train"]), "--out", str(afile)]) == 2
    assert f"--out {afile} is a file, not a directory" in capsys.readouterr().err
    assert afile.read_text() == "keep me"
    under = afile / "sub"
    assert main(["data", "prepare", "--train", str(flashrag["nq_train"]), "--out", str(under)]) == 2
    assert f"cannot write {under / 'train.parquet'}" in capsys.readouterr().err


def test_prepare_keeps_every_test_file_whatever_its_folder_says(tmp_path, capsys):
    """Shared-data layout (split = folder): a train-folder file under --test is test data, merged."""
    dev = _flashrag(tmp_path / "dev/nq.jsonl", [("d0", "dev q", ["a"]), ("d1", "dev q2", ["b"])])
    train = _flashrag(tmp_path / "train/nq.jsonl", [("t0", "train q", ["c"])])
    only_train = _flashrag(tmp_path / "FlashRAG/hotpotqa/train.jsonl", [("h0", "hp q", ["d"])])
    out = tmp_path / "out"
    code = main(["data", "prepare", "--test", str(dev), str(train), str(only_train), "--out", str(out), "--json"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["test"]["n"] == 4
    assert summary["test"]["chosen"] == {"nq": [str(dev), str(train)], "hotpotqa": [str(only_train)]}
    assert [q.id for q in load_questions(out / "test.parquet")] == ["nq/test/d0", "nq/test/d1", "nq/test/t0",
                                                                    "hotpotqa/test/h0"]  # fmt: skip
    assert f"note: nq: merged 2 test files: {dev}, {train}" in lines
    assert f"note: nq: {train} is named as train data; used as test data (given under --test)" in lines
    assert f"note: hotpotqa: {only_train} is named as train data; used as test data (given under --test)" in lines


def test_prepare_says_when_train_files_of_one_dataset_are_merged(flashrag, tmp_path, capsys):
    more = _flashrag(tmp_path / "more/nq/train.jsonl", [("train_9", "another", ["z"])])
    out = tmp_path / "out"
    assert main(["data", "prepare", "--train", str(flashrag["nq_train"]), str(more), "--out", str(out)]) == 0
    assert f"note: nq: merged 2 train files: {flashrag['nq_train']}, {more}" in capsys.readouterr().out
    assert len(load_questions(out / "train.parquet")) == 3


@needs_shared
def test_prepare_shared_dev_and_train_nq_as_test_keeps_all_rows(tmp_path, capsys):
    files = [str(SHARED / "dev" / "nq.jsonl"), str(SHARED / "train" / "nq.jsonl")]
    assert main(["data", "prepare", "--test", *files, "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["test"]["n"] == 200 + 1717
    assert len({q.id for q in load_questions(tmp_path / "test.parquet")}) == 1917


@needs_shared
def test_prepare_on_the_shared_dev_files(tmp_path):
    files = [str(p) for p in sorted((SHARED / "dev").glob("*.jsonl"))]
    out = tmp_path / "out"
    assert main(["data", "prepare", "--test", *files, "--limit", "3", "--out", str(out)]) == 0
    test = load_questions(out / "test.parquet")
    assert {q.data_source for q in test} == {"nq", "hotpotqa", "2wikimultihopqa", "musique"}
    assert len(test) == 12 and len({q.id for q in test}) == 12


def test_prepare_hub_path_falls_back_to_dev(monkeypatch, tmp_path):
    """The --hub path (no network here): load_hub is replaced by a fake with FlashRAG's splits."""
    import sleuth.data.prepare as prep
    from sleuth.data.qa import QADataError
    from sleuth.types import Question

    splits = {"nq": {"train", "dev", "test"}, "hotpotqa": {"train", "dev"}}
    calls = []

    def fake_hub(name, split, *, limit=None):
        calls.append((name, split))
        if split not in splits[name]:
            raise QADataError(f"RUC-NLPIR/FlashRAG_datasets/{name}: no split {split!r}")
        return [Question(f"{name}/{split}/{i}", f"q{i}", ["a"], name, meta={"row_id": f"{split}_{i}"})
                for i in range(2)]

    monkeypatch.setattr(prep, "load_hub", fake_hub)
    summary = prep.prepare(["nq", "hotpotqa"], ["nq", "hotpotqa"], tmp_path, hub=True)
    assert summary["test"]["chosen"] == {"nq": ["hub:nq/test"], "hotpotqa": ["hub:hotpotqa/dev"]}
    assert calls == [("nq", "train"), ("hotpotqa", "train"), ("nq", "test"), ("hotpotqa", "test"),
                     ("hotpotqa", "dev")]
    test = load_questions(tmp_path / "test.parquet")
    assert [q.id for q in test] == ["nq/test/test_0", "nq/test/test_1", "hotpotqa/test/dev_0", "hotpotqa/test/dev_1"]
