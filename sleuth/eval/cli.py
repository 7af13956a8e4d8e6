"""``sleuth eval`` and ``sleuth ask`` (thin: parse -> build -> call).

    sleuth eval --model M --data FILE... (--index DIR | --retriever-url URL | --corpus FILE)
                [--max-turns 4] [--topk 3] [--limit N] [--no-search] [--format search_r1]
                [--batch-size 64] [--baseline DIR] --out DIR [--json]

A Sleuth run directory (or one of its checkpoints) as ``--model`` is evaluated, by default, with the
protocol and budget it was trained with (format, top-k, turns, token budgets, chat template, from
its ``config.yaml``); ``tiny`` with the demo's. Flags and ``--set rollout.*`` override them, and
what was taken is printed.

Writes ``OUT/setting.json`` (first), ``OUT/trajectories.jsonl`` (appended per finished batch),
then ``OUT/results.json`` and ``OUT/report.md``. Rerunning with the same ``--out`` skips the
question ids already in ``trajectories.jsonl`` (a half-written last line is dropped) and refuses
when the setting differs from the recorded one. ``--limit`` and ``--batch-size`` are not part of
the setting: a rerun with a larger ``--limit`` extends a finished eval; the results always cover
exactly the questions selected by the current invocation. ``--limit N`` takes the first N questions
of each data source of each file (in file order), so a merged file such as Search-R1's
``test.parquet`` (NQ, then TriviaQA, ...) gives N of every dataset, not N of NQ only.

Before any model is loaded, one test search checks the retriever: one that is down (or a mistyped
``--retriever-url``) is a one-line error, exit 2. A question whose search fails during the run is
not stored in ``trajectories.jsonl``: it counts in this run's figures, flagged (``report.md``, a
warning, ``retrieval_errors`` in the ``--json`` line), and a rerun with the same ``--out`` retries it.

``--baseline DIR`` names a finished eval of the same questions (typically the same command with
``--no-search``): ``report.md`` then shows EM and F1 of this run beside the baseline's with the
difference, and ``results.json`` gains the baseline's figures. It is checked before any model is
loaded, and it is not part of the setting, so it can be added to a finished eval by rerunning it::

    sleuth eval --model smollm2 --data nq.jsonl --index IDX --limit 50 --no-search --out ev/direct
    sleuth eval --model smollm2 --data nq.jsonl --index IDX --limit 50 --baseline ev/direct --out ev/search
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from sleuth.eval.defaults import resolve_run_defaults


def add_model_retrieval_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``eval`` and ``ask``: model, retriever, protocol budget."""
    p.add_argument("--model", required=True,
                   help="hub name, local dir, Sleuth run/checkpoint dir, .gguf file, 'smollm2' or 'tiny'")
    p.add_argument("--index", help="index directory written by `sleuth index build`")
    p.add_argument("--retriever-url", help="Search-R1 /retrieve endpoint, e.g. http://127.0.0.1:8000/retrieve")
    p.add_argument("--corpus", help="jsonl corpus, indexed with BM25 on the fly (cached)")
    p.add_argument("--format", default=None,
                   help="protocol format (default: the one the model was trained with for 'tiny' or a Sleuth "
                        "run dir, else search_r1)")
    p.add_argument("--max-turns", type=int, default=None,
                   help="searches executed at most (default: the run's, else 4)")
    p.add_argument("--topk", type=int, default=None, help="passages per search (default: the run's, else 3)")
    p.add_argument("--max-tokens-per-turn", type=int, default=None,
                   help="tokens per policy turn (default: the run's, else 500)")
    p.add_argument("--max-context-tokens", type=int, default=None,
                   help="prompt + response budget (default: the run's, else 4096)")
    p.add_argument("--no-search", action="store_true",
                   help="no-retrieval baseline: direct-answer prompt and max_turns=0 (searches not executed)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--set", action="append", default=[], metavar="rollout.KEY=VALUE",
                   help="override a rollout config value, e.g. --set rollout.max_obs_tokens=256 (repeatable)")


