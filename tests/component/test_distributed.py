"""Data-parallel updates with PyTorch distributed (2 gloo processes on CPU) equal the
single-process update on the same batch: DDP and FSDP2 (``train.parallel``). The FSDP run also
checks what the trainer relies on: forwards under ``gathered`` need no matching calls on the other
rank, the gathered checkpoint is a plain ``save_pretrained`` directory, and the optimizer state
resumes (one more update after reloading equals the update of the run that went on)."""

import copy
import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sleuth.config import AlgoConfig
from sleuth.train import distributed as par
from sleuth.train.forward import batched_logprobs
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update
from sleuth.train.layout import RowLayout

pytestmark = pytest.mark.component

ALGO = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0, kl_mode="none", loss_agg="token_mean")
GRAD_CLIP = 0.05  # below the batch's gradient norm: the clip (a global norm under FSDP) is active
WORLD = 2


ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp", "gae")
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
GROUPS = list("aabbccdd")
# train.skip_zero_advantage: rank 0's groups (a, b) all alike, advantage 0: it runs idle passes beside rank 1's
SKIP_SCORES = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0])


def _values(mask):
    """Fixed critic values for GAE (any numbers: the test compares N ranks with one process)."""
    return torch.linspace(-0.5, 0.7, mask.numel()).reshape(mask.shape)


def _advantages(mask, rows=slice(None)):
    """Every estimator's advantages for ``rows`` of the batch (under torchrun: this rank's rows)."""
    return {name: compute_advantages(AlgoConfig(advantage=name, kl_coef=0.0, kl_mode="none"), SCORES[rows],
                                     GROUPS[rows], mask[rows], values_BT=_values(mask)[rows])[0]
            for name in ESTIMATORS}


def _setup(scores=SCORES):
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    g = torch.Generator().manual_seed(0)
    lengths = [9, 6, 12, 7, 10, 5, 8, 11]
    B, T = len(lengths), max(lengths)
    ids = torch.full((B, T), tok.pad_token_id)
    att = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, L in enumerate(lengths):
        ids[b, :L] = torch.randint(5, len(tok), (L,), generator=g)
        att[b, :L] = 1
        mask[b, L - 2 - b % 3 : L] = 1  # 11 vs 12 trained tokens per rank: the global count matters
    model = tiny_model(tok, seed=1).train()
    old = batched_logprobs(model, ids, att, micro_batch_size=8) + 0.2 * mask
    adv, _ = compute_advantages(ALGO, scores, GROUPS, mask)
    return model, UpdateBatch(ids, att, mask, adv, old)


def _rows(batch: UpdateBatch, rank: int, world: int) -> UpdateBatch:
    share = batch.input_ids_BT.shape[0] // world
    rows = slice(rank * share, (rank + 1) * share)
    return UpdateBatch(batch.input_ids_BT[rows], batch.attention_mask_BT[rows], batch.loss_mask_BT[rows],
                       batch.advantages_BT[rows], batch.old_logprobs_BT[rows])


def _update(model, opt, batch, max_tokens=None, skip=False):
    return policy_update(model, opt, batch, ALGO, RowLayout("padded", 2, max_tokens), grad_clip=GRAD_CLIP,
                         skip_zero_advantage=skip)


# a token budget that cuts rank 0's rows (lengths 9, 6, 12, 7) into 3 micro-batches and rank 1's
# (10, 5, 8, 11) into 4: the ranks must still pair their collectives
BUDGET = 14


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _parallel_update(model, batch, rank, world, parallel, max_tokens=None, skip=False):
    """One SGD update on this rank's half of the batch under DDP or FSDP; the full weights (rank 0)
    and every rank's ``algo/loss``."""
    wrapped = par.wrap_for_update(model, parallel=parallel, world_size=world)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # after sharding: FSDP swaps the parameters
    metrics = _update(wrapped, opt, _rows(batch, rank, world), max_tokens, skip)
    state = par.full_model_state(model)  # a collective under FSDP
    losses, entropies = [None] * world, [None] * world
    dist.all_gather_object(losses, metrics["algo/loss"])
    dist.all_gather_object(entropies, metrics["algo/entropy"])
    share = batch.input_ids_BT.shape[0] // world
    advantages = [None] * world
    dist.all_gather_object(advantages, _advantages(batch.loss_mask_BT, slice(rank * share, (rank + 1) * share)))
    return {"state": state, "losses": losses, "entropies": entropies, "sharded": par.is_sharded(wrapped),
            "rows_skipped": metrics["algo/rows_skipped"],
            "advantages": {k: torch.cat([a[k] for a in advantages]) for k in ESTIMATORS}}


