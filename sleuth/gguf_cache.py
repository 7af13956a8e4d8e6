"""GGUF models de-quantised once: the weights transformers de-quantises on every GGUF load, kept as a plain
Hugging Face directory in ``$SLEUTH_CACHE/models/dequantized/``.

transformers reads a GGUF file by de-quantising every tensor in Python: 11 s for SmolLM2-135M and ~25 s for
Gemma-3-270M on this 2-core CPU, paid by every ``sleuth train``, ``eval``, ``ask`` and ``sft`` that names them.
The first load writes what it produced (weights in the dtype loaded, config, tokenizer) with ``save_pretrained``
beside the cache entry and renames it into place (an interrupted write leaves no entry); later loads of the same
file in the same dtype read that directory, a round trip that gives back the same tensors. An entry is keyed by
the GGUF file's path, size and modification time, the dtype and the transformers version (its de-quantiser could
change), so a replaced file or an upgrade makes a new entry. ``SLEUTH_GGUF_CACHE=0`` turns it off. A failed
write (a full disk, a read-only cache) is said once and the load goes on from the GGUF file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from sleuth.files import cache_root

FORMAT = 1  # bump when what an entry holds changes


def enabled() -> bool:
    return os.environ.get("SLEUTH_GGUF_CACHE", "1") != "0"


def entry(gguf: Path, dtype: str) -> Path:
    """Where the de-quantised copy of ``gguf`` loaded in ``dtype`` lives (whether written or not)."""
    import transformers

    st = gguf.stat()
    key = json.dumps([str(gguf.resolve()), st.st_size, st.st_mtime_ns, dtype, transformers.__version__, FORMAT])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "models" / "dequantized" / f"{gguf.stem}-{dtype}-{digest}"


def lookup(gguf: Path, dtype: str) -> Path | None:
    """The cached directory for ``gguf`` in ``dtype``, if one was written completely; None otherwise."""
    if not enabled():
        return None
    path = entry(gguf, dtype)
    return path if (path / "config.json").is_file() else None


def store(model, tokenizer, gguf: Path, dtype: str) -> Path | None:
    """Write ``model`` (de-quantised from ``gguf``, in ``dtype``) and ``tokenizer`` as the cache entry; the entry,
    or None when the cache is off or the write failed (said on stderr; the caller keeps its loaded model)."""
    if not enabled():
        return None
    path = entry(gguf, dtype)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(path)
        except OSError:
            if not (path / "config.json").is_file():  # not a concurrent writer that got there first
                raise
    except OSError as e:
        print(f"sleuth: note: could not keep the de-quantised {gguf.name} in {path.parent} ({e}); later loads "
              "de-quantise it again (SLEUTH_GGUF_CACHE=0 stops trying)", file=sys.stderr)
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
