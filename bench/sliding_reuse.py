"""Prefix reuse over sliding-window layers (issue #36): Gemma-3-270M's agent rounds through the HF backend's
slot buffers with a mask per layer kind (``HFBackend``'s default for such models) against whole prefills through
transformers' own sliding cache (``reuse_prefix=False``, what ran before), in the same run.

    .venv/bin/python bench/sliding_reuse.py [--json] [--model gemma3-270m] [--questions 4] [--group 8]
                                            [--new-tokens 64] [--repeats 2] [--threads N]

Workload: a GRPO step's two rounds, the second forced so that every row has one. ``--questions`` NQ dev
questions as Search-R1 plain-text prompts (the base model has no chat template), ``--group`` rows each, sampled
at temperature 1 with a seed per row; round 1 generates up to ``--new-tokens`` (stop strings as in a rollout);
each row then gets its question's top-3 BM25 passages over ``wiki_dev.jsonl`` as the format's
``<information>`` block and round 2 generates again. Inside one session the reuse engine prefills a group's
shared prompt once in round 1 and only the observation in round 2; the whole engine prefills every row's whole
context in both rounds. ``--model tiny`` runs a tiny Gemma3 built in-process with a 4-token window (the test
suite's smoke run).

Reported: each engine's best wall time over ``--repeats`` interleaved runs (the machine may be shared), the
ratio (``speedup``: whole over reuse), the ratio of process CPU times, how many sampled rows got the same tokens
from both (the same per-row generators: equal up to float rounding, which at temperature 1 over Gemma's 262k
tokens can tip a draw), and how many of ``--greedy-rows`` questions decoded greedily over the same two rounds
are equal token for token (they must all be). The last stdout line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from sleuth.data.qa import load_questions
from sleuth.retrieval.factory import bm25_for_corpus
from sleuth.rollout.backends import SamplingParams
from sleuth.rollout.formats import get_format
from sleuth.rollout.hf_backend import HFBackend
from sleuth.rollout.hf_cache import sliding_window

DATA = ROOT.parent / "shared" / "data"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(name: str):
    if name == "tiny":  # the test suite's tiny Gemma3 (a window shorter than the contexts)
        from tests.component.test_gemma3_arch import tiny_gemma3
        from tests.helpers.tiny import tiny_tokenizer

        tok = tiny_tokenizer()
        return tiny_gemma3(tok), tok
    from sleuth.models import load_policy

    model, tok = load_policy(name, device="cpu")
    return model.eval(), tok


def workload(tok, n: int, group: int, data: Path):
    """Round-1 prompts (``group`` copies of each question's) and each row's observation text."""
    fmt = get_format("search_r1")
    qs = load_questions(data / "dev" / "nq.jsonl", limit=n)
    passages = bm25_for_corpus(data / "corpus" / "wiki_dev.jsonl").search([q.text for q in qs], 3)
    prompts = [tok(fmt.user_content(q))["input_ids"] for q in qs for _ in range(group)]
    obs = [fmt.render_observation([(q.text, ps)]) for q, ps in zip(qs, passages) for _ in range(group)]
    return prompts, [tok(o, add_special_tokens=False)["input_ids"] for o in obs], tuple(fmt.stop_sequences)


def two_rounds(engine, prompts, obs, params, seeds):
    with engine.session():
        first = engine.generate(prompts, params, seeds=seeds)
        again = [p + r.token_ids + o for p, r, o in zip(prompts, first, obs)]
        second = engine.generate(again, params, seeds=[s + 1 for s in seeds])
    return [a.token_ids + b.token_ids for a, b in zip(first, second)], sum(map(len, again))


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    window = sliding_window(model)
    if window is None:
        raise SystemExit(f"{args.model}: no sliding-window layers under sdpa/eager attention; nothing to compare")
    prompts, obs, stop = workload(tok, args.questions, args.group, Path(args.data))
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop=stop)
    seeds = list(range(len(prompts)))
    engines = {"reuse": HFBackend(model, tok), "whole": HFBackend(model, tok, reuse_prefix=False)}
    assert engines["reuse"].reuse_prefix and not engines["whole"].reuse_prefix
    for e in engines.values():  # warm-up
        e.generate(prompts[:2], SamplingParams(max_new_tokens=2, greedy=True))
    best = {k: (math.inf, math.inf) for k in engines}
    out, context = {}, 0
    for r in range(args.repeats):
        for name, e in engines.items():
            wall, cpu = time.perf_counter(), time.process_time()
            out[name], context = two_rounds(e, prompts, obs, params, seeds)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
            log(f"  repeat {r + 1}: {name} {wall:.1f} s")
    same = sum(a == b for a, b in zip(out["reuse"], out["whole"]))
    # greedy, one row per question: equal token for token (sampling at T=1 over a large vocabulary may part at a
    # float-rounding difference; greedy shows the masks are right)
    g_prompts, g_obs, _ = workload(tok, args.greedy_rows, 1, Path(args.data))
    greedy = SamplingParams(max_new_tokens=args.new_tokens, greedy=True, stop=stop)
    g = {name: two_rounds(e, g_prompts, g_obs, greedy, list(range(len(g_prompts))))[0] for name, e in engines.items()}
    same_greedy = sum(a == b for a, b in zip(g["reuse"], g["whole"]))
    return {
        "model": args.model, "window": window, "rows": len(prompts), "new_tokens": args.new_tokens,
        "round2_context_tokens_mean": round(context / len(prompts), 1),
        "reuse_s": round(best["reuse"][0], 2), "whole_s": round(best["whole"][0], 2),
        "speedup": round(best["whole"][0] / best["reuse"][0], 3),
        "speedup_cpu": round(best["whole"][1] / best["reuse"][1], 3),
        "same_tokens_rows": f"{same}/{len(prompts)}", "same_greedy_rows": f"{same_greedy}/{len(g_prompts)}",
        "threads": torch.get_num_threads(), "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--model", default="gemma3-270m", help="gemma3-270m (default), another model, or tiny")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--greedy-rows", type=int, default=8, help="questions decoded greedily by both engines, compared")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args(argv)
    res = run(args)
    for k, v in res.items():
        print(f"{k:>28}: {v}")
    if args.json:
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
