"""Rollout decode tokens/s against the memory-bandwidth floor, in bf16 or in training's configuration.

    python bench/gpu_decode.py [--json] [--device auto] [--model random-qwen2] [--autocast]
                               [--engines hf,hf_static,generate,vllm] [--batch-sizes 1,32,128]
                               [--prompt-len 128] [--new-tokens 128] [--bandwidth TB/s] [--static-cache]
                               [--churn N] [--compiled-fixed B] [--compile-backend inductor] [--tiny]

``--model``: ``random-qwen2`` (default: Qwen2.5-0.5B's shape, random weights, the figures measured so
far), ``random-smollm2`` (SmolLM2-135M's shape) or a .gguf / model path (``gpu_common.load_bench_model``).
Precision: by default the parameters are cast to ``--dtype`` (bf16) and no autocast runs; with
``--autocast`` the parameters stay float32 and every call runs under
``sleuth.models.compute_autocast(--dtype, device)``, as a training rollout does (float32 master
weights, bf16 matmuls, keys promoted to float32 by the rotary embedding, values bf16).

For each batch size B, every engine of ``--engines`` generates ``--new-tokens`` tokens per row after
a ``--prompt-len``-token random prompt, sampling at temperature 1 with a seed per row (as training
rollouts do) and no eos, so every row decodes the same number of tokens. A decode step's time is that
call's time minus the same call's with one new token (the prefill), over ``new_tokens - 1``:
``{engine}_ms_per_step``, and ``{engine}_tokens_per_s = B / step time``. Engines:

* ``hf``: Sleuth's rollout backend (``HFBackend``); ``hf_static``: ``rollout.backend: hf_static``
  (static KV cache, device sampling), eager; with ``--static-cache`` also ``hf_static_compiled``;
* ``generate``: ``model.generate`` at the same settings (with ``--static-cache`` also
  ``generate_static``, transformers' compiled static-cache decode: minutes of compiling);
* ``vllm``: ``vllm.LLM`` with ``load_format="dummy"`` when vllm imports and the device is CUDA.

The floor: a decode step reads every weight once, so at most ``B · bandwidth / weight_bytes``
tokens/s (``limit_tokens_per_s``; H100 SXM 3.35 TB/s, ``--bandwidth`` to override), and
``{engine}_bandwidth_fraction`` is the measured rate over it. Which bytes ``weight_bytes`` counts:

* without ``--autocast``: the parameters' bytes (bf16: 2 per parameter);
* with ``--autocast``: what an eager step reads when autocast's cache holds the casts (measured:
  ``autocast_weight_casts_per_step`` is 0 when it does): the bf16 copy of every weight autocast casts
  (2 bytes per parameter; matmul weights and the tied output layer) plus the float32 bytes of the
  others (norms). ``weight_bytes_recast`` counts a step that casts every weight again (what a
  compiled step does, dynamo turns the autocast cache off, or eager without the cache): float32
  read + bf16 written + bf16 read; ``limit_recast_tokens_per_s`` and
  ``{engine}_bandwidth_fraction_recast`` are the figures against it.

``limit_incl_kv_tokens_per_s`` also counts the KV cache read per step at the mean context length
(``kv_bytes_per_token`` measured from a real cache: float32 keys under autocast). ``--churn N`` and
``--compiled-fixed B``: the compiled hf_static step (``bench/gpu_decode_compile.py``). Every figure
is measured in its own try block: a failure (out of memory, a compile error) is recorded as
``{engine}_error`` and named in ``failed`` (exit status 1 then, after the full summary); the rest goes
on. After each phase a partial summary (``"partial": true``) goes to stderr, so a run killed by a
timeout still leaves its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_common import (  # noqa: E402
    add_common_args, add_model_arg, device_spec, free_memory, load_bench_model, partial, report, resolve_device,
    timed)
from gpu_decode_compile import churn_probe, compiled_fixed, compiled_static, error_text  # noqa: E402
from gpu_decode_traffic import step_bytes  # noqa: E402

from sleuth.models import compute_autocast  # noqa: E402
from sleuth.rollout.backends import SamplingParams  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.hf_static import StaticHFBackend  # noqa: E402

BANDWIDTH_GOAL = 0.5
ENGINES = ("hf", "hf_static", "generate", "vllm")


def decode_step_s(run, device, new_tokens: int, repeats: int, tries: int = 4) -> float:
    """Seconds per decode step, ``(t_n - t_1) / (n - 1)`` where ``run(n)`` generates n tokens per row
    (best of ``repeats`` calls each). Measured again, up to ``tries`` times, while noise makes
    ``t_n <= t_1`` (tiny shapes on a busy CPU); then it fails rather than report a meaningless rate."""
    run(1)  # warm-up: kernels, allocator, and (static cache) one compilation per shape
    run(new_tokens)
    for _ in range(tries):
        t_n = timed(lambda: run(new_tokens), device, repeats)
        t_1 = timed(lambda: run(1), device, repeats)
        if t_n > t_1:
            return (t_n - t_1) / (new_tokens - 1)
    raise RuntimeError(f"decode time not measurable: {new_tokens} tokens took {t_n:.4g} s, 1 token {t_1:.4g} s")


def backend_runner(backend, prompts):
    seeds = list(range(len(prompts)))

    def run(n):
        out = backend.generate(prompts, SamplingParams(max_new_tokens=n, temperature=1.0), seeds=seeds)
        assert all(len(r.token_ids) == n for r in out)

    return run


def generate_runner(model, prompts, static: bool = False):
    """``model.generate`` at the same settings; ``static``: a static KV cache, which transformers
    decodes with a compiled forward (CUDA graphs on GPU)."""
    ids_BT = torch.tensor(prompts, device=next(model.parameters()).device)
    att_BT = torch.ones_like(ids_BT)
    extra = {"cache_implementation": "static"} if static else {}

    def run(n):
        model.generate(input_ids=ids_BT, attention_mask=att_BT, do_sample=True, temperature=1.0, top_k=0,
                       max_new_tokens=n, min_new_tokens=n, **extra)

    return run


def row_runners(args) -> dict:
    """``{engine: make(model, prompts) -> run}`` for the per-batch rows (vLLM runs apart)."""
    tok = SimpleNamespace(pad_token_id=0)
    makers = {
        "hf": lambda m, p: backend_runner(HFBackend(m, tok, eos_token_ids=[]), p),
        "hf_static": lambda m, p: backend_runner(StaticHFBackend(m, tok, eos_token_ids=[]), p),
        "generate": lambda m, p: generate_runner(m, p),
    }
    if args.static_cache:
        makers["hf_static_compiled"] = lambda m, p: backend_runner(compiled_static(m, args.compile_backend), p)
        makers["generate_static"] = lambda m, p: generate_runner(m, p, static=True)
    base = {"hf_static_compiled": "hf_static", "generate_static": "generate"}
    return {e: f for e, f in makers.items() if base.get(e, e) in args.engines}


def add_limits(row: dict, bw_tbs: float | None, traffic: dict, mean_ctx: float) -> None:
    """The bandwidth floors of a row and every engine's share of them (see the module docstring)."""
    if not bw_tbs:
        return
    b, bw = row["batch"], bw_tbs * 1e12
    row["limit_tokens_per_s"] = b * bw / traffic["weight_bytes"]
    if traffic.get("kv_bytes_per_token"):
        row["limit_incl_kv_tokens_per_s"] = b * bw / (traffic["weight_bytes"] + b * mean_ctx
                                                      * traffic["kv_bytes_per_token"])
    if traffic.get("weight_bytes_recast"):
        row["limit_recast_tokens_per_s"] = b * bw / traffic["weight_bytes_recast"]
    for key in [k for k in row if k.endswith("_tokens_per_s") and not k.startswith("limit")]:
        engine = key[: -len("_tokens_per_s")]
        row[f"{engine}_bandwidth_fraction"] = row[key] / row["limit_tokens_per_s"]
        if "limit_recast_tokens_per_s" in row:
            row[f"{engine}_bandwidth_fraction_recast"] = row[key] / row["limit_recast_tokens_per_s"]


