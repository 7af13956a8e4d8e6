"""``torchrun --standalone --nproc_per_node 2 -m sleuth train`` end to end on CPU (gloo), DDP and
FSDP: the run exits 0, rank 0 alone writes metrics for every step and a checkpoint transformers
loads, metrics are combined over ranks (trajectories summed) and the rollouts are sharded (the
ranks' questions are disjoint, so the step's distinct questions are both ranks' together).

Real NQ questions and Wikipedia passages from ``../shared/data`` when it is beside the checkout
(a few hand-written rows otherwise); a random tiny model saved to a temp dir."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.e2e

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
Q, G, STEPS, RANKS, EVAL_LIMIT = 4, 2, 2, 2, 3
REPO = Path(__file__).resolve().parents[2]


def _write_data(root: Path) -> None:
    """8 QA rows and a small corpus (the real dev data's first rows and passages when present)."""
    if (SHARED / "dev" / "nq.jsonl").exists():
        qa = (SHARED / "dev" / "nq.jsonl").read_text().splitlines()[:8]
        with open(SHARED / "corpus" / "wiki_dev.jsonl") as f:
            corpus = [next(f) for _ in range(200)]
    else:
        qa = [json.dumps({"id": f"toy_{i}", "question": f"what is the capital of country {i}",
                          "golden_answers": [f"city {i}"], "data_source": "toy"}) for i in range(8)]
        corpus = [json.dumps({"id": str(i), "contents": f'"Country {i}"\nIts capital is city {i}.'}) + "\n"
                  for i in range(8)]
    (root / "train.jsonl").write_text("\n".join(qa) + "\n")
    (root / "corpus.jsonl").write_text("".join(corpus))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("torchrun")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=32)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    _write_data(root)
    config = f"""
model: {{name_or_path: {root / 'model'}, device: cpu}}
data: {{train_files: [{root / 'train.jsonl'}], eval_files: [{root / 'train.jsonl'}], shuffle: false}}
retrieval: {{kind: bm25, corpus: {root / 'corpus.jsonl'}, topk: 2}}
rollout: {{format: search_r1, use_chat_template: false, group_size: {G}, max_turns: 1,
          max_tokens_per_turn: 8, max_obs_tokens: 64, max_context_tokens: 1024}}
algo: {{advantage: grpo, kl_coef: 0.01, kl_mode: loss, entropy_coef: 0.01}}
train: {{total_steps: {STEPS}, questions_per_step: {Q}, micro_batch_size: 2, lr: 0.01, eval_limit: {EVAL_LIMIT},
        save_every: 1, keep_checkpoints: 1}}
"""
    (root / "tiny_test.yaml").write_text(config)
    return root


def _launch(root: Path, out: Path, parallel: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
           "-m", "sleuth", "train", "--config", str(root / "tiny_test.yaml"), "--out", str(out), "--json",
           "--set", f"train.parallel={parallel}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(setup):
    """Both runs at once (most of each run's time is its processes importing torch)."""
    procs = {p: _launch(setup, setup / f"run_{p}", p) for p in ("ddp", "fsdp")}
    done = {}
    for parallel, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        done[parallel] = (proc.returncode, stdout, stderr)
    return done


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_two_ranks_train(setup, runs, parallel):
    from transformers import AutoModelForCausalLM

    out = setup / f"run_{parallel}"
    returncode, stdout, stderr = runs[parallel]
    assert returncode == 0, stdout[-3000:] + stderr[-6000:]
    summary = json.loads(stdout.strip().splitlines()[-1])  # rank 0's --json line
    assert summary["step"] == STEPS

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # one writer: no duplicated steps
    for r in rows:
        assert r["rollout/trajectories"] == Q * G  # both ranks' rollouts, summed
        assert r["rollout/questions"] == Q  # disjoint shards: Q / RANKS each
        assert r["algo/optimizer_steps"] == 1
        assert torch.isfinite(torch.tensor(r["algo/loss"]))
    # every rank evaluated its share (2 + 1 of the 3 eval questions); rank 0 logged the whole set
    assert "eval/em" in rows[-1] and rows[-1]["eval/questions"] == EVAL_LIMIT

    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == [f"step_{STEPS:06d}"] and not list((out / "checkpoints").glob("*.tmp-*"))
    policy_dir = out / "checkpoints" / ckpts[0] / "policy"
    assert json.loads((policy_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    trained = AutoModelForCausalLM.from_pretrained(policy_dir)
    start = AutoModelForCausalLM.from_pretrained(setup / "model")
    changed = [n for n, p in trained.state_dict().items() if not torch.equal(p, start.state_dict()[n])]
    assert changed  # the ranks trained and rank 0 saved the result
    state = torch.load(out / "checkpoints" / ckpts[0] / "trainer_state.pt", weights_only=False)
    assert state["step"] == STEPS and state["optimizer"]["state"]  # optimizer state saved (full)
