"""Build and open an index directory: the one entry point other components use.

Layout of ``<out>/``::

    meta.json        kind, corpus (path, sha256, n passages, skipped lines), encoder, faiss
                     factory + search params, recall@k vs exact, bytes, build seconds, version
    corpus/          the corpus store (memory-mapped Arrow; see sleuth.retrieval.corpus)
    bm25/            bm25s index files (kind bm25 | hybrid)
    dense/           faiss.index + sleuth_dense.json (kind dense | hybrid); embeddings/ cache
                     (chunked .npy, reused when a build is rerun or resumed)

``meta.json`` is written last: a directory without it is an unfinished build, and building again
into it resumes from the embedding cache.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from sleuth.retrieval.base import Retriever

KINDS = ("bm25", "dense", "hybrid")
META_FILE = "meta.json"
FORMAT_VERSION = 1


def build_index(
    corpus: str | Path,
    kind: str,
    out: str | Path,
    encoder: str | None = None,
    faiss_factory: str = "Flat",
    *,
    faiss_search_params: str | None = None,
    bm25_params=None,
    cache_dir: str | Path | None = None,
    recall_queries: list[str] | None = None,
    skip_bad: bool = False,
    overwrite: bool = False,
    batch_size: int = 64,
    device: str | None = None,
    show_progress: bool = True,
) -> dict:
    """Ingest ``corpus`` (jsonl) and build a ``kind`` index in ``out``; return the meta dict.

    ``encoder`` defaults to all-MiniLM-L6-v2 for dense/hybrid; ``faiss_factory`` is a faiss
    factory string; ``cache_dir`` holds the embedding chunks (default ``out/dense/embeddings``).
    ``recall_queries`` are used to measure an approximate index's recall (default: sampled
    passage openings). ``skip_bad`` skips and counts malformed corpus lines instead of failing.
    """
    from sleuth import __version__
    from sleuth.device import check_device
    from sleuth.retrieval.bm25 import build_bm25
    from sleuth.retrieval.corpus import CorpusStore, ingest_jsonl
    from sleuth.retrieval.dense import build_dense

    if kind not in KINDS:
        raise ValueError(f"index kind must be one of {KINDS}, got {kind!r}")
    if kind != "bm25":
        check_device(device)  # before the ingest, not after it
    out = Path(out)
    if (out / META_FILE).exists():
        if not overwrite:
            raise FileExistsError(f"{out} already holds an index ({META_FILE}); "
                                  "choose another --out or pass overwrite (--overwrite)")
        (out / META_FILE).unlink()
    for sub in ("corpus", "bm25"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "dense" / "faiss.index").unlink(missing_ok=True)
    t0 = time.perf_counter()
    stats = ingest_jsonl(corpus, out / "corpus", skip_bad=skip_bad, show_progress=show_progress)
    store = CorpusStore(out / "corpus")
    meta: dict = {
        "format_version": FORMAT_VERSION, "sleuth_version": __version__, "kind": kind,
        "corpus": {"path": str(Path(corpus).resolve()), "sha256": stats.sha256,
                   "n_passages": stats.n_passages, "n_skipped": stats.n_skipped,
                   "skipped_examples": stats.skipped_examples},
        "n_passages": stats.n_passages,
    }
    if kind in ("bm25", "hybrid"):
        meta.update(build_bm25(store, out / "bm25", bm25_params, show_progress=show_progress))
    if kind in ("dense", "hybrid"):
        meta["dense"] = build_dense(
            store, out / "dense", encoder=encoder, factory=faiss_factory,
            search_params=faiss_search_params, cache_dir=cache_dir, recall_queries=recall_queries,
            batch_size=batch_size, device=device, show_progress=show_progress)
        for key in ("encoder", "faiss_factory", "faiss_search_params", "recall"):
            meta[key] = meta["dense"][key]
    meta["build_seconds"] = round(time.perf_counter() - t0, 2)
    meta["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def read_meta(index_dir: str | Path) -> dict:
    """The ``meta.json`` of an index directory, with clear errors when it is not one."""
    index_dir = Path(index_dir)
    path = index_dir / META_FILE
    if not index_dir.is_dir():
        raise FileNotFoundError(f"index directory {index_dir} does not exist; build one with "
                                "`sleuth index build --corpus FILE --kind bm25 --out DIR`")
    if not path.is_file():
        raise FileNotFoundError(f"{index_dir} has no {META_FILE}: not an index, or its build did not "
                                "finish (rerun `sleuth index build` into it to resume)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); rebuild the index") from None
    if meta.get("kind") not in KINDS:
        raise ValueError(f"{path}: unknown index kind {meta.get('kind')!r} (expected one of {KINDS})")
    return meta


def load_index(index_dir: str | Path, *, kind: str | None = None, device: str | None = None) -> Retriever:
    """Open an index directory as a ``Retriever``.

    ``kind`` may pick one side of a hybrid index (``bm25`` or ``dense``); by default the kind it
    was built as. ``device`` is the encoder's torch device (default: sentence-transformers' choice).
    """
    from sleuth.device import check_device
    from sleuth.retrieval.base import IndexFileError
    from sleuth.retrieval.corpus import CorpusError

    index_dir = Path(index_dir)
    meta = read_meta(index_dir)
    built = meta["kind"]
    kind = kind or built
    if kind not in KINDS or (built != "hybrid" and kind != built):
        raise ValueError(f"index {index_dir} was built as {built!r}; cannot open it as {kind!r}")
    if kind != "bm25":
        check_device(device)  # before the corpus store and the index files are read
    try:
        sparse, dense = _open_parts(index_dir, kind, device)
    except (IndexFileError, CorpusError) as e:
        corpus = meta.get("corpus", {}).get("path", "CORPUS.jsonl")
        raise IndexFileError(
            f"index {index_dir} is damaged or incomplete: {e}. Rebuild it: sleuth index build "
            f"--corpus {corpus} --kind {built} --out {index_dir} --overwrite") from None
    if kind == "hybrid":
        from sleuth.retrieval.hybrid import HybridRetriever

        return HybridRetriever(sparse, dense)
    return sparse if sparse is not None else dense


def _open_parts(index_dir: Path, kind: str, device: str | None):
    """``(bm25 retriever or None, dense retriever or None)`` over the index's corpus store."""
    from sleuth.retrieval.corpus import CorpusStore

    store = CorpusStore(index_dir / "corpus")
    sparse = dense = None
    if kind in ("bm25", "hybrid"):
        from sleuth.retrieval.bm25 import BM25Retriever

        sparse = BM25Retriever(index_dir / "bm25", store)
    if kind in ("dense", "hybrid"):
        from sleuth.retrieval.dense import DenseRetriever

        dense = DenseRetriever(index_dir / "dense", store, device=device)
    return sparse, dense
