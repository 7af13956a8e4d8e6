"""The files of an eval directory: ``setting.json`` and ``trajectories.jsonl`` (resume), and
``report.md`` / ``results.json`` with published numbers beside ours.

The main table has the Search-R1 paper's layout: one row per method (ours first, then the
published rows from ``published.json``), one column per dataset in the paper's order (NQ,
TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle; other sources of ours after them) and
``Avg``. Cells are EM in percent. A published row whose setting differs from ours (corpus,
retriever, top-k, turns, model, data) is marked † with the differences listed under the table:
such rows are context, not a like-for-like comparison.

``Avg`` is the macro mean over the row's own datasets (the paper's convention); ``Avg (ours)``
is the mean over the datasets our run has, so published rows can be compared on that subset.

With a baseline (``sleuth eval --baseline DIR``, see :mod:`sleuth.eval.baseline`) a second table
puts EM and F1 of this run beside the baseline's.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sleuth.errors import UserError
from sleuth.eval.baseline import baseline_figures, baseline_lines
from sleuth.eval.tables import DATASETS, DISPLAY, pct, source_columns

if TYPE_CHECKING:  # for annotations only: sleuth.eval.metrics pulls numpy, report.md needs none of it
    from sleuth.eval.metrics import EvalSummary

COMPARED_KEYS = ("model", "corpus", "retriever", "topk", "max_turns")


def load_published(path: str | Path | None = None) -> dict:
    """The published-numbers document (``sleuth/eval/published.json`` unless ``path``)."""
    if path is None:
        text = resources.files("sleuth.eval").joinpath("published.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    doc = json.loads(text)
    for i, e in enumerate(doc.get("entries", [])):
        for key in ("method", "model", "source", "setting", "scores"):
            if key not in e:
                raise ValueError(f"published numbers: entry {i} has no {key!r}")
    return doc


def setting_differences(ours: dict, published: dict) -> list[str]:
    """Human-readable ``key: ours vs theirs`` for every compared setting key that differs."""
    diffs = []
    for key in COMPARED_KEYS:
        mine, theirs = ours.get(key), published.get(key)
        if theirs is not None and str(mine) != str(theirs):
            diffs.append(f"{key}: ours {mine} vs {theirs}")
    return diffs


def comparison_table(summary: EvalSummary, setting: dict, published: list[dict]) -> tuple[list[str], list[str]]:
    """Markdown lines of the main table and the footnotes of the rows marked †."""
    cols = source_columns(summary.by_source)
    theirs = {d for e in published for d in e["scores"]}
    shown = [d for d in DATASETS if d in cols or d in theirs] + [c for c in cols if c not in DATASETS]
    head = ["Method"] + [DISPLAY.get(c, c) for c in shown] + ["Avg", "Avg (ours)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_src = summary.by_source
    ours = [by_src[c].em if c in by_src else None for c in shown]
    macro = summary.macro["em"]
    lines.append("| " + " | ".join([f"**ours** ({setting.get('model')})"] + [pct(x) for x in ours]
                                   + [pct(macro), pct(macro)]) + " |")  # fmt: skip
    notes = []
    for e in published:
        scores = e["scores"]
        diffs = setting_differences(setting, e["setting"] | {"model": e["model"]})
        name = " ".join(x for x in (e["method"], e["model"], e.get("algorithm")) if x)
        mark = ""
        if diffs:
            notes.append(f"{len(notes) + 1}. {name}: " + "; ".join(diffs))
            mark = f" †{len(notes)}"
        on_ours = [scores[c] for c in cols if c in scores]
        avg_ours = sum(on_ours) / len(on_ours) if len(on_ours) == len(cols) and cols else None
        cite = f" [{e['source']} {e.get('table', '')}]".rstrip()
        lines.append("| " + " | ".join([name + cite + mark] + [pct(scores.get(c)) for c in shown]
                                       + [pct(scores.get("avg")), pct(avg_ours)]) + " |")  # fmt: skip
    return lines, notes


def _setting_lines(setting: dict, summary: EvalSummary, prompts: str | None = None) -> list[str]:
    keys = ["model", "format", "no_search", "rag", "corpus", "retriever", "topk", "max_turns", "data", "rollout", "seed"]
    lines = ["| setting | value |", "|---|---|"]
    for k in keys:
        if k in setting:
            v = setting[k]
            lines.append(f"| {k} | {json.dumps(v) if isinstance(v, (dict, list)) else v} |")
        if k == "rollout" and prompts is not None:  # what rollout.use_chat_template came to with this tokenizer
            lines.append(f"| prompts | {prompts} |")
    n = ", ".join(f"{src} {s.n}" for src, s in summary.by_source.items())
    lines.append(f"| n per source | {n} (total {summary.n}) |")
    return lines


def _detail_lines(summary: EvalSummary) -> list[str]:
    judge = summary.judged
    head = ["source", "n", "EM", "cover-EM", "F1", "searches", "turns", "retrieval hit", "tokens"]
    head += ["judge", "judge failures"] if judge else []
    head += ["stop reasons"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in list(summary.by_source.items()) + [("all (micro)", summary)]:
        cells = [name, str(s.n)] + [pct(x) for x in (s.em, s.cover_em, s.f1)]
        cells += [f"{s.searches:.2f}", f"{s.turns:.2f}", pct(s.retrieval_hit), f"{s.tokens:.0f}"]
        if judge:
            cells += [pct(s.judge), str(s.judge_failures or 0)]
        cells.append(", ".join(f"{k} {v:.0%}" for k, v in s.stop_reasons.items()))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def decoding(setting: dict) -> str:
    """How the eval decoded, in words: greedy, or sampled (its temperature and samples a question)."""
    if setting.get("greedy", True):
        return "greedy decoding"
    n = setting.get("samples", 1)
    cut = "".join(f", {name} {setting[k]:g}" for k, name in (("top_p", "top-p"), ("top_k", "top-k")) if k in setting)
    each = f", mean over {n} samples a question" if n > 1 else ""
    return f"sampled at temperature {setting.get('temperature'):g}{cut}{each}"


def render_report(summary: EvalSummary, setting: dict, published_doc: dict | None,
                  baseline: dict | None = None, prompts: str | None = None) -> str:
    """The whole ``report.md``: comparison table, footnotes, the baseline beside this run (when
    given, from :func:`load_baseline`), setting (``prompts``: how they were written, when known), per-source
    details, sources."""
    published = (published_doc or {}).get("entries", [])
    table, notes = comparison_table(summary, setting, published)
    out = [f"# Evaluation: {setting.get('model')}", "", f"Exact match (EM, %), {decoding(setting)}.", ""]
    out += table + [""]
    if notes:
        out += ["† The published row's setting differs from ours, so it is context, not a like-for-like "
                "comparison:", ""] + notes + [""]  # fmt: skip
    if baseline is not None:
        out += baseline_lines(summary, setting, baseline)
    out += ["## Setting", ""] + _setting_lines(setting, summary, prompts) + [""]
    out += ["## Per source", ""] + _detail_lines(summary) + [""]
    if summary.retrieval_errors:
        failed = summary.retrieval_error_questions
        out += [f"**{summary.retrieval_errors} searches failed** in {failed} questions (retrieval errors; the "
                "policy saw an error observation instead of passages). Those questions count in the figures "
                "above but are not stored as done in `trajectories.jsonl`: check the retriever, then rerun the "
                "same command (same `--out`) to retry them.", ""]  # fmt: skip
    perf = summary.perf
    if perf is not None:
        out += [f"Wall time {perf.seconds:.1f} s ({perf.questions_per_s:.2f} questions/s; generate "
                f"{perf.generate_s:.1f} s, retrieve {perf.retrieve_s:.1f} s) for the questions run in the "
                "last invocation.", ""]  # fmt: skip
    if published_doc:
        out += ["## Sources of published numbers", ""]
        for key, src in published_doc.get("sources", {}).items():
            out.append(f"- **{key}**: {src['citation']} ({src.get('url', '')}). {src.get('verified_via', '')}")
        out.append("")
    return "\n".join(out)


def results_document(summary: EvalSummary, setting: dict, published_doc: dict | None,
                     baseline: dict | None = None, question_ids: list[str] | None = None,
                     prompt_mode: str | None = None) -> dict:
    """``results.json``: the setting, the summary, the published rows shown beside ours, the
    baseline's figures (when given), the question ids (to check a later ``--baseline`` use) and how the
    prompts were written (``prompt_mode``, when known: :func:`sleuth.rollout.chat.prompt_mode`)."""
    published = (published_doc or {}).get("entries", [])
    compared = [{**e, "differences": setting_differences(setting, e["setting"] | {"model": e["model"]})}
                for e in published]  # fmt: skip
    doc = {"setting": setting, "summary": summary.to_dict(), "published": compared}
    if baseline is not None:
        doc["baseline"] = baseline_figures(summary, baseline)
    if question_ids is not None:
        doc["question_ids"] = list(question_ids)
    if prompt_mode is not None:
        doc["prompt_mode"] = prompt_mode
    return doc


def recorded_prompt_mode(out: Path) -> str | None:
    """How an earlier eval into ``out`` wrote its prompts (its ``results.json``), if it says."""
    try:
        mode = json.loads((out / "results.json").read_text(encoding="utf-8")).get("prompt_mode")
    except (OSError, ValueError, AttributeError):
        return None
    return mode if isinstance(mode, str) else None


def check_setting(out: Path, setting: dict) -> None:
    """Record the setting, or refuse when the one already in ``out`` differs."""
    path = out / "setting.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{path} is not valid JSON ({e}); delete it or use another --out") from None
        diffs = [f"{k}: recorded {old.get(k)!r}, now {setting.get(k)!r}"
                 for k in sorted(set(old) | set(setting)) if old.get(k) != setting.get(k)]  # fmt: skip
        if diffs:
            raise UserError(f"{out} holds an eval with a different setting; use another --out (or delete "
                            f"{out} to start over):\n  " + "\n  ".join(diffs))  # fmt: skip
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(setting, indent=2))


def is_finished(row: dict) -> bool:
    """Whether an eval row is done: none of its searches failed. A row whose search failed shows
    the retriever's error, not the model's skill, so it is not stored and a rerun retries it."""
    return not row.get("retrieval_errors")


def read_finished(path: Path) -> dict[str, dict]:
    """Finished rows (:func:`is_finished`) already in ``trajectories.jsonl`` by :func:`row_key`; rows
    with failed searches (stored by earlier versions) are left for the rerun to retry. Only the
    last line can be cut by a kill (it then lacks its newline): it is dropped, or completed with its
    newline when it parses, and the file rewritten. A bad line elsewhere is an error naming it."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").split("\n")
    tail = lines.pop()  # "" when the file ends with a newline
    rows: dict[str, dict] = {}
    for n, line in enumerate(lines, 1):
        if line.strip():
            row = _parse_row(line)
            if row is None:
                raise UserError(f"{path}:{n}: not a trajectory row; fix or delete the file to start over")
            if is_finished(row):
                rows[row_key(row)] = row
    if tail.strip():
        row = _parse_row(tail)
        kept = [x for x in lines if x.strip()]
        if row is None:
            print(f"sleuth eval: dropping the half-written last line {len(lines) + 1} of {path}", file=sys.stderr)
        else:
            if is_finished(row):
                rows[row_key(row)] = row
            kept.append(tail)
        path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
    return rows


def row_key(row: dict) -> str:
    """A row's key in ``trajectories.jsonl``: its question id, and ``#sample`` for a sampled eval's rows."""
    return row["id"] if "sample" not in row else f"{row['id']}#{row['sample']}"


def _parse_row(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("id"), str) else None

