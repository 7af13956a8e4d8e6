"""Checkpoints against kills, damage and hostile files: the checkpoint ``latest`` names is never
replaced in place, pruning never deletes the one just written, a truncated file is an error naming
it and the previous checkpoint, reading a checkpoint runs no pickled code, and everything a
checkpoint holds (optimizer, scheduler, cursor, RNG states) reads back with ``weights_only=True``."""

import os
import random
import re

import numpy as np
import pytest
import torch

from sleuth.models import ModelLoadError, load_policy
from sleuth.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint_file,
    load_policy_weights,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
)
from tests.helpers.tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.component


@pytest.fixture
def model_and_tok():
    tok = tiny_tokenizer()
    return tiny_model(tok, seed=3, hidden=32, layers=1), tok


def _save(run, step, model_and_tok, keep=0, **state):
    model, tok = model_and_tok
    return save_checkpoint(run, step, policy=model, tokenizer=tok, trainer_state=state, keep=keep)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def test_resaving_the_latest_checkpoint_never_leaves_latest_naming_a_missing_one(tmp_path, model_and_tok,
                                                                                  monkeypatch):
    """A finished run resumed and saved again at its last step used to delete the checkpoint
    ``latest`` names before moving the new copy into place: a kill in between (here: the rename
    fails) left ``latest`` naming a deleted directory, and every later --resume failed."""
    _save(tmp_path, 1, model_and_tok)
    real_replace = os.replace

    class Killed(BaseException):
        pass

    def killed_at_directory_rename(src, dst):
        if os.path.isdir(src):
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_directory_rename)
    with pytest.raises((CheckpointError, Killed)):
        _save(tmp_path, 1, model_and_tok)
    monkeypatch.setattr(os, "replace", real_replace)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.name == "step_000001" and load_trainer_state(ckpt)["step"] == 1
    with pytest.raises(CheckpointError, match="step_000001 is the one .*latest names; it is not written again"):
        _save(tmp_path, 1, model_and_tok)


def test_a_rewound_run_replaces_a_later_step_and_pruning_keeps_it(tmp_path, model_and_tok):
    """``latest`` pointed back at step 1 by hand: saving step 2 again replaces the old step 2 (which
    ``latest`` does not name), and ``keep=1`` keeps that new checkpoint, not a higher-numbered one."""
    for step in (1, 2, 3):
        _save(tmp_path, step, model_and_tok, marker=step)
    (tmp_path / "checkpoints" / "latest").write_text("step_000001\n")
    _save(tmp_path, 2, model_and_tok, keep=1, marker=22)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.name == "step_000002" and load_trainer_state(ckpt)["marker"] == 22
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000002"]


class _RunsCode:
    """Unpickling this calls ``os.mkdir(path)``: what a hostile checkpoint could do with any function."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


def test_a_trainer_state_holding_pickled_code_is_refused_without_running_it(tmp_path, model_and_tok):
    ckpt = _save(tmp_path, 1, model_and_tok)
    ran = tmp_path / "code_ran"
    torch.save({"step": 1, "cursor": _RunsCode(ran)}, ckpt / "trainer_state.pt")
    torch.save({"head.weight": torch.zeros(1), "evil": _RunsCode(ran)}, ckpt / "critic.pt")
    for name in ("trainer_state.pt", "critic.pt"):
        with pytest.raises(CheckpointError, match=re.escape(str(ckpt / name)) + " holds objects other than tensors"):
            load_checkpoint_file(ckpt, name)
    assert not ran.exists()


def test_truncated_checkpoint_files_name_the_file_and_the_previous_checkpoint(tmp_path, model_and_tok):
    _save(tmp_path, 1, model_and_tok)
    ckpt = _save(tmp_path, 2, model_and_tok)
    model = model_and_tok[0]
    _truncate(ckpt / "trainer_state.pt")
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {ckpt} is damaged: {ckpt / 'trainer_state.pt'} "
                                                        "is truncated") + ".*previous checkpoint step_000001"):
        load_trainer_state(latest_checkpoint(tmp_path))
    weights = ckpt / "policy" / "model.safetensors"
    _truncate(weights)
    with pytest.raises(CheckpointError, match=re.escape(f"{weights} is truncated") + ".*echo step_000001 > "):
        load_policy_weights(model, ckpt)  # train --resume
    with pytest.raises(ModelLoadError, match=re.escape(f"its weights file {weights} is truncated")
                       + ".*previous checkpoint " + re.escape(str(ckpt.parent / "step_000001"))):
        load_policy(str(tmp_path), device="cpu")  # eval --model RUN: the run's latest policy


def test_everything_a_checkpoint_holds_reads_back_with_weights_only(tmp_path, model_and_tok):
    """Optimizer (AdamW moments), scheduler, cursor and the RNG states of Python, numpy and torch
    load with plain ``torch.load(weights_only=True)``, and the RNGs continue exactly."""
    model = model_and_tok[0]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
             "cursor": {"epoch": 1, "pos": 2, "deferred": [0, 3]}}
    ckpt = _save(tmp_path, 1, model_and_tok, **state)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    loaded = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    set_rng_state(loaded["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    assert loaded["cursor"] == state["cursor"] and loaded["scheduler"] == sched.state_dict()
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(loaded["optimizer"])
    for a, b in zip(fresh.state.values(), opt.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_an_older_trainer_state_with_a_numpy_rng_array_still_resumes(tmp_path, model_and_tok):
    """Checkpoints written before the numpy RNG key was stored as a list hold an ndarray."""
    ckpt = _save(tmp_path, 1, model_and_tok)
    np.random.seed(7)
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"step": 1, "rng": old}, ckpt / "trainer_state.pt")
    expected = np.random.rand()
    set_rng_state(load_trainer_state(ckpt)["rng"])
    assert np.random.rand() == expected


def test_after_a_rewind_the_abandoned_later_steps_are_pruned_before_the_history(tmp_path, model_and_tok):
    """``latest`` pointed back at step 1 by hand, then step 2 saved again with ``keep=2``: the
    abandoned step 3 goes, step 1 (the history before the new step, a fallback) stays."""
    for step in (1, 2, 3):
        _save(tmp_path, step, model_and_tok, marker=step)
    (tmp_path / "checkpoints" / "latest").write_text("step_000001\n")
    _save(tmp_path, 2, model_and_tok, keep=2, marker=22)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001", "step_000002"]