def register(sub) -> None:
    """Add the ``eval`` and ``ask`` commands."""
    p = sub.add_parser("eval", help="evaluate a model on QA sets (EM/F1 per dataset, report.md)")
    add_model_retrieval_args(p)
    p.add_argument("--data", nargs="+", required=True, metavar="FILE", help="QA files: jsonl or Search-R1 parquet")
    p.add_argument("--out", required=True, help="output directory (rerun with the same --out to resume)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N questions per data source of each file: the first N of each source, in "
                        "file order (a merged Search-R1 test.parquet gives N of every dataset)")
    p.add_argument("--batch-size", type=int, default=64, help="questions per batched rollout (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None,
                   help="retrieval cache directory (default $SLEUTH_CACHE or ~/.cache/sleuth)")
    p.add_argument("--no-cache", action="store_true", help="do not cache retrieval results on disk")
    p.add_argument("--judge-url", default=None, help="OpenAI-compatible base URL for the LLM-judge metric")
    p.add_argument("--judge-model", default=None, help="model name for the judge")
    p.add_argument("--no-compare", action="store_true", help="leave the published numbers out of report.md")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="--out of a finished eval of the same questions (e.g. a --no-search run): report "
                        "EM/F1 beside it with the difference")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.set_defaults(func=_eval)
    from sleuth.eval.ask import register_ask

    register_ask(sub)


# ---------------------------------------------------------------------------------------------
# Building the pieces (shared with ``ask``)
# ---------------------------------------------------------------------------------------------


def rollout_config(args):
    """The RolloutConfig of an eval/ask invocation: defaults, the run's own settings, flags, then
    ``--set rollout.*`` (call :func:`resolve_run_defaults` first)."""
    from sleuth.errors import UserError
    from sleuth.config import ConfigError, load_config

    bad = [s for s in args.set if not s.startswith("rollout.")]
    if bad:
        raise UserError(f"--set here only takes rollout.* keys, got {bad}")
    extra = [f"rollout.{k}={v}" for k, v in getattr(args, "run_rollout", {}).items()]
    extra += [f"rollout.max_turns={args.max_turns}", f"rollout.format={args.format}"]
    if args.max_tokens_per_turn is not None:
        extra.append(f"rollout.max_tokens_per_turn={args.max_tokens_per_turn}")
    if args.max_context_tokens is not None:
        extra.append(f"rollout.max_context_tokens={args.max_context_tokens}")
    try:
        return load_config(None, extra + list(args.set)).rollout
    except ConfigError as e:
        raise UserError(str(e)) from None


def _sha(path: Path, n: int = 16) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:n]


def describe_retriever(args) -> dict:
    """What the retriever is (for the setting) and its cache fingerprint; no index is opened."""
    from sleuth.errors import UserError

    given = [x for x in ("index", "retriever_url", "corpus") if getattr(args, x)]
    if args.no_search:
        return {"kind": "none", "corpus": "none", "fingerprint": None}
    if len(given) != 1:
        raise UserError("give exactly one of --index DIR, --retriever-url URL or --corpus FILE "
                        f"(got {len(given)}); or --no-search for the no-retrieval baseline")  # fmt: skip
    if args.index:
        from sleuth.retrieval.index import META_FILE, read_meta

        meta = read_meta(args.index)
        fp = "index-" + hashlib.sha256((Path(args.index) / META_FILE).read_bytes()).hexdigest()[:16]
        corpus = f"{Path(meta['corpus']['path']).name} ({meta['n_passages']} passages)"
        kind = meta["kind"] + (f" ({meta['encoder']})" if meta.get("encoder") else "")
        return {"kind": kind, "corpus": corpus, "index": str(Path(args.index).resolve()), "fingerprint": fp}
    if args.corpus:
        path = Path(args.corpus)
        if not path.is_file():
            raise UserError(f"--corpus {path}: no such file")
        return {"kind": "bm25", "corpus": path.name, "corpus_path": str(path.resolve()),
                "fingerprint": f"bm25-corpus-{_sha(path)}"}  # fmt: skip
    return {"kind": "url", "corpus": f"server at {args.retriever_url}", "url": args.retriever_url, "fingerprint": None}


