"""Query/passage prefixes of a dense encoder: detected, chosen for a build, used at search.

Detection (:func:`detect_prefixes`): the prompts of a local model's sentence-transformers config
when it declares them; else by model family, read from the name, a Hugging Face cache path
(``models--intfloat--e5-base-v2/snapshots/<hash>``), the directory name or config.json's
``_name_or_path``: e5 ``query: ``/``passage: ``; English bge (v1.5) the query instruction
``Represent this sentence for searching relevant passages: ``; none for MiniLM and others.
Prefixes given explicitly win over detection (:func:`choose_prefixes`). Those used are recorded in
the index, and search uses them (:func:`search_query_prefix`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from sleuth.errors import ConfigError
from sleuth.retrieval.encoder import resolve_encoder

BGE_EN_INSTRUCTION = "Represent this sentence for searching relevant passages: "
BGE_ZH_INSTRUCTION = "为这个句子生成表示以用于检索相关文章："


def family_prefixes(name: str) -> tuple[str, str, str] | None:
    """``(query_prefix, passage_prefix, family)`` when the last part of a model name (``org/name``)
    names a family with prefixes, else None."""
    low = str(name).lower().rstrip("/").split("/")[-1]
    if "e5" in low.replace("_", "-").split("-"):
        return "query: ", "passage: ", "e5"
    if "bge" in low and "m3" not in low:
        return (BGE_ZH_INSTRUCTION if "-zh" in low else BGE_EN_INSTRUCTION), "", "bge"
    return None


def _read_json(path: Path) -> dict:
    """A JSON object file, or {} when it is missing or unreadable (detection then looks elsewhere)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _names_of(path: Path) -> list[tuple[str, str]]:
    """``(model name, where it was read)`` for a local model directory, most telling first."""
    out = []
    for part in reversed([*path.parts, *path.resolve().parts]):
        if part.startswith("models--"):  # huggingface_hub cache: models--{org}--{name}/snapshots/{hash}
            out.append((part[len("models--"):].replace("--", "/"), f"the Hugging Face cache path ({part})"))
            break
    for dir_name in dict.fromkeys([path.name, path.resolve().name]):  # a symlink's name, then the target's
        if dir_name:
            out.append((dir_name, "the directory name"))
    name_or_path = _read_json(path / "config.json").get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path:
        out.append((name_or_path, "config.json's _name_or_path"))
    return out


def detect_prefixes(name: str) -> tuple[str, str, str]:
    """``(query_prefix, passage_prefix, how they were chosen)`` for an encoder name or local path.

    A local directory's ``config_sentence_transformers.json`` prompts (``query``, and
    ``passage``/``document``) are used when they say something; else the model family of the
    first name that has one (:func:`_names_of` for a directory, the name itself for a hub id).
    """
    path = Path(str(name)).expanduser()
    if path.is_dir():
        prompts = _read_json(path / "config_sentence_transformers.json").get("prompts")
        if isinstance(prompts, dict):
            query = prompts.get("query") or ""
            passage = next((prompts[k] for k in ("passage", "document") if prompts.get(k)), "")
            if (query or passage) and isinstance(query, str) and isinstance(passage, str):
                return query, passage, "the prompts of its config_sentence_transformers.json"
        candidates = _names_of(path)
    else:
        candidates = [(str(name), "the encoder name")]
    for candidate, where in candidates:
        found = family_prefixes(candidate)
        if found:
            return found[0], found[1], f"{found[2]} family, from {where} ({candidate})"
    return "", "", "none: no family with prefixes found in " + ", ".join(repr(c) for c, _ in candidates)


def encoder_prefixes(name: str) -> tuple[str, str]:
    """``(query_prefix, passage_prefix)`` detected for an encoder name or path (:func:`detect_prefixes`)."""
    return detect_prefixes(name)[:2]


def choose_prefixes(encoder: str, query_prefix: str | None, passage_prefix: str | None) -> dict:
    """The prefixes a build uses: the ones given (not None) win over detection. Returns
    ``{"query_prefix", "passage_prefix", "prefix_source"}``."""
    q, p, source = detect_prefixes(resolve_encoder(encoder))
    given = [what for what, value in (("query", query_prefix), ("passage", passage_prefix)) if value is not None]
    if len(given) == 2:
        source = "given"
    elif given:
        source = f"{given[0]} prefix given; the other detected: {source}"
    return {"query_prefix": q if query_prefix is None else query_prefix,
            "passage_prefix": p if passage_prefix is None else passage_prefix, "prefix_source": source}


def search_query_prefix(params: dict, query_prefix: str | None, passage_prefix: str | None, where) -> str:
    """The query prefix to search an index with: the one it was built with, or ``query_prefix``
    (with a warning when they differ). A ``passage_prefix`` other than the built one is refused:
    the passages are already encoded with theirs."""
    built_q, built_p = params["query_prefix"], params.get("passage_prefix", "")
    if passage_prefix is not None and passage_prefix != built_p:
        raise ConfigError(
            f"index {where} was built with passage prefix {built_p!r}, not {passage_prefix!r} "
            "(--passage-prefix / retrieval.passage_prefix); its passages are encoded with it: drop "
            f"the override, or rebuild the index with --passage-prefix {passage_prefix!r}")
    if query_prefix is None or query_prefix == built_q:
        return built_q
    warnings.warn(f"index {where} was built with query prefix {built_q!r}; searching with {query_prefix!r} "
                  "as asked (--query-prefix / retrieval.query_prefix); drop the override to use the "
                  "index's own", UserWarning, stacklevel=2)
    return query_prefix
