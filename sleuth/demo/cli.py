"""``sleuth demo [--out DIR] [--json] [--steps N] [--model M] [--set key=value ...]``: the command;
the run itself is :func:`sleuth.demo.run.run_demo`."""

from __future__ import annotations

from sleuth.demo.run import DEMO_STEPS, run_demo
from sleuth.errors import UserError
from sleuth.output import output_dir, print_json_line
from sleuth.toy.recipe import DEMO_WORLD_ENTITIES


def _run(args) -> int:
    for flag, value in (("--steps", args.steps), ("--eval-limit", args.eval_limit)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    out = output_dir(args.out)  # an existing file is refused, naming it, before any work
    result = run_demo(out, steps=args.steps, seed=args.seed, world_seed=args.world_seed,
                      world_entities=args.world_entities, model=args.model,
                      eval_limit=args.eval_limit, progress=not args.json, ablation=not args.no_ablation,
                      overrides=args.set)
    keys = ("base_em", "trained_em", "single_hop_em", "two_hop_em", "no_search_em", "searches_per_question",
            "wall_minutes")
    if args.json:
        print_json_line({k: result[k] for k in keys})
    else:
        for k in keys:
            v = result[k]
            print(f"{k:>24}: {v:.3f}" if isinstance(v, float) else f"{k:>24}: {v}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="watch a tiny model learn to search (toy world, CPU, minutes)")
    p.add_argument("--out", default="runs/demo", help="output directory (report.md, plots, runs)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    p.add_argument("--steps", type=int, default=DEMO_STEPS, help="GRPO steps (each run)")
    p.add_argument("--seed", type=int, default=0, help="seed of the RL runs")
    p.add_argument("--world-seed", type=int, default=0, help="seed of the toy world (the base model serves any)")
    p.add_argument("--world-entities", type=int, default=DEMO_WORLD_ENTITIES,
                   help="size of the toy world in entities (20 to 1100)")
    p.add_argument("--model", default=None,
                   help="a real model instead of the embedded one: hub name, local dir, .gguf file, smollm2 or gemma3-270m")
    p.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N test questions of each kind (single-hop, two-hop)")
    p.add_argument("--no-ablation", action="store_true", help="skip the no-search ablation run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a training setting of both runs, e.g. --set train.lr=1e-3 (repeatable)")
    p.set_defaults(func=_run)
