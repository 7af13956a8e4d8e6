"""``rollout.workers``: asynchronous rollouts over a split of the ``torchrun`` ranks (CPU, gloo), compared with
the same schedule without the split. Four ranks (two training, two generating) train exactly as two DDP ranks
whose rollout worker runs inline (the same batches, losses and final weights), and with FSDP among the training
ranks as with DDP among them; two ranks (one of each) that
stop on ``train.time_limit_minutes`` after the first of five steps exit cleanly (the rollout rank's batch in flight
taken, then the stop it waits for sent) with the same first step as one process with an inline worker; a rollout
rank killed mid-run ends the run with a failure naming it (no hang)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.e2e.test_train_torchrun import _write_data

pytestmark = pytest.mark.e2e

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
COMPARED = ("reward/", "algo/loss", "algo/kl", "algo/entropy", "rollout/trajectories", "rollout/questions",
            "rollout/sampled_tokens", "async/staleness", "async/weights_version")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("rollout_ranks")
    tok = tiny_tokenizer()
    tiny_model(tok, seed=0, hidden=32).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    _write_data(root)
    (root / "tiny.yaml").write_text(f"""
model: {{name_or_path: {root / 'model'}, device: cpu}}
data: {{train_files: [{root / 'train.jsonl'}], eval_files: [{root / 'train.jsonl'}], shuffle: false}}
retrieval: {{kind: bm25, corpus: {root / 'corpus.jsonl'}, topk: 2}}
rollout: {{format: search_r1, use_chat_template: false, group_size: 2, max_turns: 1, max_tokens_per_turn: 8,
          max_obs_tokens: 64, max_context_tokens: 1024, async_steps: 1}}
algo: {{advantage: grpo, kl_coef: 0.01, kl_mode: loss, entropy_coef: 0.01}}  # entropy: a gradient at reward 0
train: {{total_steps: {STEPS}, questions_per_step: 4, micro_batch_size: 2, lr: 0.01, eval_every: 0,
        save_every: 0, cpu_threads: 1}}
""")
    return root


def _launch(root: Path, out: Path, ranks: int, *sets: str, env: dict | None = None) -> subprocess.Popen:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
                if ranks > 1 else [sys.executable])
    cmd = [*launcher, "-m", "sleuth", "train", "--config", str(root / "tiny.yaml"), "--out", str(out), "--json",
           *[x for s in sets for x in ("--set", s)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(setup):
    """Every run at once (most of each run's time is its processes importing torch)."""
    stop = ("train.time_limit_minutes=0.0001", "train.total_steps=5")  # stops after its first step of 5
    procs = {"split": _launch(setup, setup / "split", 4, "rollout.workers=2"),
             "split_fsdp": _launch(setup, setup / "split_fsdp", 4, "rollout.workers=2", "train.parallel=fsdp"),
             "inline": _launch(setup, setup / "inline", 2, "rollout.async_worker=inline"),
             "split_stop": _launch(setup, setup / "split_stop", 2, "rollout.workers=1", *stop),
             "one_stop": _launch(setup, setup / "one_stop", 1, "rollout.async_worker=inline", *stop),
             "split_killed": _launch(setup, setup / "split_killed", 2, "rollout.workers=1", "train.total_steps=400",
                                     env={"SLEUTH_TEST_RUN": "split_killed"})}
    _kill_rollout_rank_after_a_step(procs["split_killed"], setup / "split_killed" / "metrics.jsonl", "split_killed")
    done = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        done[name] = (proc.returncode, stdout, stderr)
    return done


def _kill_rollout_rank_after_a_step(proc: subprocess.Popen, metrics: Path, tag: str) -> None:
    """SIGKILL the rollout rank (RANK=1) of the run started with ``SLEUTH_TEST_RUN=tag`` once it has trained a step
    (as the kernel's out-of-memory killer would)."""
    deadline = time.monotonic() + 600  # a hang guard
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and metrics.read_text().strip():
            for environ in Path("/proc").glob("[0-9]*/environ"):
                try:
                    env = dict(kv.split("=", 1) for kv in environ.read_text().split("\0") if "=" in kv)
                except OSError:  # gone, or not ours
                    continue
                if env.get("SLEUTH_TEST_RUN") == tag and env.get("RANK") == "1":
                    os.kill(int(environ.parent.name), signal.SIGKILL)
                    return
        time.sleep(0.2)


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith(COMPARED) and not k.endswith("_s")} | {"step": r["step"]}
            for r in rows]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from sleuth.models import load_policy

    return load_policy(str(out), device="cpu")[0].state_dict()  # a run directory: its latest checkpoint


