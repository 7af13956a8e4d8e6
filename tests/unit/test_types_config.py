"""Core types and the config tree."""

import re

import pytest

from sleuth.config import Config
from sleuth.config_file import ConfigError, apply_overrides, load_config, save_config
from sleuth.types import Passage, Question, Segment, SegmentKind, Trajectory

pytestmark = pytest.mark.unit


def test_question_answers_tuple_and_bare_string():
    q = Question("nq/dev/1", "who?", ["a", "b"], "nq")
    assert q.golden_answers == ("a", "b")
    # A bare string is one answer, not a tuple of its characters.
    assert Question("x", "q", "Paris").golden_answers == ("Paris",)
    with pytest.raises(ValueError, match="id"):
        Question("", "q", ["a"])


def test_passage_contents_round_trip_strips_quotes():
    p = Passage.from_contents("7", '"Paris"\nParis is the capital of France.', 1.5)
    assert (p.title, p.text, p.score) == ("Paris", "Paris is the capital of France.", 1.5)
    assert p.contents == '"Paris"\nParis is the capital of France.'
    # Unquoted titles are kept as they are.
    assert Passage.from_contents("8", "Rome\ntext").title == "Rome"


def test_segment_requires_logprobs_for_sampled():
    with pytest.raises(ValueError):
        Segment(SegmentKind.SAMPLED, [1, 2], [0.0])
    s = Segment.sampled([1, 2], [-0.1, -0.2])
    assert s.trained and not Segment.injected([3]).trained


def test_trajectory_mask_follows_segments():
    q = Question("q1", "?", ["a"])
    t = Trajectory(
        q,
        0,
        [
            Segment.injected([10, 11, 12], "prompt"),
            Segment.sampled([20, 21], [-1.0, -2.0], "<search>x</search>"),
            Segment.injected([30], "<information>…</information>"),
            Segment.sampled([40], [-0.5], "<answer>a</answer>"),
        ],
    )
    assert t.token_ids == [10, 11, 12, 20, 21, 30, 40]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert t.prompt_len == 3 and t.num_sampled_tokens == 3
    assert t.response_text == "<search>x</search><information>…</information><answer>a</answer>"
    assert t.group_id == "q1"


def test_overrides_types_and_errors():
    cfg = apply_overrides(Config(), ["train.total_steps=7", "algo.clip_high=0.28", "data.train_files=[a.jsonl, b.jsonl]"])
    assert cfg.train.total_steps == 7 and cfg.algo.clip_high == 0.28
    assert cfg.data.train_files == ["a.jsonl", "b.jsonl"]
    # An int is accepted for a float field and kept as float.
    assert apply_overrides(Config(), ["algo.kl_coef=0"]).algo.kl_coef == 0.0
    # Optional fields accept null.
    assert apply_overrides(Config(), ["algo.tis_cap=2"]).algo.tis_cap == 2.0
    assert apply_overrides(Config(), ["algo.tis_cap=null"]).algo.tis_cap is None
    with pytest.raises(ConfigError, match="train.total_step"):
        apply_overrides(Config(), ["train.total_step=3"])
    with pytest.raises(ConfigError, match="train.total_steps"):
        apply_overrides(Config(), ["train.total_steps=many"])
    with pytest.raises(ConfigError, match="dotted.key=value"):
        apply_overrides(Config(), ["train.total_steps"])
    with pytest.raises(ConfigError, match="true/false"):
        apply_overrides(Config(), ["train.wandb=3"])