def measure_rows(model, prompts_by_b, args, ctx, failed: list, progress=None) -> list[dict]:
    """One row per batch size: each engine's rate and step time, in its own try block; ``progress(rows)``
    after each engine's figure (a timeout keeps what was measured)."""
    device, runners = next(model.parameters()).device, row_runners(args)
    rows = []
    for b, prompts in prompts_by_b.items() if runners else ():
        row = {"batch": b}
        for engine, make in runners.items():
            try:
                with ctx(), torch.no_grad():
                    step_s = decode_step_s(make(model, prompts), device, args.new_tokens, args.repeats)
                row[f"{engine}_tokens_per_s"], row[f"{engine}_ms_per_step"] = b / step_s, 1e3 * step_s
            except Exception as e:  # out of memory, a compile error: recorded, the others go on
                row[f"{engine}_error"] = error_text(e)
                failed.append(f"{engine}@{b}")
                free_memory(device)
            if progress is not None:
                progress(rows + [row])
        for a, ref in (("hf_static", "hf"), ("hf", "generate")):
            if f"{a}_tokens_per_s" in row and f"{ref}_tokens_per_s" in row:
                row[f"{a}_vs_{ref}"] = row[f"{a}_tokens_per_s"] / row[f"{ref}_tokens_per_s"]
        rows.append(row)
    return rows


