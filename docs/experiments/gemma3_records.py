"""Keep a Gemma-3 recipe run's figures in git (``runs/`` does not outlive a session).

    python docs/experiments/gemma3_records.py runs/gemma3/zero2 docs/experiments/gemma3_attempt2_report.json \
        --what "issue #36 attempt 2's reported run" --code 6fa50b9

Writes one JSON file: the commit the run used (``--code``), the hashes of P and C, each
stage's wall seconds (``times.tsv``), each training stage's per-step figures (from ``metrics.jsonl``), and for every
evaluation under ``RUN/eval`` its summary and per question: id, source, em, f1, searches, stop reason, answer and the
queries. Refuses to overwrite an existing file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

STEP_KEYS = ("reward/mean", "reward/em", "reward/format", "rollout/searches_mean", "rollout/answered_frac",
             "groups/reward_variance_share", "sampling/rounds", "perf/step_s")
TRAIN_STAGES = ("rl_stage1", "rl", "sft", "sft_rl")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def training(run: Path) -> dict:
    out = {}
    for name in TRAIN_STAGES:
        metrics = run / name / "metrics.jsonl"
        if metrics.is_file():
            steps = [r for r in _jsonl(metrics) if "reward/mean" in r]
            out[name] = {"steps": len(steps),
                         "per_step": [{k: round(r[k], 4) for k in STEP_KEYS if k in r} for r in steps]}
    return out


def evaluations(run: Path) -> dict:
    out = {}
    for d in sorted(p for p in (run / "eval").iterdir() if (p / "results.json").is_file()):
        rows = _jsonl(d / "trajectories.jsonl")
        out[d.name] = {
            "summary": json.loads((d / "results.json").read_text(encoding="utf-8"))["summary"],
            "questions": [{"id": r["id"], "source": r["data_source"], "em": r["em"], "f1": round(r["f1"], 4),
                           "searches": r["searches"], "stop": r["stop_reason"], "answer": r["answer"],
                           "queries": r["queries"]} for r in rows]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="the recipe's OUT_DIR")
    p.add_argument("out", type=Path, help="the JSON file to write (must not exist)")
    p.add_argument("--what", required=True, help="what the run is, in words")
    p.add_argument("--code", required=True, help="the commit whose code the run used")
    p.add_argument("--splits", type=Path, default=Path("runs/rl_gain"), help="where P.jsonl and C.jsonl are")
    a = p.parse_args(argv)
    if a.out.exists():
        print(f"{a.out} exists: not overwritten (choose another name or remove it yourself)", file=sys.stderr)
        return 2
    if not (a.run / "eval").is_dir():
        print(f"{a.run} has no eval/ directory: is it a recipe's OUT_DIR?", file=sys.stderr)
        return 2
    times = {}
    if (a.run / "times.tsv").is_file():
        for line in (a.run / "times.tsv").read_text(encoding="utf-8").splitlines():
            if line.strip():
                name, seconds = line.rsplit("\t", 1)
                times[name] = int(float(seconds))
    record = {"what": a.what, "code": a.code, "P_sha256": _sha256(a.splits / "P.jsonl"),
              "C_sha256": _sha256(a.splits / "C.jsonl"), "stage_seconds": times, "training": training(a.run),
              "evaluations": evaluations(a.run)}
    a.out.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {a.out}: {len(record['evaluations'])} evaluations, "
          f"{sum(len(e['questions']) for e in record['evaluations'].values())} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
