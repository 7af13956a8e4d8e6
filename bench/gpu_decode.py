"""Rollout decode tokens/s of a ~0.5B Qwen2 (random weights) against the memory-bandwidth limit.

    python bench/gpu_decode.py [--json] [--device auto] [--batch-sizes 1,32,128] [--prompt-len 128]
                               [--new-tokens 128] [--bandwidth TB/s] [--no-vllm] [--tiny]

For each batch size B, every engine generates ``--new-tokens`` tokens per row after a
``--prompt-len``-token random prompt, sampling at temperature 1 with a seed per row (as training
rollouts do) and no eos, so every row decodes the same number of tokens. Decode time is the time
of that call minus the time of the same call with one new token (the prefill), so
``decode_tokens_per_s = B · (new_tokens - 1) / (t_n - t_1)``. Engines:

* ``hf``: Sleuth's rollout backend (``sleuth.rollout.hf_backend.HFBackend``: our decode loop,
  KV cache, per-row generators);
* ``hf_static``: ``rollout.backend: hf_static`` (static KV cache, device sampling, a host sync
  every 8 tokens on CUDA); with ``--static-cache`` also ``hf_static_compiled`` (its decode step
  through ``torch.compile``, CUDA graphs on a GPU);
* ``generate``: ``model.generate`` at the same settings (the baseline measured in the same run);
  with ``--static-cache`` also ``generate_static``: a static KV cache, decoded by a compiled forward;
* ``vllm``: ``vllm.LLM`` with ``load_format="dummy"`` when vllm imports (reported otherwise).

Limit: one decode step reads every weight once, so at most ``B · bandwidth / weight_bytes``
tokens/s (H100 SXM 3.35 TB/s, H200 4.8 TB/s; ``--bandwidth`` to override);
``bandwidth_fraction`` is the measured rate over that limit (goal, issue #8: >= 0.5).
``limit_incl_kv`` also counts the KV cache read per step at the mean context length.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_common import (  # noqa: E402
    add_common_args,
    build_model,
    device_spec,
    free_memory,
    qwen2_config,
    report,
    resolve_device,
    timed,
    weight_bytes,
)

from sleuth.rollout.backends import SamplingParams  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.hf_static import StaticHFBackend  # noqa: E402

BANDWIDTH_GOAL = 0.5


def decode_rate(run, device, batch: int, new_tokens: int, repeats: int) -> float:
    """``B · (n - 1) / (t_n - t_1)`` where ``run(n)`` generates n tokens per row."""
    run(1)  # warm-up: kernels, allocator, and (static cache) one compilation per shape
    run(new_tokens)
    t_n = timed(lambda: run(new_tokens), device, repeats)
    t_1 = timed(lambda: run(1), device, repeats)
    return batch * (new_tokens - 1) / max(t_n - t_1, 1e-9)


def hf_runner(model, prompts, static: bool = False, compile: bool = False):
    """Our HF backend (``static``: ``hf_static``, its decode step compiled with ``compile``, CUDA graphs on a GPU)."""
    tok = SimpleNamespace(pad_token_id=0)
    if static:
        backend = StaticHFBackend(model, tok, eos_token_ids=[], compile=compile)  # CUDA graphs on a GPU
    else:
        backend = HFBackend(model, tok, eos_token_ids=[])
    seeds = list(range(len(prompts)))

    def run(n):
        out = backend.generate(prompts, SamplingParams(max_new_tokens=n, temperature=1.0), seeds=seeds)
        assert all(len(r.token_ids) == n for r in out)

    return run


def generate_runner(model, prompts, device, static: bool = False):
    """``model.generate`` at the same settings; ``static``: a static KV cache, which transformers
    decodes with a compiled forward (CUDA graphs on GPU)."""
    ids_BT = torch.tensor(prompts, device=device)
    att_BT = torch.ones_like(ids_BT)
    extra = {"cache_implementation": "static"} if static else {}

    def run(n):
        model.generate(input_ids=ids_BT, attention_mask=att_BT, do_sample=True, temperature=1.0, top_k=0,
                       max_new_tokens=n, min_new_tokens=n, **extra)

    return run


def measure_rows(model, prompts_by_b, spec, args) -> list[dict]:
    """One row of rates per batch size: our HF backend, the generate baselines, the limits."""
    device = next(model.parameters()).device
    wbytes, cfg = weight_bytes(model), model.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    kv_per_token *= model.dtype.itemsize
    mean_ctx = args.prompt_len + args.new_tokens / 2
    rows = []
    for b, prompts in prompts_by_b.items():
        row = {"batch": b}
        rate = functools.partial(decode_rate, device=device, batch=b, new_tokens=args.new_tokens,
                                 repeats=args.repeats)
        with torch.no_grad():
            row["hf_tokens_per_s"] = rate(hf_runner(model, prompts))
            row["hf_static_tokens_per_s"] = rate(hf_runner(model, prompts, static=True))
            row["hf_static_vs_hf"] = row["hf_static_tokens_per_s"] / row["hf_tokens_per_s"]
            if not args.no_generate:
                row["generate_tokens_per_s"] = rate(generate_runner(model, prompts, device))
                row["hf_vs_generate"] = row["hf_tokens_per_s"] / row["generate_tokens_per_s"]
            if args.static_cache:
                try:
                    row["hf_static_compiled_tokens_per_s"] = rate(hf_runner(model, prompts, static=True, compile=True))
                except Exception as e:  # compilation problems are reported, not fatal
                    row["hf_static_compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                try:
                    row["generate_static_tokens_per_s"] = rate(generate_runner(model, prompts, device, static=True))
                except Exception as e:  # compilation problems are reported, not fatal
                    row["generate_static_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        bw = spec["bandwidth_tbs"]
        if bw:
            row["limit_tokens_per_s"] = b * bw * 1e12 / wbytes
            row["limit_incl_kv_tokens_per_s"] = b * bw * 1e12 / (wbytes + b * mean_ctx * kv_per_token)
            for engine in ("hf", "hf_static", "hf_static_compiled", "generate_static"):
                if f"{engine}_tokens_per_s" in row:
                    row[f"{engine}_bandwidth_fraction"] = row[f"{engine}_tokens_per_s"] / row["limit_tokens_per_s"]
        rows.append(row)
    return rows


def vllm_rates(config, dtype: str, prompts_by_b, args) -> dict:
    """Decode tokens/s per batch size with an in-process vLLM engine, or why it could not run."""
    try:
        import vllm
    except Exception as e:  # ImportError, or a CUDA-less build failing at import
        return {"error": f"vllm not importable: {e}"}
    with tempfile.TemporaryDirectory() as tmp:
        config.architectures = ["Qwen2ForCausalLM"]  # vLLM picks its model class from this field
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

            out[b] = decode_rate(run, torch.device("cuda"), b, args.new_tokens, args.repeats)
    return out


def merge_vllm(rows: list[dict], rates: dict) -> None:
    for row in rows:
        if row["batch"] in rates:
            row["vllm_tokens_per_s"] = rates[row["batch"]]
            row["vllm_vs_hf"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
            if "limit_tokens_per_s" in row:
                row["vllm_bandwidth_fraction"] = row["vllm_tokens_per_s"] / row["limit_tokens_per_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch-sizes", default="1,32,128")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per measurement (the best is kept)")
    ap.add_argument("--bandwidth", type=float, default=None, help="memory bandwidth in TB/s (overrides the table)")
    ap.add_argument("--no-generate", action="store_true", help="skip the model.generate baseline")
    ap.add_argument("--static-cache", action="store_true",
                    help="also time model.generate with a static cache (compiled decode; slow first calls)")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM even when it imports")
    ap.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM gpu_memory_utilization")
    args = ap.parse_args(argv)
    if args.tiny:
        args.batch_sizes, args.prompt_len, args.new_tokens, args.repeats = "1,4", 8, 6, 1
    device = resolve_device(args.device)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    config = qwen2_config(tiny=args.tiny)
    model = build_model(config, device, getattr(torch, args.dtype)).eval()
    spec = device_spec(device, bandwidth_tbs=args.bandwidth)
    wbytes = weight_bytes(model)
    g = torch.Generator().manual_seed(0)
    prompts_by_b = {b: torch.randint(0, config.vocab_size, (b, args.prompt_len), generator=g).tolist()
                    for b in batches}
    rows = measure_rows(model, prompts_by_b, spec, args)
    del model
    free_memory(device)

    vllm_error = "skipped (--no-vllm)" if args.no_vllm else ("skipped: needs CUDA" if device.type != "cuda" else None)
    if vllm_error is None:
        rates = vllm_rates(config, args.dtype, prompts_by_b, args)
        vllm_error = rates.pop("error", None)
        merge_vllm(rows, rates)
    result = {
        **spec,
        "model": "qwen2-tiny" if args.tiny else "qwen2-0.5b",
        "dtype": args.dtype,
        "weight_bytes": wbytes,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "bandwidth_goal": BANDWIDTH_GOAL,
        "rows": rows,
        "vllm": vllm_error or "measured",
    }
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
