"""Dense retrieval: a sentence-transformers encoder + a faiss inner-product index.

* Prefixes (:mod:`sleuth.retrieval.prefixes`): detected from the encoder (e5, bge, a local
  model's sentence-transformers prompts) unless given; those used are recorded in the index, and
  search uses them. The encoder is loaded and queries are encoded by
  :mod:`sleuth.retrieval.encoder`. Embeddings are L2-normalised, so inner product = cosine.
* The faiss index is chosen by a factory string (``Flat``, ``HNSW32``, ``IVF1024,PQ64``, ``SQ8``,
  ``PQ192``, ``OPQ96,PQ96``, ``PCA192,SQ8`` ...) with ``METRIC_INNER_PRODUCT``; polysemous
  training of PQ codes is switched off (:func:`disable_polysemous_training`); search-time knobs
  (``nprobe``, ``efSearch``) go in a ``ParameterSpace`` string (:func:`default_search_params`
  when not given). The meta records ``code_bytes`` per vector (Flat: ``4 * dim``).
* Corpus embeddings are computed in chunks cached as ``.npy`` files
  (:mod:`sleuth.retrieval.embcache`), so an interrupted build resumes where it stopped.
* After an approximate index is built, its recall@k against exact search is measured on sampled
  queries (passage openings unless queries are given) and stored in the index meta.

Query behaviour matches BM25: an empty/blank query returns ``[]`` (counted in
``num_empty_queries``), ``k`` larger than the corpus returns the whole corpus, ``k < 1`` raises.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

# faiss is imported lazily, inside the functions that use it: this module is also imported where
# faiss may be absent (describe_prefixes' isinstance check for BM25 indexes, default_search_params;
# the tests treat faiss as optional).
from sleuth.errors import ConfigError
from sleuth.retrieval.base import IndexFileError, index_file_error
from sleuth.retrieval.bm25 import check_k
from sleuth.retrieval.corpus import CorpusStore
from sleuth.retrieval.embcache import encode_corpus, exact_search
from sleuth.retrieval.encoder import DEFAULT_ENCODER, encode_queries, load_encoder, resolve_encode_dtype
from sleuth.retrieval.prefixes import choose_prefixes, search_query_prefix
from sleuth.types import Passage

INDEX_FILE = "faiss.index"
FLAT_TYPES = ("IndexFlatIP", "IndexFlat")  # exact indexes: their vectors are stored as they are
PARAMS_FILE = "sleuth_dense.json"


AUTO_FLAT_MAX = 1_000_000  # passages: up to here ``auto`` builds Flat (exact); beyond, a compressed index


def resolve_factory(factory: str, n: int, dim: int) -> str:
    """``auto``: Flat (exact) for corpora up to ``AUTO_FLAT_MAX`` passages; larger ones PCAR256,SQ6,
    1/8 of Flat's memory per vector (recall@3 0.959 of Flat's on ``wiki_dev`` with MiniLM,
    docs/benchmarks.md; measured again at each build), or SQ8 (1/4) when vectors have 256 or fewer
    dimensions. Any other string is returned as given."""
    if factory.strip().lower() != "auto":
        return factory
    if n <= AUTO_FLAT_MAX:
        return "Flat"
    return "PCAR256,SQ6" if dim > 256 else "SQ8"


def default_search_params(factory: str) -> str:
    """Search-time faiss parameters used when none are given: nprobe for IVF, efSearch for HNSW."""
    parts = []
    if "IVF" in factory:
        parts.append("nprobe=32")
    if "HNSW" in factory:
        parts.append("efSearch=128")
    return ",".join(parts)


def _faiss_reason(e: RuntimeError) -> str:
    """The last clause of a faiss error ("could not set parameter nprobe"), without the C++ location."""
    return str(e).strip().splitlines()[-1].rsplit(":", 1)[-1].strip()


def new_faiss_index(dim: int, factory: str):
    """An empty, untrained inner-product index for ``factory`` (a ConfigError when it is not valid)."""
    import faiss

    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ConfigError(f"faiss factory string {factory!r} is not valid (--faiss): {_faiss_reason(e)}") from None
    disable_polysemous_training(index)
    return index


def set_search_params(index, params: str, factory: str) -> None:
    """Apply a faiss ParameterSpace string (``nprobe=32``); a ConfigError naming the flag and value."""
    import faiss

    if not params:
        return
    try:
        faiss.ParameterSpace().set_index_parameters(index, params)
    except RuntimeError as e:
        raise ConfigError(
            f"--faiss-search-params {params!r} does not fit a {factory!r} index ({_faiss_reason(e)}); "
            "give name=number pairs that the index has, e.g. nprobe=32 for IVF, efSearch=128 for HNSW, "
            "or none for Flat") from None


def make_faiss_index(dim: int, factory: str, sample_fn, n: int):
    """Build and train an index for ``factory``; ``sample_fn(m)`` returns m training vectors."""
    index = new_faiss_index(dim, factory)
    if not index.is_trained:
        try:
            train_for_inner_product(index, sample_fn(min(n, 256 * 1024)))
        except RuntimeError as e:
            raise ConfigError(f"faiss index {factory!r} cannot be trained on {n} passages "
                              f"({str(e).splitlines()[-1].strip()}); use a smaller IVF/PQ size or Flat") from None
    return index


def train_for_inner_product(index, train_ND: np.ndarray) -> None:
    """Train ``index`` on ``train_ND`` so that its scores stay inner products of the raw vectors.

    faiss' ``PCA`` pre-transform subtracts the training mean from queries and passages alike:
    harmless for L2, but ``(q - m)·(x - m)`` ranks passages differently from ``q·x`` (a lossless
    ``PCA384,Flat`` on MiniLM vectors keeps only 0.90 of Flat's top-3). So the pre-transforms are
    trained here one by one and the PCA bias is dropped (a projection ``P x``; for a full-rank PCA a
    rotation, which keeps every inner product); rotations (``OPQ``, ``RR``) have no bias.
    """
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        x_ND = train_ND
        for i in range(index.chain.size()):
            vt = faiss.downcast_VectorTransform(index.chain.at(i))
            if not vt.is_trained:
                vt.train(x_ND)
            if isinstance(vt, faiss.PCAMatrix):
                vt.have_bias = False
            x_ND = vt.apply(x_ND)
    index.train(train_ND)  # a pre-transform index skips its trained transforms and trains the rest


def disable_polysemous_training(index) -> None:
    """Switch off faiss' polysemous training for every PQ inside ``index`` (through pre-transforms
    such as ``OPQ``/``PCA`` and IVF).

    The factory turns it on for ``PQ{M}`` (not ``PQ{M}np``). It only reorders centroids so that
    Hamming distances between codes mimic true distances, which matters for polysemous (Hamming
    filtered) search; we search by asymmetric distance, whose results it does not change, and it
    costs minutes for 8-bit codes (most of an ``IndexPQ`` build).
    """
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexPreTransform):
        disable_polysemous_training(index.index)
    elif isinstance(index, (faiss.IndexPQ, faiss.IndexIVFPQ)):
        index.do_polysemous_training = False


def build_dense(store: CorpusStore, out_dir: str | Path, *, encoder: str | None = None,
                factory: str = "Flat", search_params: str | None = None,
                cache_dir: str | Path | None = None, recall_queries: list[str] | None = None,
                recall_k: int = 10, n_recall: int = 200, batch_size: int = 64,
                device: str | None = None, show_progress: bool = True, seed: int = 0,
                query_prefix: str | None = None, passage_prefix: str | None = None,
                shard: tuple[int, int] | None = None, encode_dtype: str | None = "auto") -> dict:
    """Encode the store (cached chunks), build + save the faiss index, measure recall; return meta.
    ``factory`` ``auto`` picks by corpus size (:func:`resolve_factory`). ``query_prefix``/``passage_prefix``
    override the detected ones (:func:`choose_prefixes`). The index is trained on a sample of the
    cached embeddings and filled chunk by chunk: peak memory is the index plus one chunk.
    ``shard=(i, n)``: encode this shard's chunks into the cache and stop (no index; see
    :func:`sleuth.retrieval.embcache.encode_corpus`). ``encode_dtype``: the encoder's weights while it
    encodes (``auto``: float16 on CUDA, float32 elsewhere; :func:`resolve_encode_dtype`); queries are
    encoded in float32 when the index is searched."""
    import faiss

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder = encoder or DEFAULT_ENCODER
    prefixes = choose_prefixes(encoder, query_prefix, passage_prefix)
    query_prefix, passage_prefix = prefixes["query_prefix"], prefixes["passage_prefix"]
    model = load_encoder(encoder, device)
    encode_dtype = resolve_encode_dtype(encode_dtype, str(getattr(model, "device", "cpu")).split(":")[0])
    if encode_dtype != "float32":
        model = load_encoder(encoder, device, encode_dtype)
    # A bad factory or search parameter fails now, not after the (slow) encoding.
    probe_dim = encode_queries(model, ["dimension probe"], "").shape[1]
    factory = resolve_factory(factory, len(store), probe_dim)
    search_params = default_search_params(factory) if search_params is None else search_params
    set_search_params(new_faiss_index(probe_dim, factory), search_params, factory)
    t0 = time.perf_counter()
    chunks = encode_corpus(store, model, Path(cache_dir or out_dir / "embeddings"), passage_prefix,
                           encoder_id=encoder, batch_size=batch_size, show_progress=show_progress,
                           shard=shard or (0, 1))
    encode_s = time.perf_counter() - t0
    if shard is not None:  # this process's share of the embeddings is cached; another run builds the index
        return {"encoder": encoder, **prefixes, "dim": chunks.dim, "shard": list(shard), "encode_dtype": encode_dtype,
                "encode_seconds": round(encode_s, 2), "chunks": chunks.num_chunks}
    dim = chunks.dim
    rng = np.random.default_rng(seed)
    index = make_faiss_index(dim, factory, lambda m: chunks.sample(m, rng), len(store))
    for emb_CD in chunks.iter_arrays():
        index.add(emb_CD)
    set_search_params(index, search_params, factory)
    faiss.write_index(index, str(out_dir / INDEX_FILE))
    params = {"encoder": encoder, **prefixes, "dim": dim, "faiss_factory": factory,
              "faiss_search_params": search_params}
    (out_dir / PARAMS_FILE).write_text(json.dumps(params, indent=2))
    recall = measure_recall(index, model, store, chunks, query_prefix, recall_queries,
                            k=recall_k, n=n_recall, rng=rng, exact=(factory.strip() == "Flat"))
    return {**params, "encode_dtype": encode_dtype, "encode_seconds": round(encode_s, 2), "recall": recall,
            "index_bytes": (out_dir / INDEX_FILE).stat().st_size, "flat_bytes": 4 * dim * len(store),
            "code_bytes": code_size(index), "flat_code_bytes": 4 * dim}


def code_size(index) -> int | None:
    """Bytes of a vector's code (``sa_code_size``; IVF lists also keep an 8-byte id), None if unknown."""
    try:
        return int(index.sa_code_size())
    except RuntimeError:
        return None