def test_yaml_round_trip(tmp_path):
    cfg = apply_overrides(Config(), ["rollout.max_turns=2", "model.name_or_path=some/model"])
    path = tmp_path / "c.yaml"
    save_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    (tmp_path / "bad.yaml").write_text("train:\n  nope: 1\n")
    with pytest.raises(ConfigError, match="train.nope"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_shipped_configs_load_and_name_known_components():
    from pathlib import Path

    from sleuth.reward import REWARD_KINDS
    from sleuth.rollout.formats import format_names
    from sleuth.train.update import ADVANTAGES

    configs = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
    assert len(configs) >= 6
    for path in configs:
        cfg = load_config(path)
        assert cfg.rollout.format in format_names(), path  # a protocol or a registered prompt variant
        assert cfg.reward.kind in REWARD_KINDS, path
        assert cfg.algo.advantage in ADVANTAGES, path
        assert cfg.train.total_steps > 0 and cfg.rollout.group_size >= 1, path


@pytest.mark.parametrize("override, message", [
    ("retrieval.kind=bogus", r"retrieval.kind: 'bogus' is not one of \['bm25'"),
    ("rollout.format=search_r2", r"rollout.format: 'search_r2' is not one of .*'search_r1_tiny'"),
    ("algo.advantage=ppo", r"algo.advantage: 'ppo' is not one of"),
    ("train.total_steps=0", r"train.total_steps must be >= 1, got 0"),
    ("train.eval_limit=-1", r"train.eval_limit must be >= 1, got -1"),  # was a silent slice: 431 of 432
    ("train.questions_per_step=0", r"train.questions_per_step must be >= 1"),
    ("train.lr=-1", r"train.lr must be >= 0, got -1"),
    ("rollout.max_turns=-1", r"rollout.max_turns must be >= 0"),
    ("rollout.top_p=0", r"rollout.top_p must be > 0"),
    ("rollout.top_p=1.5", r"rollout.top_p must be in \(0, 1\]"),
    ("algo.dual_clip=1", r"algo.dual_clip must be > 1"),
])
def test_values_out_of_range_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_edge_values_that_mean_something_stay_valid():
    cfg = load_config(None, ["rollout.max_turns=0", "train.grad_clip=0", "rollout.temperature=0", "train.lr=0",
                             "train.eval_limit=null", "algo.dual_clip=3", "rollout.top_p=1"])
    assert (cfg.rollout.max_turns, cfg.train.eval_limit, cfg.algo.dual_clip) == (0, None, 3)


def test_config_file_that_is_a_directory_or_not_utf8(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(tmp_path)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("train:\n  lr: 0.1  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml is not UTF-8 text \(byte 23\)"):
        load_config(bad)


@pytest.mark.parametrize("spelling, value", [("1e-6", 1e-6), ("1E-6", 1e-6), ("1.0e-6", 1e-6), ("0.000001", 1e-6),
                                             ("5e-7", 5e-7), (".5", 0.5), ("+2", 2.0), ("3", 3.0)])
def test_numbers_in_the_usual_spellings_are_accepted(tmp_path, spelling, value):
    """PyYAML reads ``1e-6`` (no dot in the mantissa) as a string; --set and YAML files must take it."""
    assert apply_overrides(Config(), [f"train.lr={spelling}"]).train.lr == pytest.approx(value)
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  lr: {spelling}\n  critic_lr: '{spelling}'\n")
    cfg = load_config(path)
    assert cfg.train.lr == pytest.approx(value) and isinstance(cfg.train.lr, float)
    assert cfg.train.critic_lr == pytest.approx(value)


def test_integer_spellings_and_numbers_that_are_not():
    cfg = apply_overrides(Config(), ["train.total_steps=1e3", "train.questions_per_step=1_000", "data.limit=20"])
    assert (cfg.train.total_steps, cfg.train.questions_per_step, cfg.data.limit) == (1000, 1000, 20)
    assert isinstance(cfg.train.total_steps, int)
    with pytest.raises(ConfigError, match="train.total_steps: expected an integer"):
        apply_overrides(Config(), ["train.total_steps=2.5"])
    for bad in ("fast", "nan", "inf", "true"):
        with pytest.raises(ConfigError, match="train.lr: expected a finite number"):
            apply_overrides(Config(), [f"train.lr={bad}"])


def test_config_imports_nothing_of_sleuth():
    """Plain data: reading a config loads no component (the registries import the config, not the reverse)."""
    import subprocess
    import sys

    code = "import sys, sleuth.config; print(sorted(m for m in sys.modules if m.startswith('sleuth')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['sleuth', 'sleuth.config', 'sleuth.version']"


def test_every_setting_is_documented_and_bounds_sit_in_the_schema():
    from sleuth.config_file import _ADAPTER

    schema = _ADAPTER.json_schema()
    sections = [("Config", schema), *schema["$defs"].items()]
    undocumented = [f"{name}.{key}" for name, s in sections for key, p in s["properties"].items()
                    if not p.get("description")]
    assert undocumented == []
    rollout = schema["$defs"]["RolloutConfig"]["properties"]
    assert (rollout["top_p"]["gt"], rollout["top_p"]["le"]) == (0, 1)
    assert rollout["format"]["enum"][-1] == "search_r1_tiny"


def test_every_bound_is_enforced_naming_the_key():
    """For each number with a least value, the value just below it is refused with a message naming the key."""
    import dataclasses

    from sleuth.config_file import _unwrap

    checked = 0
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(section.type):
            _, bounds = _unwrap(f.type)
            for op, edge in (("ge", bounds.get("ge")), ("gt", bounds.get("gt"))):
                if edge is None:
                    continue
                key, bad = f"{section.name}.{f.name}", edge - 1 if op == "ge" else edge
                sign = ">=" if op == "ge" else ">"
                with pytest.raises(ConfigError, match=rf"^{key} must be {sign} {edge}, got {bad}$"):
                    load_config(None, [f"{key}={bad}"])
                checked += 1
    assert checked >= 35


def test_wrong_types_are_named_with_what_was_expected():
    cases = {
        "train.total_steps=true": "train.total_steps: expected an integer, got True",  # no bool for a number
        "algo.tis_cap=false": "algo.tis_cap: expected a finite number (e.g. 1e-6, 0.001, 3), got False",
        "train.wandb=1": "train.wandb: expected true/false, got 1",  # no number for a bool
        "train.wandb='on'": "train.wandb: expected true/false, got 'on'",  # (bare on/yes are YAML 1.1 true)
        "model.name_or_path=true": "model.name_or_path: expected a string, got True",
        "data.train_files=[a, true]": "data.train_files[1]: expected a string, got True",
        "data.train_files={a: 1}": "data.train_files: expected a list, got {'a': 1}",
        "train.lr=.inf": "train.lr: expected a finite number (e.g. 1e-6, 0.001, 3), got inf",
        "model.dtype=float64": "model.dtype: 'float64' is not one of ['float32', 'bfloat16', 'float16']",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            apply_overrides(Config(), [override])
    # what is no wrong type: a number for a string, one name for a list of names, null for an optional number
    cfg = apply_overrides(Config(), ["model.name_or_path=123", "data.train_files=a.jsonl", "train.cpu_threads=null",
                                     "model.lora_targets=[1, q_proj]", "train.total_steps= 1e1"])
    assert (cfg.model.name_or_path, cfg.data.train_files, cfg.train.cpu_threads) == ("123", ["a.jsonl"], None)
    assert (cfg.model.lora_targets, cfg.train.total_steps) == (["1", "q_proj"], 10)


def test_yaml_file_errors_name_the_key_and_the_keys_there(tmp_path):
    cases = {
        "trian:\n  lr: 1\n": r"unknown config key 'trian'; valid keys here: \['algo', 'data', 'eval', 'model', ",
        "train:\n  nope: 1\n": r"unknown config key 'train.nope'; valid keys here: \[.*'total_steps'",
        "train: 3\n": "train: expected a mapping, got 3",
        "- a\n- b\n": r"config: expected a mapping, got \['a', 'b'\]",
        "rollout:\n  top_p: '1.5'\n": r"rollout.top_p must be in \(0, 1\], got '1.5'",  # the value as written
        "train:\n  lr: nan\n": r"train.lr: expected a finite number .*, got 'nan'",
    }
    for text, message in cases.items():
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(tmp_path / "c.yaml")
    # an empty section is the section's defaults; YAML numbers in the usual spellings for an int field
    (tmp_path / "c.yaml").write_text("eval:\ntrain:\n  total_steps: 1e3\n  save_every: 1_0\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert (cfg.eval, cfg.train.total_steps, cfg.train.save_every) == (Config().eval, 1000, 10)


def test_dataclasses_are_plain_data_that_validate_checks():
    """Building or changing a config in code checks nothing (components test their own errors that way);
    ``validate`` (the trainer calls it) checks the whole config as a YAML file is checked."""
    import dataclasses

    from sleuth.config import RewardConfig
    from sleuth.config_file import to_dict, validate

    assert RewardConfig(kind="bleu").kind == "bleu"
    cfg = Config()
    cfg.train.eval_limit = 3
    assert validate(cfg) is cfg
    cfg.rollout = dataclasses.replace(cfg.rollout, top_p=0.0)
    with pytest.raises(ConfigError, match="rollout.top_p must be > 0, got 0.0"):
        validate(cfg)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, top_p=0.9))
    assert validate(cfg).rollout.top_p == 0.9 and to_dict(cfg)["train"]["eval_limit"] == 3
    assert [f.name for f in dataclasses.fields(cfg)] == list(to_dict(cfg))


def test_saved_yaml_keeps_the_sections_and_fields_in_order(tmp_path):
    import yaml

    cfg = apply_overrides(Config(), ["algo.dual_clip=3", "train.eval_limit=5", "rollout.top_p=0.5", "train.lr=1e-6",
                                     "model.lora_targets=[q_proj]", "rollout.format=search_r1_tiny"])
    save_config(cfg, tmp_path / "c.yaml")
    data = yaml.safe_load((tmp_path / "c.yaml").read_text())
    assert list(data) == ["model", "data", "retrieval", "rollout", "reward", "algo", "train", "eval", "sft"]
    assert list(data["train"])[:3] == ["total_steps", "questions_per_step", "lr"] and data["train"]["lr"] == 1e-6
    assert load_config(tmp_path / "c.yaml") == cfg


def test_retired_keys_of_an_old_run_config_are_dropped_with_a_note_and_refused_as_overrides(tmp_path, capsys,
                                                                                         monkeypatch):
    """Earlier releases wrote eval.greedy and eval.limit into every run's config.yaml; such a file still
    loads (the keys dropped, a note says why), while a --set of a retired key is an unknown key."""
    from sleuth import config_file
    from sleuth.config_file import ConfigError, load_config

    monkeypatch.setattr(config_file, "_noted", set())  # noted once per process
    old = tmp_path / "config.yaml"
    old.write_text("eval:\n  greedy: true\n  limit: null\n  batch_size: 8\n")
    cfg = load_config(old)
    assert cfg.eval.batch_size == 8 and not hasattr(cfg.eval, "greedy")
    err = capsys.readouterr().err
    assert "eval.greedy is retired" in err and "eval.limit is retired" in err
    with pytest.raises(ConfigError, match="unknown config key 'eval.greedy'"):
        load_config(None, ["eval.greedy=false"])


def test_log_samples_takes_a_count_or_all_and_names_both_forms_when_wrong():
    from sleuth.config_file import ConfigError, load_config

    assert load_config(None, ["train.log_samples=all"]).train.log_samples == "all"
    assert load_config(None, ["train.log_samples=5"]).train.log_samples == 5
    with pytest.raises(ConfigError, match=r"^train.log_samples: expected an integer >= 0 or 'all', got 'some'$"):
        load_config(None, ["train.log_samples=some"])
    with pytest.raises(ConfigError, match=r"^train.log_samples must be >= 0, got -1$"):
        load_config(None, ["train.log_samples=-1"])
