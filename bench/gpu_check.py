"""The GPU check: every GPU figure issue #32 asks for, in one command that fits one GPU visit.

    bash bench/gpu_check.sh stage            # command A (carries .gpuA): wheels, data, GGUF part 1
    bash bench/gpu_check.sh run OUT          # command B (carries .gpuB), within A's warm window
    bash bench/gpu_check.sh --dry-run OUT    # every step on CPU with tiny shapes (a test runs it)

``run`` joins the SmolLM2 GGUF (``bench/gpu_stage.py join``); when the machine went cold between A
and B (no ``.gpuA``), it says so and runs the steps that need no real weights on a randomly
initialised model of SmolLM2's shape. Steps run cheapest and most decisive first, each under its own
timeout and all under one deadline (``--deadline``, 525 s): a step that would start with less than
its minimum left is skipped and named. Each step is a separate process, so a crash or an out-of-memory
in one loses nothing else. Written under ``OUT`` (at most 8 files, what the device tool brings back):
``log.txt`` (every step's output), ``summary.jsonl`` (a line per step: status, seconds, its JSON
summary), ``recipe_metrics.jsonl`` (the GRPO probe's metrics) and ``table.txt``, also printed last.

Stdlib only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRY_SLACK = 5  # --dry-run: each step's limit times this


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout: float  # seconds at most
    minimum: float  # skipped when less is left
    what: str
    show: list[str] = field(default_factory=list)  # keys of its JSON summary for the table
    needs_weights: bool = False  # the real GGUF (and its tokenizer)
    env: dict = field(default_factory=dict)


def bench(script: str, *args: str) -> list[str]:
    return [PY, str(ROOT / "bench" / script), *args, "--json"]


def steps(model: str, real: bool, dry: bool, work: Path) -> list[Step]:
    """The steps in the order they run. ``model``: the GGUF path, or random-smollm2."""
    tiny = ["--tiny", "--device", "cpu"] if dry else []
    recipe = recipe_argv(model if real else "tiny", work / "recipe", dry)
    out = [
        Step("canaries", bench("gpu_canaries.py", "--model", model, *tiny), 120, 20,
             "Linear grads after no-grad passes; master weights move at lr 1e-6; K/V dtypes vs the plan; "
             "sampler vs trainer logprobs; reference KL at step 0", ["all_pass"]),
        Step("trainer_step", bench("gpu_trainer_step.py", "--model", model, "--profile", *tiny,
                                   *(["--rows", "16", "--group-size", "4", "--micro-batch-size", "8",
                                      "--max-tokens", "4096"] if dry else []), "--repeats", "1"), 120, 30,
             "Sleuth's reference pass + policy_update, 256 recipe rows, share_prefix off/on: s, MFU, peak vs plan"),
        Step("trainer_step_05b", bench("gpu_trainer_step.py", "--model", "random-qwen2", "--arms", "off", *tiny,
                                       *(["--rows", "8", "--group-size", "4", "--micro-batch-size", "4",
                                          "--max-tokens", "2048"] if dry else []), "--repeats", "1"), 100, 30,
             "the same update at Qwen2.5-0.5B's shape (random weights), share_prefix off: s, MFU, peak vs plan"),
        Step("recipe", recipe, 150, 60, "2 GRPO steps of configs/smollm2_nq_gpu.yaml, 64 questions x 8",
             needs_weights=not dry),
        Step("decode", bench("gpu_decode.py", "--model", model, "--autocast", "--engines", "hf,hf_static",
                             "--batch-sizes", "1,4" if dry else "1,32,128,512", "--repeats", "1", *tiny,
                             *(["--new-tokens", "8", "--prompt-len", "16"] if dry else ["--new-tokens", "64"])),
             75, 30,
             "decode tokens/s, float32 master + bf16 autocast, hf vs hf_static, against the bandwidth floor"),
        Step("cuda_tests", pytest_argv(dry), 100, 40, "pytest -m gpu + the e2e trainer tests on CUDA"),
        Step("retrieval", bench("gpu_retrieval.py", *tiny), 45, 15, "Flat dense search, 1M x 384 on the GPU"),
        Step("plain_loop_mfu", bench("gpu_train.py", "--baseline", "none", "--steps", "4", "--warmup", "2",
                                     *tiny), 45, 20, "HF's own loss loop, Qwen2.5-0.5B shape, bf16 (MFU)"),
        Step("compile", bench("gpu_decode.py", "--model", model, "--engines", "hf_static", "--churn", "5",
                              "--batch-sizes", "4" if dry else "128", *tiny,
                              *(["--compile-backend", "eager", "--new-tokens", "8", "--prompt-len", "16"] if dry
                                else [])), 240, 45,
             "compiled hf_static: compiles per call as training's shapes change"),
        Step("transformers_drift", [PY, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                    *(["-n", "8"] if not dry else []),
                                    *[f"tests/component/{t}" for t in (
                                        ["test_memory_plan.py::test_offload_and_fsdp_phases_by_hand"] if dry else
                                        ["test_rollout_hf_reuse.py", "test_rollout_hf_static.py", "test_packing.py",
                                         "test_prefix_share.py", "test_memory_plan.py"])]], 90, 25,
             "the version-dependent CPU paths on this machine's transformers"),
    ]
    if dry:  # on a CPU, beside other work: the GPU's per-step limits become hang guards with ample headroom
        out = [replace(s, timeout=s.timeout * DRY_SLACK) for s in out]
    return out


def ordered(all_steps: list[Step], only: str | None) -> list[Step]:
    """All steps in their order, or those ``only`` names (a comma list) in the order it names them."""
    if not only:
        return all_steps
    by_name = {s.name: s for s in all_steps}
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"gpu_check: --only names unknown steps {unknown}; the steps are {list(by_name)}")
    return [by_name[n] for n in names]


def pytest_argv(dry: bool) -> list[str]:
    """The CUDA tests (marked gpu) and the e2e trainer tests, which train on CUDA there (device auto)."""
    e2e = "tests/e2e/test_train_e2e.py::"
    ids = ["tests/component/test_rollout_hf.py::test_cuda_greedy_matches_cpu",
           "tests/unit/test_offload.py::test_on_a_gpu_the_state_and_the_reference_live_in_cpu_memory_between_uses",
           *[e2e + name for name in ("test_train_changes_every_parameter_and_logs",
                                     "test_bf16_training_keeps_float32_master_weights",
                                     "test_offload_options_change_no_figure",
                                     "test_a_shared_prefix_run_logs_what_the_whole_rows_run_logs",
                                     "test_resume_matches_uninterrupted_run")]]
    if dry:  # the selection resolves; the CUDA tests skip on CPU
        ids = ids[:2]
    return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *([] if dry else ["-n", "4"]), *ids]


def recipe_argv(model: str, out: Path, dry: bool) -> list[str]:
    sets = [f"model.name_or_path={model}", "train.total_steps=2", "train.save_every=0", "train.eval_every=0",
            "train.eval_limit=1"]  # the last step evaluates: one question a source
    if dry:  # the embedded tiny model, a few rows
        sets += ["train.questions_per_step=2", "rollout.group_size=2", "rollout.max_tokens_per_turn=8",
                 "train.micro_batch_size=4", "rollout.use_chat_template=false", "model.device=cpu",
                 "rollout.max_concurrent_rows=4", "train.max_tokens_per_micro_batch=4096"]
    argv = [PY, "-m", "sleuth", "train", "--config", str(ROOT / "configs" / "smollm2_nq_gpu.yaml"),
            "--out", str(out), "--overwrite"]
    return argv + [x for s in sets for x in ("--set", s)]


def last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def gpu_memory_used_mib() -> int | None:
    """Device memory in use (all processes), from nvidia-smi; None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=False).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_for_free_device(log, limit_s: float = 60.0, idle_mib: int = 2048) -> dict:
    """Wait until the device's memory is back to idle: a step killed by its timeout can hold its memory
    while the driver tears it down, and the next step then runs out of memory (the recipe probe did,
    2026-11-27, with 60 GiB still held by the killed trainer_step). Returns what it saw."""
    t0, used = time.monotonic(), gpu_memory_used_mib()
    while used is not None and used > idle_mib and time.monotonic() - t0 < limit_s:
        time.sleep(1.0)
        used = gpu_memory_used_mib()
    seen = {"device_mib_in_use": used, "waited_s": round(time.monotonic() - t0, 1)}
    if used is not None:
        log.write(f"(device memory in use before the step: {used} MiB, waited {seen['waited_s']} s)\n")
    return seen


