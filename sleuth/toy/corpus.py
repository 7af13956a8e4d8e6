"""The toy world's corpus as a file in the cache (what ``retrieval.corpus: world`` indexes), and the
search the pretraining transcripts draw their observations from (the same BM25 index)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from sleuth.files import cache_root
from sleuth.retrieval.factory import bm25_for_corpus
from sleuth.toy.world import World, generate_world
from sleuth.types import Passage


def config_world(cfg) -> World:
    """The toy world a config names (``data.world_seed``, ``data.world_entities``): what the data
    files ``world:train`` / ``world:test`` and ``retrieval.corpus: world`` refer to."""
    return generate_world(cfg.data.world_seed, n_entities=cfg.data.world_entities)


def world_corpus_path(cfg) -> Path:
    """The corpus file of the toy world a config names, written once into the cache."""
    return world_corpus_file(config_world(cfg))


def world_corpus_file(world: World) -> Path:
    """Write ``world``'s corpus once into the cache (``$SLEUTH_CACHE/worlds/<fingerprint>``; one
    rename publishes it, so concurrent callers never read a half-written file) and return its path."""
    out = cache_root() / "worlds" / world.fingerprint()
    if not (out / "corpus.jsonl").exists():
        tmp = out.with_name(out.name + f".tmp-{uuid.uuid4().hex[:12]}")
        world.write(tmp)
        try:
            tmp.rename(out)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / "corpus.jsonl").exists():  # not a race another process won: say what failed
                raise
    return out / "corpus.jsonl"


class WorldSearch:
    """BM25 over a world's passages for the pretraining transcripts' observations: the retrieval
    package's index of :func:`world_corpus_file` (the one ``retrieval.corpus: world`` searches),
    ranked by bm25s' own top-k (:meth:`~sleuth.retrieval.bm25.BM25Retriever.search_bm25s_order`),
    with a query cache: transcripts ask the same few thousand queries over and over. The shipped
    tiny model was pretrained on transcripts drawn in that order; the row order of ``search`` breaks
    ties differently (15 of 3,000 observations), and a model rebuilt on those went from demo EM 0.998 (the shipped one, same machine)
    to 0.442 (measured 2026-11-24, one rebuild)."""

    def __init__(self, world: World):
        self._bm25 = bm25_for_corpus(world_corpus_file(world))
        self._cache: dict[tuple[str, int], list[Passage]] = {}

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        for q in queries:
            if (q, k) not in self._cache:
                self._cache[(q, k)] = self._bm25.search_bm25s_order(q, k)
        return [list(self._cache[(q, k)]) for q in queries]
