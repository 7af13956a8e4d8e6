"""``sleuth data prepare``: FlashRAG-style jsonl -> Search-R1 parquet (see ``sleuth.data.prepare``);
``sleuth data filter``: the questions whose gold answer the retriever finds (see ``sleuth.data.answer_filter``).

    sleuth data prepare --train FILE... --test FILE... --out DIR [--format search_r1] [--json]
    sleuth data prepare --hub --train nq hotpotqa --test nq triviaqa popqa hotpotqa \\
                        2wikimultihopqa musique bamboogle --out DIR      (needs internet)
    sleuth data filter --data FILE (--corpus FILE | --index DIR | --retriever-url URL) [--topk 3]
                       [--out KEPT.jsonl] [--missed MISSED.jsonl] [--limit N] [--json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sleuth.data.qa import QADataError, load_questions
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

_FILTER_DESCRIPTION = """\
Retrieve the top-k passages for each question of FILE (its own text as the query, as `sleuth eval --rag`
does) and test whether a gold answer is in them (DPR's "has answer": normalised substring of a passage's
title and text, as Search-R1's retrieval reward reads its <information> blocks). Prints the share found per
source (the retriever's answer recall at k). --out writes the questions whose answer was found, --missed
the others, as JSON lines (the rows as read); neither ever overwrites a file.
"""


def register(sub) -> None:
    """Add the ``data`` command group (``prepare``, ``filter``)."""
    p = sub.add_parser("data", help="prepare QA data (FlashRAG jsonl -> Search-R1 parquet; filter by answer recall)")
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
    fl = data_sub.add_parser("filter", help="the questions whose gold answer the retriever finds for them "
                                            "(answer recall at k; R1-Searcher-style data selection)",
                             description=_FILTER_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    fl.add_argument("--data", required=True, metavar="FILE", help="QA file (.jsonl, .json or Search-R1 .parquet)")
    fl.add_argument("--corpus", help="jsonl corpus, indexed with BM25 on the fly (cached)")
    fl.add_argument("--index", help="index directory written by `sleuth index build`")
    fl.add_argument("--retriever-url", help="Search-R1 /retrieve endpoint")
    fl.add_argument("--topk", type=int, default=3, help="passages retrieved per question (default 3)")
    fl.add_argument("--out", default=None, metavar="KEPT.jsonl", help="new file for the questions found")
    fl.add_argument("--missed", default=None, metavar="MISSED.jsonl", help="new file for the others")
    fl.add_argument("--limit", type=int, default=None, help="the first N questions of each data source")
    fl.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    fl.set_defaults(func=_filter, no_search=False, web=None)


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


def _filter(args) -> int:
    from sleuth.data.answer_filter import (  # lazy: as above
        answer_found, check_new_file, counts_by_source, write_kept)
    from sleuth.eval.common import describe_retriever, open_retriever  # lazy: the retriever flags' builders

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    if args.topk < 1:
        raise UserError(f"--topk must be >= 1, got {args.topk}")
    if args.out and args.missed and Path(args.out).resolve() == Path(args.missed).resolve():
        raise UserError(f"--out and --missed are the same file {args.out}; give two files")
    for flag, path in (("--out", args.out), ("--missed", args.missed)):
        if path:  # before any retrieval: a bad path is refused at once
            check_new_file(path, flag)
    flags = (("--corpus", args.corpus), ("--index", args.index), ("--retriever-url", args.retriever_url))
    given = [f for f, v in flags if v]
    if len(given) != 1:
        raise UserError(f"give exactly one of --corpus FILE, --index DIR or --retriever-url URL (got {len(given)}: "
                        f"{' '.join(given) or 'none'})")
    try:  # a bad QA file is named before any index is built
        questions = load_questions(args.data, limit=args.limit)
    except QADataError as e:
        raise UserError(str(e)) from None
    desc = describe_retriever(args)
    found = answer_found(questions, open_retriever(args, desc, probe=True), args.topk)
    by_source = counts_by_source(questions, found)
    for source, c in by_source.items():
        print(f"{source}: the answer in the top {args.topk} for {c['found']} of {c['n']} questions "
              f"({c['found'] / c['n']:.1%})")
    summary = {"command": "data filter", "data": args.data, "retriever": desc["kind"], "corpus": desc["corpus"],
               "topk": args.topk, "n": len(questions), "found": sum(found), "by_source": by_source}
    if args.out:
        summary["out"] = args.out
        summary["kept"] = write_kept(args.data, args.out, questions, found)
        print(f"wrote {summary['kept']} questions whose answer was found to {args.out}")
    if args.missed:
        summary["missed"] = args.missed
        summary["missed_written"] = write_kept(args.data, args.missed, questions, [not f for f in found], "--missed")
        print(f"wrote {summary['missed_written']} questions whose answer was not found to {args.missed}")
    if args.json:
        print_json_line(summary)
    return 0
