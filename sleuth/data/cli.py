"""``sleuth data prepare``: FlashRAG-style jsonl -> Search-R1 parquet (see ``sleuth.data.prepare``).

    sleuth data prepare --train FILE... --test FILE... --out DIR [--format search_r1] [--json]
    sleuth data prepare --hub --train nq hotpotqa --test nq triviaqa popqa hotpotqa \\
                        2wikimultihopqa musique bamboogle --out DIR      (needs internet)
"""

from __future__ import annotations

import argparse

from sleuth.data.qa import QADataError
from sleuth.errors import UserError
from sleuth.output import output_dir, print_json_line
from sleuth.rollout.formats import get_format

_DESCRIPTION = """\
Merge QA files into OUT/train.parquet and OUT/test.parquet (Search-R1's schema and prompt).

The dataset and split of a file come from its path: nq/test.jsonl, dev/nq.jsonl or nq_test.jsonl.
Every --train file is train data and every --test file is test data, whatever split its path
names. Files of one dataset under one flag are merged (their ids must differ), with one exception
from Search-R1: when a dataset's test file is given, its dev/val files are not used. No file is
dropped silently: each merge, skipped dev file or train-named test file is printed as a note.
"""


def register(sub) -> None:
    """Add the ``data`` command group (``prepare``); other data subcommands can join it here."""
    p = sub.add_parser("data", help="prepare QA data (FlashRAG jsonl -> Search-R1 parquet)")
    data_sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: p.print_help() or 2)
    pr = data_sub.add_parser("prepare", help="merge train files and test files (test, else dev) into parquet",
                             description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("--train", nargs="+", default=[], metavar="FILE",
                    help="train files, all merged (or dataset names with --hub)")
    pr.add_argument("--test", nargs="+", default=[], metavar="FILE",
                    help="test data files, all merged whatever split their path names, except that a "
                         "dataset's dev files are skipped when its test file is given (see above)")
    pr.add_argument("--out", required=True, help="directory for train.parquet and test.parquet")
    pr.add_argument("--format", default="search_r1", help="protocol format whose prompt goes in the parquet")
    pr.add_argument("--hub", action="store_true",
                    help="--train/--test are FlashRAG dataset names loaded from the Hugging Face hub")
    pr.add_argument("--limit", type=int, default=None, help="the first N questions of each data source of each file")
    pr.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    pr.set_defaults(func=_prepare)


def _prepare(args) -> int:
    from sleuth.data.prepare import prepare  # lazy: sleuth --help start-up (pyarrow)

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    out = output_dir(args.out)
    try:
        summary = prepare(args.train, args.test, out, get_format(args.format), hub=args.hub,
                          limit=args.limit)  # fmt: skip
    except QADataError as e:
        raise UserError(str(e)) from None
    for note in summary["notes"]:
        print(f"note: {note}")
    for part in ("train", "test"):
        if part in summary:
            s = summary[part]
            extra = f" from {s['chosen']}" if "chosen" in s else ""
            print(f"wrote {s['n']} {part} questions to {s['path']}{extra}")
    if args.json:
        print_json_line({"command": "data prepare", **summary})
    return 0
