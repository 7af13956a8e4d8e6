"""``sleuth sft --config FILE [--set key=value …] --out DIR [--resume | --overwrite] [--json]``:
supervised fine-tuning on protocol transcripts (:mod:`sleuth.sft.loop`). The same run-directory
rules as ``sleuth train``: a new run never writes over an earlier one in ``--out``."""

from __future__ import annotations

from sleuth.output import print_json_line
from sleuth.train.cli import add_run_arguments


def _run(args) -> int:
    # lazy: `sleuth --help` imports this module; these load pydantic and torch
    from sleuth.config_file import load_config
    from sleuth.sft.loop import SFTTrainer  # lazy: torch, transformers
    from sleuth.train.rundir import check_config_not_rewritten  # lazy: pydantic

    cfg = load_config(args.config, args.set)
    check_config_not_rewritten(args.config, args.out, cfg)
    trainer = SFTTrainer(cfg, args.out, resume=args.resume, overwrite=args.overwrite, progress=not args.json)
    last = trainer.run()
    if args.json:
        print_json_line({"step": trainer.step, "out": str(args.out), "transcripts": len(trainer.rows),
                         **{k: v for k, v in last.items() if k.startswith("sft/")}})
    return 0


def register(sub) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning on protocol transcripts (a cold start before RL)")
    add_run_arguments(p, example="sft.steps=40")
    p.set_defaults(func=_run)