def _fsdp_checkpoint(model, batch, rank, world, tmp_dir):
    """AdamW under FSDP: update, checkpoint as the trainer does, forwards under ``gathered``, a
    second update; then a fresh sharded model resumed from the checkpoint makes the second update."""
    from sleuth.train.checkpoint import load_optimizer_state, load_policy_weights, optimizer_state
    from sleuth.train.rollout_worker import WeightSlots
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    mine = _rows(batch, rank, world)
    par.shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _update(model, opt, mine)
    full, optim = par.full_model_state(model), optimizer_state(model, opt, sharded=True)  # collectives
    slots = WeightSlots(model, 1)  # async rollouts' weight copy (rollout.async_worker: inline under torchrun)
    slots.publish(0, model)  # a collective: each tensor gathered whole
    if rank == 0:
        par.plain_model(model, full).save_pretrained(tmp_dir / "ckpt" / "policy")
        torch.save(optim, tmp_dir / "optim.pt")
    dist.barrier()
    with par.gathered(model), torch.no_grad():  # rank 0 runs 3 forwards, rank 1 one: no collective
        for _ in range(3 if rank == 0 else 1):
            logits = model(input_ids=batch.input_ids_BT[:2]).logits
    _update(model, opt, mine)
    went_on = par.full_model_state(model)

    fresh = tiny_model(tiny_tokenizer(), seed=99).train()  # other weights: all come from the checkpoint
    par.shard(fresh)
    load_policy_weights(fresh, tmp_dir / "ckpt")
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    load_optimizer_state(fresh, opt2, torch.load(tmp_dir / "optim.pt", weights_only=False), where=tmp_dir)
    _update(fresh, opt2, mine)
    blank = tiny_model(tiny_tokenizer(), seed=99).train()  # the same without the optimizer state
    par.shard(blank)
    load_policy_weights(blank, tmp_dir / "ckpt")
    _update(blank, torch.optim.AdamW(blank.parameters(), lr=1e-2), mine)
    return {"went_on": went_on, "resumed": par.full_model_state(fresh), "logits": logits, "full": full,
            "published": slots.slots[0],
            "no_optimizer_state": par.full_model_state(blank)}


def _worker(rank: int, world: int, port: int, tmp: str) -> None:
    from pathlib import Path

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = {p: _parallel_update(*_setup(), rank, world, p) for p in ("ddp", "fsdp")}
        out.update({f"{p}_budget": _parallel_update(*_setup(), rank, world, p, BUDGET) for p in ("ddp", "fsdp")})
        out.update({f"{p}_skip": _parallel_update(*_setup(SKIP_SCORES), rank, world, p, skip=True)
                    for p in ("ddp", "fsdp")})
        out["checkpoint"] = _fsdp_checkpoint(*_setup(), rank, world, Path(tmp))  # no sharded model kept
        if rank == 0:
            torch.save(out, Path(tmp) / "rank0.pt")
    finally:
        par.shutdown()  # as `sleuth train` does: without it, 1 run in ~10 aborted at exit (SIGABRT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Two gloo processes (spawned once for the module: starting them is most of the cost)."""
    tmp = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(WORLD, _free_port(), str(tmp)), nprocs=WORLD, join=True)
    return tmp, torch.load(tmp / "rank0.pt", weights_only=False)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp", "ddp_budget", "fsdp_budget", "ddp_skip", "fsdp_skip"])
