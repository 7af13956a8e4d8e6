"""Config -> the parts of a run: its questions, retriever, protocol format and reward. The one place
that turns the names a config holds (``world:train``, ``retrieval.corpus: world``, a format or
reward name) into objects. The training loop builds its parts here; ``sleuth eval`` and ``sleuth ask``
take theirs from flags (:mod:`sleuth.eval.common`) and use its start-up probe.

The embedded world is addressed by name so configs stay self-contained: a data file ``world:train``
or ``world:test`` means the toy world's split (seed ``data.world_seed``), and
``retrieval.corpus: world`` its corpus.
"""

from __future__ import annotations

from dataclasses import replace

from sleuth.config import Config
from sleuth.data.qa import PerSourceLimit, load_questions
from sleuth.errors import ConfigError, DataError
from sleuth.retrieval.base import Retriever
from sleuth.retrieval.factory import build_retriever as retriever_from_config
from sleuth.reward import build_reward as reward_from_config
from sleuth.rollout.formats import ProtocolFormat, get_format
from sleuth.named import named_world
from sleuth.types import Question


def load_split(spec: str, cfg: Config, limit: int | None = None) -> list[Question]:
    """Questions of one ``data.*_files`` entry (a file, or ``world:train`` / ``world:test``): the
    first ``data.limit`` of each data source, or the first ``limit`` where that is smaller (the
    rule of every limit: :class:`sleuth.data.qa.PerSourceLimit`)."""
    limits = [n for n in (cfg.data.limit, limit) if n]
    limit = min(limits) if limits else None
    if spec.startswith("world:"):
        split, world = spec.split(":", 1)[1], named_world()
        if split not in world.splits:
            raise DataError(f"data file {spec!r}: the embedded world has splits "
                            f"{' and '.join('world:' + s for s in world.splits)}")
        keep = PerSourceLimit(limit)  # world_1hop and world_2hop
        return [q for q in world.questions(cfg, split) if keep.take(q.data_source)]
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


def build_retriever(cfg: Config) -> Retriever:
    """The run's retriever (``retrieval.*``; ``retrieval.corpus: world`` is the toy world's corpus)."""
    rcfg = cfg.retrieval
    if rcfg.corpus == "world":
        rcfg = replace(rcfg, corpus=str(named_world().corpus_path(cfg)))
    return retriever_from_config(rcfg)


def probe_retriever(retriever, cfg: Config, *, fix: str = "retrieval.*") -> None:
    """One test search before the run, so a retriever that is down or a mistyped URL stops the run
    at once instead of becoming a run of failed searches (counted in ``rollout/retrieval_errors``).
    ``fix`` names what the user sets to point at another retriever (``sleuth eval``: its flag)."""
    try:
        retriever.search(["sleuth start-up check"], 1)
    except Exception as e:  # RetrievalError, OSError, anything the retriever raises
        r = cfg.retrieval
        where = (f"{r.web_provider} {r.web_base_url or ''}".strip() if r.kind == "web"
                 else r.url or r.index_dir or r.corpus)
        raise ConfigError(f"the retriever ({cfg.retrieval.kind}: {where}) failed a test search: {e}; start it "
                          f"(e.g. sleuth serve --index DIR) or fix {fix}") from None


def build_format(cfg: Config) -> ProtocolFormat:
    """The protocol format ``rollout.format`` names."""
    return get_format(cfg.rollout.format)


def train_questions(cfg: Config) -> list[Question]:
    """A run's training questions (``data.train_files``; ``data.limit`` per data source of each)."""
    return load_questions_for(cfg.data.train_files, cfg)


def build_reward(cfg: Config):
    """The reward function ``reward.*`` names: ``reward(response_text, golden_answers) -> float``."""
    return reward_from_config(cfg.reward)
