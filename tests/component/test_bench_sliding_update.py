"""bench/sliding_update.py's smoke run on the tiny Gemma3 (a 4-token window): both layouts run the same update
on GRPO groups, shared prefixes compute fewer token slots than the rows hold, and the two updates' loss and
gradient norm agree (bf16 autocast rounding apart)."""

import json

import pytest

pytestmark = pytest.mark.component


@pytest.mark.timeout(900)  # a hang guard: seconds idle
def test_the_sliding_update_bench_runs_both_layouts_on_the_tiny_gemma3(capsys):
    from bench.sliding_update import main

    assert main(["--model", "tiny", "--groups", "2", "--group", "4", "--queries", "2", "--repeats", "1",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["window"] == 4 and res["rows"] == 8 and res["tokens_per_row"] > 4 * res["window"]
    assert 0 < res["computed_token_share"] < 0.8  # the prompt once per group, the first turn once for 3 of 4 rows
    assert res["packed_s"] > 0 and res["shared_s"] > 0 and res["speedup"] > 0
    # on-policy (ratio 1): the loss is about 0, and bf16 rounding of the two layouts' logprobs moves the ratio by
    # about 1e-3; the gradient is the same to that rounding
    assert abs(res["loss_shared"] - res["loss_packed"]) < 0.01
    assert res["grad_norm_shared"] == pytest.approx(res["grad_norm_packed"], rel=0.02)
    assert res["grad_norm_packed"] > 0


def test_a_model_without_sliding_windows_is_refused_with_the_bench_that_measures_it(monkeypatch):
    import bench.sliding_update as bench

    monkeypatch.setattr(bench, "sliding_window", lambda model: None)
    with pytest.raises(SystemExit, match="bench/train.py --smollm2 --group-size 8"):
        bench.main(["--model", "tiny", "--repeats", "1"])


def test_queries_outside_the_group_are_refused(capsys):
    from bench.sliding_update import main

    with pytest.raises(SystemExit):
        main(["--model", "tiny", "--group", "4", "--queries", "5"])
    assert "--queries must be between 1 and --group (4), got 5" in capsys.readouterr().err