def run_step(step: Step, left: float, log, env: dict) -> dict:
    t0 = time.monotonic()
    log.write(f"\n===== {step.name}: {' '.join(step.argv)}\n")
    device = wait_for_free_device(log)
    limit = max(1.0, min(step.timeout, left - (time.monotonic() - t0)))  # timeout 0 would mean none
    log.write(f"(limit {limit:.0f} s)\n")
    log.flush()
    try:
        proc = subprocess.run(["timeout", "-k", "5", str(int(limit)), *step.argv], cwd=ROOT, env={**env, **step.env},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text, rc = proc.stdout, proc.returncode
    except OSError as e:
        text, rc = f"could not start: {e}", 127
    seconds = time.monotonic() - t0
    log.write(text)
    log.flush()
    status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "failed"
    tail = "\n".join(text.strip().splitlines()[-3:]) if status != "ok" else ""
    return {"step": step.name, "status": status, "rc": rc, "seconds": round(seconds, 1), "what": step.what,
            "result": last_json(text), "tail": tail[-600:], **device}


# per step, the figures of its JSON summary the table shows (fnmatch patterns over flattened keys)
TRAINER_SHOW = ["arms.*.arm", "arms.*.status", "arms.*.update_s", "arms.*.mfu", "arms.*.mfu_measured_peak",
                "arms.*.measured_update_gib", "arms.*.plan_update_gib", "arms.*.update_gib_ratio",
                "arms.*.profile.device_ms_total", "arms.*.profile.host_ms_total", "arms.*.profile.by_host_time.0.op"]
SHOW = {
    "trainer_step": TRAINER_SHOW,
    "trainer_step_05b": TRAINER_SHOW,
    "decode": ["key_dtype", "rows.*.batch", "rows.*.hf_tokens_per_s", "rows.*.hf_static_tokens_per_s",
               "rows.*.hf_bandwidth_fraction", "rows.*.hf_static_bandwidth_fraction", "failed"],
    "retrieval": ["torch_qps", "baseline", "baseline_qps", "speedup_vs_baseline", "recall_vs_baseline"],
    "plain_loop_mfu": ["step_s", "tokens_per_s", "mfu", "peak_mem_gb"],
    "compile": ["churn_new_shapes", "churn_new_buckets", "churn_graphs_in_seen_buckets", "churn_graphs_total",
                "churn_graphs_per_new_shape", "churn_graphs_on_seen_shapes",
                "churn_compiles_per_call", "churn_s_first_call", "churn_s_per_call", "churn_cudagraph_records",
                "compiled_tokens_per_s", "failed"],
    "recipe": ["step*.step_s", "step*.train_s", "step*.*peak_gib", "step*.*plan_gib", "step*.*outside_torch_gib",
               "step*.reward_mean"],
}


def flatten(value, prefix: str = "") -> dict:
    """``{"a.b": 1, "rows.0.batch": 1, ...}`` of a JSON value's scalars."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def headline(row: dict) -> str:
    """A line of figures for the table from a step's JSON summary."""
    r = row.get("result") or {}
    if row["step"] == "canaries" and isinstance(r.get("canaries"), list):
        return " ".join(f"{c.get('name')}={'pass' if c.get('pass') else 'n/a' if c.get('pass') is None else 'FAIL'}"
                        for c in r["canaries"])
    if row["step"] == "cuda_tests":
        return row.get("pytest", "")
    if row.get("why"):
        return row["why"]
    flat = flatten(r)
    keys = [k for k in flat if any(fnmatch.fnmatchcase(k, p) for p in SHOW.get(row["step"], []))]
    return " ".join(f"{k}={fmt(flat[k])}" for k in keys if flat[k] is not None)


def table(rows: list[dict], env_facts: dict) -> str:
    lines = [f"GPU check {env_facts.get('date', '')}: {env_facts.get('device', '?')} | "
             f"torch {env_facts.get('torch', '?')} | "
             f"transformers {env_facts.get('transformers', '?')} | jax {env_facts.get('jax', '?')} | "
             f"weights {env_facts.get('weights', '?')} | "
             f"commit {env_facts.get('commit', '?')}",
             f"{'step':<20} {'status':<8} {'s':>6}  figures"]
    for row in rows:
        lines.append(f"{row['step']:<20} {row['status']:<8} {row['seconds']:>6.1f}  {headline(row)}")
        if row["status"] not in ("ok", "skipped") and row.get("tail"):
            lines += ["    " + t for t in row["tail"].splitlines()]
    return "\n".join(lines)


def env_facts(dry: bool, weights: str) -> dict:
    code = ("import json, torch, transformers; d = torch.cuda.is_available(); "
            "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__, "
            "'device': torch.cuda.get_device_name() if d else 'cpu', "
            "'recompile_limit': getattr(torch._dynamo.config, 'recompile_limit', None), "
            "'cuda': torch.version.cuda, 'jax': jax}))")
    code = ("import importlib.metadata as md\ntry:\n    jax = md.version('jax')\nexcept md.PackageNotFoundError:\n"
            "    jax = 'absent'\n" + code)  # JAX preallocates 75% of a GPU when started there (bm25s can start it)
    try:
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120).stdout
        facts = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        facts = {"error": str(e)}
    try:
        facts["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                         text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        facts["commit"] = "?"
    facts.update(weights=weights, dry_run=dry, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    return facts


def resolve_weights(dry: bool) -> tuple[str, bool, str]:
    """``(model, real, why)``: the joined GGUF when it is there, else random-smollm2."""
    if dry:
        return "random-smollm2", False, "dry run"
    try:
        out = subprocess.run([PY, str(ROOT / "bench" / "gpu_stage.py"), "join"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        info = last_json(out.stdout) or {}
    except (OSError, subprocess.SubprocessError) as e:
        info = {"weights": "random", "why": f"join did not run: {e}"}
    if info.get("weights") == "real" and Path(info.get("gguf", "")).is_file():
        return info["gguf"], True, "real"
    return "random-smollm2", False, info.get("why", "no joined GGUF")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for the results (the device tool's $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="every step on CPU with tiny shapes")
    ap.add_argument("--deadline", type=float, default=525.0, help="seconds for the whole check")
    ap.add_argument("--only", default=None,
                    help="comma list of step names to run, in that order (the rest are left out)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = ROOT / ".gpuA" / "work" if not args.dry_run else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    model, real, why = resolve_weights(args.dry_run)
    if not args.dry_run and not real:
        print(f"gpu_check: no real weights ({why}): steps that need them are skipped, the rest run on a "
              "randomly initialised model of SmolLM2's shape", flush=True)
    env = dict(os.environ)
    facts = env_facts(args.dry_run, "real" if real else f"random ({why})")
    rows = []
    with open(out / "log.txt", "a") as log, open(out / "summary.jsonl", "a") as summary:
        summary.write(json.dumps({"step": "env", **facts}) + "\n")
        for step in ordered(steps(model, real, args.dry_run, work), args.only):
            left = args.deadline - (time.monotonic() - start)
            if step.needs_weights and not real:
                row = {"step": step.name, "status": "skipped", "seconds": 0.0, "what": step.what,
                       "result": None, "why": "needs the real weights"}
            elif left < step.minimum:
                row = {"step": step.name, "status": "skipped", "seconds": 0.0, "what": step.what, "result": None,
                       "why": f"{left:.0f} s left of the deadline, it needs {step.minimum:.0f}"}
            else:
                row = run_step(step, left, log, env)
                if step.name == "cuda_tests":
                    row["pytest"] = next((ln for ln in reversed(row.get("tail", "").splitlines() or [""])
                                          if "passed" in ln or "failed" in ln), "")
                    if row["status"] == "ok":
                        row["pytest"] = "all passed"
                if step.name == "recipe":
                    metrics = work / "recipe" / "metrics.jsonl"
                    if metrics.exists():
                        shutil.copy(metrics, out / "recipe_metrics.jsonl")
                        row["result"] = recipe_figures(metrics)
            rows.append(row)
            summary.write(json.dumps(row) + "\n")
            summary.flush()
            print(f"gpu_check: {row['step']}: {row['status']} in {row['seconds']} s", flush=True)
    text = table(rows, facts)
    (out / "table.txt").write_text(text + "\n")
    print(text, flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


def recipe_figures(metrics: Path) -> dict:
    """The GRPO probe's per-step figures: seconds by part and each phase's peak against the plan."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    keep = ("perf/step_s", "perf/train_s", "perf/tokens_per_s", "reward/mean")
    result = {}
    for r in rows:
        s = r.get("step")
        for k, v in r.items():
            if isinstance(v, (int, float)) and (k in keep or k.startswith("mem/")):
                result[f"step{s}.{k.replace('mem/', '').replace('perf/', '').replace('/', '_')}"] = v
    return result


if __name__ == "__main__":
    sys.exit(main())
