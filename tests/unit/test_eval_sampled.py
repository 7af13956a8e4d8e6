"""sleuth eval --samples: the unbiased pass@k by hand, and its per-source figures."""

import pytest

from sleuth.eval.sampled import ks, pass_at_k, sampled_figures, sampled_lines

pytestmark = pytest.mark.unit


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one right of four: a single try hits it 1/4 of the time
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # C(3,2)/C(4,2) pairs miss it
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0 and pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError, match="n=2, c=3"):
        pass_at_k(2, 3, 1)
    assert ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6] and ks(1) == [1]


def test_figures_over_questions_and_sources():
    rows = [{"id": "a", "data_source": "nq", "em": e} for e in (1.0, 0.0, 0.0, 0.0)]
    rows += [{"id": "b", "data_source": "hotpotqa", "em": e} for e in (1.0, 1.0, 0.0, 0.0)]
    fig = sampled_figures(rows, samples=4, temperature=1.0)
    assert fig["questions"] == 2
    assert fig["pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert fig["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert fig["pass@4"] == 1.0
    assert fig["by_source"]["nq"]["pass@1"] == pytest.approx(0.25)
    assert "| All | 2 | 37.5 | 66.7 | 100.0 |" in "\n".join(sampled_lines(fig))
