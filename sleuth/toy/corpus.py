"""The toy world's corpus as a file in the cache (what ``retrieval.corpus: world`` indexes), and the
BM25 the pretraining transcripts search it with."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from sleuth.retrieval.bm25 import BM25Params
from sleuth.toy.world import World, generate_world
from sleuth.types import Passage


def cache_root() -> Path:
    """``$SLEUTH_CACHE`` or ``~/.cache/sleuth``."""
    return Path(os.environ.get("SLEUTH_CACHE") or Path.home() / ".cache" / "sleuth").expanduser()

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
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return out / "corpus.jsonl"


class WorldSearch:
    """BM25 over a world's passages for the pretraining transcripts' observations: bm25s with the
    settings of :mod:`sleuth.retrieval.bm25` (Lucene k1=0.9 b=0.4, English stemmer and stopwords),
    with a query cache. It ranks as the retrieval package's BM25 does except among equal scores,
    where bm25s' own order holds: the shipped tiny model was pretrained on transcripts drawn with it,
    and the retrieval package's order (lower row first) changes 15 of 3,000 sampled observations.
    A model rebuilt on those went from EM 0.995 to 0.442 in the demo (measured 2026-11-24, one
    rebuild), so this stays until the tiny model is rebuilt and re-measured on purpose."""

    def __init__(self, world: World):
        import bm25s  # lazy: only pretraining uses it
        import Stemmer

        params = BM25Params()
        self.passages, self._stemmer = list(world.passages), Stemmer.Stemmer(params.stemmer)
        corpus_tokens = bm25s.tokenize([f"{p.title}\n{p.text}" for p in self.passages], stopwords=params.stopwords,
                                       stemmer=self._stemmer, show_progress=False)
        self._bm25 = bm25s.BM25(method=params.method, k1=params.k1, b=params.b)
        self._bm25.index(corpus_tokens, show_progress=False)
        self._cache: dict[tuple[str, int], list[Passage]] = {}

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        import bm25s  # lazy: only pretraining uses it

        out = []
        for q in queries:
            if (q, k) not in self._cache:
                terms = bm25s.tokenize([q], stopwords="en", stemmer=self._stemmer, return_ids=False,
                                       show_progress=False)
                docs, scores = self._bm25.retrieve(terms, k=min(k, len(self.passages)), show_progress=False)
                self._cache[(q, k)] = [Passage(self.passages[i].id, self.passages[i].title, self.passages[i].text,
                                               float(s)) for i, s in zip(docs[0], scores[0]) if s > 0]
            out.append(self._cache[(q, k)])
        return out
