"""Keep a Gemma-3 recipe run's figures in git (``runs/`` does not outlive a session).

    python docs/experiments/gemma3_records.py runs/gemma3/zero2 docs/experiments/gemma3_attempt2_report.json \
        --what "issue #36 attempt 2's reported run" --code 6fa50b9
    python docs/experiments/gemma3_records.py --arm E=runs/gemma3/sel_E --arm F=runs/gemma3/sel_F \
        docs/experiments/gemma3_attempt3_selection.json --what "issue #36 attempt 3's selection" --code 2fbbba6

Writes one JSON file: the commit the run used (``--code``), the hashes of P and C (of P and S for a selection), each
stage's wall seconds (``times.tsv``), each training stage's per-step figures (every number a step logged in
``metrics.jsonl``) and logged samples (``samples.jsonl``: retrieval hit, queries, answer), and for every evaluation
under ``RUN/eval`` (a selection arm's ``eval_S``) its summary, its real searches per question (queries other than the
instruction's placeholder ``query`` and the few-shot example's ``timbuktu city country``; more with ``--copy``) and
per question: id, source, em, f1, searches, stop reason, answer and the queries. Refuses to overwrite an existing
file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

TRAIN_STAGES = ("rl_stage1", "rl", "sft", "sft_rl")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def steps(metrics: Path) -> list[dict]:
    """The rows of a training stage's ``metrics.jsonl`` that are steps (they carry ``reward/mean``; the trainer's
    evaluation rows do not)."""
    return [r for r in _jsonl(metrics) if "reward/mean" in r]


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _figures(row: dict) -> dict:
    """Every number a step logged (its step included), to 4 decimals: records written before 2026-11-30 kept 12 of
    them (the reward's, searches, answered, stops, groups' spread share, rounds, step seconds, update peak)."""
    return {k: round(v, 4) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def training(run: Path) -> dict:
    out = {}
    for name in TRAIN_STAGES:
        metrics = run / name / "metrics.jsonl"
        if metrics.is_file():
            rows = steps(metrics)
            out[name] = {"steps": len(rows),
                         "per_step": [_figures(r) for r in rows]}
            if (run / name / "samples.jsonl").is_file():  # the few samples logged a step (retrieval hits, queries)
                out[name]["logged_samples"] = [
                    {"step": r["step"], "id": r["question_id"], "retrieval_hit": r["retrieval_hit"], "em": r["em"],
                     "stop": r["stop_reason"], "queries": r["queries"], "answer": r["answer"]}
                    for r in _jsonl(run / name / "samples.jsonl")]
    return out


COPIES = frozenset({"query", "timbuktu city country"})  # copies of the prompt, not searches for the question


def evaluation(d: Path, copies: frozenset[str] = COPIES) -> dict:
    rows = _jsonl(d / "trajectories.jsonl")
    real = sum(q.strip().lower() not in copies for r in rows for q in r["queries"])
    return {"summary": json.loads((d / "results.json").read_text(encoding="utf-8"))["summary"],
            "real_searches_per_question": round(real / len(rows), 4) if rows else 0.0,
            "questions": [{"id": r["id"], "source": r["data_source"], "em": r["em"], "f1": round(r["f1"], 4),
                           "searches": r["searches"], "stop": r["stop_reason"], "answer": r["answer"],
                           "queries": r["queries"]} for r in rows]}


def evaluations(run: Path, copies: frozenset[str] = COPIES) -> dict:
    dirs = sorted(p for p in (run / "eval").iterdir() if (p / "results.json").is_file())
    return {d.name: evaluation(d, copies) for d in dirs}


def stage_seconds(run: Path) -> dict:
    times = {}
    if (run / "times.tsv").is_file():
        for line in (run / "times.tsv").read_text(encoding="utf-8").splitlines():
            if line.strip():
                name, seconds = line.rsplit("\t", 1)
                times[name] = int(float(seconds))
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", type=Path, nargs="+", metavar="[RUN] OUT",
                   help="the recipe's OUT_DIR (not with --arm), then the JSON file to write (must not exist)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=DIR",
                   help="a selection arm's OUT_DIR (its evaluation in DIR/eval_S); repeat for each arm")
    p.add_argument("--what", required=True, help="what the run is, in words")
    p.add_argument("--code", required=True, help="the commit whose code the run used")
    p.add_argument("--splits", type=Path, default=Path("runs/rl_gain"), help="where P, S and C.jsonl are")
    p.add_argument("--copy", action="append", default=[], metavar="QUERY",
                   help="one more query that copies the prompt (not a real search), beside those of COPIES; repeat")
    a = p.parse_args(argv)
    copies = COPIES | {q.strip().lower() for q in a.copy}
    if len(a.paths) != (1 if a.arm else 2):
        p.error("give RUN OUT, or --arm NAME=DIR ... OUT")
    out = a.paths[-1]
    if out.exists():
        print(f"{out} exists: not overwritten (choose another name or remove it yourself)", file=sys.stderr)
        return 2
    record = {"what": a.what, "code": a.code, "P_sha256": _sha256(a.splits / "P.jsonl"),
              **({"copies": sorted(copies)} if a.copy else {})}
    if a.arm:
        arms = {}
        for spec in a.arm:
            name, sep, d = spec.partition("=")
            if not sep or not name or not (Path(d) / "eval_S" / "results.json").is_file():
                print(f"--arm {spec}: expected NAME=DIR with an evaluation in DIR/eval_S", file=sys.stderr)
                return 2
            arms[name] = {**evaluation(Path(d) / "eval_S", copies), "stage_seconds": stage_seconds(Path(d)),
                          "training": training(Path(d))}
        record.update(S_sha256=_sha256(a.splits / "S.jsonl"), arms=arms)
        n = sum(len(e["questions"]) for e in arms.values())
    else:
        run = a.paths[0]
        if not (run / "eval").is_dir():
            print(f"{run} has no eval/ directory: is it a recipe's OUT_DIR?", file=sys.stderr)
            return 2
        record.update(C_sha256=_sha256(a.splits / "C.jsonl"), stage_seconds=stage_seconds(run),
                      training=training(run), evaluations=evaluations(run, copies))
        n = sum(len(e["questions"]) for e in record["evaluations"].values())
    out.write_text(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {out}: {n} question records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