def open_retriever(args, desc: dict, *, cache: bool = False, cache_dir: str | None = None, probe: bool = False):
    """The retriever the flags ask for; behind the on-disk cache when ``cache`` and it has a fingerprint.

    ``probe``: make one test search first (as ``sleuth train`` does), so a retriever that is down or
    a mistyped ``--retriever-url`` is a one-line error (a ``ValueError`` naming it and the flag)
    before any model is loaded, not an eval whose every search failed."""
    from sleuth.config import Config, RetrievalConfig
    from sleuth.retrieval.factory import build_retriever
    from sleuth.build import probe_retriever

    if args.no_search:
        return None
    cfg = RetrievalConfig(kind="url" if args.retriever_url else "bm25", index_dir=args.index,
                          corpus=args.corpus, url=args.retriever_url, topk=args.topk)  # fmt: skip
    if args.index:
        cfg.kind = desc["kind"].split(" ")[0]
    retriever = build_retriever(cfg)  # a URL reads its bearer token from $SLEUTH_RETRIEVAL_TOKEN
    if probe:  # before the cache, which would keep the test query
        flag = "--retriever-url" if args.retriever_url else "--index" if args.index else "--corpus"
        probe_retriever(retriever, Config(retrieval=cfg), fix=flag)
    if cache and desc.get("fingerprint"):
        import os

        from sleuth.eval.evaluate import DiskCachedRetriever

        root = Path(cache_dir or os.environ.get("SLEUTH_CACHE", Path.home() / ".cache" / "sleuth"))
        retriever = DiskCachedRetriever(retriever, root / "retrieval_cache.sqlite", desc["fingerprint"])
    return retriever


def load_model(args):
    """``(model, tokenizer)``; a model that cannot be loaded (offline hub name, broken files) is a
    clear input error, not a traceback."""
    from sleuth.errors import UserError
    from sleuth.models import load_policy

    try:
        return load_policy(args.model, dtype=args.dtype, device=args.device)
    except OSError as e:
        raise UserError(f"could not load model {args.model!r}: {e}") from None


# ---------------------------------------------------------------------------------------------
# The eval command
# ---------------------------------------------------------------------------------------------


def eval_setting(args, rollout_cfg, retr: dict) -> dict:
    """Everything that changes the trajectories; compared on resume."""
    from sleuth.models import resolve_model

    if args.model == "tiny":
        model_id = "tiny"
    else:
        src = resolve_model(args.model)
        model_id = str(Path(src.path).resolve()) if Path(src.path).exists() else src.path
        model_id += f"::{src.gguf_file}" if src.gguf_file else ""
    keep = ("max_tokens_per_turn", "max_obs_tokens", "max_context_tokens", "max_invalid", "use_chat_template",
            "final_nudge")  # fmt: skip
    return {
        "model": args.model, "model_path": model_id, "format": rollout_cfg.format, "no_search": args.no_search,
        "corpus": retr["corpus"], "retriever": retr["kind"], "retriever_fingerprint": retr["fingerprint"],
        "topk": None if args.no_search else args.topk, "max_turns": 0 if args.no_search else args.max_turns,
        "data": [str(Path(f).resolve()) for f in args.data], "dtype": args.dtype, "seed": args.seed,
        "greedy": True, "rollout": {k: getattr(rollout_cfg, k) for k in keep},
    }  # fmt: skip


def load_eval_questions(args):
    from sleuth.errors import UserError
    from sleuth.data.qa import QADataError, load_questions

    questions, seen = [], {}
    for f in args.data:
        try:
            qs = load_questions(f, limit=args.limit)
        except QADataError as e:
            raise UserError(str(e)) from None
        for q in qs:
            if q.id in seen:
                raise UserError(f"question id {q.id!r} is in both {seen[q.id]} and {f}; ids must be unique")
            seen[q.id] = f
        questions += qs
    return questions


