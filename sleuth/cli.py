"""The ``sleuth`` command: thin, only parse -> build -> call.

Each command group lives beside the code it drives, in a module with
``register(subparsers) -> None``; that function adds its parser(s) and sets ``func`` (which
receives the parsed ``argparse.Namespace`` and returns an exit code). Heavy imports (torch,
transformers, faiss …) happen inside ``func``, so ``sleuth --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import sleuth.toy  # noqa: F401  registers the embedded 'tiny' model and toy world (sleuth.named)
from sleuth.errors import SleuthError
from sleuth.retrieval.base import RetrieverDownError
from sleuth.train.host_memory import limit_kernel_caches
from sleuth.version import __version__

# Modules that contribute commands, in help order.
COMMAND_MODULES = [
    "sleuth.demo.cli",  # sleuth demo
    "sleuth.reward.cli",  # sleuth reward score
    "sleuth.train.cli",  # sleuth train
    "sleuth.sft.cli",  # sleuth sft
    "sleuth.retrieval.cli",  # sleuth index build, sleuth search
    "sleuth.retrieval.serve_cli",  # sleuth serve
    "sleuth.eval.cli",  # sleuth eval, sleuth ask
    "sleuth.data.cli",  # sleuth data prepare
    "sleuth.view.cli",  # sleuth view
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sleuth",
        description="Train language models with RL to reason and call a search engine.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    limit_kernel_caches()  # before torch's first oneDNN call (sleuth.train.host_memory)
    try:
        return int(args.func(args) or 0)
    except RetrieverDownError as e:  # a retriever that stays down: the message says what happened and what to do
        print(f"sleuth: error: {e}", file=sys.stderr)
        return 1
    except (SleuthError, FileNotFoundError) as e:
        # Errors caused by input (sleuth.errors; a missing file names its path) carry messages that name
        # the input and what to do: one line, exit 2. Anything else is a bug and keeps its traceback.
        print(f"sleuth: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
