"""What ``sleuth eval`` and ``sleuth ask`` use when a flag is not given: the protocol and budget the
model was trained with. A Sleuth run directory (or a checkpoint inside it) carries them in its
``config.yaml``; the embedded ``tiny`` model's are the demo's; any other model gets the built-in
defaults (Search-R1 format, top-3, 4 searches). A flag given always wins, and ``--set rollout.*``
overrides what comes from the run.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import yaml

from sleuth.errors import UserError
from sleuth.named import named_model

# Rollout settings a run was trained with; ``eval``/``ask`` on that run default to them.
FLAGGED = ("format", "max_turns", "max_tokens_per_turn", "max_context_tokens")  # eval/ask flags of the same name
SET_ONLY = ("max_obs_tokens", "use_chat_template", "max_invalid", "final_nudge")  # no flag of their own: --set
RUN_ROLLOUT_KEYS = FLAGGED + SET_ONLY
BUILTIN = {"format": "search_r1", "topk": 3, "max_turns": 4}  # defaults for any other model


def _run_config(model: str) -> dict | None:
    """The parsed ``config.yaml`` of a Sleuth run when ``model`` is its directory or a checkpoint
    inside it (up to three levels down); None for anything else (a hub name never reads ./config.yaml)."""
    p = Path(model).resolve()
    if not p.is_dir():
        return None
    for d in [p, *p.parents][:4]:
        cfg = d / "config.yaml"
        if d.is_dir() and cfg.is_file():
            try:
                doc = yaml.safe_load(cfg.read_text())
            except yaml.YAMLError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def run_defaults(model: str) -> dict:
    """The protocol and budget a model was trained with, as ``{"topk": k, "rollout": {key: value}}``
    (only what is known): the embedded ``tiny`` model's are the demo's, a Sleuth run's (or one of its
    checkpoints') come from its ``config.yaml``; other models have none. Evaluating a run under
    another budget (say 3 passages where it was trained on 1) measures something else."""
    named = named_model(model)
    if named is not None and named.run_config is not None:
        cfg = asdict(named.run_config())
    else:
        cfg = _run_config(model) or {}
    rollout, retrieval = cfg.get("rollout"), cfg.get("retrieval")
    out: dict = {"rollout": {}}
    if isinstance(rollout, dict):
        out["rollout"] = {k: rollout[k] for k in RUN_ROLLOUT_KEYS if rollout.get(k) is not None}
    if isinstance(retrieval, dict) and isinstance(retrieval.get("topk"), int):
        out["topk"] = retrieval["topk"]
    return out


def resolve_run_defaults(args) -> dict:
    """Fill the flags left unset (``--format``, ``--topk``, ``--max-turns``, the token budgets): a
    flag given wins, then the model's own setting (:func:`run_defaults`), then the built-in default;
    then check their ranges (a UserError names the flag and the value).
    The run's settings without a flag (:data:`SET_ONLY`: ``max_obs_tokens``, ``use_chat_template``,
    ``max_invalid``, a non-empty ``final_nudge``) go in ``args.run_rollout`` (``--set`` still overrides them).
    Returns what was taken from the run, for the user to see."""
    known = run_defaults(args.model)
    rollout = known["rollout"]
    taken: dict = {}
    for key in FLAGGED:
        if getattr(args, key) is None and key in rollout:
            setattr(args, key, rollout[key])
            taken[key] = rollout[key]
    if args.topk is None and "topk" in known:
        args.topk = taken["topk"] = known["topk"]
    for attr in ("format", "topk", "max_turns"):
        if getattr(args, attr) is None:
            setattr(args, attr, BUILTIN[attr])
    for flag, least in (("topk", 1), ("max_turns", 0), ("max_tokens_per_turn", 1), ("max_context_tokens", 1),
                        ("batch_size", 1)):
        value = getattr(args, flag, None)
        if value is not None and value < least:
            raise UserError(f"--{flag.replace('_', '-')} must be >= {least}, got {value}")
    args.run_rollout = {k: rollout[k] for k in SET_ONLY if k in rollout and rollout[k] != ""}
    taken.update(args.run_rollout)
    if taken:
        source = "the demo's setting" if args.model == "tiny" else "the run's config.yaml"
        said = (f"{k} {v!r}" if k == "final_nudge" else f"{k} {v}" for k, v in taken.items())  # a nudge quoted
        print(f"{args.model}: from {source}: " + ", ".join(said) + " (flags and --set override)", file=sys.stderr)
    return taken
