"""``sleuth demo``: the main job on the embedded default, on a laptop CPU, with nothing to download.

    world -> BM25 index -> base model (pretrained once, cached) -> evaluate base
          -> GRPO with search -> evaluate trained
          -> the same GRPO budget with retrieval disabled (ablation) -> evaluate
          -> report (DIR/report.md + PNG plots) and, with --json, one JSON line

``DIR/world`` keeps the world (``corpus.jsonl``, ``train.jsonl``, ``test.jsonl``) and
``DIR/with_search`` the trained run, so ``sleuth ask`` / ``sleuth eval`` can use the trained model
afterwards; the report ends with those two commands.

Every stage is the library's own code path (``Trainer``, ``evaluate``), so the demo is also the
strongest test we have: RL that does not learn here is a bug.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sleuth.demo.report import write_report
from sleuth.toy.recipe import DEMO_WORLD_ENTITIES, demo_config
from sleuth.toy.world import generate_world

if TYPE_CHECKING:  # annotations only: `sleuth --help` imports this module (through eval's defaults)
    from sleuth.eval.metrics import EvalSummary

DEMO_STEPS = 40  # the reward plateaus after ~40 steps (measured: 100 steps add ~nothing)
def _by_hops(summary: EvalSummary) -> dict:
    src = summary.by_source
    return {"single_hop_em": src["world_1hop"].em if "world_1hop" in src else 0.0,
            "two_hop_em": src["world_2hop"].em if "world_2hop" in src else 0.0}


def _stage(msg: str, t0: float) -> None:
    print(f"[{(time.time() - t0) / 60:5.1f} min] {msg}", flush=True)


def run_demo(out: Path, *, steps: int = DEMO_STEPS, seed: int = 0, world_seed: int = 0,
             world_entities: int = DEMO_WORLD_ENTITIES, model: str | None = None, eval_limit: int | None = None,
             progress: bool = True, ablation: bool = True, overrides: list[str] = ()) -> dict:
    """Run the whole demo into ``out``; returns the JSON summary. ``overrides`` are ``--set``
    style ``dotted.key=value`` changes of the training config (both runs). Any world (``world_seed``,
    ``world_entities``) uses the same tiny base model: its names come from the one name inventory
    and pretraining renamed them at random, so the model knows no world's facts."""
    from transformers.utils import logging as hf_logging

    from sleuth.config_file import apply_overrides  # lazy: pydantic (~0.2 s) at `sleuth --help`
    from sleuth.train.loop import Trainer  # lazy: torch (~2 s) at `sleuth --help`

    hf_logging.disable_progress_bar()  # no "Loading weights" bars between the demo's own lines
    t0 = time.time()
    world_args = dict(world_seed=world_seed, world_entities=world_entities)
    apply_overrides(demo_config("tiny", steps=steps, seed=seed, fmt="search_r1", **world_args),
                    list(overrides))  # a bad key fails here, before any work
    world = generate_world(world_seed, n_entities=world_entities)  # bad sizes fail here too
    out.mkdir(parents=True, exist_ok=True)
    world.write(out / "world")  # corpus.jsonl, train.jsonl, test.jsonl: for `sleuth ask` / `sleuth eval` later
    _stage(f"world: {len(world.passages)} passages, {len(world.train)} train / {len(world.test)} test questions", t0)
    if model is None:
        from sleuth.toy.cache import default_tiny_model_path  # lazy: torch (~2 s) at `sleuth --help`

        # the shipped base model (pretraining seed 0) for every world; --seed varies the RL run only
        model_path, fmt = str(default_tiny_model_path()), "search_r1_tiny"
    else:
        model_path, fmt = model, "search_r1"
    _stage(f"base model: {model_path}", t0)
    cfg = demo_config(model_path, steps=steps, seed=seed, fmt=fmt, **world_args)
    if model is not None:
        cfg = replace(cfg, rollout=replace(cfg.rollout, use_chat_template=True, max_tokens_per_turn=200,
                                           max_context_tokens=2048), train=replace(cfg.train, cpu_threads=None))
    if eval_limit:
        cfg = replace(cfg, train=replace(cfg.train, eval_limit=eval_limit))
    cfg = apply_overrides(cfg, list(overrides))

    trainer = Trainer(cfg, out / "with_search", overwrite=True, progress=progress)  # a rerun replaces the demo
    _stage("evaluating the base model (greedy, with search)", t0)
    trainer.evaluate()
    base_summary, base_rows = trainer.last_eval
    _stage(f"base EM {base_summary.em:.3f}; training with search (GRPO, {steps} steps)", t0)
    t_train = time.time()
    trainer.run()
    train_minutes = (time.time() - t_train) / 60
    trained_summary, trained_rows = trainer.last_eval
    _stage(f"trained EM {trained_summary.em:.3f} ({train_minutes:.1f} min of RL)", t0)
    result = {
        "base_em": base_summary.em,
        "trained_em": trained_summary.em,
        **_by_hops(trained_summary),
        "no_search_em": None,
        "searches_per_question": trained_summary.searches,
        "base_searches_per_question": base_summary.searches,
        "base_single_hop_em": _by_hops(base_summary)["single_hop_em"],
        "base_two_hop_em": _by_hops(base_summary)["two_hop_em"],
        "rl_minutes": train_minutes,
    }
    if ablation:
        _stage("ablation: the same GRPO budget with retrieval disabled", t0)
        no_search_cfg = replace(cfg, rollout=replace(cfg.rollout, max_turns=0))
        ablation_trainer = Trainer(no_search_cfg, out / "no_search", overwrite=True, progress=progress)
        ablation_trainer.run()
        result["no_search_em"] = ablation_trainer.last_eval[0].em
        _stage(f"no-search EM {result['no_search_em']:.3f}", t0)
    result["wall_minutes"] = (time.time() - t0) / 60
    try_it = try_commands(out, world.test[0].text)
    write_report(out, result, base=(base_summary, base_rows), trained=(trained_summary, trained_rows),
                 metrics_path=out / "with_search" / "metrics.jsonl", setting={"steps": steps, "model": model_path},
                 try_it=try_it, view_it=view_command(out))
    (out / "result.json").write_text(json.dumps(result, indent=2))
    _stage(f"report: {out / 'report.md'}", t0)
    if progress:
        print(f"ask the trained model: {try_it[0]}", flush=True)
        print(f"browse its curves and trajectories: {view_command(out)}", flush=True)
    return result