def test_two_training_and_two_rollout_ranks_train_as_two_ranks_with_inline_rollouts(setup, runs):
    for name in ("split", "inline"):
        returncode, stdout, stderr = runs[name]
        assert returncode == 0, name + stdout[-2000:] + stderr[-6000:]
    split, inline = _metrics(setup / "split"), _metrics(setup / "inline")
    assert [r["step"] for r in split] == list(range(1, STEPS + 1))  # rank 0 alone writes: one row a step
    assert split[0]["rollout/trajectories"] == 8 and split[-1]["async/staleness"] == 1.0
    for a, b in zip(split, inline):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), (a["step"], k)
    w_split, w_inline = _weights(setup / "split"), _weights(setup / "inline")
    start = _weights(setup / "model")
    assert any(not torch.equal(w_split[k], start[k]) for k in start)  # it trained
    for k in w_inline:
        torch.testing.assert_close(w_split[k], w_inline[k], rtol=1e-6, atol=1e-7, msg=k)


def test_fsdp_training_ranks_train_as_ddp_training_ranks(setup, runs):
    """FSDP among the training ranks (each tensor gathered before its pair's broadcast) against DDP among them:
    the same batches, losses and final weights, to float rounding (the gradients are averaged in another order)."""
    returncode, stdout, stderr = runs["split_fsdp"]
    assert returncode == 0, stdout[-2000:] + stderr[-6000:]
    ckpt = sorted((setup / "split_fsdp" / "checkpoints").glob("step_*"))[-1]
    optim = torch.load(ckpt / "trainer_state.pt", weights_only=False)["optimizer"]
    assert all(isinstance(p, str) for g in optim["param_groups"] for p in g["params"])  # FSDP's: keyed by name
    fsdp, ddp = _metrics(setup / "split_fsdp"), _metrics(setup / "split")
    assert [r["step"] for r in fsdp] == list(range(1, STEPS + 1)) and fsdp[-1]["async/staleness"] == 1.0
    for a, b in zip(fsdp, ddp):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (a["step"], k)
    w_fsdp, w_ddp, start = _weights(setup / "split_fsdp"), _weights(setup / "split"), _weights(setup / "model")
    assert any(not torch.equal(w_fsdp[k], start[k]) for k in start)  # it trained
    for k in w_ddp:
        # Adam turns the rounding of a near-zero gradient into up to ~2e-6 (measured); training moved them ~3e-2
        torch.testing.assert_close(w_fsdp[k], w_ddp[k], rtol=1e-5, atol=1e-5, msg=k)


def test_a_split_run_stopped_by_the_clock_ends_cleanly_after_the_same_step_as_one_process(setup, runs):
    for name in ("split_stop", "one_stop"):
        returncode, stdout, stderr = runs[name]
        assert returncode == 0, name + stdout[-2000:] + stderr[-6000:]
        assert "train.time_limit_minutes" in stderr and json.loads(stdout.strip().splitlines()[-1])["step"] == 1
    split, one = _metrics(setup / "split_stop"), _metrics(setup / "one_stop")
    assert len(split) == len(one) == 1
    for k in one[0]:
        assert split[0][k] == pytest.approx(one[0][k], rel=1e-6, abs=1e-9), k


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rollout rank through /proc")
def test_a_rollout_rank_that_dies_stops_the_run_with_an_error_naming_it(setup, runs):
    """The rollout rank killed (SIGKILL) after the first step of 400: the run ends (no hang on the training rank's
    wait for its next batch) with a failure that names the dead rank, and nothing more was trained."""
    returncode, stdout, stderr = runs["split_killed"]
    assert returncode != 0, stdout[-2000:] + stderr[-4000:]
    assert "rank: 1" in stderr and ("Signal 9" in stderr or "SIGKILL" in stderr or "exitcode: -9" in stderr), stderr[-4000:]
    steps = [json.loads(line)["step"] for line in (setup / "split_killed" / "metrics.jsonl").read_text().splitlines()]
    assert 1 <= len(steps) < 400
