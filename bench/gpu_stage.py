"""Staging for the GPU check's visit: what the GPU machine (no network) lacks, in two carried folders.

    make gpu-bundle                                # = python bench/gpu_stage.py build
    python bench/gpu_stage.py build --check        # payload table of the bundles already built
    python3 bench/gpu_stage.py install             # GPU machine, command A (carry [".gpuA"])
    python3 bench/gpu_stage.py join                # GPU machine, command B (carry [".gpuB"])

``.gpuA``: the essential wheels (``whl/``), ``../shared/data`` as ``shared.tar.xz``, GGUF part 1 (as
large as A allows) and ``MANIFEST.json`` (sha256 of the GGUF and of each part, wheels and versions, what
was left out). ``.gpuB``: part 2, the wheels of ``sleuth serve`` (``whl/``) and, where they fit, a copy
of A's wheels and data (``whlA/``, ``shared.tar.xz``) so that a B which finds the machine cold (A's
files gone) still runs everything but the real-weight steps; faiss-cpu only where it fits too.
``build`` is bench/gpu_bundle.py (run here, with the venv; imported only by ``build``).
``install`` and ``join`` need only the stdlib (nothing is installed there yet) and are idempotent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MiB = 1 << 20
LIMIT_MIB = 59.0  # per payload: the tool's hard limit is 64 MiB, the plan keeps under 60


class StageError(RuntimeError):
    """A bundle cannot be made or used; the message names the figures or the file."""


class Layout:
    """Every path the stage uses, under one repository root (a tmp dir in tests)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    a = property(lambda s: s.root / ".gpuA")
    b = property(lambda s: s.root / ".gpuB")
    cache = property(lambda s: s.root / ".gpu-cache")
    site = property(lambda s: s.a / "site")  # what PYTHONPATH names on the GPU machine
    shared = property(lambda s: s.a / "shared")  # unpacked data: shared/data/...
    link = property(lambda s: s.root.parent / "shared")  # the configs read ../shared/data
    gguf = property(lambda s: s.a / GGUF_NAME)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


def join_parts(parts: list[Path], dest: Path) -> str:
    """Concatenate ``parts`` into ``dest`` (through a temporary file); the sha256 of what was written."""
    h, tmp = hashlib.sha256(), dest.with_name(dest.name + ".partial")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(MiB):
                    out.write(chunk)
                    h.update(chunk)
    tmp.replace(dest)
    return h.hexdigest()


# --- on the GPU machine (stdlib only) --------------------------------------------------------------

