"""bench/gpu_stage.py and gpu_bundle.py: the GGUF split and join (sha256 checked), the split point chosen from a payload
budget, join's random-weights answers (bad hash, A's files gone), install's ../shared link, and the
wheel closure read from METADATA. A tmp dir is the repository root; nothing is downloaded."""

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # gpu_bundle imports gpu_stage by name: the same module, one StageError
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gs():
    saved = {n: sys.modules.get(n) for n in ("gpu_stage", "gpu_bundle")}
    yield _load("gpu_stage")
    for name, mod in saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod


@pytest.fixture(scope="module")
def gb(gs):
    """bench/gpu_bundle.py, the build side (split, data tar, wheel closure), bound to ``gs``."""
    return _load("gpu_bundle")


def _bundle(gs, gb, tmp_path, gguf_bytes=b"", budget=None):
    """A built-like pair of folders under tmp_path/repo: data tar in both, GGUF parts, manifest."""
    lay = gs.Layout(tmp_path / "repo")
    data = tmp_path / "src" / "data"
    for rel in gb.MUST_HAVE:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(json.dumps({"question": rel}) + "\n")
    for d in (lay.a, lay.b):
        (d / "whl").mkdir(parents=True)
        gb.pack_data(data, d / "shared.tar.xz")
    (lay.b / "whlA").mkdir()
    gguf = tmp_path / "src" / gs.GGUF_NAME
    gguf.write_bytes(gguf_bytes or os.urandom(10_000))
    part1, part2 = gb.plan_split(0, 0, 0, gguf.stat().st_size, budget or 6_000)
    parts = [(lay.a / "gguf.part1", part1), (lay.b / "gguf.part2", part2)]
    whole, digests = gb.write_parts(gguf, parts)
    man = {"gguf": {"name": gs.GGUF_NAME, "bytes": gguf.stat().st_size, "sha256": whole, "parts": [
        {"file": str(p.relative_to(lay.root)), "bytes": n, "sha256": d} for (p, n), d in zip(parts, digests)]}}
    for d in (lay.a, lay.b):
        (d / "MANIFEST.json").write_text(json.dumps(man))
    return lay, gguf


def test_split_at_a_budget_and_join_give_back_the_same_bytes(gs, gb, tmp_path):
    src = tmp_path / "model.gguf"
    blob = os.urandom(3 * gs.MiB + 12_345)
    src.write_bytes(blob)
    # budget 2 MiB for payload A, of which the repo takes 100 000 bytes and A's other files 50 000
    part1, part2 = gb.plan_split(100_000, 50_000, 30_000, len(blob), 2 * gs.MiB)
    assert part1 == 2 * gs.MiB - 150_000 and part1 + part2 == len(blob)
    parts = [(tmp_path / "p1", part1), (tmp_path / "p2", part2)]
    whole, digests = gb.write_parts(src, parts)
    assert [p.stat().st_size for p, _ in parts] == [part1, part2]
    assert whole == hashlib.sha256(blob).hexdigest()
    assert digests == [hashlib.sha256(blob[:part1]).hexdigest(), hashlib.sha256(blob[part1:]).hexdigest()]
    out = tmp_path / "joined.gguf"
    assert gs.join_parts([p for p, _ in parts], out) == whole and out.read_bytes() == blob
    with pytest.raises(gs.StageError, match="add up"):
        gb.write_parts(src, [(tmp_path / "p1", part1)])


def test_split_point_fills_payload_a_and_says_which_payload_cannot_fit(gs, gb):
    # limit 100: A holds repo 10 + other files 20 + part 1 70; B holds repo 10 + other 5 + part 2 30
    assert gb.plan_split(10, 20, 5, 100, 100) == (70, 30)
    assert gb.plan_split(10, 20, 5, 50, 100) == (50, 0)  # the whole file fits in A
    with pytest.raises(gs.StageError, match=r"payload A cannot fit"):
        gb.plan_split(60, 40, 0, 100, 100)
    with pytest.raises(gs.StageError, match=r"payload B cannot fit.*part 2") as e:
        gb.plan_split(10, 20, 61, 100, 100)  # part 2 is 30: 10 + 61 + 30 > 100
    assert "part 1 is already" in str(e.value)