def sleuth_command() -> str:
    """How this shell reaches the ``sleuth`` being run: ``sleuth`` when that one is on PATH, else its
    path (``.venv/bin/sleuth`` after ``make demo``), else ``python -m sleuth``."""
    import os
    import shutil
    import sys

    here = Path(sys.executable).parent / "sleuth"
    found = shutil.which("sleuth")
    if found and here.exists() and Path(found).resolve() == here.resolve():
        return "sleuth"
    if here.exists():
        rel = os.path.relpath(here)
        return rel if not rel.startswith("..") else str(here)
    return f"{sys.executable} -m sleuth"


def try_commands(out: Path, question: str) -> list[str]:
    """Shell commands that use the demo's trained model afterwards: ``ask`` one question, ``eval``
    the test split (the run directory carries its protocol and budget, so the figures match)."""
    import shlex

    run, world = shlex.quote(str(out / "with_search")), out / "world"
    corpus, cmd = shlex.quote(str(world / "corpus.jsonl")), sleuth_command()
    return [f"{cmd} ask {shlex.quote(question)} --model {run} --corpus {corpus}",
            f"{cmd} eval --model {run} --data {shlex.quote(str(world / 'test.jsonl'))} --corpus {corpus} "
            f"--out {shlex.quote(str(out / 'eval'))}"]


def view_command(out: Path) -> str:
    """The shell command that opens the demo's runs in ``sleuth view`` (with search, compared with the
    run trained without search)."""
    import shlex

    return f"{sleuth_command()} view {shlex.quote(str(out / 'with_search'))} {shlex.quote(str(out / 'no_search'))}"
