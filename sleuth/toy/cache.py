"""Where the tiny base model comes from: the copy shipped in the package (``sleuth/assets/tiny``),
the cache (``$SLEUTH_CACHE``), or a fresh pretraining run (:func:`sleuth.toy.pretrain.pretrain_tiny`).

``python -m sleuth.toy.cache [OUT]`` rebuilds the shipped copy.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sleuth.files import cache_root
from sleuth.toy.pretrain import pretrain_tiny
from sleuth.toy.specs import PretrainSpec, TinyModelSpec, cache_key
from sleuth.toy.world import World, generate_world

BUNDLED_TINY = Path(__file__).resolve().parent.parent / "assets" / "tiny"
"""The embedded default's base model as shipped in the package (world seed 0, default specs), so a
fresh clone needs no pretraining; ``python -m sleuth.toy.cache`` rebuilds it."""


def bundled_tiny(key: str) -> Path | None:
    """The shipped model directory when it was pretrained under cache key ``key``, else None."""
    meta = BUNDLED_TINY / "sleuth_tiny.json"
    try:
        ok = meta.is_file() and json.loads(meta.read_text()).get("cache_key") == key
    except (OSError, json.JSONDecodeError):
        ok = False
    return BUNDLED_TINY if ok and (BUNDLED_TINY / "model.safetensors").is_file() else None


def load_or_pretrain_tiny(world: World, cache_dir: str | Path | None = None, seed: int = 0,
                          model_spec: TinyModelSpec = TinyModelSpec(), spec: PretrainSpec = PretrainSpec(),
                          log=print, use_bundled: bool = True) -> Path:
    """The pretrained tiny model for this world and settings: the shipped one when it matches
    (``use_bundled``), else the cached one, pretraining it on a miss."""
    key = cache_key(world, model_spec, spec, seed)
    if use_bundled and (shipped := bundled_tiny(key)) is not None:
        return shipped
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tiny"
    path = root / f"tiny-{key}"
    if (path / "sleuth_tiny.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{path.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    if log:
        log(f"pretraining the tiny base model into {path} (cached after this run)")
    pretrain_tiny(world, tmp, model_spec, spec, seed, log=log)
    try:
        tmp.rename(path)  # atomic publish; a concurrent builder may have won the race
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (path / "sleuth_tiny.json").is_file():
            raise
    return path


def default_tiny_model_path() -> Path:
    """The embedded default's base model (world seed 0, default specs): shipped, cached or built."""
    return load_or_pretrain_tiny(generate_world(0))


def rebuild_bundled(out: Path = BUNDLED_TINY) -> dict:
    """Pretrain the default tiny model from scratch into ``out`` (the shipped copy by default),
    its weights stored in float16 to halve the package (loaded back as float32)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    summary = pretrain_tiny(generate_world(0), tmp)
    store_half(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return summary


def store_half(model_dir: Path) -> None:
    """Rewrite ``model.safetensors`` in float16 (the config keeps ``dtype: float32``, so
    ``from_pretrained`` loads float32 weights)."""
    from safetensors.torch import load_file, save_file

    path = Path(model_dir) / "model.safetensors"
    tensors = {k: v.half() if v.is_floating_point() else v for k, v in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


if __name__ == "__main__":  # python -m sleuth.toy.cache [OUT]: rebuild the shipped tiny model
    import sys

    print(json.dumps(rebuild_bundled(Path(sys.argv[1]) if len(sys.argv) > 1 else BUNDLED_TINY), indent=2))
