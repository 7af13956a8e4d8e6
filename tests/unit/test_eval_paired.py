"""sleuth eval --baseline: the paired comparison, computed by hand on four questions."""

import pytest

from sleuth.eval.paired import paired_comparison, paired_lines

pytestmark = pytest.mark.unit


def _row(i, em, answer, source="nq", f1=None):
    return {"id": f"q{i}", "data_source": source, "em": em, "f1": em if f1 is None else f1, "answer": answer}


def test_four_questions_by_hand():
    ours = [_row(0, 1, "a"), _row(1, 0, None), _row(2, 1, "a"), _row(3, 0, "a", source="hotpotqa")]
    base = {r["id"]: r for r in [_row(0, 0, "b"), _row(1, 0, "b"), _row(2, 1, "a"), _row(3, 1, None, source="hotpotqa")]}
    got = paired_comparison(ours, base, seed=0, resamples=500)
    o = got["overall"]
    assert o["n"] == 4 and o["em_diff"] == 0.0 and o["gained"] == 1 and o["lost"] == 1
    assert o["answered_by_both"] == {"n": 2, "em_diff": 0.5}  # q0 (+1), q2 (0)
    assert o["answered_by_one"] == {"n": 2, "em_diff": -0.5}  # q1 (0: only the baseline answered), q3 (-1)
    lo, hi = o["em_ci95"]
    assert -1.0 <= lo < 0.0 < hi <= 1.0
    assert got["by_source"]["nq"]["n"] == 3 and got["by_source"]["nq"]["em_diff"] == pytest.approx(1 / 3)
    assert got["by_source"]["hotpotqa"]["em_ci95"] == [-1.0, -1.0]  # one question: every resample the same
    assert paired_comparison(ours, base, seed=0, resamples=500) == got  # a fixed seed: reproducible
    assert "| All | 4 | +0.0 [" in "\n".join(paired_lines(got))


def test_questions_the_baseline_lacks_are_counted_not_paired():
    got = paired_comparison([_row(0, 1, "a"), _row(9, 1, "a")], {"q0": _row(0, 1, "a")})
    assert got["overall"]["n"] == 1 and got["unpaired"] == 1 and got["overall"]["em_ci95"] == [0.0, 0.0]
