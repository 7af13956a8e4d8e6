"""How much of a low-learning-rate update survives in bf16: the share of weights one training step
moves, float32 against bf16 compute with float32 master weights (what ``model.dtype: bfloat16``
trains with) and against bf16 parameters (the same step with no master weights, as before).

    .venv/bin/python bench/master_weights.py [--json] [--lr 1e-6] [--steps 1]

All three runs take the same step of ``configs/tiny.yaml`` (the shipped tiny model on its world,
GRPO, same seed, so the same questions), at Search-R1's learning rate by default. Reported: the
share of weights that changed, and each ratio against float32 (measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def moved_share(trainer, lr: float, steps: int) -> float:
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    for _ in range(steps):
        trainer.step += 1
        trainer.train_step()
    moved = sum(int((p.detach().float() != b.float()).sum()) for p, b in zip(trainer.policy.parameters(), before))
    return moved / sum(b.numel() for b in before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import tempfile

    import sleuth.models as models
    import sleuth.train.loop as loop
    from sleuth.config_file import load_config

    load_policy = models.load_policy

    def trainer(dtype: str, out: Path, bf16_params: bool = False):
        cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"model.dtype={dtype}", f"train.lr={args.lr}",
                                                            "data.eval_files=[]", "train.total_steps=100"])
        if bf16_params:  # the old behaviour: parameters (and so AdamW state) loaded in bf16
            models.load_policy = lambda *a, **kw: load_policy(*a, **{**kw, "dtype": "bfloat16"})
        try:
            t = loop.Trainer(cfg, out, progress=False)
            assert {p.dtype for p in t.policy.parameters()} == {torch.bfloat16 if bf16_params else torch.float32}
            return t
        finally:
            models.load_policy = load_policy

    with tempfile.TemporaryDirectory() as tmp:
        shares = {
            "float32": moved_share(trainer("float32", Path(tmp) / "f32"), args.lr, args.steps),
            "bf16_master_fp32": moved_share(trainer("bfloat16", Path(tmp) / "bf16"), args.lr, args.steps),
            "bf16_params": moved_share(trainer("bfloat16", Path(tmp) / "old", bf16_params=True), args.lr, args.steps),
        }
    result = {"lr": args.lr, "steps": args.steps, "moved_share": shares,
              "ratio_vs_float32": {k: v / shares["float32"] for k, v in shares.items()}}
    if args.json:
        print(json.dumps(result))
        return
    print(f"share of weights moved by {args.steps} step(s) at lr {args.lr:g} (configs/tiny.yaml, same seed):")
    for k, v in shares.items():
        print(f"  {k:18s} {v:8.4f}   ratio vs float32 {v / shares['float32']:.4f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
