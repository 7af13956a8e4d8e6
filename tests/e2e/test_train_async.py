"""Asynchronous rollouts (rollout.async_steps): the worker's batches are exactly what a synchronous collect
from the named older weights gives, the update on them is the synchronous learn, the spawned worker equals
the inline schedule, resume loses and repeats no question, and a dead worker stops the run."""

import json
import os
import shutil
import signal

import pytest
import torch

from sleuth.cli import main
from tests.e2e.test_train_e2e import _args, _metrics, world  # noqa: F401 - the shared tiny world fixture

pytestmark = pytest.mark.e2e

ONE_THREAD = ["train.cpu_threads=1", "rollout.async_threads=1", "train.eval_every=0", "train.log_samples=all"]


def _trainer(world, out, extra, steps=3):
    from sleuth.config_file import load_config
    from sleuth.train.loop import Trainer

    return Trainer(load_config(None, _args(world, out, steps, list(extra))[5::2]), out, progress=False)


def _samples(out):
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return [(r["step"], r["question_id"], r["sample_index"], r["reward"], r["segments"]) for r in rows]


def _weights(ckpt):
    from sleuth.models import load_policy

    model, _ = load_policy(str(ckpt), device="cpu")
    return [p.detach().clone() for p in model.parameters()]


def test_a_batch_is_the_synchronous_collect_from_the_weights_n_updates_old_and_the_update_is_learn(world, tmp_path):
    from sleuth.train.checkpoint import load_trainer_state
    from sleuth.train.logging import trajectory_record

    out = tmp_path / "async"
    extra = [*ONE_THREAD, "rollout.async_steps=1", "rollout.async_worker=inline", "train.save_every=1",
             "train.keep_checkpoints=10"]
    assert main(_args(world, out, 3, extra)) == 0
    rows = _metrics(out)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0]  # batch 2 from v0, batch 3 from v1
    assert [r["async/weights_version"] for r in rows] == [0.0, 0.0, 1.0]
    assert all(r["async/dropped_batches"] == 0 for r in rows)
    ckpt = out / "checkpoints"
    # batch 3, synchronously: the weights after update 1, the question cursor after batch 2, seeds of step 3
    sync = _trainer(world, tmp_path / "sync", ONE_THREAD)
    sync._resume(ckpt / "step_000001")
    sync.sampler.load_state(load_trainer_state(ckpt / "step_000002")["cursor"])
    sync.step = 3
    with sync.compute():
        batch = sync.collect()
    got = [s for s in _samples(out) if s[0] == 3]
    records = [json.loads(json.dumps(trajectory_record(t))) for t in batch.trajectories]
    assert [(r["question_id"], r["sample_index"], r["reward"], r["segments"]) for r in records] == [s[1:] for s in got]
    # the reference's logprobs, which the worker adds to its batch (it holds the reference): the sync trainer's
    from sleuth.train.learn import reference_logprobs

    with sync.compute():
        batch.ref_logprobs_BT = reference_logprobs(sync.state, sync.layout, batch.input_ids_BT, batch.attention_mask_BT,
                                                   batch.loss_mask_BT, max(sync.cfg.rollout.temperature, 1e-6))
    # update 3, synchronously: learn on that batch from the checkpoint of step 2 (old logprobs recomputed)
    learner = _trainer(world, tmp_path / "learner", [*ONE_THREAD, "rollout.async_steps=1", "rollout.async_worker=inline"])
    learner._resume(ckpt / "step_000002")
    learner.step = 3
    with learner.compute():
        learner.learn(batch)
    for p, q in zip(learner.policy.parameters(), _weights(ckpt / "step_000003")):
        assert torch.equal(p.detach(), q)
    learner.close()
    sync.close()


def test_the_spawned_worker_gives_the_inline_schedules_run(world, tmp_path):
    runs = {}
    for mode in ("inline", "process"):
        out = tmp_path / mode
        assert main(_args(world, out, 3, [*ONE_THREAD, "rollout.async_steps=1", f"rollout.async_worker={mode}"])) == 0
        runs[mode] = out
    a, b = _metrics(runs["inline"]), _metrics(runs["process"])
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            if not k.startswith("async/") or k in ("async/staleness", "async/weights_version"):
                assert ra[k] == rb[k], (ra["step"], k)
    assert _samples(runs["inline"]) == _samples(runs["process"])
    for p, q in zip(_weights(runs["inline"]), _weights(runs["process"])):
        assert torch.equal(p, q)


