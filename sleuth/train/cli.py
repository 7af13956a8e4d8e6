"""``sleuth train --config FILE [--set dotted.key=value …] --out DIR [--resume | --overwrite]``.

A new run never writes over an earlier one in ``--out``: ``--resume`` continues it, ``--overwrite``
replaces it. The run records its settings in ``--out``'s ``config.yaml``; when that file is the
``--config`` given (a config kept in the run directory), it is never written over: it already holds
the settings and is kept as is, and a ``--set`` that would change them is refused before anything
runs (put the change into the file instead)."""

from __future__ import annotations

from sleuth.errors import ConfigError
from sleuth.output import print_json_line


def _run(args) -> int:
    # lazy: `sleuth --help` imports this module; these load pydantic and torch (2.6 s against 0.12 s)
    from sleuth.config_file import load_config
    from sleuth.train import distributed as par  # lazy: torch
    from sleuth.train.loop import Trainer  # lazy: torch, transformers
    from sleuth.train.rundir import check_config_not_rewritten  # lazy: pydantic

    cfg = load_config(args.config, args.set)
    if args.plan:
        return _print_plan(cfg, args.json)
    if not args.out:
        raise ConfigError("sleuth train: --out DIR is required (the run directory), except with --plan")
    check_config_not_rewritten(args.config, args.out, cfg)
    if par.init_distributed(cfg.rollout.workers).role == "rollout":  # rollout.workers: a generating rank
        return _serve_rollouts(cfg, args.out)
    trainer = None
    try:
        trainer = Trainer(cfg, args.out, resume=args.resume, overwrite=args.overwrite, progress=not args.json)
        last = trainer.run()
        if args.json and trainer.ctx.is_main:
            keep = {k: v for k, v in last.items()
                    if k.startswith(("reward/", "eval/", "algo/loss", "rollout/searches"))}
            print_json_line({"step": trainer.step, "out": str(args.out), **keep})
    finally:
        if trainer is not None:
            trainer.close()  # a vLLM engine goes while the process group is alive
        del trainer  # its (sharded) models go before the process group: see par.shutdown
        par.shutdown()
    return 0


def _serve_rollouts(cfg, out) -> int:
    from sleuth.config_file import validate  # lazy: pydantic
    from sleuth.train import distributed as par  # lazy: torch
    from sleuth.train.rollout_ranks import serve_rollouts  # lazy: torch, transformers
    from sleuth.train.state import check_parallel_settings, seed_everything, set_determinism  # lazy: torch

    try:
        cfg, ctx = validate(cfg), par.init_distributed(cfg.rollout.workers)
        check_parallel_settings(cfg, ctx)  # what the training ranks refuse, refused here too
        seed_everything(cfg.train.seed)
        set_determinism(cfg, ctx)  # the training ranks' matmul settings
        serve_rollouts(cfg, out, ctx)
    finally:
        par.shutdown()
    return 0


def add_run_arguments(p, *, example: str, out_required: bool = True) -> None:
    """The flags every run command shares (``sleuth train``, ``sleuth sft``): --config, --set, --out,
    --resume, --overwrite, --json; ``example`` is a --set shown in the help."""
    p.add_argument("--config", help="YAML config (see configs/); defaults when omitted")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config value, e.g. --set {example} (repeatable)")
    p.add_argument("--out", required=out_required, help="run directory (metrics, samples, checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run in --out (its metrics and checkpoints are deleted)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a search agent with RL (GRPO, PPO, REINFORCE++, RLOO)")
    add_run_arguments(p, example="train.total_steps=10", out_required=False)
    p.add_argument("--plan", action="store_true",
                   help="print the memory plan (expected peak memory per rank) and exit; --out is then optional")
    p.set_defaults(func=_run)


def _print_plan(cfg, as_json: bool) -> int:
    """``--plan``: the memory plan of ``cfg`` on this machine's device, under torchrun's world size."""
    import os

    from sleuth.models import pick_device  # lazy: torch
    from sleuth.train.memory_plan import advice, plan_for  # lazy: torch, transformers

    world = cfg.rollout.workers or int(os.environ.get("WORLD_SIZE", "1"))  # rollout.workers: the training ranks
    plan = plan_for(cfg, world, pick_device(cfg.model.device))
    print(plan.table())
    if not plan.fits():
        print("does not fit: " + advice(plan, cfg))
    if as_json:
        print_json_line({"peak_bytes": plan.peak, "rollout_bytes": plan.rollout, "update_bytes": plan.update,
                         "capacity_bytes": plan.capacity, "fits": plan.fits(), "items": plan.items})
    return 0
