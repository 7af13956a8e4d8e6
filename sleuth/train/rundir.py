"""The run directory's policy: a new run never writes over an earlier one (``--resume`` continues it,
``--overwrite`` replaces it), and ``config.yaml`` records the settings the run uses, written
atomically and never over a file the user gave. Checkpoints are :mod:`sleuth.train.checkpoint`."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml

from sleuth.config import Config
from sleuth.config_file import ConfigError, config_yaml, load_config, to_dict
from sleuth.errors import RunDirError
from sleuth.files import write_text_atomic


def _same_settings(path: Path, cfg) -> bool:
    """Whether the YAML config at ``path`` holds exactly ``cfg``'s settings (defaults filled in)."""
    try:
        return to_dict(load_config(path)) == to_dict(cfg)
    except (ConfigError, OSError):
        return False


def write_run_config(cfg, run_dir: str | Path) -> bool:
    """Record the settings a run uses in ``run_dir/config.yaml`` (read by ``--resume``'s comparison
    and by ``sleuth eval --model RUN``); True when the file was written.

    A file that already holds exactly these settings is left as it is, so a config the user keeps in
    the run directory and passes as ``--config`` keeps its comments and layout (``sleuth train``
    refuses first, in :func:`check_config_not_rewritten`, when ``--set`` would change it). Otherwise
    the file is replaced atomically: written beside it, then renamed over it."""
    path = Path(run_dir) / "config.yaml"
    if path.is_file() and _same_settings(path, cfg):
        return False
    write_text_atomic(path, config_yaml(cfg))
    return True


def check_config_not_rewritten(config_file: str | Path | None, run_dir: str | Path, cfg) -> None:
    """Refuse a run whose ``--config`` is the run directory's own ``config.yaml`` when ``cfg`` (the
    file plus ``--set`` values) differs from it: recording the run's settings would write over the
    user's file (its comments and layout lost, the ``--set`` values written in). Without changes the
    file is simply kept (:func:`write_run_config`)."""
    target = Path(run_dir) / "config.yaml"
    if config_file is None or not target.exists() or not Path(config_file).exists():
        return
    if not os.path.samefile(config_file, target) or _same_settings(target, cfg):
        return
    raise ConfigError(
        f"--config {config_file} is the run directory's config.yaml, where the run records the settings it "
        f"uses; the --set values would be written into it (its comments lost). Put the change into {config_file} "
        "itself instead of --set, or move the file out of the run directory and pass it from there as --config "
        "(the run then writes its own config.yaml)"
    )


def check_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to write a new run over an earlier one: ``--resume`` continues it, ``--overwrite``
    replaces it (its metrics, samples and checkpoints are deleted here)."""
    if out.exists() and not out.is_dir():
        raise RunDirError(f"run directory {out} is a file; give a directory path (--out)")
    logged = [out / "metrics.jsonl", out / "samples.jsonl"]
    earlier = any(p.exists() for p in logged) or any((out / "checkpoints").glob("step_*"))
    if not earlier or resume:
        return
    if not overwrite:
        raise RunDirError(f"{out} already holds a run (metrics.jsonl, checkpoints); --resume continues it, "
                          "--overwrite replaces it, or give another --out")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for p in logged:
        p.unlink(missing_ok=True)


def warn_changed_settings(saved: Path, cfg: Config) -> list[str]:
    """On ``--resume``: the settings that differ from the run's saved ``config.yaml``, printed (the
    run goes on with the new ones: changing, say, ``train.total_steps`` to extend a run is normal)."""
    if not saved.is_file():
        return []
    try:
        before = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        return []
    now = to_dict(cfg)
    changed = [f"{section}.{key}: {old!r} -> {now[section][key]!r}"
               for section, values in before.items() if isinstance(values, dict) and section in now
               for key, old in values.items() if key in now[section] and now[section][key] != old]  # fmt: skip
    if changed:
        print(f"resuming {saved.parent} with changed settings: " + "; ".join(changed), file=sys.stderr)
    return changed
