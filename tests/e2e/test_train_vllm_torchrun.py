"""``rollout.backend=vllm`` under ``torchrun --nproc_per_node 2`` on CPU (gloo), against the stub engine
(``tests/helpers/vllm_stub.py``): one engine per rank in vLLM's external launcher mode.

Two runs at once: DDP with one engine per rank (tensor parallel 1: each rank generates its own share
of the questions) and FSDP with both ranks holding one engine (tensor parallel 2: both submit the
same prompts, each keeps its half). Every rank's engine records what happened to it; the test
checks that every rank built its engine in external launcher mode, synced the full weights (equal
to the checkpoint rank 0 saved after each step; under FSDP gathered from the shards), slept after
each rollout and woke weights first, generated its share, and was shut down while the process
group was alive."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.helpers.vllm_stub import fingerprint

pytestmark = pytest.mark.e2e

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

Q, G, STEPS, RANKS, SEED = 4, 2, 2, 2, 5
REPO = Path(__file__).resolve().parents[2]
RUNS = {"ddp_tp1": ("ddp", 1), "fsdp_tp2": ("fsdp", 2)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("vllm_torchrun")
    tok = tiny_tokenizer()
    tiny_model(tok, seed=0, hidden=32).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "train.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "question": f"what is the capital of country {i}", "golden_answers": [f"city {i}"],
                    "data_source": "toy"}) + "\n" for i in range(8)))
    (root / "corpus.jsonl").write_text("".join(
        json.dumps({"id": str(i), "contents": f'"Country {i}"\nIts capital is city {i}.'}) + "\n" for i in range(8)))
    (root / "config.yaml").write_text(f"""
model: {{name_or_path: {root / 'model'}, device: cpu}}
data: {{train_files: [{root / 'train.jsonl'}], eval_files: [{root / 'train.jsonl'}], shuffle: false}}
retrieval: {{kind: bm25, corpus: {root / 'corpus.jsonl'}, topk: 2}}
rollout: {{format: search_r1, use_chat_template: false, group_size: {G}, max_turns: 1, max_tokens_per_turn: 8,
          max_obs_tokens: 64, max_context_tokens: 1024, backend: vllm}}
algo: {{advantage: grpo, kl_coef: 0.0, kl_mode: none, entropy_coef: 0.01, tis_cap: 2.0}}
train: {{total_steps: {STEPS}, questions_per_step: {Q}, micro_batch_size: 2, lr: 0.01, eval_limit: 3,
        save_every: 1, keep_checkpoints: {STEPS + 1}, seed: {SEED}}}
""")
    return root


@pytest.fixture(scope="module")
def runs(setup):
    procs = {}
    for name, (parallel, tp) in RUNS.items():
        log = setup / f"events_{name}"
        log.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
               str(REPO / "tests" / "helpers" / "vllm_stub_cli.py"), "train", "--config", str(setup / "config.yaml"),
               "--out", str(setup / f"run_{name}"), "--json", "--set", f"train.parallel={parallel}",
               "--set", f"rollout.vllm_tensor_parallel_size={tp}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "STUB_VLLM_LOG": str(log)}
        procs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    done = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=420)  # a hang guard: the runs take a minute or two
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        events = [json.loads((setup / f"events_{name}" / f"events_rank{r}.json").read_text())
                  if (setup / f"events_{name}" / f"events_rank{r}.json").exists() else None for r in range(RANKS)]
        done[name] = (proc.returncode, stdout, stderr, events)
    return done


def _weights(path: Path) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    return {n: fingerprint(t) for n, t in load_file(path / "model.safetensors").items()}


def _pushed(push: dict[str, list[float]], expected: dict[str, list[float]]) -> None:
    assert set(expected) <= set(push)  # the push may also carry a tied output layer the file leaves out
    for n, (s, ss) in expected.items():
        assert push[n] == pytest.approx([s, ss], rel=1e-6, abs=1e-6), n


@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_builds_syncs_sleeps_wakes_and_generates(setup, runs, name):
    parallel, tp = RUNS[name]
    returncode, stdout, stderr, events = runs[name]
    assert returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert all(e is not None for e in events), "a rank built no engine"
    out = setup / f"run_{name}"
    checkpoints = [_weights(setup / "model")] + [
        _weights(out / "checkpoints" / f"step_{s:06d}" / "policy") for s in range(1, STEPS + 1)]
    assert checkpoints[1] != checkpoints[0]  # the updates changed the weights, so pushes can be told apart
    prompts_by_rank = []
    for rank, ev in enumerate(events):
        kinds = [k for k, _ in ev]
        build = ev[0][1]
        assert kinds[0] == "build" and build["distributed_executor_backend"] == "external_launcher"
        assert build["tensor_parallel_size"] == tp and build["seed"] == SEED + rank // tp
        assert build["enable_sleep_mode"] is True and build["load_format"] == "dummy"
        pushes = [d for k, d in ev if k == "push"]
        assert len(pushes) == STEPS + 1  # at start and after every update
        for push, expected in zip(pushes, checkpoints):
            _pushed(push, expected)  # the full weights (under FSDP gathered from both ranks' shards)
        seq = [(k, d if k == "wake" else None) for k, d in ev if k not in ("generate", "build")]
        per_step = [("sleep", None), ("wake", ["weights"]), ("push", None), ("wake", ["kv_cache"])]
        assert seq == [("push", None)] + per_step * STEPS + [("shutdown", None)]
        assert ev[-1][0] == "shutdown" and ev[-1][1]["process_group_alive"]  # before the group was destroyed
        sampled = [d for k, d in ev if k == "generate" and d["temperature"] > 0]  # rollouts (evaluations: greedy)
        assert sampled, "the rank generated nothing"
        prompts_by_rank.append([tuple(p) for d in sampled for p in d["prompts"]])
        evals = [d for k, d in ev if k == "generate" and d["temperature"] == 0]
        assert bool(evals) == (tp == 1)  # the run's evaluation used the rank's own engine (tp 1) or HF (tp 2)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert r["rollout/trajectories"] == Q * G and r["rollout/questions"] == Q  # each rank kept its own share
    assert "eval/em" in rows[-1]
    if tp == 1:  # separate engines: each rank generated its own questions only
        assert not set(prompts_by_rank[0]) & set(prompts_by_rank[1])
        assert len(prompts_by_rank[0]) == len(prompts_by_rank[1]) == STEPS * Q // RANKS * G
    else:  # one engine over both ranks: both submitted the same prompts, in the same calls
        assert prompts_by_rank[0] == prompts_by_rank[1]
