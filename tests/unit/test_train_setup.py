"""Questions a training run evaluates on: ``train.eval_limit`` applies to each eval file."""

import json

import pytest

from sleuth.build import load_eval_questions, load_questions_for
from sleuth.config import Config
from sleuth.config_file import from_dict

pytestmark = pytest.mark.unit


def _write(path, source, n):
    rows = [{"id": f"{source}_{i}", "question": f"{source} question {i}", "golden_answers": [str(i)],
             "data_source": source} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _ids(questions):
    return [q.id.rsplit("/", 1)[-1] for q in questions]  # ids read back as source/split/id


def test_eval_limit_is_per_file_so_every_dataset_is_evaluated(tmp_path):
    cfg = Config()
    cfg.data.eval_files = [_write(tmp_path / "nq.jsonl", "nq", 5), _write(tmp_path / "hotpotqa.jsonl", "hotpotqa", 4)]
    cfg.train.eval_limit = 3
    qs = load_eval_questions(cfg)
    # 3 from each file (a limit over the concatenation would give nq_0..nq_2 and no HotpotQA at all)
    assert _ids(qs) == ["nq_0", "nq_1", "nq_2", "hotpotqa_0", "hotpotqa_1", "hotpotqa_2"]


def test_eval_limit_and_data_limit_take_the_smaller(tmp_path):
    cfg = Config()
    cfg.data.eval_files = [_write(tmp_path / "nq.jsonl", "nq", 5), _write(tmp_path / "hotpotqa.jsonl", "hotpotqa", 4)]
    cfg.data.limit, cfg.train.eval_limit = 2, 3
    assert _ids(load_eval_questions(cfg)) == ["nq_0", "nq_1", "hotpotqa_0", "hotpotqa_1"]
    cfg.train.eval_limit = None  # no eval limit: data.limit alone, as for the training files
    assert load_eval_questions(cfg) == load_questions_for(cfg.data.eval_files, cfg)


def test_world_splits_follow_the_same_per_source_limit():
    """``world:test`` mixes single-hop and two-hop questions: a limit keeps the first N of each."""
    from collections import Counter

    cfg = from_dict({"data": {"world_entities": 200, "world_seed": 1}})
    qs = load_questions_for(["world:test"], cfg, limit=5)
    assert Counter(q.data_source for q in qs) == {"world_1hop": 5, "world_2hop": 5}
    everything = load_questions_for(["world:test"], cfg)
    assert qs == [q for q in everything if q in qs]  # in the split's order


def test_world_corpus_is_written_once_even_by_concurrent_callers(tmp_path, monkeypatch):
    """Callers that start together each write the world aside; one rename publishes it and the
    losers' copies are removed (nothing left but the published directory)."""
    from sleuth.toy.corpus import world_corpus_path
    from tests.helpers.concurrency import run_concurrently

    monkeypatch.setenv("SLEUTH_CACHE", str(tmp_path / "cache"))
    cfg = from_dict({"data": {"world_seed": 2, "world_entities": 40}})
    paths = run_concurrently(lambda: world_corpus_path(cfg), 4)
    assert len(set(paths)) == 1, paths
    assert len(paths[0].read_text().splitlines()) > 40
    assert [p.name for p in (tmp_path / "cache" / "worlds").iterdir()] == [paths[0].parent.name]
