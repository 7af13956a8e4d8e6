"""Dense index builds at scale: build time and peak memory, memory once opened, search queries/s,
for Flat and the compressed default (``PCAR256,SQ6``), extrapolated to wiki-18's 21M passages.

    .venv/bin/python bench/dense_scale.py [--json] [--passages 200000,2000000]
                                          [--factories 'Flat;PCAR256,SQ6'] [--queries 512] [--keep DIR]

Encoding is not measured here (a 2-core CPU encodes a few hundred passages a second; wiki-18 is
encoded on GPUs): for each ``--passages`` N a corpus is generated as ``bench/retrieval_scale.py``
does and ingested, and its embedding cache is filled with random unit vectors of MiniLM's 384
dimensions, in float16 chunks of 4,096 rows, exactly where ``sleuth index build --kind dense``
looks for them (the cache key of the default encoder, its passage prefix and the corpus), so the
build finds every chunk cached and encodes nothing. Then, each in its own process:

* ``build``: ``build_dense`` (the index trained on a sample of the cache, filled chunk by chunk,
  written, its recall measured on 200 held-back passage openings encoded by MiniLM): seconds and
  peak anonymous resident memory (sampled every 50 ms; the encoder's ~0.2 GB included), the
  index's size on disk, the cache's size (what the build must not hold in memory);
* ``query``: the index opened as ``sleuth`` opens it (memory-mapped), anonymous resident memory
  added, and faiss' batched search queries/s (``--queries`` random unit queries, top-3, batches of
  256, all threads), with memory after the searches.

Random vectors give pessimistic recall for compressed indexes (their recall is judged on real
embeddings: ``bench/retrieval.py``, 0.959 of Flat's top-3 for ``PCAR256,SQ6`` on ``wiki_dev``);
memory and speed do not depend on what the vectors hold. Extrapolation to 21M, printed beside each
figure as ``*_at_21M``: memory by a line through the two largest sizes (``a + b N``), sizes and
seconds per passage x 21M, queries/s x N / 21M (a full scan per query). For e5-base-v2's 768
dimensions (Search-R1's index) the Flat figures double; ``PCAR256,SQ6`` codes stay 192 bytes (its
PCA matrix and training sample grow with the dimension). The last stdout line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from retrieval_scale import WIKI18, PeakAnon, emit, extrapolate, generate, in_child, log, rss_gb  # noqa: E402

DIM = 384  # all-MiniLM-L6-v2, the default encoder (installed here; its dimension is checked)


def fill_cache(store_dir: Path, cache_root: Path, seed: int = 0) -> dict:
    """Write random unit float16 embeddings for every passage of the store where the dense build reads them."""
    from sleuth.retrieval.corpus import CorpusStore
    from sleuth.retrieval.embcache import CHUNK_ROWS, cache_key
    from sleuth.retrieval.encoder import DEFAULT_ENCODER
    from sleuth.retrieval.prefixes import choose_prefixes

    store = CorpusStore(store_dir)
    n, prefix = len(store), choose_prefixes(DEFAULT_ENCODER, None, None)["passage_prefix"]
    directory = cache_root / cache_key(DEFAULT_ENCODER, prefix, store.fingerprint(), n)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.json").write_text(json.dumps({"encoder": DEFAULT_ENCODER, "passage_prefix": prefix,
                                                    "corpus_sha256": store.fingerprint(), "n": n,
                                                    "chunk_rows": CHUNK_ROWS, "dim": DIM}))
    rng = np.random.default_rng(seed)
    for i, lo in enumerate(range(0, n, CHUNK_ROWS)):
        x = rng.standard_normal((min(CHUNK_ROWS, n - lo), DIM), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        np.save(directory / f"chunk_{i:06d}.npy", x.astype(np.float16))
    return {"cache_gb": sum(f.stat().st_size for f in directory.iterdir()) / 2**30}


def child_build(store_dir: str, out: str, cache_root: str, factory: str) -> dict:
    from sleuth.retrieval.corpus import CorpusStore
    from sleuth.retrieval.dense import INDEX_FILE, build_dense

    store = CorpusStore(store_dir)
    watch, t = PeakAnon(), time.perf_counter()
    meta = build_dense(store, out, factory=factory, cache_dir=cache_root, show_progress=False, device="cpu")
    build_s = time.perf_counter() - t
    if meta["dim"] != DIM:
        raise RuntimeError(f"the encoder's dimension is {meta['dim']}, the cache was written with {DIM}")
    if meta["encode_seconds"] > 0.2 * build_s:
        raise RuntimeError(f"the build encoded passages ({meta['encode_seconds']} s): the cache was not found")
    return {"build_s": build_s, "build_peak_rss_gb": watch.stop(), "build_peak_rss_incl_mapped_gb": rss_gb("VmHWM"),
            "index_disk_gb": (Path(out) / INDEX_FILE).stat().st_size / 2**30, "code_bytes": meta["code_bytes"],
            "recall_at_10_random_vectors": meta["recall"]["value"]}


def child_query(out: str, n: int, n_queries: int) -> dict:
    from sleuth.retrieval.dense import read_dense_dir

    before, before_all = rss_gb("RssAnon"), rss_gb()
    _, index = read_dense_dir(Path(out), n)
    loaded, loaded_all = rss_gb("RssAnon"), rss_gb()
    rng = np.random.default_rng(1)
    q = rng.standard_normal((n_queries, DIM), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    index.search(q[:8], 3)  # warm-up (and the page cache)
    t = time.perf_counter()
    for lo in range(0, n_queries, 256):
        index.search(q[lo : lo + 256], 3)
    qps = n_queries / (time.perf_counter() - t)
    return {"loaded_rss_gb": loaded - before, "loaded_rss_incl_mapped_gb": loaded_all - before_all,
            "queried_rss_gb": rss_gb("RssAnon") - before, "queried_rss_incl_mapped_gb": rss_gb() - before_all,
            "queries_per_s": qps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--passages", default="200000,2000000", help="generated corpus sizes (comma-separated)")
    ap.add_argument("--factories", default="Flat;PCAR256,SQ6", help="faiss factory strings, separated by ';'")
    ap.add_argument("--queries", type=int, default=512)
    ap.add_argument("--keep", default=None, help="keep the generated corpora, caches and indexes in this directory")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "build":
            print(json.dumps(child_build(*rest)))
        else:
            print(json.dumps(child_query(rest[0], int(rest[1]), int(rest[2]))))
        return 0
    factories = [f.strip() for f in args.factories.split(";") if f.strip()]
    from sleuth.retrieval.corpus import ingest_jsonl

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sleuth_dense_scale_"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    try:
        for n in [int(x) for x in args.passages.split(",")]:
            corpus, store = tmp / f"gen_{n}.jsonl", tmp / f"store_{n}"
            generate(corpus, n)
            ingest_jsonl(corpus, store, show_progress=False)
            t = time.perf_counter()
            cache = fill_cache(store, tmp / "cache")
            log(f"{n} passages: corpus and store written, cache {cache['cache_gb']:.2f} GiB ({time.perf_counter() - t:.0f} s)")
            for factory in factories:
                out = tmp / f"idx_{n}_{factory.replace(',', '_')}"
                row = {"passages": n, "factory": factory, **cache,
                       **in_child(["build", str(store), str(out), str(tmp / "cache"), factory], __file__)}
                row.update(in_child(["query", str(out), str(n), str(args.queries)], __file__))
                log(f"  {factory}: built in {row['build_s']:.0f} s, peak {row['build_peak_rss_gb']:.2f} GB, "
                    f"index {row['index_disk_gb']:.2f} GiB, opened {row['loaded_rss_gb']:.3f} GB, "
                    f"{row['queries_per_s']:.0f} q/s")
                rows.append(row)
                shutil.rmtree(out, ignore_errors=True)
            if not args.keep:
                corpus.unlink()
                shutil.rmtree(store, ignore_errors=True)
                shutil.rmtree(tmp / "cache", ignore_errors=True)
        summary: dict = {"bench": "dense_scale", "dim": DIM, "rows": rows, "extrapolated_to_21M": {}}
        for factory in factories:
            mine = [r for r in rows if r["factory"] == factory]
            largest = max(mine, key=lambda r: r["passages"])
            summary["extrapolated_to_21M"][factory] = {
                "build_peak_rss_gb_at_21M": extrapolate(mine, "build_peak_rss_gb"),
                "loaded_rss_gb_at_21M": extrapolate(mine, "loaded_rss_gb"),
                "queried_rss_gb_at_21M": extrapolate(mine, "queried_rss_gb"),
                "index_disk_gb_at_21M": largest["index_disk_gb"] * WIKI18 / largest["passages"],
                "cache_gb_at_21M": largest["cache_gb"] * WIKI18 / largest["passages"],
                "build_minutes_at_21M": largest["build_s"] * WIKI18 / largest["passages"] / 60,
                "queries_per_s_at_21M": largest["queries_per_s"] * largest["passages"] / WIKI18,
            }
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return emit(summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
