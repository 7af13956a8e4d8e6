"""One place that turns a :class:`sleuth.config.RetrievalConfig` into a Retriever."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path

from sleuth.config import RetrievalConfig
from sleuth.errors import ConfigError
from sleuth.files import cache_root
from sleuth.retrieval.base import Retriever
from sleuth.retrieval.client import RemoteRetriever
from sleuth.retrieval.corpus import parse_row
from sleuth.retrieval.index import META_FILE, build_index, load_index
from sleuth.retrieval.memory import InMemoryRetriever
from sleuth.retrieval.web import make_web_retriever
from sleuth.types import Passage


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def read_passages(corpus: str | Path) -> list:
    """All passages of a small jsonl corpus as ``Passage`` objects (errors name file and line)."""
    out = []
    with open(corpus, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                pid, title, text = parse_row(line, f"{corpus}:{n}")
                out.append(Passage(pid, title, text))
    return out


def bm25_for_corpus(corpus: str | Path, *, show_progress: bool = False) -> Retriever:
    """A BM25 index over ``corpus`` built once and cached by the corpus' content hash."""
    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"retrieval.corpus {corpus} does not exist")
    out = cache_root() / "indexes" / f"bm25-{_file_digest(corpus)}"
    if not (out / META_FILE).exists():
        # Built aside and published by one rename: processes that start together (torchrun ranks,
        # parallel runs) never read a half-written index, whoever wins the race.
        tmp = out.with_name(f"{out.name}.tmp-{uuid.uuid4().hex[:12]}")
        try:
            build_index(corpus, "bm25", tmp, show_progress=show_progress)
            for _ in range(2):
                try:
                    tmp.rename(out)
                    break
                except OSError:
                    if (out / META_FILE).exists():
                        break  # another process published it first
                    shutil.rmtree(out, ignore_errors=True)  # a partial directory left by an interrupted build
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return load_index(out)


def build_retriever(cfg: RetrievalConfig, *, show_progress: bool = False) -> Retriever:
    """``url`` -> HTTP client; ``index_dir`` -> the built index; ``corpus`` -> a cached BM25 index.
    ``query_prefix``/``passage_prefix`` apply to a dense ``index_dir`` only (refused elsewhere)."""
    if cfg.kind == "web":  # a search API; the key from its environment variable (web.MissingAPIKeyError names it)
        return make_web_retriever(cfg.web_provider, base_url=cfg.web_base_url, timeout_s=cfg.timeout_s,
                                  retries=cfg.retries)
    use_url = cfg.kind == "url" or (cfg.url and not cfg.index_dir)
    prefixes = {"query_prefix": cfg.query_prefix, "passage_prefix": cfg.passage_prefix}
    if (use_url or not cfg.index_dir) and any(v is not None for v in prefixes.values()):
        raise ConfigError("retrieval.query_prefix/passage_prefix apply to a dense retrieval.index_dir; a url "
                          "server uses its own index's prefixes and a corpus is indexed with BM25: unset them")
    if use_url:
        if not cfg.url:
            raise ConfigError("retrieval.kind=url needs retrieval.url (e.g. http://127.0.0.1:8000/retrieve)")
        return RemoteRetriever.from_config(cfg)  # bearer token from $SLEUTH_RETRIEVAL_TOKEN
    if cfg.index_dir:
        kind = cfg.kind if cfg.kind in ("bm25", "dense") else None
        return load_index(cfg.index_dir, kind=kind, **prefixes)
    if cfg.corpus:
        if cfg.kind == "memory":
            return InMemoryRetriever(read_passages(cfg.corpus))
        return bm25_for_corpus(cfg.corpus, show_progress=show_progress)
    raise ConfigError("no retriever configured: set retrieval.url, retrieval.index_dir or retrieval.corpus")
