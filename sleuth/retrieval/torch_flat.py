"""Exact (Flat) inner-product search with torch on one or several devices: a faiss ``IndexFlatIP``'s
vectors copied onto the GPUs in row shards (float16 by default: wiki-18's 21M x 768 e5 vectors take
32 GB, one H100 or two smaller GPUs), searched as ``q @ X.T`` + top-k per shard, merged on the host.

Used by :class:`sleuth.retrieval.dense.DenseRetriever` for a Flat index when it is given
``search_devices`` (``sleuth serve --search-devices cuda:0,cuda:1``). Equal to faiss' own search (rows;
scores to float rounding) when run in float32; tested on CPU devices, not yet on a GPU.
"""

from __future__ import annotations

import numpy as np
import torch


class TorchFlatSearch:
    """``search(q_QD, k) -> (scores_QK, rows_QK)`` like a faiss index, over ``index``'s vectors."""

    def __init__(self, index, devices: list[str | torch.device], dtype: torch.dtype = torch.float16,
                 rows_per_copy: int = 1 << 18, query_batch: int = 256):  # fmt: skip
        if not devices:
            raise ValueError("TorchFlatSearch needs at least one device")
        self.ntotal, self.d = int(index.ntotal), int(index.d)
        self.query_batch = query_batch
        bounds = np.linspace(0, self.ntotal, len(devices) + 1).astype(np.int64)  # contiguous row shards
        self.shards: list[tuple[int, torch.Tensor]] = []
        for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:]):
            x_ND = torch.empty((int(hi - lo), self.d), dtype=dtype, device=dev)
            for a in range(int(lo), int(hi), rows_per_copy):  # a block at a time: host memory stays small
                b = min(a + rows_per_copy, int(hi))
                x_ND[a - lo : b - lo] = torch.from_numpy(index.reconstruct_n(a, b - a)).to(dev, dtype)
            self.shards.append((int(lo), x_ND))

    def search(self, q_QD: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.ntotal)
        scores, rows = [], []
        for i in range(0, len(q_QD), self.query_batch):
            q = torch.from_numpy(np.ascontiguousarray(q_QD[i : i + self.query_batch]))
            part_s, part_r = [], []
            for lo, x_ND in self.shards:
                kk = min(k, len(x_ND))
                if kk == 0:
                    continue
                s_BN = (q.to(x_ND.device, x_ND.dtype) @ x_ND.T).float()  # fp16 inputs accumulate in fp32
                top = torch.topk(s_BN, kk, dim=1)
                part_s.append(top.values.cpu())
                part_r.append(top.indices.cpu() + lo)
            s_BK, r_BK = torch.cat(part_s, 1), torch.cat(part_r, 1)
            order = torch.argsort(s_BK, dim=1, descending=True, stable=True)[:, :k]  # merge the shards' top-k
            scores.append(torch.gather(s_BK, 1, order))
            rows.append(torch.gather(r_BK, 1, order))
        return torch.cat(scores).numpy(), torch.cat(rows).numpy().astype(np.int64)
