"""docs/experiments/gemma3_rows.py: a record's evaluations as a report's table rows, from a hand-written record."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location(
    "gemma3_rows", Path(__file__).resolve().parents[2] / "docs" / "experiments" / "gemma3_rows.py")
rows = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rows)

BOTH = {"em": 0.1, "f1": 0.2, "searches": 1.085, "retrieval_hit": 0.665,
        "stop_reasons": {"answered": 0.885, "max_turns": 0.115},
        "by_source": {"nq": {"em": 0.24}, "hotpotqa": {"em": 0.1}}, "macro": {"em": 0.17, "f1": 0.23},
        "perf": {"seconds": 455.3}}
C_ONLY = {"em": 0.118, "f1": 0.1666, "searches": 0.98, "retrieval_hit": 0.706, "stop_reasons": {"answered": 0.652},
          "by_source": {"nq": {"em": 0.118}}, "macro": {"em": 0.118, "f1": 0.1666}, "perf": {"seconds": 1226.0}}
DIRECT = {"em": 0.025, "f1": 0.06, "searches": 0.0, "retrieval_hit": 0.0, "stop_reasons": {"answered": 0.58},
          "by_source": {"nq": {"em": 0.04}, "hotpotqa": {"em": 0.01}}, "macro": {"em": 0.025, "f1": 0.06}}


def test_rows_take_the_recipe_stage_time_else_the_evaluation_own_marked(tmp_path, capsys):
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"stage_seconds": {"eval rl (confirm)": 1237, "eval rl (direct)": 212},
                                  "evaluations": {"rl11_search": {"summary": BOTH}, "rl_confirm": {"summary": C_ONLY},
                                                  "rl_direct": {"summary": DIRECT}}}))
    assert rows.main([str(record)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:] == [
        "| rl11_search | 0.240 | 0.100 | 0.170 | 0.230 | 1.085 | 66.5% | 88.5% | 455 s * |",  # no stage: its own time
        "| rl_confirm | 0.118 |  |  | 0.167 | 0.980 | 70.6% | 65.2% | 1,237 s |",  # one source: no macro, overall F1
        "| rl_direct | 0.040 | 0.010 | 0.025 | 0.060 | 0 |  | 58% | 212 s |",  # no search: no retrieval hit
    ]


def test_stage_names_and_bad_records(tmp_path):
    assert rows.stage_name("base_search") == "eval base (search)"
    assert rows.stage_name("rl_confirm") == "eval rl (confirm)"
    with pytest.raises(SystemExit, match="no such record"):
        rows.main([str(tmp_path / "missing.json")])
    (tmp_path / "sel.json").write_text(json.dumps({"arms": {}}))
    with pytest.raises(SystemExit, match="holds no evaluations"):
        rows.main([str(tmp_path / "sel.json")])
