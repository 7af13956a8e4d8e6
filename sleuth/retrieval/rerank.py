"""Rerank: a cross-encoder rescoring the top-n passages of any base retriever.

The base retriever (BM25, dense, hybrid, an HTTP client ...) returns ``max(k, top_n)`` candidates
per query; the cross-encoder scores each ``(query, title line + text)`` pair and the best ``k``
by that score are returned, with the cross-encoder score as ``Passage.score`` (ties keep the base
order). Queries with no candidates (e.g. empty) return ``[]``.
"""

from __future__ import annotations

import numpy as np

from sleuth.device import check_device
from sleuth.errors import ConfigError, ModelError
from sleuth.retrieval.bm25 import check_k
from sleuth.retrieval.corpus import index_text
from sleuth.types import Passage


def load_cross_encoder(name_or_path: str, device: str | None = None, max_length: int = 512):
    """A ``sentence_transformers.CrossEncoder`` from a hub name or a local directory."""
    from sentence_transformers import CrossEncoder

    device = check_device(device)
    try:
        return CrossEncoder(name_or_path, device=device, max_length=max_length)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load cross-encoder {name_or_path!r} ({e}); pass a local directory "
                         "or a cached hub name") from e


class CrossEncoderReranker:
    """Wrap ``base`` (any Retriever) and rerank its top ``top_n`` with a cross-encoder."""

    def __init__(self, base, model, *, top_n: int = 20, batch_size: int = 32, device: str | None = None):
        if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
            raise ConfigError(f"rerank top_n (--rerank-top-n) must be an integer >= 1, got {top_n!r}")
        self.base = base
        self.model = load_cross_encoder(model, device) if isinstance(model, str) else model
        self.top_n, self.batch_size = top_n, batch_size

    def score_pairs(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """Cross-encoder scores (higher = more relevant) of ``(query, passage text)`` pairs."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        out = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                 convert_to_numpy=True)
        return np.asarray(out, dtype=np.float32).reshape(len(pairs), -1)[:, -1]

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Batched search: base top-n per query, reranked; at most ``k`` passages each."""
        check_k(k)
        candidates = self.base.search(queries, max(k, self.top_n))
        pairs = [(q, index_text(p.title, p.text)) for q, ps in zip(queries, candidates) for p in ps]
        scores = self.score_pairs(pairs)
        out, pos = [], 0
        for ps in candidates:
            s = scores[pos:pos + len(ps)]
            pos += len(ps)
            order = np.argsort(-s, kind="stable")[:k]
            out.append([Passage(ps[i].id, ps[i].title, ps[i].text, float(s[i])) for i in order])
        return out
