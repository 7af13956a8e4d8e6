"""A baseline beside this run (``sleuth eval --baseline DIR``).

The baseline is a finished eval of the same questions, typically the same command with
``--no-search`` (the no-retrieval baseline of the Search-R1 paper's "Direct inference" rows).
:func:`load_baseline` reads its ``results.json`` and refuses one run on other questions, naming
what differs; :func:`baseline_lines` is the ``report.md`` section (per source, macro and micro
average: EM and F1 of this run, the baseline's, and the difference in points, with the settings
that differ named); :func:`baseline_figures` is ``results.json["baseline"]``.

This run's figures are an :class:`~sleuth.eval.metrics.EvalSummary`; the baseline's are the
``summary`` of its ``results.json`` as read (a mapping, maybe written by an older version, hence
the ``.get``), or an ``EvalSummary``, which reads the same way.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sleuth.errors import UserError
from sleuth.eval.paired import paired_lines
from sleuth.eval.tables import DISPLAY, pct, source_columns

if TYPE_CHECKING:  # for annotations only: sleuth.eval.metrics pulls numpy, the tables need none of it
    from sleuth.eval.metrics import EvalSummary

BASELINE_KEYS = ("model", "format", "no_search", "rag", "corpus", "retriever", "topk", "max_turns", "rollout")


def setting_label(setting: dict, long: bool = False) -> str:
    """How a run answers: ``no search`` or ``search``; with ``long`` the retrieval budget too,
    e.g. ``search (bm25, top-3, <=4 searches)``."""
    if setting.get("no_search"):
        return "no search (direct answer)" if long else "no search"
    if setting.get("rag"):
        return f"RAG ({setting.get('retriever')}, top-{setting.get('topk')} in the prompt)" if long else "RAG"
    if not long:
        return "search"
    return f"search ({setting.get('retriever')}, top-{setting.get('topk')}, <={setting.get('max_turns')} searches)"


def load_baseline(path: str | Path, questions: list, data_files: list[str]) -> dict:
    """The baseline of a ``--baseline DIR`` eval: ``{"dir", "setting", "summary"}`` from its
    ``results.json``. Refuses (naming what differs) a directory without results or one whose
    questions are not this run's ``questions`` (``Question``s, read from ``data_files``)."""
    base = Path(path)
    res = base / "results.json"
    if not res.is_file():
        raise UserError(f"--baseline {base}: no results.json there; give the --out directory of a finished "
                        "`sleuth eval` (e.g. the same command with --no-search)")  # fmt: skip
    try:
        doc = json.loads(res.read_text(encoding="utf-8"))
        b_setting, b_summary = doc["setting"], doc["summary"]
        missing = [k for k in ("n", "em", "f1", "by_source", "macro") if k not in b_summary]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"--baseline {res}: not a results.json written by `sleuth eval` ({e!r})") from None
    if missing:
        raise UserError(f"--baseline {res}: its summary lacks {missing}; not a results.json of `sleuth eval`")
    diffs = data_differences(questions, data_files, doc)
    if diffs:
        raise UserError(f"--baseline {base} was run on different data than this eval; rerun one of them on the "
                        "same --data and --limit:\n  " + "\n  ".join(diffs))  # fmt: skip
    return {"dir": str(base.resolve()), "setting": b_setting, "summary": b_summary, "rows": _rows(base)}


def _rows(base: Path) -> dict[str, dict]:
    """The baseline's per-question rows by id (its ``trajectories.jsonl``), for the paired comparison;
    empty when the file is not there (a baseline copied without it: the report says so)."""
    path = base / "trajectories.jsonl"
    if not path.is_file():
        return {}
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            rows[r["id"]] = r
    return rows


def data_differences(questions: list, data_files: list[str], doc: dict) -> list[str]:
    """What differs between this run's questions and those of a baseline ``results.json``: the
    question ids it records, or (a results.json without them) the count per data source."""
    ours_files = [Path(f).name for f in data_files]
    theirs_files = [Path(f).name for f in doc["setting"].get("data", [])]
    diffs = [f"data files: this run {ours_files}, baseline {theirs_files}"]
    theirs_ids = doc.get("question_ids")
    if theirs_ids is None:  # written before question ids were recorded: compare counts per source
        ours_n = Counter(q.data_source for q in questions)
        theirs_n = {src: s.get("n") for src, s in doc["summary"]["by_source"].items()}
        diffs += [f"{src}: this run {ours_n.get(src, 0)} questions, baseline {theirs_n.get(src, 0)}"
                  for src in sorted(set(ours_n) | set(theirs_n)) if ours_n.get(src, 0) != theirs_n.get(src, 0)]
        return diffs if len(diffs) > 1 else []
    ours, theirs = {q.id for q in questions}, set(theirs_ids)
    for name, a, b in (("this run", ours, theirs), ("the baseline", theirs, ours)):
        extra = sorted(a - b)
        if extra:
            diffs.append(f"{len(extra)} of {name}'s {len(a)} questions are not in the other run "
                         f"(e.g. {', '.join(extra[:3])})")  # fmt: skip
    return diffs if len(diffs) > 1 else []


