"""Asynchronous rollouts against synchronous ones, measured in one run: steps per hour and reward per step.

    python bench/async.py [--model DIR] [--steps 6] [--curve-steps 20] [--latency 0.3] [--threads 2] [--json] [--tiny]
                          [--config FILE] [--set KEY=VALUE ...]

The retriever is BM25 over ``../shared/data/corpus/wiki_dev.jsonl`` behind the Search-R1 ``/retrieve`` server
(``sleuth serve``'s app, in a thread of this process), each request held ``--latency`` seconds before it is
answered (what web search or a loaded 21M-passage server costs). Each arm is a ``sleuth train`` process on
``configs/smollm2_nq.yaml`` (or ``--config``; bf16 compute, the recipe's shape: 4 questions x 8 samples a step) from
``--model`` (an SFT run: the base model never searches, so retrieval would cost nothing):

* ``sync`` (``rollout.async_steps=0``, ``train.cpu_threads=T``) and ``async`` (``async_steps=1``, the same T
  threads split between the trainer and the worker), with the latency for ``--steps`` steps; then both again
  with none for ``--curve-steps`` steps (default ``--steps``), whose reward curves print step by step.

Steps per hour come from the trainer's own step times after its first step (start-up, and the worker's model
load, left out); the ratio is async / sync at the same latency. Reward per step is the training reward's mean
(few steps: noisy; the same questions in both arms). For async: the trainer's idle share (waiting for a batch)
and the worker's (waiting for weights), which say what bounds the overlap. ``--tiny`` runs the same arms on
the embedded tiny model and toy world in seconds (the CI smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "data" / "corpus" / "wiki_dev.jsonl"
DEFAULT_MODEL = ROOT / "runs" / "rl_gain" / "a1_sft_epoch"


class Delayed:
    """A retriever whose every call is held ``seconds`` (one call per request: the server batches none here)."""

    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds

    def search(self, queries, k):
        time.sleep(self.seconds)
        return self.inner.search(queries, k)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def serve(retriever, latency: float):
    from sleuth.retrieval.serve_cli import ServerThread
    from sleuth.retrieval.server import ServerLimits, make_app

    app = make_app(Delayed(retriever, latency), limits=ServerLimits(cache_size=0, batching=False))
    return ServerThread(app).start()


def run_arm(name: str, sets: list[str], out: Path, base: list[str]) -> dict:
    args = [sys.executable, "-m", "sleuth", "train", "--out", str(out), "--json", *base]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"arm {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summarize(name, rows, time.perf_counter() - t0)


def summarize(name: str, rows: list[dict], wall_s: float) -> dict:
    """Steady-state figures of one arm (steps after the first)."""
    steady = rows[1:] or rows
    step_s = sum(r["perf/step_s"] for r in steady)
    out = {"arm": name, "steps": len(rows), "wall_s": wall_s, "steady_step_s": step_s / len(steady),
           "steps_per_hour": 3600 * len(steady) / step_s, "reward_per_step": sum(r["reward/mean"] for r in rows) / len(rows),
           "retrieve_s_per_step": sum(r.get("rollout/time_retrieve_s", 0.0) for r in steady) / len(steady),
           "reward_curve": [round(r["reward/mean"], 4) for r in rows]}
    if "async/trainer_wait_s" in rows[-1]:
        wait = sum(r["async/trainer_wait_s"] for r in steady)
        busy = sum(r["async/worker_rollout_s"] for r in steady)
        idle = sum(r["async/worker_wait_s"] for r in steady)
        out.update({"trainer_idle_share": wait / step_s, "worker_idle_share": idle / max(busy + idle, 1e-9),
                    "publish_s": sum(r.get("async/publish_s", 0.0) for r in steady) / len(steady)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="the policy to train (an SFT run directory)")
    p.add_argument("--steps", type=int, default=6, help="steps of each arm with the latency")
    p.add_argument("--curve-steps", type=int, default=None, help="steps of each arm without (default --steps)")
    p.add_argument("--latency", type=float, default=0.3, help="seconds each retrieval request is held")
    p.add_argument("--threads", type=int, default=2, help="CPU threads in all, for either arm")
    p.add_argument("--tiny", action="store_true", help="the embedded tiny model and toy world (seconds)")
    p.add_argument("--config", default=str(ROOT / "configs" / "smollm2_nq.yaml"),
                   help="the arms' config (a GPU: configs/smollm2_nq_gpu.yaml, as `bash bench/gpu_check.sh async`); "
                        "--tiny uses configs/tiny.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more settings for every arm, applied before the bench's own (steps, threads, async_steps, "
                        "the retriever's URL), which win")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from sleuth.retrieval.factory import bm25_for_corpus

    if args.tiny:
        import sleuth.toy  # noqa: F401 - registers the tiny model and the world
        from sleuth.config_file import load_config
        from sleuth.named import named_world

        cfg = load_config(str(ROOT / "configs" / "tiny.yaml"))
        corpus = named_world().corpus_path(cfg)
        base = ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", "train.eval_every=0",
                "--set", "train.save_every=0", "--set", "train.eval_limit=1"]
    else:
        if not Path(args.model).exists():
            raise SystemExit(f"--model {args.model} does not exist: train one with `sleuth sft` (docs/results.md)")
        corpus = CORPUS
        base = ["--config", args.config, "--set", f"model.name_or_path={args.model}",
                "--set", "model.dtype=bfloat16", "--set", "train.eval_every=0", "--set", "train.save_every=0",
                "--set", "train.eval_limit=1"]
    base += [w for s in args.set for w in ("--set", s)]
    retriever = bm25_for_corpus(corpus)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for latency, steps in ((args.latency, args.steps), (0.0, args.curve_steps or args.steps)):
            server = serve(retriever, latency)
            try:
                common = ["retrieval.kind=url", f"retrieval.url={server.url}/retrieve", "retrieval.cache_size=0",
                          f"train.total_steps={steps}", f"train.cpu_threads={args.threads}"]
                for name, sets in (("sync", ["rollout.async_steps=0"]), ("async", ["rollout.async_steps=1"])):
                    row = run_arm(name, [*common, *sets], Path(tmp) / f"{name}_{latency}", base)
                    row["latency_s"] = latency
                    results.append(row)
                    print(json.dumps(row) if args.json else _line(row), flush=True)
            finally:
                server.stop()
    for latency in (args.latency, 0.0):
        sync, asy = (next(r for r in results if r["arm"] == a and r["latency_s"] == latency) for a in ("sync", "async"))
        ratio = {"latency_s": latency, "steps_per_hour_ratio": asy["steps_per_hour"] / sync["steps_per_hour"],
                 **reward_difference(sync["reward_curve"], asy["reward_curve"])}
        print(json.dumps(ratio) if args.json else f"latency {latency:g} s: async / sync steps per hour "
              f"{ratio['steps_per_hour_ratio']:.2f}x; reward per step async - sync {ratio['reward_diff']:+.3f} "
              f"(95% {ratio['reward_diff_low']:+.3f} to {ratio['reward_diff_high']:+.3f}, steps as samples)",
              flush=True)
    return 0


def reward_difference(sync: list[float], asy: list[float]) -> dict[str, float]:
    """Mean training reward per step, async minus sync, with a normal 95% interval treating each step's
    mean as one sample (the steps draw different questions: a rough guide to "within noise")."""
    def mean_var(xs):
        m = sum(xs) / len(xs)
        return m, sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1)

    (ms, vs), (ma, va) = mean_var(sync), mean_var(asy)
    se = (vs / len(sync) + va / len(asy)) ** 0.5
    return {"reward_diff": ma - ms, "reward_diff_low": ma - ms - 1.96 * se, "reward_diff_high": ma - ms + 1.96 * se}


def _line(r: dict) -> str:
    extra = (f", trainer idle {r['trainer_idle_share']:.0%}, worker idle {r['worker_idle_share']:.0%}, "
             f"publish {r['publish_s']:.2f} s" if "trainer_idle_share" in r else "")
    return (f"{r['arm']:5s} latency {r['latency_s']:g} s: {r['steady_step_s']:.1f} s/step "
            f"({r['steps_per_hour']:.0f} steps/h), reward/step {r['reward_per_step']:.3f}, "
            f"retrieve {r['retrieve_s_per_step']:.2f} s/step{extra}\n      reward by step: {r['reward_curve']}")


if __name__ == "__main__":
    raise SystemExit(main())