def measure_recall(index, model, store, chunks, query_prefix, queries, *, k, n, rng, exact) -> dict:
    """recall@k of ``index`` against exact search (1.0 by construction for Flat)."""
    if exact:
        return {"k": k, "value": 1.0, "n_queries": 0, "note": "Flat index is exact"}
    if not queries:
        rows = rng.choice(len(store), size=min(n, len(store)), replace=False)
        queries = [" ".join(p.text.split()[:12]) or p.title for p in store.get_many(np.sort(rows))]
    queries = [q for q in queries[:n] if q.strip()]
    kk = min(k, len(store))
    q_QD = encode_queries(model, queries, query_prefix)
    _, exact_QK = exact_search(chunks, q_QD, kk)
    _, approx_QK = index.search(q_QD, kk)
    hits = [len(set(a.tolist()) & set(e.tolist())) for a, e in zip(approx_QK, exact_QK)]
    return {"k": kk, "value": round(float(np.mean(hits)) / kk, 4), "n_queries": len(queries)}


def read_dense_dir(dense_dir: Path, n_passages: int):
    """``(params, faiss index)`` saved by :func:`build_dense`; IndexFileError when missing or corrupt."""
    import faiss

    link = dense_dir / INDEX_FILE
    if link.is_symlink() and not link.exists():  # an imported index whose faiss file moved
        raise IndexFileError(f"{link} links to {os.readlink(link)}, which no longer exists (the faiss file this "
                             "index was imported from, `sleuth index import`); put it back or import again")
    for name in (PARAMS_FILE, INDEX_FILE):
        if not (dense_dir / name).is_file():
            raise IndexFileError(f"{dense_dir} holds no dense index ({name} is missing)")
    try:
        params = json.loads((dense_dir / PARAMS_FILE).read_text())
        index = read_mapped(link)
    except (OSError, ValueError) as e:
        raise index_file_error(dense_dir, e) from None
    except RuntimeError as e:  # faiss
        raise IndexFileError(f"cannot read {dense_dir / INDEX_FILE} ({_faiss_reason(e)})") from None
    if not isinstance(params, dict) or not {"encoder", "query_prefix"} <= params.keys():
        raise IndexFileError(f"{dense_dir / PARAMS_FILE} does not name the encoder and its prefixes")
    set_search_params(index, params.get("faiss_search_params") or "", params.get("faiss_factory", "?"))
    if index.ntotal != n_passages:
        raise IndexFileError(f"{dense_dir}: faiss index has {index.ntotal} vectors, the corpus "
                             f"store {n_passages} passages")
    return params, index


