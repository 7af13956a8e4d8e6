"""``sleuth reward score``: mean EM / cover-EM / F1 of jsonl files of model responses."""

from __future__ import annotations

import argparse

from sleuth.errors import UserError
from sleuth.output import print_json_line

_EPILOG = """\
example:
  sleuth reward score --input runs/nq_val.jsonl --json
  sleuth reward score --input a.jsonl --input b.jsonl \\
      --answers-field reward_model.ground_truth.target --group-by data_source

Each row needs the full model response (text after the prompt) and the gold answers (a string
or a list of strings). A response without <answer>...</answer> scores 0 on all three metrics.
"""


def register(sub) -> None:
    p = sub.add_parser("reward", help="reward utilities (score transcripts)")
    p.set_defaults(func=lambda a: p.print_help() or 2)
    rsub = p.add_subparsers(dest="reward_command", metavar="SUBCOMMAND")
    s = rsub.add_parser(
        "score",
        help="mean EM / cover-EM / F1 of jsonl files of responses",
        description="Mean EM / cover-EM / F1 of jsonl files of model responses, computed as Search-R1 does.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--input", action="append", required=True, metavar="FILE.jsonl",
                   help="jsonl file of rows with a response and gold answers (repeatable)")
    s.add_argument("--response-field", default="response", metavar="PATH",
                   help="field holding the model response; dotted paths allowed (default: response)")
    s.add_argument("--answers-field", default="golden_answers", metavar="PATH",
                   help="field holding the gold answers, e.g. reward_model.ground_truth.target "
                        "(default: golden_answers)")
    s.add_argument("--group-by", default=None, metavar="PATH",
                   help="also report means per value of this field (e.g. data_source)")
    s.add_argument("--no-answer-as", default=None, metavar="TEXT",
                   help="prediction for a response without <answer> tags (default: none, scores 0); "
                        "'Beijing' reproduces Search-R1, which falls back to its prompt's example")
    s.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    s.set_defaults(func=run_score)


def _summary(scores: list, group_by: str | None) -> dict:
    """The JSON result: totals over all files (+ ``by_file`` when several, ``by_group`` if asked)."""
    from sleuth.reward.score_file import Totals  # lazy: see run_score

    total, groups = Totals(), {}
    for fs in scores:
        total.merge(fs.totals)
        for name, t in fs.by_group.items():
            groups.setdefault(name, Totals()).merge(t)
    out: dict = total.means()
    if len(scores) > 1:
        out["by_file"] = {fs.path: fs.totals.means() for fs in scores}
    if group_by is not None:
        out["by_group"] = {name: groups[name].means() for name in sorted(groups)}
    return out


def _print_table(scores: list, summary: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="answer scores (Search-R1 extraction)")
    for col in ("file", "n", "em", "cover_em", "f1", "no answer"):
        table.add_column(col, justify="left" if col == "file" else "right", overflow="fold")

    def row(label: str, m: dict) -> None:
        table.add_row(escape(label), str(m["n"]), f"{m['em']:.4f}", f"{m['cover_em']:.4f}", f"{m['f1']:.4f}",
                      str(m["no_answer"]))

    for fs in scores:
        row(fs.path, fs.totals.means())
    if len(scores) > 1:
        row("all", summary)
    for name, m in summary.get("by_group", {}).items():
        row(f"  group {name}", m)
    Console(highlight=False).print(table)


def run_score(args: argparse.Namespace) -> int:
    # lazy: `sleuth --help` imports this module; the scoring code adds ~40 ms (a third of its start-up)
    from sleuth.reward.score_file import score_file

    if len(set(args.input)) != len(args.input):
        raise UserError(f"an --input file is given twice: {args.input}")
    scores = [
        score_file(p, args.response_field, args.answers_field, args.group_by, args.no_answer_as)
        for p in args.input
    ]
    summary = _summary(scores, args.group_by)
    _print_table(scores, summary)
    if args.json:
        print_json_line(summary)
    return 0
