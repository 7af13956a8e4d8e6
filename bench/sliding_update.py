"""Shared prefixes in the update over sliding-window layers (issue #36): one GRPO update of Gemma-3-270M with each
micro-batch's common leading tokens run once (``train.share_prefix``, which now runs over full and sliding-window
layers) against the same update on packed rows (``train.remove_padding``, the Gemma-3 recipe's layout), on the
same batch, in the same run.

    .venv/bin/python bench/sliding_update.py [--json] [--model gemma3-270m] [--groups 1] [--group 8]
                                             [--queries 5] [--repeats 2] [--threads N] [--dtype bfloat16]

Workload: ``--groups`` GRPO groups of ``--group`` rows shaped as the recipe's rows (attempt 12's first step, from
its metrics: a 510-token prompt, 342 response tokens of which 253 injected, 4.7 distinct queries in a group of 8):
the group's prompt (510 tokens), a search turn (40) and its observation (250) that all but ``queries - 1`` of the
group's rows share and each other row has its own, then an answer turn (50) every row its own; random token
ids (what the layouts cost depends on the lengths and on what the rows share, not on the ids). Settings as the
recipe's: temperature 0.7, AdamW at lr 1e-5, float32 master weights under bfloat16 autocast, micro-batches of 8
rows, no KL term (no reference pass), the old policy's logprobs from one untimed no-grad pass, grad clip 1, GRPO
advantages of random rewards. ``--model tiny``: the test suite's tiny Gemma3 (4-token window) on the same spans
scaled down (the smoke run).

Reported: each layout's best wall time over ``--repeats`` interleaved updates (the machine may be shared), the
ratio (``speedup``: packed over shared), the token slots computed per real token under shared prefixes, and each
update's loss and gradient norm (the same gradient: equal to the compute dtype's rounding; ``--dtype float32``
compares them without bf16's, as tests/component/test_prefix_share.py does on a tiny Gemma3). The last stdout line
is the JSON summary with ``--json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from bench.train import rollout_rows  # noqa: E402
from sleuth.config import AlgoConfig  # noqa: E402
from sleuth.models import compute_autocast  # noqa: E402
from sleuth.rollout.hf_cache import sliding_window  # noqa: E402
from sleuth.train.forward import supports_shared_prefix  # noqa: E402
from sleuth.train.layout import RowLayout  # noqa: E402
from sleuth.train.prefix_share import computed_share  # noqa: E402
from sleuth.train.update import UpdateBatch, compute_advantages, policy_update  # noqa: E402

SPANS = [("prompt", 510), ("sampled", 40), ("injected", 250), ("sampled", 50)]  # the recipe's rows (docstring)
TINY_SPANS = [("prompt", 12), ("sampled", 4), ("injected", 6), ("sampled", 3)]
LAYOUTS = ("packed", "shared_prefix")
TEMPERATURE = 0.7  # the recipe's sampling temperature, at which the update scores the tokens


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(name: str):
    if name == "tiny":
        from tests.component.test_gemma3_arch import tiny_gemma3
        from tests.helpers.tiny import tiny_tokenizer

        tok = tiny_tokenizer()
        return tiny_gemma3(tok), tok
    from sleuth.models import load_policy

    return load_policy(name, dtype="float32", device="cpu")


def update(model, batch, algo, layout: str, mbs: int, dtype: str) -> tuple[float, dict]:
    m = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.0)
    t0 = time.perf_counter()
    with compute_autocast(dtype, "cpu"):
        metrics = policy_update(m, opt, batch, algo, RowLayout(layout, mbs), grad_clip=1.0, temperature=TEMPERATURE)
    return time.perf_counter() - t0, metrics


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    window = sliding_window(model)
    if window is None or not supports_shared_prefix(model):
        raise SystemExit(f"{args.model}: no full and sliding-window layers under sdpa/eager attention; "
                         "bench/train.py --smollm2 --group-size 8 measures shared prefixes on full attention")
    rows = args.groups * args.group
    spans = TINY_SPANS if args.model == "tiny" else SPANS
    ids, att, mask = rollout_rows(len(tok), rows, spans, group_size=args.group, queries=args.queries)
    algo = AlgoConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0)
    mbs = args.micro_batch_size
    layout = RowLayout("packed", mbs)
    log(f"{rows} rows of {ids.shape[1]} tokens ({int(mask.sum())} trained); the old policy's pass")
    with torch.no_grad(), compute_autocast(args.dtype, "cpu"):
        old = layout.logprobs(model, ids, att, temperature=TEMPERATURE, needed_BT=mask)
    scores = torch.rand(rows, generator=torch.Generator().manual_seed(1))
    adv, _ = compute_advantages(algo, scores, [f"q{i // args.group}" for i in range(rows)], mask)
    batch = UpdateBatch(ids, att, mask, adv, old)
    best = {k: math.inf for k in LAYOUTS}
    metrics: dict[str, dict] = {}
    for r in range(args.repeats):  # interleaved, so that a busy spell hits both
        for name in LAYOUTS:
            seconds, metrics[name] = update(model, batch, algo, name, mbs, args.dtype)
            best[name] = min(best[name], seconds)
            log(f"  repeat {r + 1}: {name} {seconds:.1f} s")
    shared = RowLayout("shared_prefix", mbs)
    return {
        "model": args.model, "dtype": args.dtype, "window": window, "rows": rows, "tokens_per_row": ids.shape[1],
        "trained_tokens": int(mask.sum()), "queries_per_group": args.queries,
        "computed_token_share": round(computed_share(ids, att, shared.buckets(ids, att)), 3),
        "packed_s": round(best["packed"], 2), "shared_s": round(best["shared_prefix"], 2),
        "speedup": round(best["packed"] / best["shared_prefix"], 3),
        "loss_packed": metrics["packed"]["algo/loss"], "loss_shared": metrics["shared_prefix"]["algo/loss"],
        "grad_norm_packed": metrics["packed"]["algo/grad_norm"],
        "grad_norm_shared": metrics["shared_prefix"]["algo/grad_norm"],
        "threads": torch.get_num_threads(), "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--model", default="gemma3-270m", help="gemma3-270m (default), another model, or tiny")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--queries", type=int, default=5, help="distinct first turns per group")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="the compute dtype over float32 weights (bfloat16: the recipe's; float32: the layouts' "
                         "gradients compared without bf16 rounding)")
    args = ap.parse_args(argv)
    if not 1 <= args.queries <= args.group:
        ap.error(f"--queries must be between 1 and --group ({args.group}), got {args.queries}")
    res = run(args)
    for k, v in res.items():
        print(f"{k:>24}: {v}")
    if args.json:
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
