"""The memory plan of the shipped Search-R1 configs for Qwen2.5-3B and 7B on 8 x 80 GB GPUs, DDP and FSDP,
at the configs' row budget and at a 16,384-token budget (docs/training_at_scale.md prints this table).

    python bench/memory_plan_table.py

The shapes are those of the models' published config.json (no download needed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sleuth.config_file import load_config  # noqa: E402
from sleuth.train.memory_plan import ModelShape, make_plan  # noqa: E402
SHAPES = {  # from the models' published config.json
    "Qwen2.5-3B": ModelShape(params=3_085_938_688, layers=36, hidden=2048, intermediate=11008, kv_dim=2 * 128,
                             heads=16, head_dim=128, vocab=151936, chunked_head=True),
    "Qwen2.5-7B": ModelShape(params=7_615_616_512, layers=28, hidden=3584, intermediate=18944, kv_dim=4 * 128,
                             heads=28, head_dim=128, vocab=152064, chunked_head=True),
}
gib = 2**30
print("| model | config | parallel | grad ckpt | tokens / micro-batch | master | AdamW | grads | reference | critic | activations | KV | peak per GPU | fits 80 GB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for model, shape in SHAPES.items():
    for name in ("grpo", "ppo"):
        for parallel in ("ddp", "fsdp"):
            for tokens in (None, 16384):
                cfg = load_config(Path(__file__).resolve().parents[1] / f"configs/search_r1_{name}.yaml", [f"train.parallel={parallel}"] +
                                  ([f"train.max_tokens_per_micro_batch={tokens}"] if tokens else []))
                p = make_plan(cfg, shape, world_size=8, capacity=80 * 10**9, device="H100 80GB")
                it = p.items
                t = tokens or cfg.train.micro_batch_size * cfg.rollout.max_context_tokens
                print(f"| {model} | search_r1_{name} | {parallel} | yes | {t} | {it['master weights']/gib:.1f} | {it['AdamW state']/gib:.1f} | "
                      f"{it['gradients']/gib:.1f} | {it['reference']/gib:.1f} | {it['critic']/gib:.1f} | {it['activations']/gib:.1f} | "
                      f"{it['KV cache']/gib:.1f} | {p.peak/gib:.1f} GiB | {'yes' if p.fits() else 'no'} |")