def test_two_gloo_ranks_match_single_process(ranks, parallel):
    """(``_budget``: a token budget gives the ranks 3 and 4 micro-batches. ``_skip``: rank 0's rows have no
    gradient and run no pass of their own (``train.skip_zero_advantage``); one process runs every row.)"""
    from sleuth.train.forward import length_buckets

    model, batch = _setup(SKIP_SCORES if parallel.endswith("_skip") else SCORES)
    single = copy.deepcopy(model)
    metrics = _update(single, torch.optim.SGD(single.parameters(), lr=0.5), batch)
    assert metrics["algo/grad_norm"] > GRAD_CLIP  # the clip matters for this batch
    if parallel.endswith("_budget"):
        lengths = batch.attention_mask_BT.sum(-1).tolist()
        assert [len(length_buckets(lengths[r * 4:(r + 1) * 4], 2, BUDGET)) for r in (0, 1)] == [3, 4]

    got = ranks[1][parallel]
    assert got["sharded"] == parallel.startswith("fsdp")
    assert got["rows_skipped"] == (4.0 if parallel.endswith("_skip") else 0.0)
    moved = 0
    for name, p in single.state_dict().items():
        torch.testing.assert_close(got["state"][name], p, atol=1e-6, rtol=1e-5)
        moved += not torch.equal(p, model.state_dict()[name])
    assert moved > 0  # the update did something
    # each rank's loss is its share of the global mean: the shares add up (hence summed in metrics)
    assert sum(got["losses"]) == pytest.approx(metrics["algo/loss"], abs=1e-6)
    if parallel.endswith("_skip"):
        return  # its token means cover rank 1's rows only (the rows run)
    # a token-weighted metric is combined token-weighted: every rank reports the one-process figure
    assert got["entropies"] == pytest.approx([metrics["algo/entropy"]] * WORLD, abs=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_on_two_ranks_equals_one_process(ranks, estimator):
    """REINFORCE++ and GAE whiten over the whole batch (all ranks), as verl does; the group
    estimators see whole groups on each rank."""
    mask = _setup()[1].loss_mask_BT
    single = _advantages(mask)[estimator]
    assert single.abs().sum() > 0
    torch.testing.assert_close(ranks[1]["ddp"]["advantages"][estimator], single, atol=1e-6, rtol=1e-5)


def test_fsdp_gathered_forward_checkpoint_and_optimizer_resume(ranks):
    from transformers import AutoModelForCausalLM

    tmp, results = ranks
    got = results["checkpoint"]
    model, batch = _setup()
    single = copy.deepcopy(model)
    opt = torch.optim.AdamW(single.parameters(), lr=1e-2)
    _update(single, opt, batch)
    after_one = {k: v.clone() for k, v in single.state_dict().items()}
    with torch.no_grad():
        logits = single(input_ids=batch.input_ids_BT[:2]).logits
    _update(single, opt, batch)

    policy_dir = tmp / "ckpt" / "policy"
    assert json.loads((policy_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = AutoModelForCausalLM.from_pretrained(policy_dir)  # a plain HF directory
    # AdamW divides by sqrt(v): a 1e-7 gradient difference can move a weight by ~1e-6 (lr 1e-2)
    for name, p in loaded.state_dict().items():
        torch.testing.assert_close(p, after_one[name], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got["logits"], logits, atol=1e-4, rtol=1e-4)  # gathered = full weights
    assert got["published"].keys() == got["full"].keys()
    for name, p in got["full"].items():  # the weights an async worker is sent: whole, as the checkpoint's
        assert torch.equal(got["published"][name], p), name
    for name, p in single.state_dict().items():
        torch.testing.assert_close(got["went_on"][name], p, atol=1e-5, rtol=1e-4)  # FSDP = one process
        torch.testing.assert_close(got["resumed"][name], got["went_on"][name], atol=1e-6, rtol=0)
    # the check can fail: without the optimizer state the second update differs (AdamW's first
    # step is about lr * sign(g))
    assert any(not torch.allclose(got["no_optimizer_state"][k], got["went_on"][k], atol=1e-4) for k in after_one)
