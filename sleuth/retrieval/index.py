"""Build and open an index directory: the one entry point other components use.

Layout of ``<out>/``::

    sleuth_build.json  written first: marks the directory as a Sleuth build (finished or not)
    meta.json        kind, corpus (path, sha256, n passages, skipped lines), encoder, its query and
                     passage prefixes, faiss factory + search params, recall@k vs exact, bytes,
                     build seconds, version
    corpus/          the corpus store (memory-mapped Arrow; see sleuth.retrieval.corpus)
    bm25/            bm25s index files (kind bm25 | hybrid)
    dense/           faiss.index + sleuth_dense.json (kind dense | hybrid); embeddings/ cache
                     (chunked .npy, reused when a build is rerun or resumed)

``meta.json`` is written last: a directory with the marker but without it is an unfinished build,
and building again into it resumes from the embedding cache. A build deletes nothing but the parts
above of an earlier Sleuth build of the same directory (:func:`prepare_out`); a finished index is
replaced only with ``overwrite``, and a non-empty directory that is not a Sleuth build is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from sleuth.errors import ConfigError
from sleuth.version import __version__
from sleuth.device import check_device
from sleuth.retrieval.encoder import resolve_encode_dtype
from sleuth.retrieval.base import IndexFileError, Retriever

# The corpus store, BM25, dense and hybrid modules are imported inside the functions that use them
# (each such line says "lazy: sleuth --help start-up"): sleuth.eval.common imports this module at
# `sleuth --help` start-up, and they load pyarrow + numpy (measured ~0.14 s, as much as the rest of
# `sleuth --help`).

KINDS = ("bm25", "dense", "hybrid")
META_FILE = "meta.json"
BUILD_MARKER = "sleuth_build.json"
FORMAT_VERSION = 1
REPLACED_PARTS = ("corpus", "bm25", "dense/faiss.index", "dense/sleuth_dense.json", META_FILE)
"""What a build of a directory replaces (the embedding cache ``dense/embeddings`` is reused)."""


def _is_sleuth_meta(path: Path) -> bool:
    """Whether ``path`` is the meta.json of a Sleuth index (not some other tool's meta.json)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("kind") in KINDS and "format_version" in meta


def prepare_out(out: Path, corpus: str | Path, kind: str, overwrite: bool) -> None:
    """Make ``out`` ready for a build, deleting nothing that is not Sleuth's.

    A missing or empty directory is used as is. A Sleuth index (``meta.json``) is replaced only
    with ``overwrite``; an unfinished Sleuth build (the marker, no meta) is resumed. Any other
    non-empty directory is refused, as is a ``corpus`` that lies inside a part that would be
    replaced. Raises FileExistsError naming the directory and what to do.
    """
    if out.is_dir() and any(out.iterdir()):
        finished = (out / META_FILE).exists()
        if not (_is_sleuth_meta(out / META_FILE) or (out / BUILD_MARKER).is_file()):
            held = ", ".join(sorted(p.name for p in out.iterdir())[:3])
            raise FileExistsError(
                f"--out {out} is not empty (it holds {held} ...) and is not a Sleuth index; nothing in "
                "it was touched. Give a new or empty directory as --out (--overwrite only replaces a "
                "Sleuth index)")
        if finished and not overwrite:
            raise FileExistsError(f"{out} already holds an index ({META_FILE}); "
                                  "choose another --out or pass overwrite (--overwrite)")
        sources = {Path(os.path.abspath(corpus)), Path(corpus).resolve()}  # the path as given, and its target
        for part in REPLACED_PARTS:
            replaced = {Path(os.path.abspath(out / part)), (out / part).resolve()}
            if any(s.is_relative_to(r) for s in sources for r in replaced):
                raise FileExistsError(
                    f"--corpus {corpus} lies inside {out / part}, which building into --out {out} "
                    f"replaces; move the corpus out of {out / part} or choose another --out")
        for part in REPLACED_PARTS:
            path = out / part
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / BUILD_MARKER).write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "kind": kind, "corpus": str(Path(corpus).resolve()),
         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2))


def build_index(
    corpus: str | Path,
    kind: str,
    out: str | Path,
    encoder: str | None = None,
    faiss_factory: str = "auto",
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
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    shard: tuple[int, int] | None = None,
    encode_dtype: str | None = "auto",
) -> dict:
    """Ingest ``corpus`` (jsonl) and build a ``kind`` index in ``out``; return the meta dict.

    ``shard=(i, n)`` (dense only, with a ``cache_dir`` every shard shares): encode only the i-th of n
    interleaved shares of the embedding chunks and stop; ``out`` stays an unfinished build. Once
    every shard has run (other processes, other GPUs), the same build without ``shard`` finds all
    chunks cached, encodes nothing, and builds the index.

    ``encoder`` defaults to all-MiniLM-L6-v2 for dense/hybrid; ``faiss_factory`` is a faiss
    factory string, or ``auto`` (Flat up to 1M passages, then a compressed index); ``cache_dir`` holds the embedding chunks (default ``out/dense/embeddings``).
    ``recall_queries`` are used to measure an approximate index's recall (default: sampled
    passage openings). ``skip_bad`` skips and counts malformed corpus lines instead of failing.
    ``query_prefix``/``passage_prefix`` override the encoder's detected prefixes (None: detect).
    ``encode_dtype``: the encoder's weights while it encodes passages (``auto``: float16 on CUDA).
    ``out`` must be new, empty or an earlier Sleuth build (:func:`prepare_out`).
    """
    from sleuth.retrieval.bm25 import build_bm25  # lazy: sleuth --help start-up
    from sleuth.retrieval.corpus import CorpusStore, ingest_jsonl  # lazy: sleuth --help start-up
    from sleuth.retrieval.dense import build_dense  # lazy: sleuth --help start-up

    if kind not in KINDS:
        raise ConfigError(f"index kind must be one of {KINDS}, got {kind!r}")
    if kind == "bm25" and (query_prefix is not None or passage_prefix is not None):
        raise ConfigError("--query-prefix/--passage-prefix apply to dense and hybrid indexes, not bm25")
    if shard is not None and (kind != "dense" or cache_dir is None):
        raise ConfigError("--shard applies to --kind dense with a --cache-dir that every shard shares "
                          "(the index is built by a last run without --shard)")
    if kind != "bm25":
        check_device(device)  # before the ingest, not after it
        resolve_encode_dtype(encode_dtype, "cpu")  # the same: a bad name fails now
    out = Path(out)
    prepare_out(out, corpus, kind, overwrite)
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
            batch_size=batch_size, device=device, show_progress=show_progress,
            query_prefix=query_prefix, passage_prefix=passage_prefix, shard=shard, encode_dtype=encode_dtype)
        if shard is not None:  # no index yet: nothing more to record
            return {**meta, "shard": list(shard), "dense": meta["dense"]}
        for key in ("encoder", "query_prefix", "passage_prefix", "prefix_source", "faiss_factory",
                    "faiss_search_params", "recall", "encode_dtype"):
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
        raise IndexFileError(f"{path} is not valid JSON ({e}); rebuild the index") from None
    if meta.get("kind") not in KINDS:
        raise IndexFileError(f"{path}: unknown index kind {meta.get('kind')!r} (expected one of {KINDS})")
    return meta


