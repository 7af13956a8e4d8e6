"""``sleuth index import``: a faiss index built elsewhere (Search-R1's ``e5_Flat.index``) and its corpus
as a Sleuth dense index directory, with no re-encoding and no BM25 build.

The corpus is ingested into the directory's corpus store (row i = line i of the jsonl, as Search-R1
numbers passages); the faiss file is not copied (wiki-18's is 60-70 GB) nor touched: the directory
links to it (``dense/faiss.index`` is a symbolic link to its absolute path), and opening the index
memory-maps a flat index (faiss' ``IO_FLAG_MMAP_IFC``) instead of reading it into RAM. Checks, each
a clear error naming both sides: the index's vector count equals the corpus's passage count; the
encoder's output dimension equals the index's; the index compares by inner product (Sleuth's dense
search ranks by it, and Search-R1's e5 index is ``IndexFlatIP``); the faiss file is not inside what
``--out`` would replace. The result is opened by ``load_index`` like a built one (``serve``,
``search``, ``eval``, ``train``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sleuth.errors import DataError
from sleuth.version import __version__
from sleuth.retrieval.corpus import ingest_jsonl
from sleuth.retrieval.dense import FLAT_TYPES, INDEX_FILE, PARAMS_FILE, read_mapped
from sleuth.retrieval.encoder import encode_queries, load_encoder
from sleuth.retrieval.index import FORMAT_VERSION, META_FILE, REPLACED_PARTS, prepare_out
from sleuth.retrieval.prefixes import choose_prefixes

class FaissImportError(DataError):
    """An import whose inputs do not fit together (a ``DataError``: the CLI prints it as an input error)."""


def read_header(path: Path):
    """The faiss index at ``path``, memory-mapped (its vectors are not read into RAM)."""
    try:
        return read_mapped(path)
    except RuntimeError as e:
        raise FaissImportError(f"--faiss {path} is not a faiss index faiss can read "
                               f"({str(e).strip().splitlines()[-1]})") from None


def import_faiss(faiss_path: str | Path, corpus: str | Path, encoder: str, out: str | Path, *,
                 query_prefix: str | None = None, passage_prefix: str | None = None, overwrite: bool = False,
                 skip_bad: bool = False, device: str | None = None, show_progress: bool = True) -> dict:
    """Write a dense index directory ``out`` over ``corpus`` that searches ``faiss_path``; the meta."""
    import faiss  # lazy: an optional dependency, needed once an import runs

    faiss_path, out = Path(faiss_path), Path(out)
    if not faiss_path.is_file():
        raise FileNotFoundError(f"--faiss {faiss_path} does not exist")
    source = faiss_path.resolve()
    for part in REPLACED_PARTS:
        if source.is_relative_to(Path(os.path.abspath(out / part))):
            raise FaissImportError(f"--faiss {faiss_path} lies inside {out / part}, which importing into --out "
                                   f"{out} replaces; move it or choose another --out")
    index = read_header(source)
    n_vectors, dim, kind = int(index.ntotal), int(index.d), type(index).__name__
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise FaissImportError(f"--faiss {faiss_path} ({kind}) compares vectors by L2 distance; Sleuth's dense search "
                           "ranks by inner product (Search-R1's e5 index is IndexFlatIP): rebuild it with "
                           "METRIC_INNER_PRODUCT or build one with `sleuth index build --kind dense`")
    del index
    model = load_encoder(encoder, device)  # before the ingest: a wrong --encoder fails fast
    enc_dim = int(encode_queries(model, ["dimension probe"], "").shape[1])
    if enc_dim != dim:
        raise FaissImportError(f"--encoder {encoder} gives {enc_dim}-dimensional vectors but --faiss {faiss_path} "
                           f"holds {dim}-dimensional ones: give the encoder the index was built with "
                           "(Search-R1's e5_Flat.index: intfloat/e5-base-v2, 768)")
    if not skip_bad and (lines := count_lines(corpus)) != n_vectors:  # before anything is written
        raise FaissImportError(f"--faiss {faiss_path} holds {n_vectors} vectors but --corpus {corpus} has {lines} "
                               "passages; vector i must be the passage on line i: give the corpus the index was "
                               "built from")
    prepare_out(out, corpus, "dense", overwrite)
    t0 = time.perf_counter()
    stats = ingest_jsonl(corpus, out / "corpus", skip_bad=skip_bad, show_progress=show_progress)
    if stats.n_passages != n_vectors:
        raise FaissImportError(f"--faiss {faiss_path} holds {n_vectors} vectors but --corpus {corpus} has "
                           f"{stats.n_passages} passages{f' ({stats.n_skipped} lines skipped)' if stats.n_skipped else ''}; "
                           "vector i must be the passage on line i: give the corpus the index was built from")
    dense = out / "dense"
    dense.mkdir(parents=True, exist_ok=True)
    link = dense / INDEX_FILE
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(source)
    prefixes = choose_prefixes(encoder, query_prefix, passage_prefix)
    params = {"encoder": encoder, **prefixes, "dim": dim, "faiss_factory": "Flat" if kind in FLAT_TYPES else kind,
              "faiss_search_params": "", "imported_from": str(source)}
    (dense / PARAMS_FILE).write_text(json.dumps(params, indent=2))
    meta = {
        "format_version": FORMAT_VERSION, "sleuth_version": __version__, "kind": "dense",
        "corpus": {"path": str(Path(corpus).resolve()), "sha256": stats.sha256, "n_passages": stats.n_passages,
                   "n_skipped": stats.n_skipped, "skipped_examples": stats.skipped_examples},
        "n_passages": stats.n_passages, **params, "faiss_index_type": kind,
        "build_seconds": round(time.perf_counter() - t0, 2), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def count_lines(path: str | Path) -> int:
    """Non-blank lines of a file (the passages of a well-formed jsonl corpus)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