def _delta(a, b) -> str:
    if a is None or b is None:
        return "–"
    d = round(100 * (a - b), 1)
    return "0.0" if d == 0 else f"{d:+.1f}"


def baseline_table(summary: EvalSummary, base: Mapping[str, Any], ours_label: str, base_label: str) -> list[str]:
    """Markdown lines: per source, macro and micro average, EM and F1 of this run, the baseline's,
    and this run minus the baseline (points)."""
    if ours_label == base_label:
        ours_label, base_label = "this run", "baseline"
    head = ["Source", "n"] + [h for m in ("EM", "F1") for h in (f"{m} {ours_label}", f"{m} {base_label}", f"Δ {m}")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    b_src = base["by_source"]
    rows = [(DISPLAY.get(c, c), summary.by_source[c], b_src.get(c)) for c in source_columns(summary.by_source)]
    rows.append(("Avg (macro)", summary.macro | {"n": summary.n}, base["macro"]))
    rows.append(("All (micro)", summary, base))
    for name, s, b in rows:
        cells = [name, str(s["n"])]
        for m in ("em", "f1"):
            mine, theirs = s.get(m), (b or {}).get(m)
            cells += [pct(mine), pct(theirs), _delta(mine, theirs)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def baseline_lines(summary: EvalSummary, setting: dict, baseline: dict) -> list[str]:
    """The ``report.md`` section of the baseline: which run it is, what differs, the table."""
    b_setting = baseline["setting"]
    ours_long, base_long = setting_label(setting, long=True), setting_label(b_setting, long=True)
    diffs = [f"{k}: {b_setting.get(k)!r} (this run {setting.get(k)!r})"
             for k in BASELINE_KEYS if b_setting.get(k) != setting.get(k)]  # fmt: skip
    out = [f"## Beside the baseline: {setting_label(setting)} vs {setting_label(b_setting)}", "",
           f"This run: **{ours_long}**, model {setting.get('model')}. Baseline: **{base_long}**, model "
           f"{b_setting.get('model')}, from `{baseline['dir']}` (same questions).", ""]  # fmt: skip
    out += ["Baseline setting where it differs from this run: " + ("; ".join(diffs) if diffs else "none") + ".", ""]
    out += ["EM and F1 in %, Δ = this run − baseline (points).", ""]
    table = baseline_table(summary, baseline["summary"], setting_label(setting), setting_label(b_setting))
    out += table + [""]
    if baseline.get("paired"):
        out += paired_lines(baseline["paired"])
    else:
        out += ["(No paired comparison: the baseline directory holds no trajectories.jsonl.)", ""]
    return out


def baseline_figures(summary: EvalSummary, baseline: dict) -> dict:
    """``results.json["baseline"]``: the baseline's figures and this run minus them."""
    base = baseline["summary"]
    keep = ("n", "em", "f1", "cover_em", "searches")
    figures = {k: base.get(k) for k in keep} | {"macro": base["macro"]}
    figures["by_source"] = {src: {k: s.get(k) for k in keep} for src, s in base["by_source"].items()}

    def minus(a: Mapping, b: Mapping) -> dict:
        return {m: a[m] - b[m] for m in ("em", "f1") if a.get(m) is not None and b.get(m) is not None}

    delta = minus(summary, base) | {"macro": minus(summary.macro, base["macro"])}
    delta["by_source"] = {src: minus(s, base["by_source"][src])
                          for src, s in summary.by_source.items() if src in base["by_source"]}  # fmt: skip
    label = setting_label(baseline["setting"], long=True)
    return {"dir": baseline["dir"], "label": label, "setting": baseline["setting"], "summary": figures, "delta": delta,
            "paired": baseline.get("paired")}
