"""``train.time_limit_minutes``, as ``sleuth train`` and ``sleuth sft`` read it: stop after the step after which one
more as long as the last would end past the limit. Hand-computed cases."""

import pytest

from sleuth.train.state import time_limit_reached

pytestmark = pytest.mark.unit


def test_no_limit_never_stops():
    assert not time_limit_reached(None, 1e9, 1e9)


def test_stops_when_one_more_step_would_end_past_the_limit():
    # 1 minute = 60 s: 45 s in, a 10 s step ends at 55 s (go on); a 15 s step would end at 60 s (stop, the bound
    # itself counts); a 20 s step at 65 s (stop)
    assert not time_limit_reached(1, 45.0, 10.0)
    assert time_limit_reached(1, 45.0, 15.0)
    assert time_limit_reached(1, 45.0, 20.0)
    assert time_limit_reached(0.5, 20.0, 10.0) and not time_limit_reached(0.5, 19.0, 10.0)
