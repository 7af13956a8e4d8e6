"""Exhaustive inner-product search with torch on one or several devices, for the faiss indexes that
are themselves searched by scanning every vector: Flat (exact), and the compressed flat codecs
(``SQ4``/``SQ6``/``SQ8``/``SQfp16``, ``PQm``), alone or behind a transform (``PCAR256,SQ6``, Sleuth's
default beyond 1M passages; ``OPQ``). The vectors (decoded, in the space the codes live in: 256-d
after ``PCAR256``) are copied onto the devices in row shards, float16 by default, and searched as
``q @ X.T`` + top-k per block of rows (a million by default: the scores of 256 queries take 1.5 GB
of device memory, not 16 GB as a whole 10M-row shard's would), merged on the host; queries go
through the index's transforms first.
wiki-18 (21M) with e5-base-v2: Flat is 32 GB in float16; ``PCAR256,SQ6`` decoded 10.7 GB (its
codes take 4 GB on the host). faiss scores a code by the inner product with its decoded vector, so
the results are faiss' own (rows; scores to float rounding) when run in float32; in float16 (the
default) the scores are rounded to float16 (about 5e-4), which can reorder near-ties. IVF and HNSW
indexes visit part of the vectors: not searched here (faiss searches them on the CPU; Sleuth does
not drive faiss-gpu, which the pip faiss wheel lacks).

Used by :class:`sleuth.retrieval.dense.DenseRetriever` when it is given ``search_devices`` (``sleuth
serve --search-devices cuda:0,cuda:1``). Tested on CPU devices, not yet on a GPU.
"""

from __future__ import annotations

import numpy as np
import torch

from sleuth.errors import ConfigError

SCAN_TYPES = ("IndexFlatIP", "IndexFlatL2", "IndexFlat", "IndexScalarQuantizer", "IndexPQ")  # every vector scored, by its decoding


def scan_parts(index) -> tuple[object, list]:
    """``(codec, transforms)``: the index that holds the vectors and the transforms a query goes
    through first; ``ConfigError`` naming the index type where it is not searched by a full scan with
    inner product."""
    import faiss

    index = faiss.downcast_index(index)
    transforms = []
    if type(index).__name__ == "IndexPreTransform":
        transforms = [faiss.downcast_VectorTransform(index.chain.at(i)) for i in range(index.chain.size())]
        index = faiss.downcast_index(index.index)
    kind = type(index).__name__
    if kind not in SCAN_TYPES:
        raise ConfigError(f"the index is a {kind}, which is not searched by a scan over every vector; torch searches "
                          "Flat, SQ and PQ indexes (with or without a PCA/OPQ transform); faiss searches the others "
                          "on the CPU")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ConfigError(f"the {kind} index does not use inner product (metric {index.metric_type}); "
                          "Sleuth's dense indexes do: rebuild it with `sleuth index build --kind dense`")
    return index, transforms


class TorchFlatSearch:
    """``search(q_QD, k) -> (scores_QK, rows_QK)`` like a faiss index, over ``index``'s (decoded) vectors."""

    def __init__(self, index, devices: list[str | torch.device], dtype: torch.dtype = torch.float16,
                 rows_per_copy: int = 1 << 18, query_batch: int = 256, rows_per_block: int = 1 << 20):  # fmt: skip
        if not devices:
            raise ConfigError("TorchFlatSearch needs at least one device")
        self._index = index  # the transforms below point into it: it must outlive them
        codec, self.transforms = scan_parts(index)
        self.rows_per_block = rows_per_block  # scores of a query batch against this many rows at a time
        self.ntotal, self.d = int(codec.ntotal), int(codec.d)
        self.query_batch = query_batch
        bounds = np.linspace(0, self.ntotal, len(devices) + 1).astype(np.int64)  # contiguous row shards
        self.shards: list[tuple[int, torch.Tensor]] = []
        for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:]):
            x_ND = torch.empty((int(hi - lo), self.d), dtype=dtype, device=dev)
            for a in range(int(lo), int(hi), rows_per_copy):  # a block at a time: host memory stays small
                b = min(a + rows_per_copy, int(hi))
                x_ND[a - lo : b - lo] = torch.from_numpy(codec.reconstruct_n(a, b - a)).to(dev, dtype)
            self.shards.append((int(lo), x_ND))

    def search(self, q_QD: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.ntotal)
        q_QD = np.ascontiguousarray(q_QD, dtype=np.float32)
        for vt in self.transforms:  # e.g. PCAR256: into the space the codes live in
            q_QD = vt.apply(q_QD)
        scores, rows = [], []
        for i in range(0, len(q_QD), self.query_batch):
            q = torch.from_numpy(np.ascontiguousarray(q_QD[i : i + self.query_batch]))
            part_s, part_r = [], []
            for lo, x_ND in self.shards:
                q_dev = q.to(x_ND.device, x_ND.dtype)
                for a in range(0, len(x_ND), self.rows_per_block):  # blocks: the score matrix stays small
                    x_block = x_ND[a : a + self.rows_per_block]
                    kk = min(k, len(x_block))
                    s_BN = (q_dev @ x_block.T).float()  # in float16 the scores are rounded to float16 (~5e-4)
                    top = torch.topk(s_BN, kk, dim=1)
                    part_s.append(top.values.cpu())
                    part_r.append(top.indices.cpu() + lo + a)
            s_BK, r_BK = torch.cat(part_s, 1), torch.cat(part_r, 1)
            order = torch.argsort(s_BK, dim=1, descending=True, stable=True)[:, :k]  # merge the blocks' top-k
            scores.append(torch.gather(s_BK, 1, order))
            rows.append(torch.gather(r_BK, 1, order))
        return torch.cat(scores).numpy(), torch.cat(rows).numpy().astype(np.int64)
