"""Writing files so that a kill or a power cut at any moment leaves the old content or the new one,
never a torn file: write beside, flush to disk, rename over, flush the directory entry."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's entries, to disk (a no-op where the OS cannot open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` and ``root`` itself, so that a rename of ``root`` into place
    publishes only data already on disk (a power cut cannot leave a renamed but empty checkpoint)."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            fsync_path(Path(dirpath) / f)
        fsync_path(Path(dirpath))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: written beside it, flushed, then renamed over it."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def cache_root() -> Path:
    """Sleuth's cache directory: ``$SLEUTH_CACHE``, or ``~/.cache/sleuth`` when it is unset or empty."""
    return Path(os.environ.get("SLEUTH_CACHE") or Path.home() / ".cache" / "sleuth").expanduser()