def pip_install(lay: Layout, folder: Path) -> str:
    """Install ``folder``'s wheels into ``lay.site`` unless the same set already is (a stamp says)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return "no wheels carried"
    stamp, names = lay.site / f".installed-{folder.parent.name}-{folder.name}", "\n".join(w.name for w in wheels)
    if stamp.is_file() and stamp.read_text() == names:
        return f"{len(wheels)} wheels already installed"
    lay.site.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                         "--no-cache-dir", "--upgrade", "--target", str(lay.site), *map(str, wheels)]).returncode
    if rc:
        raise StageError(f"pip install of {len(wheels)} wheels from {folder} into {lay.site} failed (exit {rc})")
    stamp.write_text(names)
    return f"{len(wheels)} wheels installed"


def link_shared(lay: Layout) -> str:
    """``../shared`` -> ``.gpuA/shared`` (ln -sfn), never replacing a ``../shared`` made by someone else."""
    link, target = lay.link, str(lay.shared)
    if link.is_symlink() and os.readlink(link) == target:
        return "kept"
    if os.path.lexists(link):
        return f"refused: {link} exists and is not a link made here; use {lay.shared / 'data'} instead"
    try:
        os.symlink(target, link)
    except OSError as e:
        return f"failed ({e}); use {lay.shared / 'data'} instead"
    return "made"


def unpack(lay: Layout, tar: Path) -> dict:
    """``tar`` into ``.gpuA/shared`` (once), then the ``../shared`` link."""
    if not (lay.shared / "data").is_dir():
        if not tar.is_file():
            raise StageError(f"no data: {tar} is missing")
        tmp = lay.a / "shared.partial"
        for d in (tmp, lay.shared):
            shutil.rmtree(d, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(tar) as t:
            t.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        tmp.rename(lay.shared)
    return {"data": str(lay.shared / "data"), "shared_link": link_shared(lay)}


def install(lay: Layout, src: Path | None = None, whl: str = "whl") -> dict:
    """Command A's job: ``src``'s wheels into ``.gpuA/site``, its data unpacked and linked."""
    src = src or lay.a
    if not src.is_dir():
        raise StageError(f"{src} is missing: carry it with this command")
    wheels = _safe(pip_install, lay, src / whl)
    return {"wheels": wheels, **unpack(lay, src / "shared.tar.xz"), "site": str(lay.site)}


def join(lay: Layout) -> dict:
    """Command B's job: B's wheels installed, the GGUF joined and checked. ``{"weights": "real", "gguf":
    path}``, or ``{"weights": "random", "why": ...}`` when A's files are gone or a hash differs."""
    info, man_path = {}, lay.a / "MANIFEST.json"
    if not man_path.is_file() or not (lay.a / "gguf.part1").is_file():
        info["why"] = f"{lay.a} has no MANIFEST.json or gguf.part1: the machine went cold between A and B"
        if (lay.b / "whlA").is_dir():  # B carries A's wheels and data: everything but the weights runs
            info["fallback"] = _safe(install, lay, lay.b, "whlA")
    info["wheels_B"] = _safe(pip_install, lay, lay.b / "whl")
    if "why" in info:
        return {"weights": "random", **info}
    man = json.loads(man_path.read_text())["gguf"]
    for spec in man["parts"]:
        part = lay.root / spec["file"]
        if not part.is_file() or part.stat().st_size != spec["bytes"]:
            got = f"{part.stat().st_size} bytes" if part.is_file() else "missing"
            return {"weights": "random", "why": f"{part}: {got}, the manifest says {spec['bytes']} bytes", **info}
    if not (lay.gguf.is_file() and lay.gguf.stat().st_size == man["bytes"] and sha256(lay.gguf) == man["sha256"]):
        digest = join_parts([lay.root / p["file"] for p in man["parts"]], lay.gguf)
        if digest != man["sha256"]:
            lay.gguf.unlink()
            return {"weights": "random", "why": f"joined GGUF has sha256 {digest}, the manifest says "
                                                f"{man['sha256']}", **info}
    return {"weights": "real", "gguf": str(lay.gguf), **info}


def _safe(fn, *args):
    try:
        return fn(*args)
    except (StageError, OSError, tarfile.TarError) as e:
        return f"failed: {e}"


def _bundle():
    """bench/gpu_bundle.py, imported here only (the GPU machine never builds). It imports its shared names
    from ``gpu_stage``: this module is registered under that name first, so that a script run as
    ``__main__`` and the bundle share one StageError (the one ``main`` catches)."""
    sys.modules.setdefault("gpu_stage", sys.modules[__name__])
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpu_bundle
    return gpu_bundle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this checkout)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="make .gpuA and .gpuB here (make gpu-bundle)")
    b.add_argument("--check", action="store_true", help="only print the payload table of the bundles built")
    b.add_argument("--limit", type=float, default=LIMIT_MIB, help="MiB per payload (default %(default)s)")
    b.add_argument("--data", type=Path, default=None, help="the data folder (default ../shared/data)")
    b.add_argument("--venv-python", default=None, help="interpreter whose versions are carried")
    sub.add_parser("install", help="GPU machine, command A: wheels, data, ../shared link")
    sub.add_parser("join", help="GPU machine, command B: join and check the GGUF, B's wheels")
    args = ap.parse_args(argv)
    lay = Layout(args.root.resolve())
    try:
        if args.cmd == "build":
            bundle = _bundle()
            if not args.check:
                venv = lay.root / ".venv" / "bin" / "python"
                bundle.build(lay, args.limit, args.data or lay.root.parent / "shared" / "data",
                             args.venv_python or (str(venv) if venv.exists() else sys.executable))
            table, ok = bundle.payload_table(lay, args.limit)
            print(table)
            return 0 if ok else 1
        info = install(lay) if args.cmd == "install" else join(lay)
    except (StageError, OSError, ValueError, KeyError, tarfile.TarError, subprocess.SubprocessError) as e:
        print(f"gpu_stage {args.cmd}: {e}", file=sys.stderr)
        print(json.dumps({"weights": "random", "why": str(e)} if args.cmd == "join" else {"error": str(e)}))
        return 1
    for key, value in info.items():
        print(f"gpu_stage {args.cmd}: {key}: {value}")
    print(f"PYTHONPATH={lay.site}:{lay.root}")
    print(json.dumps(info))
    if args.cmd == "join":
        return 0 if info["weights"] == "real" else 1
    return 1 if any(str(v).startswith("failed") for v in info.values()) else 0


if __name__ == "__main__":
    sys.exit(main())