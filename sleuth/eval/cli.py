"""``sleuth eval`` and ``sleuth ask`` (thin: parse -> build -> call).

    sleuth eval --model M --data FILE... (--index DIR | --retriever-url URL | --corpus FILE)
                [--max-turns 4] [--topk 3] [--limit N] [--no-search] [--format search_r1]
                [--batch-size 64] [--baseline DIR] [--backend hf|hf_static|vllm] --out DIR [--json]

A Sleuth run directory (or one of its checkpoints) as ``--model`` is evaluated, by default, with the
protocol and budget it was trained with (format, top-k, turns, token budgets, chat template, invalid-turn
budget and final nudge, from its ``config.yaml``); ``tiny`` with the demo's. Flags and ``--set rollout.*``
override them, and what was taken is printed.

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

import dataclasses
import json
import sys
from pathlib import Path

from sleuth.data.qa import QADataError, load_questions
from sleuth.errors import UserError
from sleuth.eval.ask import register_ask
from sleuth.eval.baseline import load_baseline
from sleuth.eval.common import (
    add_model_retrieval_args,
    describe_retriever,
    load_model,
    open_retriever,
    protocol,
    resolve_dtype,
)
from sleuth.eval.defaults import resolve_run_defaults
from sleuth.eval.paired import paired_comparison
from sleuth.eval.report import (
    check_setting,
    is_finished,
    load_published,
    read_finished,
    recorded_prompt_mode,
    render_report,
    results_document,
    row_key,
)
from sleuth.eval.sampled import sampled_figures, sampled_lines
from sleuth.output import output_dir, print_json_line
from sleuth.rollout.chat import prompt_mode


def register(sub) -> None:
    """Add the ``eval`` and ``ask`` commands."""
    p = sub.add_parser("eval", help="evaluate a model on QA sets (EM/F1 per dataset, report.md)")
    add_model_retrieval_args(p)
    p.add_argument("--backend", default=None, choices=["hf", "hf_static", "vllm"],
                   help="generation engine (default: --set rollout.backend, else hf): hf (transformers, our "
                        "decode loop) | hf_static (static KV cache, device sampling; --set rollout.hf_compile=true "
                        "compiles its step) | vllm (a vLLM engine on a CUDA GPU, pip install 'sleuth[gpu]'; engine "
                        "options as --set rollout.vllm_*, e.g. rollout.vllm_gpu_memory_utilization=0.85 when nothing "
                        "else shares the GPU)")
    p.add_argument("--data", nargs="+", required=True, metavar="FILE", help="QA files: jsonl or Search-R1 parquet")
    p.add_argument("--out", required=True, help="output directory (rerun with the same --out to resume)")
    p.add_argument("--limit", type=int, default=None,
                   help="at most N questions per data source of each file: the first N of each source, in "
                        "file order (a merged Search-R1 test.parquet gives N of every dataset)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="rollouts per batched call (default 64): that many questions, or that // N with --samples N "
                        "(a batch's memory grows with its rollouts)")
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
    p.add_argument("--rag", action="store_true",
                   help="retrieval-augmented baseline: the question's top-k passages in the prompt, one answer, no "
                        "search turns (Search-R1's RAG rows)")
    p.add_argument("--samples", type=int, default=1, metavar="N",
                   help="answer each question N times by sampling: pass@k beside the mean over samples, every "
                        "sample written with its reward (for sleuth sft --set sft.source=trajectories)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature with --samples (default 1.0); alone: one sample at it")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.set_defaults(func=_eval)
    register_ask(sub)


def eval_setting(args, rollout_cfg, retr: dict) -> dict:
    """Everything that changes the trajectories; compared on resume."""
    from sleuth.models import resolve_model  # lazy: torch (~2 s) at `sleuth --help`

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
        "topk": None if args.no_search else args.topk,
        "max_turns": 0 if args.no_search or getattr(args, "rag", False) else args.max_turns,
        "data": [str(Path(f).resolve()) for f in args.data], "dtype": args.dtype, "seed": args.seed,
        "greedy": not sampled(args), "rollout": {k: getattr(rollout_cfg, k) for k in keep},
        **({"samples": args.samples, "temperature": sample_temperature(args), **truncation(rollout_cfg)}
           if sampled(args) else {}),
        **({"rag": True} if getattr(args, "rag", False) else {}),  # earlier evals: no key
        **({"backend": args.backend} if getattr(args, "backend", "hf") != "hf" else {}),  # earlier evals: hf
    }  # fmt: skip


def truncation(rcfg) -> dict:
    """A sampled eval's top-p / top-k where they cut the distribution (``--set rollout.top_p`` / ``top_k``); none
    at their defaults, so the setting of an eval sampled without them is what it always was."""
    return {**({"top_p": rcfg.top_p} if rcfg.top_p < 1 else {}), **({"top_k": rcfg.top_k} if rcfg.top_k > 0 else {})}


def generation_backend(args, rcfg) -> str:
    """The engine an eval generates with: ``--backend``, else ``--set rollout.backend`` (its default: hf)."""
    return args.backend or rcfg.backend


def sampled(args) -> bool:
    """Whether the eval samples (``--samples`` > 1 or a ``--temperature``) instead of decoding greedily."""
    return getattr(args, "samples", 1) > 1 or getattr(args, "temperature", None) is not None


def sample_temperature(args) -> float:
    return 1.0 if args.temperature is None else args.temperature


def load_eval_questions(args):
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
    from sleuth.eval.evaluate import evaluate  # lazy: pydantic (~0.2 s) at `sleuth --help`
    from sleuth.eval.judge import LLMJudge  # lazy: httpx (~0.1 s) at `sleuth --help`
    from sleuth.eval.metrics import EvalPerf, summarize  # lazy: numpy at `sleuth --help`

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    resolve_run_defaults(args)
    resolve_dtype(args, args.out)  # before the setting is recorded (a resumed eval keeps the dtype it ran in)
    if bool(args.judge_url) != bool(args.judge_model):
        raise UserError("--judge-url and --judge-model go together")
    if args.samples < 1 or (args.temperature is not None and args.temperature <= 0):
        raise UserError(f"--samples must be >= 1 and --temperature > 0 (got {args.samples}, {args.temperature}); "
                        "greedy decoding is the default without them")
    if args.rag and args.no_search:
        raise UserError("--rag and --no-search are two baselines (passages in the prompt, or none): give one")
    if sampled(args) and args.baseline:
        raise UserError("--baseline pairs greedy evals question by question; run the sampled eval without it")
    rcfg, fmt = protocol(args)
    args.backend = generation_backend(args, rcfg)
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
    n = args.samples if sampled(args) else 1
    keys = {q.id: [f"{q.id}#{s}" for s in range(n)] if sampled(args) else [q.id] for q in questions}
    todo = [q for q in questions if not all(k in finished for k in keys[q.id])]
    print(f"sleuth eval: {len(questions)} questions, {len(questions) - len(todo)} already done in {out}",
          file=sys.stderr)  # fmt: skip
    judge = LLMJudge(args.judge_url, args.judge_model) if args.judge_url else None
    perf = EvalPerf()  # nothing left to run: zeros
    prompts = recorded_prompt_mode(out)  # how the prompts were written: said by the tokenizer when one loads
    if todo:
        retriever = open_retriever(args, retr, cache=not args.no_cache, cache_dir=args.cache_dir, probe=True)
        if args.backend == "vllm":
            model, (tok, backend) = None, vllm_engine(args, rcfg)
        else:
            from sleuth.rollout.hf_static import hf_backend  # lazy: torch, transformers (~2 s) at `sleuth --help`

            model, tok = load_model(args)
            backend = hf_backend(model.eval(), tok, dataclasses.replace(rcfg, backend=args.backend))
        prompts = prompt_mode(tok, rcfg.use_chat_template)

        def append(rows: list[dict]) -> None:
            """Store the finished rows; a row with a failed search is not finished (a rerun retries it)."""
            with traj_path.open("a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows if is_finished(r)))

        summary_new, new_rows = evaluate(model, tok, todo, fmt, retriever, rcfg, topk=args.topk,
                                         batch_size=args.batch_size, no_search=args.no_search, rag=args.rag,
                                         seed=args.seed,
                                         backend=backend, judge=judge, on_batch=append, progress=True,
                                         samples=n, temperature=sample_temperature(args) if sampled(args) else None)
        if args.backend == "vllm":
            backend.close()
        perf = summary_new.perf
        finished.update({row_key(r): r for r in new_rows})
    rows = [finished[k] for q in questions for k in keys[q.id]]
    if judge is not None:
        missing = [r for r in rows if "judge" not in r]
        if missing:
            judge.judge_rows(missing)
    summary = summarize(rows)
    summary.perf = perf
    if baseline is not None and baseline["rows"]:
        baseline["paired"] = paired_comparison(rows, baseline["rows"], seed=args.seed)
    figures = sampled_figures(rows, n, sample_temperature(args)) if sampled(args) else None
    _write_outputs(args, out, summary, setting, baseline, [q.id for q in questions], figures, prompts)
    return 0


def vllm_engine(args, rcfg):
    """``(tokenizer, VLLMBackend)`` on ``--model`` for ``--backend vllm`` (its weights loaded by vLLM);
    clear errors where vLLM cannot run or cannot read the model."""
    from sleuth.models import load_tokenizer, resolve_model  # lazy: torch (~2 s) at `sleuth --help`
    from sleuth.rollout.vllm_backend import VLLMBackend, require_vllm  # lazy: only --backend vllm needs it

    if args.model == "tiny":
        raise UserError("--backend vllm: the embedded 'tiny' model runs on --backend hf")
    require_vllm("--backend vllm")
    src = resolve_model(args.model)
    if src.gguf_file:
        raise UserError(f"--backend vllm: {args.model!r} is a GGUF file; give a model directory or hub name, "
                        "or use --backend hf")
    tok = load_tokenizer(src)
    engine = VLLMBackend(src.path, dtype=args.dtype, seed=args.seed, max_model_len=rcfg.max_context_tokens,
                         gpu_memory_utilization=rcfg.vllm_gpu_memory_utilization,
                         tensor_parallel_size=rcfg.vllm_tensor_parallel_size, enforce_eager=rcfg.vllm_enforce_eager)
    return tok, engine


def budget_warnings(summary, share: float = 0.25) -> list[str]:
    """What the figures alone would hide: stop reasons that say the budget, not the model, decided
    many questions; searches that failed; judge calls that failed (all also in report.md).
    ``summary``: an ``EvalSummary`` or a ``results.json`` summary (read the same way)."""
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


def _write_outputs(args, out: Path, summary, setting: dict, baseline: dict | None, ids: list[str],
                   sampled_fig: dict | None = None, prompts: str | None = None) -> None:
    """``results.json``, ``report.md``, the summary line and (``--json``) the JSON line."""
    published = None if args.no_compare else load_published()
    doc = results_document(summary, setting, published, baseline, question_ids=ids, prompt_mode=prompts)
    report = render_report(summary, setting, published, baseline, prompts=prompts)
    if sampled_fig is not None:  # the pass@k section after the comparison table
        doc["sampled"] = sampled_fig
        head, sep, rest = report.partition("## Setting")
        report = head + "\n".join(sampled_lines(sampled_fig)) + "\n" + sep + rest
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    (out / "report.md").write_text(report)
    count = f"{len(ids)} questions" + (f" x {sampled_fig['samples']} samples" if sampled_fig else "")
    print(f"EM {summary.em:.3f}  F1 {summary.f1:.3f}  cover-EM {summary.cover_em:.3f}  "
          f"searches {summary.searches:.2f}  ({count}) -> {out / 'report.md'}")
    for warning in budget_warnings(summary):
        print(f"warning: {warning}", file=sys.stderr)
    if baseline is not None:
        b = baseline["summary"]
        print(f"baseline ({doc['baseline']['label']}): EM {b['em']:.3f}  F1 {b['f1']:.3f}  "
              f"(this run {summary.em - b['em']:+.3f} EM)")
    if args.json:
        line = {
            "n": summary.n, "em": summary.em, "f1": summary.f1, "cover_em": summary.cover_em,
            "retrieval_errors": summary.retrieval_errors,
            "by_source": {src: {k: s[k] for k in ("n", "em", "f1", "cover_em", "searches")}
                          for src, s in summary.by_source.items()},
        }  # fmt: skip
        if sampled_fig is not None:
            line["sampled"] = sampled_fig
        if baseline is not None:
            fig = doc["baseline"]["summary"]
            line["baseline"] = {"dir": baseline["dir"], "em": fig["em"], "f1": fig["f1"],
                                "by_source": {src: {"em": s["em"], "f1": s["f1"]}
                                              for src, s in fig["by_source"].items()},
                                "paired": baseline.get("paired")}  # fmt: skip
        print_json_line(line)