def read_mapped(path: Path):
    """A faiss index read memory-mapped: ``IO_FLAG_MMAP`` maps inverted lists, but a flat index's vectors
    only with ``IO_FLAG_MMAP_IFC`` (which other index types refuse), so that one is tried first."""
    import faiss

    ifc = getattr(faiss, "IO_FLAG_MMAP_IFC", 0)
    if ifc:
        try:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | ifc)
        except RuntimeError:
            pass
    return faiss.read_index(str(path), faiss.IO_FLAG_MMAP)


class DenseRetriever:
    """Encoder + faiss index over a corpus store (satisfies ``Retriever``). Queries get the prefix
    the index was built with, or ``query_prefix`` when given (:func:`search_query_prefix`)."""

    def __init__(self, dense_dir: str | Path, store: CorpusStore, device: str | None = None, *,
                 query_prefix: str | None = None, passage_prefix: str | None = None,
                 search_devices: list[str] | None = None):
        self.params, self.index = read_dense_dir(Path(dense_dir), len(store))
        self.query_prefix = search_query_prefix(self.params, query_prefix, passage_prefix, Path(dense_dir).parent)
        self.passage_prefix = self.params.get("passage_prefix", "")
        self.store = store
        self.model = load_encoder(self.params["encoder"], device)
        self.num_empty_queries = 0
        self.searcher = self.index  # what answers ``search(q_QD, k)``: faiss, or torch on the given devices
        if search_devices:  # opt-in (sleuth serve --search-devices): the vectors then live in those devices' memory
            from sleuth.retrieval.torch_flat import TorchFlatSearch  # lazy: torch, only for GPU search

            self.searcher = TorchFlatSearch(self.index, search_devices)  # Flat, SQ, PQ (+ PCA/OPQ); else ConfigError

    def search_rows(self, queries: list[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows_K, scores_K)`` per query, best first (cosine similarity)."""
        check_k(k)
        out: list = [None] * len(queries)
        live = [i for i, q in enumerate(queries) if q.strip()]
        for i in set(range(len(queries))) - set(live):
            self.num_empty_queries += 1
            out[i] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if live:
            q_QD = encode_queries(self.model, [queries[i] for i in live], self.query_prefix)
            scores_QK, rows_QK = self.searcher.search(q_QD, min(k, self.index.ntotal))
            for i, s_K, r_K in zip(live, scores_QK, rows_QK):
                keep = r_K >= 0  # faiss pads with -1 when fewer than k vectors are reachable
                out[i] = (r_K[keep].astype(np.int64), s_K[keep])
        return out

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list of at most ``k`` passages (best first, cosine scores) per query."""
        return [self.store.get_many(rows, scores) for rows, scores in self.search_rows(queries, k)]
