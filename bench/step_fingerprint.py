"""Fingerprints of short tiny runs, to show that a refactor of the train step changes no figure.

    python bench/step_fingerprint.py OUT.json                # run every arm, write their fingerprints
    python bench/step_fingerprint.py --compare A.json B.json # exit 1 and name what differs
                                                             # (--new-keys: metrics added since A are not)

Each arm is ``configs/tiny.yaml`` for 3 steps (a checkpoint at step 3, eval at the last step) with a few
settings changed, so the paths a refactor moves are all run: whole rows, packed rows, shared prefixes, a
KL reference, PPO with a critic, several epochs and mini-batches (the old-policy forward), and two gloo
ranks under DDP and under FSDP. A fingerprint is every metric of every step except timings and memory
(whose values differ between any two runs) and the sha256 of every tensor of the last checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["train.total_steps=3", "train.save_every=3", "train.eval_limit=4", "train.questions_per_step=4"]
ARMS = {
    "grpo": [],
    "packed": ["train.remove_padding=true"],
    "shared_prefix": ["train.share_prefix=true"],
    "kl_reference": ["algo.kl_coef=0.01", "algo.kl_mode=loss"],
    "ppo_critic": ["algo.advantage=gae", "algo.kl_coef=0.01", "algo.kl_mode=reward"],
    "epochs_minibatches": ["train.epochs=2", "train.mini_batches=2", "algo.kl_coef=0.01", "algo.kl_mode=loss"],
    "ddp_2_ranks": ["train.parallel=ddp", "algo.kl_coef=0.01", "algo.kl_mode=loss"],
    "fsdp_2_ranks": ["train.parallel=fsdp", "algo.kl_coef=0.01", "algo.kl_mode=loss"],
}
VOLATILE = ("perf/", "mem/", "time")


def run_arm(name: str, sets: list[str], out: Path) -> None:
    args = ["-m", "sleuth", "train", "--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(out), "--json"]
    for s in [*BASE, *sets]:
        args += ["--set", s]
    if name.endswith("_2_ranks"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    else:
        cmd = [sys.executable, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"arm {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def fingerprint(out: Path) -> dict:
    from safetensors.torch import load_file

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [{k: v for k, v in r.items() if not any(x in k for x in VOLATILE)} for r in rows]
    ckpt = sorted((out / "checkpoints").glob("step_*"))[-1]
    tensors = {}
    for f in sorted(ckpt.rglob("*.safetensors")):
        for key, t in sorted(load_file(str(f)).items()):
            tensors[f"{f.relative_to(ckpt)}:{key}"] = hashlib.sha256(t.contiguous().view(-1).view(
                __import__("torch").uint8).numpy().tobytes()).hexdigest()[:16]
    others = {str(f.relative_to(ckpt)): hashlib.sha256(f.read_bytes()).hexdigest()[:16]
              for f in sorted(ckpt.rglob("*")) if f.is_file() and f.suffix in (".pt", ".json") and "config" not in f.name}
    return {"metrics": metrics, "tensors": tensors, "files": others}


def compare(a: dict, b: dict, *, new_keys: bool = False) -> list[str]:
    diffs = []
    for arm in sorted(set(a) | set(b)):
        if arm not in a or arm not in b:
            diffs.append(f"{arm}: only in one file")
            continue
        for part in ("metrics", "tensors", "files"):
            x, y = a[arm][part], b[arm][part]
            if part == "metrics":
                for i, (r, s) in enumerate(zip(x, y, strict=False)):
                    keys = sorted(k for k in (set(r) if new_keys else set(r) | set(s)) if r.get(k) != s.get(k))
                    diffs += [f"{arm}: step {i + 1} {k}: {r.get(k)} != {s.get(k)}" for k in keys[:10]]
                if len(x) != len(y):
                    diffs.append(f"{arm}: {len(x)} != {len(y)} metric rows")
            else:
                keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                diffs += [f"{arm}: {part} {k} differs" for k in keys[:10]]
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="fingerprints JSON to write")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--new-keys", action="store_true",
                    help="with --compare: metrics only B logs (added since A) are not differences")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma list of arms to run")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = compare(a, b, new_keys=args.new_keys)
        print("\n".join(diffs) if diffs else f"identical: {len(a)} arms")
        return 1 if diffs else 0
    if not args.out:
        ap.error("give OUT.json, or --compare A B")
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.arms.split(","):
            run_arm(name, ARMS[name], Path(tmp) / name)
            result[name] = fingerprint(Path(tmp) / name)
            print(f"{name}: {len(result[name]['metrics'])} steps, {len(result[name]['tensors'])} tensors", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
