"""bench/rl_gain_confirm.py, issue #34's registered analysis, on hand-made evaluations of four questions: the
seeds averaged per question and kept paired, the bootstrap's bounds, and the success flags."""

import json

import numpy as np
import pytest

from bench.rl_gain_confirm import analyse, averaged, bootstrap, main


def _rows(ems, answered=None):
    answered = answered or [True] * len(ems)
    return {f"q{i}": {"id": f"q{i}", "data_source": "nq", "em": float(e), "f1": float(e),
                      "answer": "x" if a else None} for i, (e, a) in enumerate(zip(ems, answered))}


def test_seeds_are_averaged_per_question_and_the_difference_stays_paired():
    a1 = _rows([0, 0, 1, 1])
    seeds = [_rows([1, 0, 1, 1]), _rows([1, 1, 1, 0], answered=[True, True, True, False])]
    avg = averaged(seeds)
    assert [avg[f"q{i}"]["em"] for i in range(4)] == [1.0, 0.5, 1.0, 0.5]
    assert avg["q3"]["answered"] == 0.5
    res = analyse(a1, seeds)
    p = res["primary_A2_minus_A1"]
    assert p["n"] == 4 and p["mean"] == pytest.approx((1 + 0.5 + 0 - 0.5) / 4)
    assert [s["em_diff"] for s in res["per_seed_A2_minus_A1"]] == [0.25, 0.25]
    assert res["arms"]["A2 (seeds averaged)"]["answered"] == pytest.approx(7 / 8)
    assert res["success"]["both_seeds_positive"] and res["success"]["point_at_least_0.03"]
    # seed 1 loses q3 by not answering: on the three questions both answer, it gains q0 and q1: +2/3
    assert res["per_seed_A2_minus_A1"][1]["answered_by_both"] == {"n": 3, "em_diff": pytest.approx(2 / 3)}


def test_the_bootstrap_bounds_bracket_the_mean_and_a_constant_difference_has_no_spread():
    flat = bootstrap(np.full(50, 0.1))
    assert flat["mean"] == pytest.approx(0.1) and flat["ci95"] == pytest.approx([0.1, 0.1])
    assert flat["lower95_one_sided"] == pytest.approx(0.1)
    mixed = bootstrap(np.array([1.0, -1.0] * 100))
    assert mixed["ci95"][0] < mixed["lower95_one_sided"] < mixed["mean"] == 0.0 < mixed["ci95"][1]


def test_the_command_reads_eval_directories_and_refuses_a_missing_one(tmp_path, capsys):
    for name, ems in (("a1", [0, 0, 1, 1]), ("s0", [1, 0, 1, 1]), ("s1", [1, 1, 1, 1]), ("a3", [0, 1, 1, 1])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trajectories.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in _rows(ems).values()))
    assert main(["--a1", str(tmp_path / "a1"), "--a2", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--a3", str(tmp_path / "a3"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["primary_A2_minus_A1"]["mean"] == pytest.approx(0.375)
    assert res["A2_minus_A3"]["mean"] == pytest.approx(0.125) and res["success"]["A2_minus_A3_at_least_0.02"]
    with pytest.raises(SystemExit, match="no trajectories.jsonl"):
        main(["--a1", str(tmp_path / "missing"), "--a2", str(tmp_path / "s0")])
