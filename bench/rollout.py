"""Rollout benchmark: our batched multi-turn loop vs the naive loop of common inference scripts.

    .venv/bin/python bench/rollout.py [--json] [--questions 16] [--data ../shared/data]

Both loops run the same tiny model (2-layer Llama, byte-level BPE, built in-process) on the same
NQ questions, greedy, Search-R1 format, the same retriever (term overlap over a slice of
``wiki_dev.jsonl``, or a built-in toy corpus when the data folder is absent). The model is first
cloned from a scripted policy (search the question, read, answer, eos) so that it really issues
``<search>`` and ``<answer>`` turns; it is not perfect, which is realistic.

* **ours**: ``run_rollouts`` with ``HFBackend``: every question in one batch, KV cache, stop on
  ``</search>`` / ``</answer>`` during decoding, one de-duplicated retrieval call per round.
* **naive** (what Search-R1-style ``infer.py`` scripts do without stopping criteria): one question
  at a time, ``model.generate`` up to 512 new tokens, cut the text after the first ``</search>`` or
  ``</answer>``, retrieve, append the observation to the *text*, re-tokenise, repeat.

Useful tokens are the policy tokens kept in the trajectories (naive: the tokens up to and
including the one that completed the stop tag). Wasted tokens are generated tokens thrown away
(naive: everything after the cut; ours: generated minus kept, measured at the backend). The last
stdout line is the JSON summary; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sleuth.config import RolloutConfig  # noqa: E402
from sleuth.retrieval.memory import InMemoryRetriever  # noqa: E402
from sleuth.rollout.formats import get_format  # noqa: E402
from sleuth.rollout.hf_backend import HFBackend  # noqa: E402
from sleuth.rollout.loop import run_rollouts  # noqa: E402
from sleuth.types import Passage, Question, Segment  # noqa: E402
from tests.helpers.tiny import ScriptedBackend, teach, tiny_model, tiny_tokenizer  # noqa: E402

TARGETS = {"speedup": 5.0, "wasted_tokens_ours": 0}
TOY = [
    ("who wrote hamlet", "William Shakespeare", "Hamlet is a tragedy written by William Shakespeare."),
    ("what is the capital of france", "Paris", "Paris is the capital and largest city of France."),
    ("who painted the mona lisa", "Leonardo da Vinci", "The Mona Lisa is a portrait by Leonardo da Vinci."),
    ("where is mount everest", "Nepal", "Mount Everest lies on the border of Nepal and China."),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_world(data: Path, n: int) -> tuple[list[Question], list[Passage]]:
    """``n`` NQ dev questions and a corpus slice holding passages for them (toy world without data)."""
    qa_path, corpus_path = data / "dev" / "nq.jsonl", data / "corpus" / "wiki_dev.jsonl"
    if not (qa_path.exists() and corpus_path.exists()):
        log(f"{data} not found: using the built-in toy world")
        qs = [Question(f"toy/{i}", q, (a,)) for i, (q, a, _) in enumerate(TOY * (n // len(TOY) + 1))][:n]
        qs = [Question(f"toy/{i}", q.text, q.golden_answers) for i, q in enumerate(qs)]
        return qs, [Passage(f"d{i}", a, t) for i, (_, a, t) in enumerate(TOY)]
    rows = [json.loads(x) for x in qa_path.read_text().splitlines() if x.strip()][:n]
    qs = [Question(f"nq/dev/{r['id']}", r["question"], tuple(r["golden_answers"]), "nq") for r in rows]
    passages = []
    with corpus_path.open() as f:
        for i, line in enumerate(f):
            if i >= 1500:
                break
            p = Passage.from_contents(json.loads(line)["id"], json.loads(line)["contents"])
            passages.append(Passage(p.id, p.title, p.text[:200].rsplit(" ", 1)[0]))  # short: a tiny context
    return qs, passages


def clone_scripted_policy(tok, model, fmt, questions, retriever, cfg) -> float:
    """Clone a scripted policy (search the question, read, answer, eos) from the transcripts of the
    first 8 questions (loss on the policy's tokens only)."""

    def script(context: str, turn: int) -> str:
        q = context.split("Question: ", 1)[1].split("\n")[0].rstrip("?")
        gold = next(x for x in questions if x.text.rstrip("?") == q).golden_answers[0]
        if turn == 0:
            return f"<think> I need to search. </think>\n<search> {q} </search>"
        return f"<think> Found it. </think>\n<answer> {gold} </answer>"

    trajs, _ = run_rollouts(questions[:8], ScriptedBackend(tok, script), tok, fmt, retriever, cfg, k=1)
    for t in trajs:  # the teacher ends its answer with eos (our loop stops at </answer> before it)
        t.segments.append(Segment.sampled([tok.eos_token_id], [0.0]))
    return teach(model, tok, trajs, steps=80, lr=5e-3)


class CountingBackend:
    """Wraps a backend and counts every token it generates (to measure waste)."""

    def __init__(self, inner):
        self.inner, self.generated, self.calls = inner, 0, 0
        self.eos_token_ids = inner.eos_token_ids

    def generate(self, prompts, params, seeds=None, max_new_tokens=None):
        out = self.inner.generate(prompts, params, seeds, max_new_tokens)
        self.generated += sum(len(r.token_ids) for r in out)
        self.calls += 1
        return out

    def session(self):
        """The wrapped backend's round-to-round reuse (the loop enters it when present)."""
        return self.inner.session()


def run_ours(tok, model, fmt, questions, retriever, cfg) -> dict:
    backend = CountingBackend(HFBackend(model, tok))
    t0 = time.perf_counter()
    trajs, m = run_rollouts(questions, backend, tok, fmt, retriever, cfg, k=1, greedy=True)
    seconds = time.perf_counter() - t0
    useful = sum(t.num_sampled_tokens for t in trajs)
    return {
        "seconds": seconds, "useful": useful, "wasted": backend.generated - useful,
        "answered": sum(t.answer is not None for t in trajs), "retrieval_calls": int(m["rollout/retrieval_calls"]),
        "rounds": int(m["rollout/rounds"]), "queries": int(m["rollout/queries"]),
        "distinct_queries": int(m["rollout/distinct_queries"]),
    }  # fmt: skip


@torch.no_grad()
def run_naive(tok, model, fmt, questions, retriever, max_turns: int, max_new: int) -> dict:
    """One question at a time; generate to 512 tokens; cut at the first stop tag; re-tokenise."""
    useful = wasted = calls = answered = 0
    t0 = time.perf_counter()
    for q in questions:
        text = fmt.user_content(q)
        for turn in range(max_turns + 1):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out = model.generate(ids, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
            new = out[0, ids.shape[1] :].tolist()
            kept = _cut_len(tok, new, fmt.stop_sequences)
            useful, wasted = useful + kept, wasted + len(new) - kept
            piece = tok.decode(new[:kept], skip_special_tokens=True)
            action = fmt.parse_action(piece)
            if action.answer is not None or not action.queries or turn == max_turns:
                answered += action.answer is not None
                break
            calls += 1
            results = retriever.search(action.queries, 1)
            text += piece + fmt.render_observation(list(zip(action.queries, results)))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "useful": useful, "wasted": wasted, "answered": answered, "retrieval_calls": calls}


def _cut_len(tok, new: list[int], stops: list[str]) -> int:
    """Tokens up to and including the one that completes the first stop tag (all when none)."""
    text = tok.decode(new)
    hits = [text.find(s) + len(s) for s in stops if s in text]
    if not hits:
        return len(new)
    end = min(hits)
    return next(n for n in range(1, len(new) + 1) if len(tok.decode(new[:n])) >= end)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON summary on stdout")
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--naive-max-new", type=int, default=512)
    args = ap.parse_args()

    tok, fmt = tiny_tokenizer(), get_format("search_r1")
    questions, passages = load_world(args.data, args.questions)
    retriever = InMemoryRetriever(passages)
    cfg = RolloutConfig(group_size=1, max_turns=2, max_tokens_per_turn=512, max_obs_tokens=512,
                        max_context_tokens=4096, use_chat_template=False)  # fmt: skip
    model = tiny_model(tok, seed=0)
    t0 = time.perf_counter()
    loss = clone_scripted_policy(tok, model, fmt, questions, retriever, cfg)
    log(f"cloned the scripted policy in {time.perf_counter() - t0:.1f}s (loss {loss:.3f})")
    ours = run_ours(tok, model, fmt, questions, retriever, cfg)
    log(f"ours:  {ours}")
    naive = run_naive(tok, model, fmt, questions, retriever, cfg.max_turns, args.naive_max_new)
    log(f"naive: {naive}")
    tps_ours, tps_naive = ours["useful"] / ours["seconds"], naive["useful"] / naive["seconds"]
    summary = {
        "speedup": round(tps_ours / tps_naive, 2),
        "useful_tokens_per_s_ours": round(tps_ours, 1),
        "useful_tokens_per_s_naive": round(tps_naive, 1),
        "wasted_tokens_ours": ours["wasted"],
        "wasted_tokens_naive": naive["wasted"],
        "useful_tokens_ours": ours["useful"],
        "useful_tokens_naive": naive["useful"],
        "answered_ours": ours["answered"],
        "answered_naive": naive["answered"],
        "questions": len(questions),
        "rounds_ours": ours["rounds"],
        "retrieval_calls_ours": ours["retrieval_calls"],
        "retrieval_calls_naive": naive["retrieval_calls"],
        "queries_ours": ours["queries"],
        "distinct_queries_ours": ours["distinct_queries"],
        "targets_met": tps_ours / tps_naive >= TARGETS["speedup"] and ours["wasted"] == 0,
    }
    if not args.json:
        for k, v in summary.items():
            print(f"{k:28s} {v}")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
