"""``sleuth ask "question" --model M (--index DIR | --retriever-url URL | --corpus FILE)``.

Runs one question through the same rollout loop as training and evaluation (greedy by default)
and streams it: each policy turn is printed as soon as it is generated, each search with the
titles it returned, then the answer. Without a question it reads questions from stdin, one per
line, until EOF or an empty line (interactive mode; the model is loaded once).

Streaming is per turn: :class:`StreamingBackend` prints what the wrapped backend generated for a
turn, :class:`StreamingRetriever` prints each search as it is served. Token-by-token streaming
would need a hook inside the backends' decode loops, which the generation protocol does not have.
"""

from __future__ import annotations

import sys
from typing import TextIO

from sleuth.errors import ConfigError, UserError
from sleuth.eval.common import add_model_retrieval_args, describe_retriever, load_model, open_retriever, protocol
from sleuth.eval.defaults import resolve_run_defaults
from sleuth.output import print_json_line
from sleuth.types import Question


class StreamingBackend:
    """A generation backend that prints every turn's text (the new tokens, decoded) when it is done."""

    def __init__(self, inner, tokenizer, out: TextIO):
        self.inner, self.tokenizer, self.out = inner, tokenizer, out

    @property
    def eos_token_ids(self) -> list[int]:
        return self.inner.eos_token_ids

    def generate(self, prompts, params, seeds=None, max_new_tokens=None):
        results = self.inner.generate(prompts, params, seeds, max_new_tokens)
        for res in results:
            self.out.write(self.tokenizer.decode(res.token_ids, skip_special_tokens=True) + "\n")
            self.out.flush()
        return results


class StreamingRetriever:
    """A retriever that prints each query and the titles of the passages it returned."""

    def __init__(self, inner, out: TextIO):
        self.inner, self.out = inner, out

    def search(self, queries: list[str], k: int):
        for q in queries:
            self.out.write(f"  [search] {q}\n")
        self.out.flush()
        try:
            found = self.inner.search(queries, k)
        except Exception as e:  # the rollout turns it into an observation; show it first
            self.out.write(f"  [search failed] {type(e).__name__}: {e}\n")
            raise
        for ps in found:
            for rank, p in enumerate(ps, 1):
                self.out.write(f"    {rank}. {p.title} [{p.id}]\n")
        self.out.flush()
        return found


def ask_one(text: str, backend, tokenizer, fmt, retriever, rollout_cfg, *, topk: int, qid: str = "ask/0",
            greedy: bool = True, seed: int = 0, out: TextIO | None = None):  # fmt: skip
    """Roll out one question while streaming it to ``out``; returns the trajectory."""
    from sleuth.rollout.loop import run_rollouts  # lazy: pydantic (~0.2 s) at `sleuth --help`

    out = out or sys.stdout
    if not text.strip():
        raise ConfigError("the question is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8, kept by Python as surrogate escapes
        raise ConfigError(f"the question {text!r} is not valid UTF-8 text; give it in UTF-8") from None
    q = Question(id=qid, text=text.strip(), golden_answers=("",), data_source="ask")
    trajs, _ = run_rollouts([q], StreamingBackend(backend, tokenizer, out), tokenizer, fmt,
                            StreamingRetriever(retriever, out), rollout_cfg, seed=seed, k=topk, greedy=greedy,
                            group_size=1)  # fmt: skip
    traj = trajs[0]
    out.write(f"answer: {traj.answer if traj.answer is not None else '(none)'}"
              f"   [{traj.stop_reason.value}, {traj.num_searches} searches]\n")  # fmt: skip
    out.flush()
    return traj


def _questions(args, stdin: TextIO):
    """The question given on the command line, else stdin lines until EOF or an empty line."""
    if args.question is not None:
        yield args.question
        return
    interactive = stdin.isatty()
    while True:
        if interactive:
            print("question> ", end="", file=sys.stderr, flush=True)
        line = stdin.readline()
        if not line or not line.strip():
            return
        yield line.strip()


def _ask(args) -> int:
    from sleuth.eval.evaluate import NoRetriever, NoSearchFormat  # lazy: pydantic (~0.2 s) at `sleuth --help`
    from sleuth.rollout.hf_backend import HFBackend  # lazy: torch (~2 s) at `sleuth --help`

    if args.question is not None and not args.question.strip():
        raise UserError("the question is empty; give a question or none for interactive mode")
    resolve_run_defaults(args)
    rcfg, fmt = protocol(args)
    desc = describe_retriever(args)
    if args.temperature is not None:
        rcfg.temperature = args.temperature
    if args.no_search:
        fmt, rcfg.max_turns, retriever = NoSearchFormat(fmt), 0, NoRetriever()
    else:
        retriever = open_retriever(args, desc)
    model, tok = load_model(args)
    backend = HFBackend(model.eval(), tok)
    last = None
    for i, text in enumerate(_questions(args, sys.stdin)):
        print(f"question: {text}", flush=True)
        last = ask_one(text, backend, tok, fmt, retriever, rcfg, topk=args.topk, qid=f"ask/{i}",
                       greedy=args.temperature is None, seed=args.seed)  # fmt: skip
    if args.json and last is not None:
        print_json_line({"question": last.question.text, "answer": last.answer, "searches": last.num_searches,
                         "queries": last.queries, "stop_reason": last.stop_reason.value})  # fmt: skip
    return 0


def register_ask(sub) -> None:
    """Add the ``ask`` command (called from ``sleuth.eval.cli.register``)."""
    p = sub.add_parser("ask", help="ask a model a question; streams its reasoning, searches and answer")
    p.add_argument("question", nargs="?", default=None,
                   help="the question (omit to read questions from stdin until EOF or an empty line)")
    add_model_retrieval_args(p)
    p.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the last answer as one JSON line")
    p.set_defaults(func=_ask)