@pytest.mark.parametrize("sampling", [[], ["train.dynamic_sampling=true", "train.max_sampling_rounds=3"]],
                         ids=["plain", "dynamic_sampling"])
def test_resume_with_batches_in_flight_neither_repeats_nor_loses_a_question(world, tmp_path, sampling):
    """The checkpoint holds the cursor after the last trained batch; the batch the worker had ready is drawn
    again after the resume, from the checkpoint's weights (staleness 0 where the uninterrupted run had 1).
    With dynamic sampling the worker's rounds move the cursor; which groups it keeps after the resume depends on
    the weights they were sampled from, so there only the steps before the stop are compared."""
    extra = [*ONE_THREAD, "rollout.async_steps=1", "train.save_every=2", *sampling]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(_args(world, full, 4, extra)) == 0
    assert main(_args(world, part, 2, extra)) == 0
    assert main(_args(world, part, 4, extra) + ["--resume"]) == 0
    a, b = _metrics(full), _metrics(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a[:2], b[:2]):  # before the stop: the same run (the stopped one also evaluated at step 2)
        assert {k: v for k, v in ra.items() if not k.startswith(("async/", "eval/"))} == \
            {k: v for k, v in rb.items() if not k.startswith(("async/", "eval/"))}
    asked = lambda out: [(s[0], s[1]) for s in _samples(out)]
    if not sampling:  # the same questions at the same steps (with dynamic sampling the kept groups depend on
        assert sorted(set(asked(full))) == sorted(set(asked(part)))  # the weights, which differ after resume)
    else:
        assert sorted(set(asked(full)))[:4] == sorted(set(asked(part)))[:4]
    assert [r["async/staleness"] for r in b] == [0.0, 1.0, 0.0, 1.0]
    assert [r["async/staleness"] for r in a] == [0.0, 1.0, 1.0, 1.0]


def test_a_worker_that_dies_stops_the_run_with_an_error_naming_it(world, tmp_path):
    trainer = _trainer(world, tmp_path / "run", [*ONE_THREAD, "rollout.async_steps=1"])
    try:
        pid = trainer.rollouts.proc.pid
        os.kill(pid, signal.SIGKILL)
        trainer.rollouts.proc.join(timeout=60)
        trainer.step = 1
        with pytest.raises(RuntimeError, match=rf"rollout worker \(process {pid}\) exited with code -9"):
            trainer.train_step()
    finally:
        trainer.close()


def test_async_under_torchrun_needs_a_split_of_the_ranks_or_inline(world, tmp_path, monkeypatch):
    from sleuth.config_file import ConfigError, load_config
    from sleuth.train.distributed import DistContext, init_distributed
    from sleuth.train.state import check_parallel_settings

    def cfg(*extra):
        return load_config(None, _args(world, tmp_path / "x", 2, list(extra))[5::2])

    with pytest.raises(ConfigError, match="rollout.async_steps=1 runs in one process"):
        check_parallel_settings(cfg("rollout.async_steps=1"), DistContext(0, 2, 0))
    check_parallel_settings(cfg("rollout.async_steps=1", "rollout.async_worker=inline"), DistContext(0, 2, 0))
    split = DistContext(0, 2, 0, role="train", peer=2)
    check_parallel_settings(cfg("rollout.async_steps=1", "rollout.workers=2"), split)
    check_parallel_settings(cfg("rollout.async_steps=1", "rollout.workers=2", "train.parallel=fsdp"), split)
    for extra, said in ((["rollout.workers=2"], "set rollout.async_steps >= 1"),
                        (["rollout.async_steps=1", "rollout.workers=2", "rollout.backend=vllm"], "not supported yet"),
                        (["rollout.async_steps=1", "rollout.workers=2", "train.on_collapse=rollback"], "rollback")):
        with pytest.raises(ConfigError, match=said):
            check_parallel_settings(cfg(*extra), split)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="--nproc_per_node 2"):  # one process: no rank to split
        init_distributed(workers=1)


