"""Building what a run needs from its config: questions, retriever, format, distributed context.

The embedded world is addressed by name so configs stay self-contained: a data file ``world:train``
or ``world:test`` means the toy world's split (seed ``data.world_seed``), and
``retrieval.corpus: world`` its corpus.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from sleuth.config import Config
from sleuth.toy.cache import config_world, world_corpus_path
from sleuth.types import Question


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistContext:
    """Join the process group when launched by ``torchrun`` (gloo on CPU, nccl on GPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return DistContext(dist.get_rank(), dist.get_world_size(), local)


def load_split(spec: str, cfg: Config, limit: int | None = None) -> list[Question]:
    """Questions of one ``data.*_files`` entry (a file, or ``world:train`` / ``world:test``): the
    first ``data.limit`` of each data source, or the first ``limit`` where that is smaller (the
    rule of every limit: :class:`sleuth.data.qa.PerSourceLimit`)."""
    from sleuth.data.qa import PerSourceLimit, load_questions

    limits = [n for n in (cfg.data.limit, limit) if n]
    limit = min(limits) if limits else None
    if spec.startswith("world:"):
        split = spec.split(":", 1)[1]
        if split not in ("train", "test"):
            raise ValueError(f"data file {spec!r}: the embedded world has splits world:train and world:test")
        keep = PerSourceLimit(limit)  # world_1hop and world_2hop
        return [q for q in getattr(config_world(cfg), split) if keep.take(q.data_source)]
    return load_questions(spec, limit=limit)


def load_questions_for(files: list[str], cfg: Config, limit: int | None = None) -> list[Question]:
    """The questions of every file in turn (``limit``, if given, applies to each data source of
    each file)."""
    out: list[Question] = []
    for spec in files:
        out.extend(load_split(spec, cfg, limit))
    return out


def load_eval_questions(cfg: Config) -> list[Question]:
    """A run's evaluation questions: ``train.eval_limit`` applies per data source of each eval
    file, so a run that evaluates on several datasets (several files, or one merged file such as
    Search-R1's ``test.parquet``) reports every one of them, not only the first one's."""
    return load_questions_for(cfg.data.eval_files, cfg, limit=cfg.train.eval_limit)


def build_run_retriever(cfg: Config):
    from sleuth.retrieval.factory import build_retriever

    rcfg = cfg.retrieval
    if rcfg.corpus == "world":
        from dataclasses import replace

        rcfg = replace(rcfg, corpus=str(world_corpus_path(cfg)))
    return build_retriever(rcfg)


def check_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to write a new run over an earlier one: ``--resume`` continues it, ``--overwrite``
    replaces it (its metrics, samples and checkpoints are deleted here)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"run directory {out} is a file; give a directory path (--out)")
    logged = [out / "metrics.jsonl", out / "samples.jsonl"]
    earlier = any(p.exists() for p in logged) or any((out / "checkpoints").glob("step_*"))
    if not earlier or resume:
        return
    if not overwrite:
        raise ValueError(f"{out} already holds a run (metrics.jsonl, checkpoints); --resume continues it, "
                         "--overwrite replaces it, or give another --out")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for p in logged:
        p.unlink(missing_ok=True)


def warn_changed_settings(saved: Path, cfg: Config) -> list[str]:
    """On ``--resume``: the settings that differ from the run's saved ``config.yaml``, printed (the
    run goes on with the new ones: changing, say, ``train.total_steps`` to extend a run is normal)."""
    import sys

    import yaml

    from sleuth.config import to_dict

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


def probe_retriever(retriever, cfg: Config, *, fix: str = "retrieval.*") -> None:
    """One test search before the run, so a retriever that is down or a mistyped URL stops the run
    at once instead of becoming a run of failed searches (counted in ``rollout/retrieval_errors``).
    ``fix`` names what the user sets to point at another retriever (``sleuth eval``: its flag)."""
    try:
        retriever.search(["sleuth start-up check"], 1)
    except Exception as e:  # RetrievalError, OSError, anything the retriever raises
        where = cfg.retrieval.url or cfg.retrieval.index_dir or cfg.retrieval.corpus
        raise ValueError(f"the retriever ({cfg.retrieval.kind}: {where}) failed a test search: {e}; start it "
                         f"(e.g. sleuth serve --index DIR) or fix {fix}") from None


def build_format(name: str):
    from sleuth.rollout.formats import get_format

    return get_format(name)
