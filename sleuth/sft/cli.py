"""``sleuth sft --config FILE [--set key=value …] --out DIR [--resume | --overwrite] [--json]``:
supervised fine-tuning on protocol transcripts (:mod:`sleuth.sft.loop`). The same run-directory
rules as ``sleuth train``: a new run never writes over an earlier one in ``--out``."""

from __future__ import annotations

from sleuth.output import print_json_line


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
    p.add_argument("--config", help="YAML config (the sft section, data, retrieval, rollout format); defaults "
                                    "when omitted")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set sft.steps=40 (repeatable)")
    p.add_argument("--out", required=True, help="run directory (transcripts, metrics, checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run in --out (its metrics and checkpoints are deleted)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.set_defaults(func=_run)
