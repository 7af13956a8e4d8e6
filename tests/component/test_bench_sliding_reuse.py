"""bench/sliding_reuse.py's smoke run on the tiny Gemma3 (a 4-token window): both engines run the two forced
rounds, produce the same tokens row for row, and the figures come out positive."""

import json

import pytest

pytestmark = pytest.mark.component


@pytest.mark.timeout(900)  # a hang guard: seconds idle
def test_the_sliding_reuse_bench_runs_both_engines_on_the_tiny_gemma3(capsys):
    from bench.sliding_reuse import main

    assert main(["--model", "tiny", "--questions", "2", "--group", "2", "--new-tokens", "8", "--repeats", "1",
                 "--greedy-rows", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["window"] == 4 and res["rows"] == 4 and res["same_tokens_rows"] == "4/4"
    assert res["same_greedy_rows"] == "2/2"
    assert res["round2_context_tokens_mean"] > 4 * res["window"]  # the window is in effect in round 2
    assert res["reuse_s"] > 0 and res["whole_s"] > 0 and res["speedup"] > 0
