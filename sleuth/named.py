"""Names a config or a command may use for things a higher package provides: the embedded model
``tiny`` and the toy world behind the data files ``world:train`` / ``world:test`` and
``retrieval.corpus: world``.

The core (models, build, eval, the memory plan) looks these names up here and never imports the
package that provides them: :mod:`sleuth.toy` registers its model and world when it is imported, and
the command line (``sleuth.cli``) imports it. Library code that uses these names imports ``sleuth.toy``
first; otherwise the lookup says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class NamedModel:
    path: Callable[[], Path]  # its model directory (built and cached on first use)
    run_config: Callable[[], Any] | None = None  # the Config it was trained with: eval's protocol defaults


@dataclass(frozen=True)
class NamedWorld:
    questions: Callable[[Any, str], list]  # (config, split) -> the split's questions
    corpus_path: Callable[[Any], Path]  # config -> its corpus file (written once into the cache)
    splits: tuple[str, ...] = ("train", "test")


_MODELS: dict[str, NamedModel] = {}
_WORLD: list[NamedWorld] = []


def register_model(name: str, model: NamedModel) -> None:
    _MODELS[name] = model


def named_model(name: str) -> NamedModel | None:
    """The model registered under ``name`` (``tiny``), or None for any other name or path."""
    return _MODELS.get(name)


PROVIDED_BY = {"tiny": "sleuth.toy"}  # names a package registers when imported (for the error only)


def model_dir(name_or_path: str) -> str:
    """A registered name's model directory (built on first use); any other name or path as given."""
    named = _MODELS.get(name_or_path)
    if named is None and name_or_path in PROVIDED_BY and not Path(name_or_path).exists():
        raise RuntimeError(f"model {name_or_path!r} is registered by {PROVIDED_BY[name_or_path]}: import it first "
                           "(the sleuth command does)")
    return str(named.path()) if named is not None else name_or_path


def registrars() -> list[str]:
    """The modules that registered the names held now: what another process (an asynchronous rollout
    worker) imports to hold the same names."""
    found = [m.path.__module__ for m in _MODELS.values()] + [w.questions.__module__ for w in _WORLD]
    return sorted(set(found))


def register_world(world: NamedWorld) -> None:
    _WORLD[:] = [world]


def named_world() -> NamedWorld:
    """The registered toy world (the package root registers :mod:`sleuth.toy`'s)."""
    if not _WORLD:
        raise RuntimeError("no toy world is registered: import sleuth.toy first (the sleuth command does)")
    return _WORLD[0]