def _eval(args) -> int:
    from sleuth.errors import UserError
    from sleuth.output import output_dir
    from sleuth.eval.evaluate import evaluate, summarize
    from sleuth.eval.baseline import load_baseline
    from sleuth.eval.report import check_setting, is_finished, read_finished
    from sleuth.rollout.formats import get_format

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    resolve_run_defaults(args)
    if bool(args.judge_url) != bool(args.judge_model):
        raise UserError("--judge-url and --judge-model go together")
    rcfg = rollout_config(args)
    fmt = get_format(rcfg.format)
    questions = load_eval_questions(args)
    retr = describe_retriever(args)
    setting = eval_setting(args, rcfg, retr)
    out = Path(args.out)
    baseline = None
    if args.baseline:
        if Path(args.baseline).resolve() == out.resolve():
            raise UserError(f"--baseline {args.baseline} is this eval's own --out; give another eval's directory")
        baseline = load_baseline(args.baseline, questions, args.data)
    output_dir(out)
    check_setting(out, setting)
    traj_path = out / "trajectories.jsonl"
    finished = read_finished(traj_path)
    todo = [q for q in questions if q.id not in finished]
    print(f"sleuth eval: {len(questions)} questions, {len(questions) - len(todo)} already done in {out}",
          file=sys.stderr)  # fmt: skip
    judge = None
    if args.judge_url:
        from sleuth.eval.judge import LLMJudge

        judge = LLMJudge(args.judge_url, args.judge_model)
    summary_new = {"perf": {"seconds": 0.0, "questions_per_s": 0.0, "generate_s": 0.0, "retrieve_s": 0.0}}
    if todo:
        retriever = open_retriever(args, retr, cache=not args.no_cache, cache_dir=args.cache_dir, probe=True)
        model, tok = load_model(args)

        def append(rows: list[dict]) -> None:
            """Store the finished rows; a row with a failed search is not finished (a rerun retries it)."""
            with traj_path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows if is_finished(r)))

        summary_new, new_rows = evaluate(model, tok, todo, fmt, retriever, rcfg, topk=args.topk,
                                         batch_size=args.batch_size, no_search=args.no_search, seed=args.seed,
                                         judge=judge, on_batch=append, progress=True)  # fmt: skip
        finished.update({r["id"]: r for r in new_rows})
    rows = [finished[q.id] for q in questions]
    if judge is not None:
        missing = [r for r in rows if "judge" not in r]
        if missing:
            judge.judge_rows(missing)
    summary = summarize(rows)
    summary["perf"] = summary_new["perf"]
    _write_outputs(args, out, summary, setting, baseline, [q.id for q in questions])
    return 0


def budget_warnings(summary: dict, share: float = 0.25) -> list[str]:
    """What the figures alone would hide: stop reasons that say the budget, not the model, decided
    many questions; searches that failed; judge calls that failed (all also in report.md)."""
    out = []
    for reason, flag in (("context_full", "--max-context-tokens"), ("max_tokens", "--max-tokens-per-turn")):
        got = summary.get("stop_reasons", {}).get(reason, 0.0)
        if got >= share:
            out.append(f"{got:.0%} of trajectories stopped at {reason}; {flag} may be too small for this model "
                       "and prompt")
    if summary.get("retrieval_errors"):
        out.append(f"{summary['retrieval_errors']} searches failed in {summary.get('retrieval_error_questions', '?')} "
                   "questions (the model saw an error message instead of passages; their figures are counted "
                   "here, but the rows are not stored as done); check the retriever, then rerun with the same "
                   "--out to retry them")
    if summary.get("judge_failures"):
        out.append(f"{summary['judge_failures']} LLM-judge calls failed; check --judge-url and --judge-model")
    return out


def _write_outputs(args, out: Path, summary: dict, setting: dict, baseline: dict | None, ids: list[str]) -> None:
    """``results.json``, ``report.md``, the summary line and (``--json``) the JSON line."""
    from sleuth.output import print_json_line
    from sleuth.eval.report import load_published, render_report, results_document

    published = None if args.no_compare else load_published()
    doc = results_document(summary, setting, published, baseline, question_ids=ids)
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    (out / "report.md").write_text(render_report(summary, setting, published, baseline))
    print(f"EM {summary['em']:.3f}  F1 {summary['f1']:.3f}  cover-EM {summary['cover_em']:.3f}  "
          f"searches {summary['searches']:.2f}  ({summary['n']} questions) -> {out / 'report.md'}")
    for warning in budget_warnings(summary):
        print(f"warning: {warning}", file=sys.stderr)
    if baseline is not None:
        b = baseline["summary"]
        print(f"baseline ({doc['baseline']['label']}): EM {b['em']:.3f}  F1 {b['f1']:.3f}  "
              f"(this run {summary['em'] - b['em']:+.3f} EM)")
    if args.json:
        line = {
            "n": summary["n"], "em": summary["em"], "f1": summary["f1"], "cover_em": summary["cover_em"],
            "retrieval_errors": summary["retrieval_errors"],
            "by_source": {src: {k: s[k] for k in ("n", "em", "f1", "cover_em", "searches")}
                          for src, s in summary["by_source"].items()},
        }  # fmt: skip
        if baseline is not None:
            fig = doc["baseline"]["summary"]
            line["baseline"] = {"dir": baseline["dir"], "em": fig["em"], "f1": fig["f1"],
                                "by_source": {src: {"em": s["em"], "f1": s["f1"]}
                                              for src, s in fig["by_source"].items()}}  # fmt: skip
        print_json_line(line)
