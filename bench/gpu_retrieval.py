"""Exact dense search on the GPU (torch matmul + top-k) against faiss Flat on the CPU, same vectors.

    python bench/gpu_retrieval.py [--json] [--device auto] [--passages 1000000] [--dim 384]
                                  [--queries 8192] [--cpu-queries 1024] [--k 3] [--batch 1024]
                                  [--dtype float16] [--embeddings FILE.npy] [--tiny]

Passages are L2-normalised vectors: random (``--passages`` x ``--dim``, MiniLM's 384 by default)
or read from ``--embeddings`` (an ``[N, D]`` .npy, e.g. encoded ``wiki_dev`` chunks). Queries are
noisy copies of random passages (cosine ~0.9 to their source), so each has a clear nearest
passage, as real questions have a relevant one. Inner product = cosine, as in
``sleuth.retrieval.dense``.

* ``torch``: passages resident on ``--device`` in ``--dtype``; per batch of queries: copy to the
  device, ``q @ P.T`` (fp32 accumulation), ``topk``, results back to the host (all timed).
* baseline, on the CPU, on the first ``--cpu-queries`` queries: faiss ``IndexFlatIP`` (what
  ``sleuth index build --kind dense`` makes with the default ``Flat``), float32, all threads; where
  faiss does not import, torch float32 matmul + top-k on the CPU (named in ``baseline``).

Figures: queries/s of each, ``speedup_vs_baseline``, and ``recall_vs_baseline``: the share of the
baseline's exact top-k that the device search also returns (below 1 only through low-precision ties).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import add_common_args, device_spec, report, resolve_device, synchronize  # noqa: E402


def make_vectors(args) -> tuple[np.ndarray, np.ndarray]:
    """``(passages_ND, queries_QD)``, float32, unit norm."""
    rng = np.random.default_rng(0)
    if args.embeddings:
        p_ND = np.load(args.embeddings).astype(np.float32, copy=False)
        if p_ND.ndim != 2:
            raise SystemExit(f"--embeddings {args.embeddings}: expected a 2-d [N, D] array, got shape {p_ND.shape}")
    else:
        p_ND = rng.standard_normal((args.passages, args.dim), dtype=np.float32)
    p_ND /= np.linalg.norm(p_ND, axis=1, keepdims=True) + 1e-12
    src_Q = rng.integers(0, len(p_ND), args.queries)
    noise_QD = rng.standard_normal((args.queries, p_ND.shape[1]), dtype=np.float32)
    noise_QD *= 0.5 / np.sqrt(p_ND.shape[1])  # |noise| ~ 0.5: cosine to the source ~ 0.9
    q_QD = p_ND[src_Q] + noise_QD
    q_QD /= np.linalg.norm(q_QD, axis=1, keepdims=True)
    return p_ND, q_QD


def torch_search(p_ND: torch.Tensor, q_QD: np.ndarray, k: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of every query: ``(scores_QK, rows_QK)`` on the host."""
    scores, rows = [], []
    for i in range(0, len(q_QD), batch):
        qb_BD = torch.from_numpy(q_QD[i : i + batch]).to(p_ND.device, non_blocking=True).to(p_ND.dtype)
        s_BN = torch.matmul(qb_BD, p_ND.T)  # [B, N]; fp16/bf16 inputs accumulate in fp32
        top = torch.topk(s_BN.float(), k, dim=1)
        scores.append(top.values.cpu())
        rows.append(top.indices.cpu())
    return torch.cat(scores).numpy(), torch.cat(rows).numpy()


def recall(rows_QK: np.ndarray, ref_QK: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(rows_QK, ref_QK)]))


def cpu_baseline(p_ND: np.ndarray, q_QD: np.ndarray, k: int) -> tuple[str, float, np.ndarray]:
    """``(name, seconds, rows_QK)`` of exact search on the CPU: faiss ``IndexFlatIP`` (all threads),
    or, where faiss does not import (the GPU image has none unless carried), torch float32."""
    try:
        import faiss
    except ImportError as e:
        t0 = time.perf_counter()
        _, rows_QK = torch_search(torch.from_numpy(p_ND), q_QD, k, batch=256)
        return f"torch_cpu_float32 (faiss not importable: {e})", time.perf_counter() - t0, rows_QK
    index = faiss.IndexFlatIP(p_ND.shape[1])
    index.add(p_ND)
    t0 = time.perf_counter()
    _, rows_QK = index.search(q_QD, k)
    return f"faiss_cpu_flat ({faiss.omp_get_max_threads()} threads)", time.perf_counter() - t0, rows_QK


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(ap)
    ap.add_argument("--passages", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=8192)
    ap.add_argument("--cpu-queries", type=int, default=1024, help="queries searched by the CPU baseline")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024, help="queries per matmul on the device")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--embeddings", default=None, help="an [N, D] .npy of passage vectors instead of random ones")
    args = ap.parse_args(argv)
    if args.tiny:
        args.passages, args.dim, args.queries, args.cpu_queries, args.batch = 4000, 32, 256, 128, 64
    device = resolve_device(args.device)
    p_ND, q_QD = make_vectors(args)
    n_cpu = min(args.cpu_queries, len(q_QD))
    baseline, cpu_s, ref_QK = cpu_baseline(p_ND, q_QD[:n_cpu], args.k)

    p_dev_ND = torch.from_numpy(p_ND).to(device).to(getattr(torch, args.dtype))
    torch_search(p_dev_ND, q_QD[: args.batch], args.k, args.batch)  # warm-up
    synchronize(device)
    t0 = time.perf_counter()
    _, rows_QK = torch_search(p_dev_ND, q_QD, args.k, args.batch)
    synchronize(device)
    torch_s = time.perf_counter() - t0

    torch_qps, cpu_qps = len(q_QD) / torch_s, n_cpu / cpu_s
    result = {
        **device_spec(device),
        "passages": len(p_ND),
        "dim": p_ND.shape[1],
        "vectors": args.embeddings or "random",
        "k": args.k,
        "dtype": args.dtype,
        "queries": len(q_QD),
        "torch_qps": torch_qps,
        "baseline": baseline,
        "baseline_queries": n_cpu,
        "baseline_qps": cpu_qps,
        "speedup_vs_baseline": torch_qps / cpu_qps,
        "recall_vs_baseline": recall(rows_QK[:n_cpu], ref_QK),
        "passage_bytes_on_device": p_dev_ND.numel() * p_dev_ND.element_size(),
    }
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
