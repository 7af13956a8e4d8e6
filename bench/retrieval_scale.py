"""BM25 at scale: build memory and time, loaded memory, batched queries/s, each extrapolated to
wiki-18's 21M passages; and the real ``wiki_dev`` corpus against today's (bm25s in-memory) build.

    .venv/bin/python bench/retrieval_scale.py [--json] [--passages 200000,2000000] [--queries 2000]
                                              [--baseline-max 200000] [--keep DIR]

For each ``--passages`` N a corpus with Wikipedia-like word statistics is generated (95% of the
words drawn with the frequencies words have in ``../shared/data``'s ``wiki_dev``, 5% rare made-up
words from a vocabulary growing with the words written as Heaps' law says, about 2M at wiki-18's
2.1B words; a 1-3 word title and a 100-word body, as wiki-18's passages), written to a
temporary directory (removed at the end unless ``--keep``), and indexed with ``sleuth index
build --kind bm25`` in a child process. Figures per N, each measured in its own process:

* ``build_s``, ``build_peak_rss_gb`` (the child's peak anonymous resident memory, sampled every
  50 ms, corpus ingest included; ``*_incl_mapped_gb``: with the memory-mapped file pages, which
  the kernel writes back and drops under pressure);
* ``loaded_rss_gb`` (anonymous resident memory added by opening the index, memory-mapped) and
  ``queried_rss_gb`` (after the queries; ``*_incl_mapped_gb``: with the mapped pages they touched);
* ``queries_per_s``: the NQ + HotpotQA dev questions (cycled to ``--queries``), top-3, in batches
  of 256 on worker threads, ranked by the numba kernel when numba is installed (``compiled``; with
  MaxScore pruning from 200k passages: ``pruned_share`` of the queries, reading
  ``postings_read_share`` of their postings, lookups counted; then also, same process, measured
  first: ``numpy_queries_per_s``, the numpy path, and ``unpruned_queries_per_s``, the kernel
  reading every posting); baseline in the same process: the same queries one at a time, each
  summed over the whole corpus (today's path), on a sample of them.

The baseline build (bm25s' own ``index``: every passage's token ids as Python lists) runs for N up
to ``--baseline-max``. Extrapolation to 21M, printed beside each figure as ``*_at_21M`` and
marked as such: memory by a line through the two largest sizes measured (``a + b N``), time per
passage times 21M, queries/s by the cost per query growing with the postings it reads, i.e.
with N (``qps x N / 21M``; for the pruned kernel too, though the k-th best score a passage must
beat to be read can only rise with N). On ``wiki_dev``: the share of dev questions whose top-3
equals today's build's (goal >= 0.99), also ranked with pruning. Goals (issue #21): build <= 24 GB
and loaded <= 4 GB at 21M, >= 100 queries/s batched at 21M on 2 cores. The last stdout line is
the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
WIKI18 = 21_000_000
GOALS = {"build_peak_rss_gb_at_21M": 24.0, "loaded_rss_gb_at_21M": 4.0, "queries_per_s_at_21M": 100.0,
         "wiki_dev_top3_equal": 0.99}
RARE, HEAPS_K, HEAPS_BETA = 0.05, 44.0, 0.5  # share of rare words; their vocabulary: K * words ** beta


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_gb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def dev_questions() -> list[str]:
    out = []
    for name in ("nq", "hotpotqa"):
        path = SHARED / "dev" / f"{name}.jsonl"
        if path.exists():
            out += [json.loads(x)["question"] for x in path.read_text().splitlines() if x.strip()]
    return out or [f"who founded the city of {w}" for w in ("paris", "rome", "berlin", "madrid")]


def word_counts() -> tuple[list[str], np.ndarray]:
    """Words of ``wiki_dev`` and their counts (made-up words when the data is absent)."""
    path = SHARED / "corpus" / "wiki_dev.jsonl"
    if not path.exists():
        words = [f"w{i}" for i in range(50_000)]
        return words, 1.0 / np.arange(1, len(words) + 1)
    counts: Counter = Counter()
    with open(path) as f:
        for line in f:
            counts.update(re.findall(r"[a-z0-9]+", json.loads(line)["contents"].lower()))
    words, freq = zip(*counts.most_common())
    return list(words), np.array(freq, dtype=np.float64)


def generate(path: Path, n: int, seed: int = 0) -> None:
    """``n`` passages: title (1-3 words) and a 100-word body. ``RARE`` of the words are rare words,
    log-uniform over a vocabulary that grows with the words written so far as Heaps' law says
    (``HEAPS_K * T ** HEAPS_BETA``); the others follow ``wiki_dev``'s word frequencies."""
    rng = np.random.default_rng(seed)
    words, freq = word_counts()
    vocab, cdf = np.array(words, dtype=object), np.cumsum(freq) / freq.sum()
    chunk, written = 20_000, 0
    with open(path, "w") as f:
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            common = vocab[np.minimum(np.searchsorted(cdf, rng.random((m, 103))), len(vocab) - 1)]
            written += m * 103
            v_rare = max(2.0, HEAPS_K * written**HEAPS_BETA)
            rare_ids = np.exp(rng.random((m, 103)) * np.log(v_rare)).astype(np.int64)
            is_rare = rng.random((m, 103)) < RARE
            title_len = rng.integers(1, 4, size=m)
            lines = []
            for i in range(m):
                row = [f"zq{rare_ids[i, j]}" if is_rare[i, j] else common[i, j] for j in range(103)]
                title = " ".join(row[: title_len[i]]).title()
                lines.append(json.dumps({"id": str(lo + i), "contents": f'"{title}"\n' + " ".join(row[3:])}))
            f.write("\n".join(lines) + "\n")