def load_index(index_dir: str | Path, *, kind: str | None = None, device: str | None = None,
               query_prefix: str | None = None, passage_prefix: str | None = None,
               search_devices: list[str] | None = None) -> Retriever:
    """Open an index directory as a ``Retriever``.

    ``kind`` may pick one side of a hybrid index (``bm25`` or ``dense``); by default the kind it
    was built as. ``device`` is the encoder's torch device (default: sentence-transformers' choice).
    Dense queries get the prefix the index was built with; ``query_prefix`` overrides it (with a
    warning when it differs), and a ``passage_prefix`` other than the built one is refused.
    ``search_devices`` (a Flat, SQ or PQ dense index, with or without a PCA/OPQ transform): search
    with torch on these devices, the (decoded) vectors in row shards there
    (:mod:`sleuth.retrieval.torch_flat`), instead of faiss on the CPU.
    """
    from sleuth.retrieval.corpus import CorpusError  # lazy: sleuth --help start-up

    index_dir = Path(index_dir)
    meta = read_meta(index_dir)
    built = meta["kind"]
    kind = kind or built
    if kind not in KINDS or (built != "hybrid" and kind != built):
        raise ConfigError(f"index {index_dir} was built as {built!r}; cannot open it as {kind!r}")
    if kind == "bm25" and (query_prefix is not None or passage_prefix is not None):
        raise ConfigError(f"index {index_dir} is opened as bm25: a query/passage prefix "
                          "(--query-prefix, --passage-prefix, retrieval.*_prefix) applies to dense indexes only")
    if kind != "bm25":
        check_device(device)  # before the corpus store and the index files are read
    try:
        sparse, dense = _open_parts(index_dir, kind, device, query_prefix, passage_prefix, search_devices)
    except (IndexFileError, CorpusError) as e:
        corpus = meta.get("corpus", {}).get("path", "CORPUS.jsonl")
        raise IndexFileError(
            f"index {index_dir} is damaged or incomplete: {e}. Rebuild it: sleuth index build "
            f"--corpus {corpus} --kind {built} --out {index_dir} --overwrite") from None
    if kind == "hybrid":
        from sleuth.retrieval.hybrid import HybridRetriever  # lazy: sleuth --help start-up

        return HybridRetriever(sparse, dense)
    return sparse if sparse is not None else dense


def _open_parts(index_dir: Path, kind: str, device: str | None, query_prefix: str | None,
                passage_prefix: str | None, search_devices: list[str] | None = None):
    """``(bm25 retriever or None, dense retriever or None)`` over the index's corpus store."""
    from sleuth.retrieval.corpus import CorpusStore  # lazy: sleuth --help start-up

    store = CorpusStore(index_dir / "corpus")
    sparse = dense = None
    if kind in ("bm25", "hybrid"):
        from sleuth.retrieval.bm25 import BM25Retriever  # lazy: sleuth --help start-up

        sparse = BM25Retriever(index_dir / "bm25", store)
    if kind in ("dense", "hybrid"):
        from sleuth.retrieval.dense import DenseRetriever  # lazy: sleuth --help start-up

        dense = DenseRetriever(index_dir / "dense", store, device=device, query_prefix=query_prefix,
                               passage_prefix=passage_prefix, search_devices=search_devices)
    return sparse, dense


def describe_prefixes(retriever) -> str | None:
    """A line naming the dense encoder and the prefixes a retriever searches with (None when it
    has no dense part): printed when ``sleuth search`` / ``sleuth serve`` start."""
    from sleuth.retrieval.dense import DenseRetriever  # lazy: sleuth --help start-up

    dense = getattr(retriever, "base", retriever)  # a reranker wraps its base retriever
    dense = getattr(dense, "dense", dense)  # a hybrid holds its dense side
    if not isinstance(dense, DenseRetriever):
        return None
    built = dense.params["query_prefix"]
    how = "as built" if dense.query_prefix == built else f"overridden; the index was built with {built!r}"
    return (f"dense encoder {dense.params['encoder']}: query prefix {dense.query_prefix!r} ({how}), "
            f"passage prefix {dense.passage_prefix!r}")