def test_join_gives_real_weights_when_the_hash_matches_and_is_idempotent(gs, gb, tmp_path):
    lay, gguf = _bundle(gs, gb, tmp_path)
    for _ in range(2):
        info = gs.join(lay)
        assert info["weights"] == "real" and Path(info["gguf"]) == lay.gguf
        assert lay.gguf.read_bytes() == gguf.read_bytes()
    assert info["wheels_B"] == "no wheels carried"


def test_join_refuses_a_bad_hash_with_the_reason(gs, gb, tmp_path):
    lay, _ = _bundle(gs, gb, tmp_path)
    part2 = lay.b / "gguf.part2"
    blob = bytearray(part2.read_bytes())
    blob[7] ^= 0xFF  # same size, one byte changed
    part2.write_bytes(bytes(blob))
    info = gs.join(lay)
    assert info["weights"] == "random" and "sha256" in info["why"]
    assert not lay.gguf.exists()  # no half-trusted file left behind
    part2.write_bytes(bytes(blob[:-1]))  # a short part is caught before the join
    info = gs.join(lay)
    assert info["weights"] == "random" and "bytes" in info["why"]


def test_join_without_gpuA_is_random_and_uses_Bs_copy_of_the_data(gs, gb, tmp_path, capsys):
    lay, _ = _bundle(gs, gb, tmp_path)
    shutil.rmtree(lay.a)  # the machine went cold between A and B
    assert gs.main(["--root", str(lay.root), "join"]) == 1
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["weights"] == "random" and "cold" in info["why"]
    assert info["fallback"]["shared_link"] == "made"
    assert (lay.link / "data" / "train" / "nq.jsonl").is_file()
    assert lay.b.is_dir() and (lay.b / "gguf.part2").is_file()  # nothing of B's deleted


def test_install_links_shared_once_and_never_replaces_a_real_directory(gs, gb, tmp_path):
    lay, _ = _bundle(gs, gb, tmp_path)
    first, again = gs.install(lay), gs.install(lay)
    assert (first["shared_link"], again["shared_link"]) == ("made", "kept")
    assert os.readlink(lay.link) == str(lay.shared) and (lay.link / "data" / "dev" / "nq.jsonl").is_file()

    os.unlink(lay.link)
    lay.link.mkdir()
    (lay.link / "mine.txt").write_text("keep")
    info = gs.install(lay)
    assert info["shared_link"].startswith("refused") and str(lay.shared / "data") in info["shared_link"]
    assert not lay.link.is_symlink() and (lay.link / "mine.txt").read_text() == "keep"
    assert Path(info["data"], "corpus", "wiki_dev.jsonl").is_file()  # the data is reachable at the path given

    (lay.link / "mine.txt").unlink()
    lay.link.rmdir()
    os.symlink(tmp_path / "elsewhere", lay.link)  # someone else's link
    assert gs.install(lay)["shared_link"].startswith("refused")
    assert os.readlink(lay.link) == str(tmp_path / "elsewhere")


def _wheel(cache, name, version, requires):
    cache.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    path = cache / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}-{version}.dist-info/METADATA", meta)
    return path


def test_gather_follows_requires_dist_pins_and_skips_what_the_image_has(gs, gb, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _wheel(cache, "pkg-a", "1.0", ["pkg-b==2.0", "numpy>=1.25", "pkg-c; python_version < '3.11'",
                                   "pkg-d; extra == 'dev'", "pkg-e>=1; python_version < '3.13'"])
    _wheel(cache, "pkg-b", "2.0", ["pkg-a"])
    _wheel(cache, "pkg-b", "3.0", [])
    _wheel(cache, "pkg-e", "1.5", [])
    monkeypatch.setattr(gb.subprocess, "run", lambda *a, **k: pytest.fail(f"no download expected: {a}"))
    venv = {"pkg-a": "1.0", "pkg-b": "3.0", "pkg-e": "1.5"}  # pkg-a pins pkg-b to 2.0: the pin wins
    names = sorted(w.name for w in gb.gather(cache, ["pkg_a"], venv, set()))
    assert names == ["pkg_a-1.0-py3-none-any.whl", "pkg_b-2.0-py3-none-any.whl", "pkg_e-1.5-py3-none-any.whl"]
    assert [w.name for w in gb.gather(cache, ["pkg-a"], venv, {"pkg-b", "pkg-e"})] == ["pkg_a-1.0-py3-none-any.whl"]
    with pytest.raises(gs.StageError, match="pkg-z.*not installed"):
        gb.gather(cache, ["pkg-z"], venv, set())