def vllm_rates(config, arch: str, dtype: str, prompts_by_b, args) -> dict:
    """Decode tokens/s per batch size with an in-process vLLM engine, or why it could not run."""
    try:
        import vllm
    except Exception as e:  # ImportError, or a CUDA-less build failing at import
        return {"error": f"vllm not importable: {e}"}
    with tempfile.TemporaryDirectory() as tmp:
        config.architectures = [arch]  # vLLM picks its model class from this field
        config.save_pretrained(tmp)
        llm = vllm.LLM(model=tmp, load_format="dummy", skip_tokenizer_init=True, dtype=dtype, seed=0,
                       max_model_len=args.prompt_len + args.new_tokens + 8,
                       gpu_memory_utilization=args.vllm_memory)
        out = {}
        for b, prompts in prompts_by_b.items():
            def run(n, prompts=prompts):
                params = [vllm.SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True, detokenize=False,
                                              seed=i) for i in range(len(prompts))]
                llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

            out[b] = b / decode_step_s(run, torch.device("cuda"), args.new_tokens, args.repeats)
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    add_model_arg(ap, default="random-qwen2")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                    help="parameter dtype, or with --autocast the autocast (compute) dtype")
    ap.add_argument("--autocast", action="store_true",
                    help="float32 parameters decoded under compute_autocast(--dtype): training's rollout")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)} (or none)")
    ap.add_argument("--batch-sizes", default=None, help="comma list (default 1,32,128; --tiny 1,4)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 128 (--tiny 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128 (--tiny 6)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per figure, best kept (2; --tiny 1)")
    ap.add_argument("--bandwidth", type=float, default=None, help="memory bandwidth in TB/s (overrides the table)")
    ap.add_argument("--no-generate", action="store_true", help="same as leaving generate out of --engines")
    ap.add_argument("--no-vllm", action="store_true", help="same as leaving vllm out of --engines")
    ap.add_argument("--static-cache", action="store_true",
                    help="also hf_static_compiled and generate_static (compiled decodes; slow first calls)")
    ap.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM gpu_memory_utilization")
    ap.add_argument("--churn", type=int, default=0, metavar="N",
                    help="recompile probe: N compiled hf_static calls, shapes changing as in training")
    ap.add_argument("--compiled-fixed", type=int, default=0, metavar="B",
                    help="compiled hf_static at batch B: compile seconds, tokens/s after warm-up")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend of the compiled hf_static (inductor: hf_static's own, CUDA graphs "
                         "on a GPU; eager / aot_eager: cheap CPU checks of the recompiles)")
    args = ap.parse_args(argv)
    for name, full, tiny in (("batch_sizes", "1,32,128", "1,4"), ("prompt_len", 128, 8), ("new_tokens", 128, 6),
                             ("repeats", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    engines = set() if args.engines.strip() in ("", "none") else {e.strip() for e in args.engines.split(",")}
    if engines - set(ENGINES):
        ap.error(f"--engines: unknown {sorted(engines - set(ENGINES))}; choose from {', '.join(ENGINES)}")
    args.engines = engines - ({"generate"} if args.no_generate else set()) - ({"vllm"} if args.no_vllm else set())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    device = resolve_device(args.device)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    model, _, label = load_bench_model(args.model, device, tiny=args.tiny)
    model.eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    if args.autocast:
        def ctx():
            return compute_autocast(args.dtype, device)
    else:
        model.to(getattr(torch, args.dtype))
        ctx = contextlib.nullcontext
    spec = device_spec(device, bandwidth_tbs=args.bandwidth)
    failed: list[str] = []
    result = {**spec, "model": label, "dtype": args.dtype, "autocast": args.autocast,
              "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
              "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "bandwidth_goal": BANDWIDTH_GOAL,
              "engines": sorted(args.engines), "failed": failed}

    def emit():
        partial(result, t_start)

    mean_ctx = args.prompt_len + args.new_tokens / 2
    traffic = step_bytes(model, ctx, args.dtype if args.autocast else None, context=max(int(mean_ctx), 1))
    result.update(traffic)
    g = torch.Generator().manual_seed(0)
    prompts_by_b = {b: torch.randint(0, model.config.vocab_size, (b, args.prompt_len), generator=g).tolist()
                    for b in batches}
    rows = measure_rows(model, prompts_by_b, args, ctx, failed,
                        progress=lambda so_far: (result.update(rows=so_far), emit()))
    for row in rows:
        add_limits(row, spec["bandwidth_tbs"], traffic, mean_ctx)
    result["rows"] = rows
    emit()
    if args.compiled_fixed:
        try:
            result.update(compiled_fixed(model, args.compiled_fixed, args.prompt_len, args.new_tokens,
                                         args.repeats, args.compile_backend, ctx))
            if spec["bandwidth_tbs"]:  # a compiled step under autocast casts every weight again
                bw_b = spec["bandwidth_tbs"] * 1e12 * args.compiled_fixed  # limit = B · bandwidth / bytes
                for suffix, key in (("", "weight_bytes"), ("_recast", "weight_bytes_recast")):
                    if traffic.get(key):
                        result[f"compiled_bandwidth_fraction{suffix}"] = (
                            result["compiled_tokens_per_s"] * traffic[key] / bw_b)
        except Exception as e:  # a compile failure is a result
            result["compiled_error"] = error_text(e)
            failed.append("compiled_fixed")
            free_memory(device)
        emit()
    if args.churn:
        try:
            result.update(churn_probe(model, args.churn, batches[0], args.prompt_len, args.new_tokens,
                                      args.compile_backend, ctx, progress=lambda s: (result.update(s), emit())))
            if result["churn_failed_calls"]:
                failed.append("churn")
        except Exception as e:
            result["churn_error"] = error_text(e)
            failed.append("churn")
    config, arch = model.config, type(model).__name__
    del model
    free_memory(device)

    if "vllm" not in args.engines:
        result["vllm"] = "skipped (not in --engines)"
    elif device.type != "cuda":
        result["vllm"] = "skipped: needs CUDA"
    else:
        try:
            rates = vllm_rates(config, arch, args.dtype, prompts_by_b, args)
        except Exception as e:  # an engine that fails to start or runs out of memory
            rates = {"error": f"failed: {error_text(e)}"}
            failed.append("vllm")
        result["vllm"] = rates.pop("error", None) or "measured"
        for row in rows:
            if row["batch"] in rates:
                row["vllm_tokens_per_s"] = rates[row["batch"]]
                if "hf_tokens_per_s" in row:
                    row["vllm_vs_hf"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
                add_limits(row, spec["bandwidth_tbs"], traffic, mean_ctx)
    report(result, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
