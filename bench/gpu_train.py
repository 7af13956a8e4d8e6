"""Trainer throughput and MFU of a ~0.5B Qwen2 model (random weights) on one device.

    python bench/gpu_train.py [--json] [--device auto] [--batch-size 8] [--seq-len 2048]
                              [--peak-tflops T] [--baseline eager|fp32|none] [--compile] [--tiny]

One training step = forward with labels (Hugging Face's shifted cross-entropy) + backward + AdamW
step, all parameters trainable, parameters and optimizer state in ``--dtype`` (bf16, as
``model.dtype: bfloat16`` trains in Sleuth). Figures:

* ``tokens_per_s``: tokens of the batch per second of step time (best of ``--steps`` after warm-up).
* ``mfu`` = ``6 · N · tokens_per_s / peak`` with N the parameters (tied embedding counted once: its
  matmul as LM head is real work, its lookup free) and ``peak`` the bf16 dense peak of the device
  (989 TFLOP/s on H100 SXM and H200; ``--peak-tflops`` to override). ``mfu_incl_attention`` adds
  the attention score/value matmuls, ``12 · layers · hidden · seq_len`` per token (PaLM, appendix B).
* Baseline measured in the same run (same shapes): ``eager`` attention instead of SDPA, or ``fp32``
  parameters; ``speedup_vs_baseline`` = baseline step time / ours. Out of memory is reported.

Goal (issue #8): MFU >= 0.40. ``--tiny`` runs a toy Qwen2 in seconds on CPU (smoke test only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import (  # noqa: E402
    add_common_args,
    build_model,
    device_spec,
    free_memory,
    num_params,
    peak_memory_gb,
    qwen2_config,
    report,
    resolve_device,
    timed,
)

MFU_GOAL = 0.40


def measure(config, device, dtype, attn, batch, seq_len, steps, warmup, compile_model=False) -> dict:
    """Best step time and peak memory of full-parameter training steps on random tokens."""
    model = build_model(config, device, dtype, attn=attn).train()
    n_params = num_params(model)
    step_model = torch.compile(model) if compile_model else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    ids_BT = torch.randint(0, config.vocab_size, (batch, seq_len), generator=g).to(device)

    def step():
        loss = step_model(input_ids=ids_BT, labels=ids_BT).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    best = timed(step, device, repeats=steps)
    out = {"step_s": best, "params": n_params, "peak_mem_gb": peak_memory_gb(device)}
    del model, step_model, opt
    free_memory(device)
    return out


def run_baseline(kind, config, device, dtype, args) -> dict:
    if kind == "none":
        return {}
    attn, bdtype = ("eager", dtype) if kind == "eager" else ("sdpa", torch.float32)
    try:
        return measure(config, device, bdtype, attn, args.batch_size, args.seq_len, args.steps, args.warmup)
    except torch.cuda.OutOfMemoryError as e:
        free_memory(device)
        return {"error": f"out of memory: {str(e).splitlines()[0]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (the best is kept)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation of the measured model")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (slow first steps)")
    ap.add_argument("--baseline", default="eager", choices=["eager", "fp32", "none"])
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the device's bf16 dense peak")
    args = ap.parse_args(argv)
    if args.tiny:
        args.batch_size, args.seq_len, args.steps, args.warmup = 2, 32, 2, 1
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    config = qwen2_config(tiny=args.tiny)
    spec = device_spec(device, peak_tflops=args.peak_tflops)

    ours = measure(config, device, dtype, args.attn, args.batch_size, args.seq_len, args.steps, args.warmup,
                   compile_model=args.compile)
    base = run_baseline(args.baseline, config, device, dtype, args)
    tokens = args.batch_size * args.seq_len
    tps = tokens / ours["step_s"]
    n = ours["params"]
    attn_flops = 12 * config.num_hidden_layers * config.hidden_size * args.seq_len
    peak = spec["peak_tflops"]
    result = {
        **spec,
        "model": "qwen2-tiny" if args.tiny else "qwen2-0.5b",
        "params": n,
        "dtype": args.dtype,
        "attn": args.attn,
        "compiled": args.compile,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "step_s": ours["step_s"],
        "tokens_per_s": tps,
        "achieved_tflops": 6 * n * tps / 1e12,
        "mfu": 6 * n * tps / (peak * 1e12) if peak else None,
        "mfu_incl_attention": (6 * n + attn_flops) * tps / (peak * 1e12) if peak else None,
        "mfu_goal": MFU_GOAL,
        "peak_mem_gb": ours["peak_mem_gb"],
        "baseline": args.baseline,
    }
    if "step_s" in base:
        result.update(baseline_tokens_per_s=tokens / base["step_s"],
                      speedup_vs_baseline=base["step_s"] / ours["step_s"], baseline_peak_mem_gb=base["peak_mem_gb"])
    elif base:
        result["baseline_error"] = base["error"]
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
