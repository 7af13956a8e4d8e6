"""Evaluation throughput: our batched eval against a one-question-at-a-time loop, same model and data.

    .venv/bin/python bench/eval.py [--json] [--questions 64] [--batch-size 64] [--repeat 3]

Both sides run ``sleuth.eval.evaluate.evaluate`` (greedy, the training rollout code, the default
``HFBackend``) with the same tiny Llama (taught to search, then answer, like the e2e test) over the
same ``../shared/data/dev`` questions and the same BM25 index of ``wiki_dev.jsonl``:

* **batched**: ``evaluate(questions, batch_size=B)`` -- one ``run_rollouts`` call per B questions
  (one batched decode per round, the instruction every prompt starts with prefilled once, each
  row's KV cache kept from round to round, one de-duplicated retriever call per round);
* **sequential**: ``evaluate([q], batch_size=1)`` for each question in turn -- the loop a
  one-question-at-a-time script would run (it keeps its own row's KV cache across rounds too);
* **plain batched** (information): the batched eval with ``HFBackend(reuse_prefix=False)``, i.e.
  without the KV reuse, to show what that reuse buys.

The machine is shared, so each side runs ``--repeat`` times, interleaved; reported: the best
(least disturbed) time of each side and the speedup from those, the speedup of every repeat, and
the speedup in process CPU time (less sensitive to other jobs). Also: whether both sides produced
the same answers and queries, and the retrieval cache: the batched eval run again behind a warm
``DiskCachedRetriever`` (the situation of evaluating a second checkpoint), its retrieve time
against the cold one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sleuth.config import RolloutConfig  # noqa: E402
from sleuth.data.qa import load_questions  # noqa: E402
from sleuth.eval.evaluate import DiskCachedRetriever, evaluate  # noqa: E402
from sleuth.retrieval.factory import bm25_for_corpus  # noqa: E402
from sleuth.rollout.formats import get_format  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.loop import run_rollouts  # noqa: E402
from tests.helpers.tiny import ScriptedBackend, teach, tiny_model, tiny_tokenizer  # noqa: E402

TARGET_SPEEDUP = 5.0
SCRIPT = ["<think> I need to search. </think>\n<search> capital of France </search>",
          "<think> The answer is clear. </think>\n<answer> Paris </answer>"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def setup(data: Path, n: int):
    """Questions (n spread over the dev files), the BM25 retriever, a taught tiny model."""
    files = sorted((data / "dev").glob("*.jsonl"))
    per = max(1, n // len(files))
    questions = [q for f in files for q in load_questions(f, limit=per)][:n]
    retriever = bm25_for_corpus(data / "corpus" / "wiki_dev.jsonl")
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    cfg = RolloutConfig(max_turns=2, max_tokens_per_turn=64, max_obs_tokens=128, max_context_tokens=1024,
                        use_chat_template=False)  # fmt: skip
    trajs, _ = run_rollouts(questions[:4], ScriptedBackend(tok, SCRIPT), tok, get_format("search_r1"), retriever,
                            cfg, k=3, greedy=True, group_size=1)  # fmt: skip
    teach(model, tok, trajs, steps=80)
    return questions, retriever, model, tok, cfg


def timed(fn):
    """``(wall seconds, process CPU seconds, fn())``."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def same_rows(a: list[dict], b: list[dict]) -> int:
    return sum(x["answer"] == y["answer"] and x["queries"] == y["queries"] for x, y in zip(a, b))


def run(args) -> dict:
    data = Path(args.data)
    questions, retriever, model, tok, cfg = setup(data, args.questions)
    fmt = get_format("search_r1")
    n, B = len(questions), args.batch_size
    log(f"bench/eval: {n} questions, batch size {B}, {args.repeat} repeats")
    evaluate(model, tok, questions[:2], fmt, retriever, cfg, topk=3, batch_size=2)  # warm-up

    def batched(backend=None):
        return evaluate(model, tok, questions, fmt, retriever, cfg, topk=3, batch_size=B, backend=backend)

    def sequential():
        return [row for q in questions for row in evaluate(model, tok, [q], fmt, retriever, cfg, topk=3,
                                                              batch_size=1)[1]]  # fmt: skip

    bat, seq, plain = [], [], []
    for r in range(args.repeat):
        bat.append(timed(batched))
        plain.append(timed(lambda: batched(HFBackend(model, tok, reuse_prefix=False))))
        seq.append(timed(sequential))
        log(f"  repeat {r + 1}: batched {bat[-1][0]:.2f} s (plain {plain[-1][0]:.2f} s), "
            f"sequential {seq[-1][0]:.2f} s -> {seq[-1][0] / bat[-1][0]:.2f}x")  # fmt: skip
    t_bat, t_seq, t_plain = (min(t for t, _, _ in xs) for xs in (bat, seq, plain))
    cpu_bat, cpu_seq = min(c for _, c, _ in bat), min(c for _, c, _ in seq)
    summary, rows_b = bat[0][2]
    rows_s = seq[0][2]
    with tempfile.TemporaryDirectory() as tmp:
        cached = DiskCachedRetriever(retriever, Path(tmp) / "c.sqlite", "bench")
        cold, _ = evaluate(model, tok, questions, fmt, cached, cfg, topk=3, batch_size=B)
        warm, _ = evaluate(model, tok, questions, fmt, cached, cfg, topk=3, batch_size=B)
        hits = cached.hits
        cached.close()
    return {
        "questions": n,
        "batch_size": B,
        "repeats": args.repeat,
        "batched_questions_per_s": round(n / t_bat, 3),
        "sequential_questions_per_s": round(n / t_seq, 3),
        "speedup": round(t_seq / t_bat, 2),
        "speedup_per_repeat": [round(s_[0] / b_[0], 2) for s_, b_ in zip(seq, bat)],
        "speedup_cpu": round(cpu_seq / cpu_bat, 2),
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": t_seq / t_bat >= TARGET_SPEEDUP,
        "plain_batched_questions_per_s": round(n / t_plain, 3),
        "kv_reuse_gain": round(t_plain / t_bat, 2),
        "same_answers_and_queries": f"{same_rows(rows_b, rows_s)}/{n}",
        "same_with_plain_backend": f"{same_rows(rows_b, plain[0][2][1])}/{n}",
        "batched_repeats_identical": all(x[2][1] == rows_b for x in bat),
        "em_batched": round(summary["em"], 4),
        "searches_per_question": round(summary["searches"], 3),
        "cache_retrieve_s_cold": round(cold["perf"]["retrieve_s"], 4),
        "cache_retrieve_s_warm": round(warm["perf"]["retrieve_s"], 4),
        "cache_hits_warm": hits,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, interleaved; the best counts")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    args = p.parse_args()
    res = run(args)
    for k, v in res.items():
        print(f"{k:>30}: {v}")
    if args.json:
        print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
