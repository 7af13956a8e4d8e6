"""On-disk cache of corpus embeddings in chunked ``.npy`` files, and exact search over it.

``<cache_root>/<key>/chunk_000000.npy`` ... each holds ``chunk_rows`` consecutive passages'
L2-normalised embeddings ([C, D]) in float16 (half of float32's disk: 32 GB for wiki-18 with a
768-d encoder; relative rounding 5e-4), read back as float32; float32 chunks of older caches are
reused as they are. The key hashes everything that changes the vectors
(encoder, passage prefix, corpus hash, passage count), so several encoders or corpora can share
one cache root; ``key.json`` records the chunk size the cache was started with, which is kept.
Each chunk is written to a temporary file and renamed, so a build that is interrupted resumes at
the first missing chunk and never reads a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np

from sleuth.errors import ConfigError
from sleuth.retrieval.corpus import CorpusStore, progress_bar

CHUNK_ROWS = 4096


class EmbeddingChunks:
    """The cached chunks of one (encoder, corpus): iterate, sample, count."""

    def __init__(self, directory: Path, n: int, chunk_rows: int, dim: int):
        self.dir, self.n, self.chunk_rows, self.dim = directory, n, chunk_rows, dim

    @property
    def num_chunks(self) -> int:
        return (self.n + self.chunk_rows - 1) // self.chunk_rows

    def path(self, i: int) -> Path:
        return self.dir / f"chunk_{i:06d}.npy"

    def load(self, i: int) -> np.ndarray:
        return np.load(self.path(i), mmap_mode="r")

    def iter_arrays(self) -> Iterator[np.ndarray]:
        """Yield each chunk as a contiguous float32 [C, D] array, in row order."""
        for i in range(self.num_chunks):
            yield np.ascontiguousarray(self.load(i), dtype=np.float32)

    def sample(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """``m`` rows drawn without replacement ([m, D]), e.g. to train an IVF/PQ index."""
        rows = np.sort(rng.choice(self.n, size=min(m, self.n), replace=False))
        parts = [self.load(int(c))[rows[rows // self.chunk_rows == c] % self.chunk_rows]
                 for c in np.unique(rows // self.chunk_rows)]
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)


def cache_key(encoder_id: str, passage_prefix: str, corpus_sha: str, n: int) -> str:
    blob = json.dumps([encoder_id, passage_prefix, corpus_sha, n])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def encode_corpus(store: CorpusStore, model, cache_root: Path, passage_prefix: str, *,
                  encoder_id: str, batch_size: int = 64, chunk_rows: int | None = None,
                  show_progress: bool = True, shard: tuple[int, int] = (0, 1)) -> EmbeddingChunks:
    """Encode every passage of ``store`` (reusing cached chunks); return the chunk set.

    ``shard=(i, n)`` encodes only chunks ``c`` with ``c % n == i`` (the others are left to the
    processes or GPUs running the other shards into the same ``cache_root``); a later call with
    the default ``(0, 1)`` finds them all cached and encodes nothing."""
    i_shard, n_shards = shard
    if not 0 <= i_shard < n_shards:
        raise ConfigError(f"shard {i_shard}/{n_shards}: need 0 <= i < N")
    chunk_rows = chunk_rows or CHUNK_ROWS
    n = len(store)
    directory = Path(cache_root) / cache_key(encoder_id, passage_prefix, store.fingerprint(), n)
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "key.json").is_file():  # resume with the chunking the cache was started with
        chunk_rows = int(json.loads((directory / "key.json").read_text())["chunk_rows"])
    get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = int(get_dim())
    key_tmp = directory / f"key.json.tmp-{uuid.uuid4().hex[:12]}"  # written aside: a reader never sees half
    key_tmp.write_text(json.dumps(
        {"encoder": encoder_id, "passage_prefix": passage_prefix, "corpus_sha256": store.fingerprint(),
         "n": n, "chunk_rows": chunk_rows, "dim": dim}, indent=2))
    os.replace(key_tmp, directory / "key.json")
    chunks = EmbeddingChunks(directory, n, chunk_rows, dim)
    step = max(batch_size * 4, 1)
    with progress_bar(show_progress) as progress:
        task = progress.add_task("encode passages", total=n)
        for i in range(chunks.num_chunks):
            lo, hi = i * chunk_rows, min((i + 1) * chunk_rows, n)
            if i % n_shards != i_shard or _chunk_ok(chunks.path(i), hi - lo, dim):
                progress.advance(task, hi - lo)
                continue
            (_, texts), = store.iter_texts(batch_rows=hi - lo, start=lo, stop=hi)
            parts = []
            for j in range(0, len(texts), step):
                parts.append(model.encode([passage_prefix + t for t in texts[j:j + step]],
                                          batch_size=batch_size, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False))
                progress.advance(task, len(texts[j:j + step]))
            tmp = chunks.path(i).with_suffix(f".tmp-{uuid.uuid4().hex[:12]}.npy")  # one per writer: ranks may race
            np.save(tmp, np.concatenate(parts).astype(np.float16))  # half the disk; read back as float32
            os.replace(tmp, chunks.path(i))
    return chunks


def _chunk_ok(path: Path, rows: int, dim: int) -> bool:
    """A cached chunk is reused only when it loads and has the expected shape."""
    if not path.is_file():
        return False
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.shape == (rows, dim) and arr.dtype in (np.float16, np.float32)  # float32: caches before fp16


def exact_search(chunks: EmbeddingChunks, q_QD: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force inner-product top-k over all chunks: ``(scores_QK, rows_QK)``, best first."""
    best_s = np.full((len(q_QD), 0), -np.inf, dtype=np.float32)
    best_r = np.zeros((len(q_QD), 0), dtype=np.int64)
    for i, emb_CD in enumerate(chunks.iter_arrays()):
        s_QC = q_QD @ emb_CD.T
        rows_C = np.arange(len(emb_CD), dtype=np.int64) + i * chunks.chunk_rows
        cat_s = np.concatenate([best_s, s_QC], axis=1)
        cat_r = np.concatenate([best_r, np.broadcast_to(rows_C, s_QC.shape)], axis=1)
        top = np.argsort(-cat_s, axis=1, kind="stable")[:, :k]
        best_s, best_r = np.take_along_axis(cat_s, top, 1), np.take_along_axis(cat_r, top, 1)
    return best_s, best_r