class PeakAnon:
    """The largest anonymous resident memory (``RssAnon``: what the process itself holds; memory-mapped
    file pages, which the kernel writes back and drops under pressure, are left out) seen while alive."""

    def __init__(self, every_s: float = 0.05):
        import threading

        self.peak, self._stop = rss_gb("RssAnon"), threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(every_s,), daemon=True)
        self._thread.start()

    def _watch(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.peak = max(self.peak, rss_gb("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_gb("RssAnon"))


def child_build(corpus: str, out: str, baseline: bool) -> dict:
    from sleuth.retrieval import bm25
    from sleuth.retrieval.index import build_index

    if baseline:  # today's build: bm25s' in-memory index
        bm25.build_bm25 = lambda store, out_dir, params=None, show_progress=True: bm25._build_bm25_in_memory(
            store, out_dir, params or bm25.BM25Params(), show_progress)
    watch, t = PeakAnon(), time.perf_counter()
    build_index(corpus, "bm25", out, show_progress=False)
    return {"build_s": time.perf_counter() - t, "build_peak_rss_gb": watch.stop(),
            "build_peak_rss_incl_mapped_gb": rss_gb("VmHWM")}


def child_query(index: str, n_queries: int, baseline_queries: int) -> dict:
    from sleuth.retrieval.bm25 import NUMBA, top_rows
    from sleuth.retrieval.index import load_index

    before, before_all = rss_gb("RssAnon"), rss_gb()
    r = load_index(index)
    loaded, loaded_all = rss_gb("RssAnon"), rss_gb()
    qs = dev_questions()
    qs = (qs * (n_queries // len(qs) + 1))[:n_queries]

    def batched() -> float:
        t = time.perf_counter()
        for lo in range(0, len(qs), 256):
            r.search_rows(qs[lo : lo + 256], k=3)
        return len(qs) / (time.perf_counter() - t)

    r.search_rows(qs[:8], k=3)  # warm-up: numba compiles its kernels here (when installed), not in the timing
    r.pruned = False
    r.search_rows(qs[:8], k=3)  # the kernel without pruning too (from 200k passages the first call prunes)
    r.pruned = True
    extra: dict = {"compiled": NUMBA}
    if NUMBA:  # the numpy path and the kernel without pruning too, in the same process (numpy first: it
        r.compiled = False  # also warms the page cache)
        extra["numpy_queries_per_s"] = batched()
        r.compiled, r.pruned = True, False
        extra["unpruned_queries_per_s"] = batched()
        r.pruned, r.counts = True, dict.fromkeys(r.counts, 0)
    qps = batched()
    if NUMBA:
        c = r.counts
        extra["pruned_share"] = c["queries_pruned"] / max(c["queries"], 1)
        extra["postings_read_share"] = c["postings_read"] / max(c["postings"], 1)
    sample = qs[:baseline_queries]
    t = time.perf_counter()
    for q in sample:  # today's path: one query at a time over a dense [N] score array
        ids = r.query_term_ids(q)
        if ids:
            top_rows(r.scores(ids), 3)
    base_qps = len(sample) / (time.perf_counter() - t)
    return {"loaded_rss_gb": loaded - before, "loaded_rss_incl_mapped_gb": loaded_all - before_all,
            "queried_rss_gb": rss_gb("RssAnon") - before, "queried_rss_incl_mapped_gb": rss_gb() - before_all,
            "queries_per_s": qps, **extra, "baseline_queries_per_s": base_qps, "threads": r.threads}


def in_child(args: list[str], script: str = __file__) -> dict:
    """Run ``script --child ARGS`` in a fresh process (its own memory figures); its last stdout line as JSON."""
    out = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True, cwd=ROOT,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def wiki_dev_agreement(tmp: Path) -> dict:
    """Top-3 of the streaming build against today's (bm25s in-memory) build on the real corpus."""
    from sleuth.retrieval import bm25
    from sleuth.retrieval.bm25 import BM25Params, BM25Retriever, _build_bm25_in_memory
    from sleuth.retrieval.index import build_index, load_index

    corpus = SHARED / "corpus" / "wiki_dev.jsonl"
    if not corpus.exists():
        return {"wiki_dev": "skipped: ../shared/data not present"}
    build_index(corpus, "bm25", tmp / "wiki_dev", show_progress=False)
    ours = load_index(tmp / "wiki_dev")
    _build_bm25_in_memory(ours.store, tmp / "wiki_dev_ref", BM25Params(), show_progress=False)
    ref = BM25Retriever(tmp / "wiki_dev_ref", ours.store)
    qs = dev_questions()
    a, b = ours.search_rows(qs, 3), ref.search_rows(qs, 3)
    same = sum(x[0].tolist() == y[0].tolist() for x, y in zip(a, b))
    out = {"wiki_dev_passages": len(ours.store), "wiki_dev_questions": len(qs), "wiki_dev_top3_equal": same / len(qs)}
    if bm25.NUMBA:  # the pruned kernel (used from 200k passages) on the real corpus too
        sizes = bm25.PRUNE_FROM, bm25.PRUNE_PER_K
        bm25.PRUNE_FROM = bm25.PRUNE_PER_K = 0
        try:
            pruned = ours.search_rows(qs, 3)
        finally:
            bm25.PRUNE_FROM, bm25.PRUNE_PER_K = sizes
        out["wiki_dev_top3_equal_pruned"] = sum(x[0].tolist() == y[0].tolist() for x, y in zip(pruned, b)) / len(qs)
    return out


def extrapolate(rows: list[dict], key: str) -> float | None:
    """``a + b N`` through the two largest sizes measured, at 21M (one size: proportional)."""
    pts = sorted((r["passages"], r[key]) for r in rows if key in r)
    if not pts:
        return None
    if len(pts) == 1:
        return pts[0][1] * WIKI18 / pts[0][0]
    (n1, y1), (n2, y2) = pts[-2], pts[-1]
    slope = (y2 - y1) / (n2 - n1)
    return y2 + slope * (WIKI18 - n2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--passages", default="200000,2000000", help="generated corpus sizes (comma-separated)")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--baseline-queries", type=int, default=100)
    ap.add_argument("--baseline-max", type=int, default=200_000, help="largest N for today's in-memory build")
    ap.add_argument("--keep", default=None, help="keep the generated corpora and indexes in this directory")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "build":
            print(json.dumps(child_build(rest[0], rest[1], rest[2] == "1")))
        else:
            print(json.dumps(child_query(rest[0], int(rest[1]), int(rest[2]))))
        return 0
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sleuth_scale_"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in [int(x) for x in args.passages.split(",")]:
            corpus = tmp / f"gen_{n}.jsonl"
            t = time.perf_counter()
            generate(corpus, n)
            log(f"{n} passages generated in {time.perf_counter() - t:.0f} s ({corpus.stat().st_size / 2**30:.2f} GiB)")
            row = {"passages": n, **in_child(["build", str(corpus), str(tmp / f"idx_{n}"), "0"])}
            log(f"  built in {row['build_s']:.0f} s, peak RSS {row['build_peak_rss_gb']:.2f} GB")
            row.update(in_child(["query", str(tmp / f"idx_{n}"), str(args.queries), str(args.baseline_queries)]))
            log(f"  loaded RSS {row['loaded_rss_gb']:.3f} GB, {row['queries_per_s']:.0f} q/s batched "
                f"(one at a time: {row['baseline_queries_per_s']:.0f} q/s)")
            if n <= args.baseline_max:
                base = in_child(["build", str(corpus), str(tmp / f"idx_{n}_base"), "1"])
                row["baseline_build_s"], row["baseline_build_peak_rss_gb"] = base["build_s"], base["build_peak_rss_gb"]
                log(f"  today's build: {base['build_s']:.0f} s, peak RSS {base['build_peak_rss_gb']:.2f} GB")
                shutil.rmtree(tmp / f"idx_{n}_base", ignore_errors=True)
            row["build_s_per_passage"] = row["build_s"] / n
            row["index_disk_gb"] = sum(f.stat().st_size for f in (tmp / f"idx_{n}").rglob("*") if f.is_file()) / 2**30
            rows.append(row)
            if not args.keep:
                corpus.unlink()
        summary = {"bench": "retrieval_scale", "rows": rows, "cpu_count": os.cpu_count()}
        largest = max(rows, key=lambda r: r["passages"])
        summary["extrapolated_to_21M"] = {
            "build_peak_rss_gb_at_21M": extrapolate(rows, "build_peak_rss_gb"),
            "baseline_build_peak_rss_gb_at_21M": extrapolate(rows, "baseline_build_peak_rss_gb"),
            "loaded_rss_gb_at_21M": extrapolate(rows, "loaded_rss_gb"),
            "queried_rss_gb_at_21M": extrapolate(rows, "queried_rss_gb"),
            "queried_rss_incl_mapped_gb_at_21M": extrapolate(rows, "queried_rss_incl_mapped_gb"),
            "build_hours_at_21M": largest["build_s_per_passage"] * WIKI18 / 3600,
            "index_disk_gb_at_21M": extrapolate(rows, "index_disk_gb"),
            "queries_per_s_at_21M": largest["queries_per_s"] * largest["passages"] / WIKI18,
            "baseline_queries_per_s_at_21M": largest["baseline_queries_per_s"] * largest["passages"] / WIKI18,
        }
        for key in ("numpy_queries_per_s", "unpruned_queries_per_s"):
            if largest.get(key):
                summary["extrapolated_to_21M"][f"{key}_at_21M"] = largest[key] * largest["passages"] / WIKI18
        summary.update(wiki_dev_agreement(tmp))
        summary["goals"] = GOALS
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return emit(summary, args.json)


def emit(summary: dict, json_only: bool) -> int:
    """The summary, indented on stderr unless ``json_only``, and as the last stdout line; exit status 0."""
    if not json_only:
        log(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
