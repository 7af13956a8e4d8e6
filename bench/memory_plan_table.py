"""The memory plan of the shipped Search-R1 configs for Qwen2.5-3B and 7B on 8 x 80 GB GPUs: DDP and
FSDP, with and without offload (train.offload_optimizer + train.offload_reference), at the configs'
worst case (8 rows x 4,096 tokens per micro-batch). docs/training_at_scale.md prints this table.

    python bench/memory_plan_table.py

The shapes are those of the models' published config.json (no download needed)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sleuth.config_file import load_config  # noqa: E402
from sleuth.train.memory_plan import ModelShape, make_plan  # noqa: E402

SHAPES = {  # from the models' published config.json
    "Qwen2.5-3B": ModelShape(params=3_085_938_688, layers=36, hidden=2048, intermediate=11008, kv_dim=2 * 128,
                             heads=16, head_dim=128, vocab=151936, chunked_head=True),
    "Qwen2.5-7B": ModelShape(params=7_615_616_512, layers=28, hidden=3584, intermediate=18944, kv_dim=4 * 128,
                             heads=28, head_dim=128, vocab=152064, chunked_head=True),
}
GIB = 2**30
COLUMNS = ["master weights", "AdamW state", "gradients", "reference", "critic", "gathered weights", "activations",
           "KV cache"]
PHASES = ["rollout", "update", "reference pass", "optimizer step"]


def main() -> None:
    print("| model | config | parallel | offload | " + " | ".join(c.replace(" weights", "").replace(" state", "")
                                                          for c in COLUMNS)
          + " | " + " | ".join(PHASES) + " | peak | fits |")
    print("|---" * (4 + len(COLUMNS) + len(PHASES) + 2) + "|")
    for model, shape in SHAPES.items():
        for name in ("grpo", "ppo"):
            for parallel in ("ddp", "fsdp"):
                for offload in ("false", "true"):
                    cfg = load_config(ROOT / f"configs/search_r1_{name}.yaml", [
                        f"train.parallel={parallel}", f"train.offload_optimizer={offload}",
                        f"train.offload_reference={offload}"])
                    p = make_plan(cfg, shape, world_size=8, capacity=80 * 10**9, device="H100 80GB")
                    cells = [f"{p.items.get(c, 0.0) / GIB:.1f}" for c in COLUMNS]
                    phases = [f"{p.phases[ph][0] / GIB:.1f}" if ph in p.phases else "-" for ph in PHASES]
                    print(f"| {model} | {name} | {parallel} | {'yes' if offload == 'true' else 'no'} | "
                          + " | ".join(cells) + " | " + " | ".join(phases)
                          + f" | **{p.peak / GIB:.1f}** | {'yes' if p.fits() else 'no'} |")


if __name__ == "__main__":
    main()
