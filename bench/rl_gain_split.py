"""The data split of issue #34's pre-registered experiment (docs/results.md, "RL beats SFT?").

    python bench/rl_gain_split.py OUT_DIR [--data ../shared/data]

From ``train/nq.jsonl`` (1,717 questions) and ``train/hotpotqa.jsonl`` (100):

* **S**, the selection set: issue #18's 400-question held-out slice (2026-11-25), rebuilt to the id from
  its script with the code of 3831070; its ids are in ``docs/experiments/rl_gain_split.json`` (S has been
  looked at: choose settings on it, never confirm).
* **C**, the confirmation set: 500 NQ questions outside S, drawn with seed 20261127 in two strata so that the
  share whose synthesized transcript exists (the question-as-query BM25 top-3 observation, or its follow-up,
  holds a gold answer: ``sleuth sft``'s synthesis with configs/smollm2_nq.yaml) equals NQ's.
* **P**, the training pool: NQ minus S and C, plus HotpotQA train. ``sleuth sft`` and RL read P only.

Disjointness is asserted by id and by normalised question text (a P question whose text equals one of S or
C is dropped from P and counted). Writes ``OUT_DIR/{S,C,P}.jsonl`` (rows as in the source files) and
``OUT_DIR/split.json`` (ids, counts, the seed, sha256 of the sources and of each file); with ``--check FILE``
it verifies that the split it builds equals the recorded one (ids and hashes) and exits 1 naming any
difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORD = ROOT / "docs" / "experiments" / "rl_gain_split.json"
SEED, N_C = 20261127, 500


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kept_ids(data: Path) -> set[str]:
    """Question ids whose transcript the recipe's synthesis writes (the stratum of S and C)."""
    from sleuth.build import build_format, build_retriever, train_questions
    from sleuth.config_file import load_config
    from sleuth.models import load_tokenizer, resolve_model
    from sleuth.rollout.chat import ChatRenderer
    from sleuth.sft.synthesize import YES_NO, synthesize

    cfg = load_config(ROOT / "configs" / "smollm2_nq.yaml",
                      [f"data.train_files=[{data / 'train' / 'nq.jsonl'}]",
                       f"retrieval.corpus={data / 'corpus' / 'wiki_dev.jsonl'}"])
    tok = load_tokenizer(resolve_model("smollm2"))
    render = ChatRenderer(tok, build_format(cfg), cfg.rollout.use_chat_template)
    transcripts, _ = synthesize(train_questions(cfg), build_retriever(cfg), render.fmt, render, cfg)
    # S's strata were drawn when yes/no questions got no transcript: they count as without one here too
    return {t.question.id for t in transcripts if not {a.strip().lower() for a in t.question.golden_answers} <= YES_NO}


def build(data: Path, s_ids: list[str]) -> tuple[dict, dict[str, list[dict]]]:
    from sleuth.reward.metrics import normalize_answer

    nq = [json.loads(x) for x in (data / "train" / "nq.jsonl").read_text().splitlines() if x.strip()]
    hotpot = [json.loads(x) for x in (data / "train" / "hotpotqa.jsonl").read_text().splitlines() if x.strip()]
    qid = lambda r: f"nq/nq/{r['id']}"  # noqa: E731 (the id a run gives a row of nq.jsonl)
    s_set = set(s_ids)
    by_id = {qid(r): r for r in nq}
    missing = s_set - set(by_id)
    if missing:
        raise SystemExit(f"S ids not in {data / 'train' / 'nq.jsonl'}: {sorted(missing)[:3]}")
    kept = kept_ids(data)
    rest = [r for r in nq if qid(r) not in s_set]
    k = round(N_C * sum(qid(r) in kept for r in nq) / len(nq))
    rng = random.Random(SEED)
    with_t = [r for r in rest if qid(r) in kept]
    without = [r for r in rest if qid(r) not in kept]
    c = rng.sample(with_t, k) + rng.sample(without, N_C - k)
    rng.shuffle(c)
    c_set = {qid(r) for r in c}
    held_text = {normalize_answer(by_id[i]["question"]) for i in s_set | c_set}
    pool_nq = [r for r in rest if qid(r) not in c_set]
    pool = [r for r in pool_nq + hotpot if normalize_answer(r["question"]) not in held_text]
    dropped = len(pool_nq) + len(hotpot) - len(pool)
    s_rows = [by_id[i] for i in s_ids]
    assert not (s_set & c_set) and not ({qid(r) for r in pool_nq} & (s_set | c_set))
    files = {"S": s_rows, "C": c, "P": pool}
    meta = {"seed": SEED, "n": {name: len(rows) for name, rows in files.items()},
            "c_strata": {"with_transcript": k, "without": N_C - k},
            "pool_dropped_same_text": dropped,
            "sources": {f"train/{n}": sha(data / "train" / n) for n in ("nq.jsonl", "hotpotqa.jsonl")}
            | {"corpus/wiki_dev.jsonl": sha(data / "corpus" / "wiki_dev.jsonl")},
            "ids": {"S": s_ids, "C": [qid(r) for r in c]}}
    return meta, files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for S.jsonl, C.jsonl, P.jsonl and split.json")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--check", default=str(RECORD), help="the recorded split to compare with")
    args = ap.parse_args(argv)
    record = json.loads(Path(args.check).read_text())
    meta, files = build(Path(args.data), record["ids"]["S"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        meta.setdefault("files", {})[f"{name}.jsonl"] = sha(out / f"{name}.jsonl")
    (out / "split.json").write_text(json.dumps(meta, indent=1))
    diffs = [k for k in ("ids", "files", "sources", "n") if k in record and record[k] != meta[k]]
    print(json.dumps({k: meta[k] for k in ("n", "c_strata", "pool_dropped_same_text", "files")}))
    if diffs:
        print(f"rl_gain_split: differs from {args.check} in {diffs}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