@pytest.mark.timeout(2400)  # a hang guard: ~1.5 min idle
def test_the_toy_demo_learns_with_one_step_off_rollouts(tmp_path):
    """The demo's setting (sleuth.toy.recipe.demo_config, the CI learning test's world) through `sleuth train`
    with rollout.async_steps=1 and the worker in its own process learns: the base model scores <= 0.15 (the
    demo test), this run 0.927 after 40 steps (measured 2026-11-27; synchronous 1.0; seeds 1 and 2: async
    0.978 / 0.861, synchronous 0.949 / 0.949: the issue's 0.95 is within this setting's seed noise, not met
    at seed 0). Asserted: a wide margin over the base and every batch one update old."""
    import sleuth.toy  # noqa: F401 - registers the tiny model and the world

    out = tmp_path / "run"
    sets = ["model.name_or_path=tiny", "data.train_files=[world:train]", "data.eval_files=[world:test]",
            "data.world_seed=1", "data.world_entities=200", "retrieval.corpus=world", "retrieval.topk=1",
            "rollout.format=search_r1_tiny", "rollout.group_size=8", "rollout.max_turns=2",
            "rollout.max_tokens_per_turn=40", "rollout.max_obs_tokens=128", "rollout.max_context_tokens=512",
            "rollout.use_chat_template=false", "reward.kind=em", "algo.kl_coef=0", "algo.kl_mode=none",
            "algo.clip_high=0.28", "train.total_steps=40", "train.questions_per_step=8", "train.lr=5e-4",
            "train.micro_batch_size=32", "train.eval_every=0", "train.save_every=0", "train.cpu_threads=1",
            "rollout.async_steps=1"]
    assert main(["train", "--out", str(out), "--json"] + [x for s in sets for x in ("--set", s)]) == 0
    rows = _metrics(out)
    assert rows[-1]["step"] == 40 and rows[-1]["eval/questions"] == 137
    assert rows[-1]["eval/em"] >= 0.8, rows[-1]
    assert [r["async/staleness"] for r in rows] == [0.0] + [1.0] * 39


def test_an_error_in_the_worker_is_raised_by_the_trainer_with_the_workers_traceback(world, tmp_path):
    """The training questions vanish after the trainer read them and before the worker (a new interpreter,
    seconds to import) does: the worker's error reaches the trainer's step, noted as the worker's."""
    data = tmp_path / "train.jsonl"
    shutil.copy(world / "train.jsonl", data)
    trainer = _trainer(world, tmp_path / "run", [*ONE_THREAD, "rollout.async_steps=1", f"data.train_files=[{data}]"])
    data.unlink()
    try:
        trainer.step = 1
        with pytest.raises(Exception) as info:
            trainer.train_step()
        assert str(data) in str(info.value)
        assert any("raised in the rollout worker" in n and "Traceback" in n for n in info.value.__notes__)
    finally:
        trainer.close()


def test_the_spawned_worker_takes_the_trainers_determinism_settings(monkeypatch):
    """A spawned process starts with torch's defaults: the worker applies train.deterministic (and, on a GPU,
    train.tf32) as the trainer does before it builds anything, so its rollouts run as the inline worker's."""
    import queue
    import threading

    import sleuth.train.rollout_worker as rw
    from sleuth.config_file import load_config

    def refuse(*args, **kwargs):
        raise LookupError("stopped where the worker would be built")

    monkeypatch.setattr(rw, "RolloutWorker", refuse)
    box, before = queue.Queue(), (torch.are_deterministic_algorithms_enabled(),
                                  torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(False)
    try:
        rw.worker_main(load_config(None, ["train.deterministic=true"]), "unused", {}, 0, 1, 1, None, box,
                       threading.Event(), os.getppid(), [], 0)
        seen = torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    kind, err, _ = box.get_nowait()
    assert kind == "error" and isinstance(err, LookupError)  # it got as far as building the worker
    assert seen
