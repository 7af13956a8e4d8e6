"""What ``sleuth eval`` and ``sleuth ask`` share: the model / retriever / protocol flags both add,
and the builders that turn those flags into the parts of a run (rollout config and format,
retriever, model). Call :func:`sleuth.eval.defaults.resolve_run_defaults` on the parsed flags
first: it fills the ones left unset from what the model was trained with.

``sleuth --help`` imports this module (through the command modules), so what loads pydantic
(``sleuth.config``, ~0.2 s) or torch (~2 s) is imported inside the builder that needs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from sleuth.errors import ConfigError, UserError
from sleuth.files import cache_root
from sleuth.retrieval.index import META_FILE, read_meta
from sleuth.rollout.formats import ProtocolFormat, get_format


def add_model_retrieval_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``eval`` and ``ask``: model, retriever, protocol budget."""
    p.add_argument("--model", required=True,
                   help="hub name, local dir, Sleuth run/checkpoint dir, .gguf file, 'smollm2', 'gemma3-270m' or 'tiny'")
    p.add_argument("--index", help="index directory written by `sleuth index build`")
    p.add_argument("--retriever-url", help="Search-R1 /retrieve endpoint, e.g. http://127.0.0.1:8000/retrieve")
    p.add_argument("--corpus", help="jsonl corpus, indexed with BM25 on the fly (cached)")
    p.add_argument("--web", choices=["serper", "serpapi", "brave"], default=None,
                   help="web search through this API (key from SERPER_API_KEY / SERPAPI_API_KEY / BRAVE_API_KEY)")
    p.add_argument("--web-base-url", default=None, help="with --web: another address for the API (a proxy)")
    p.add_argument("--format", default=None,
                   help="protocol format (default: the one the model was trained with for 'tiny' or a Sleuth "
                        "run dir, else search_r1)")
    p.add_argument("--max-turns", type=int, default=None,
                   help="searches executed at most (default: the run's, else 4)")
    p.add_argument("--topk", type=int, default=None, help="passages per search (default: the run's, else 3)")
    p.add_argument("--max-tokens-per-turn", type=int, default=None,
                   help="tokens per policy turn (default: the run's, else 500)")
    p.add_argument("--max-context-tokens", type=int, default=None,
                   help="prompt + response budget (default: the run's, else 4096)")
    p.add_argument("--no-search", action="store_true",
                   help="no-retrieval baseline: direct-answer prompt and max_turns=0 (searches not executed)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights and compute dtype (default auto: bfloat16 on a GPU that supports it, else float32)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--set", action="append", default=[], metavar="rollout.KEY=VALUE",
                   help="override a rollout config value, e.g. --set rollout.max_obs_tokens=256 (repeatable)")


def rollout_config(args):
    """The RolloutConfig of an eval/ask invocation: defaults, the run's own settings, flags, then
    ``--set rollout.*`` (call :func:`resolve_run_defaults` first)."""
    from sleuth.config_file import load_config  # lazy: pydantic (~0.2 s) at `sleuth --help`

    bad = [s for s in args.set if not s.startswith("rollout.")]
    if bad:
        raise UserError(f"--set here only takes rollout.* keys, got {bad}")
    extra = [f"rollout.{k}={json.dumps(v)}" for k, v in getattr(args, "run_rollout", {}).items()]  # YAML scalars
    extra += [f"rollout.max_turns={args.max_turns}", f"rollout.format={args.format}"]
    if args.max_tokens_per_turn is not None:
        extra.append(f"rollout.max_tokens_per_turn={args.max_tokens_per_turn}")
    if args.max_context_tokens is not None:
        extra.append(f"rollout.max_context_tokens={args.max_context_tokens}")
    try:
        return load_config(None, extra + list(args.set)).rollout
    except ConfigError as e:
        raise UserError(str(e)) from None


def protocol(args):
    """``(rollout_config, format)`` of an eval/ask invocation (the format ``rollout.format`` names)."""
    rcfg = rollout_config(args)
    fmt: ProtocolFormat = get_format(rcfg.format)
    return rcfg, fmt


def _sha(path: Path, n: int = 16) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:n]


def describe_retriever(args) -> dict:
    """What the retriever is (for the setting) and its cache fingerprint; no index is opened."""
    given = [x for x in ("index", "retriever_url", "corpus", "web") if getattr(args, x, None)]
    if args.no_search:
        return {"kind": "none", "corpus": "none", "fingerprint": None}
    if len(given) != 1:
        raise UserError("give exactly one of --index DIR, --retriever-url URL, --corpus FILE or --web PROVIDER "
                        f"(got {len(given)}); or --no-search for the no-retrieval baseline")  # fmt: skip
    if args.index:
        meta = read_meta(args.index)
        fp = "index-" + hashlib.sha256((Path(args.index) / META_FILE).read_bytes()).hexdigest()[:16]
        corpus = f"{Path(meta['corpus']['path']).name} ({meta['n_passages']} passages)"
        kind = meta["kind"] + (f" ({meta['encoder']})" if meta.get("encoder") else "")
        return {"kind": kind, "corpus": corpus, "index": str(Path(args.index).resolve()), "fingerprint": fp}
    if args.corpus:
        path = Path(args.corpus)
        if not path.is_file():
            raise UserError(f"--corpus {path}: no such file")
        return {"kind": "bm25", "corpus": path.name, "corpus_path": str(path.resolve()),
                "fingerprint": f"bm25-corpus-{_sha(path)}"}  # fmt: skip
    if getattr(args, "web", None):  # results change over time: never cached
        return {"kind": "web", "corpus": f"{args.web} web search", "fingerprint": None}
    return {"kind": "url", "corpus": f"server at {args.retriever_url}", "url": args.retriever_url, "fingerprint": None}


def open_retriever(args, desc: dict, *, cache: bool = False, cache_dir: str | None = None, probe: bool = False):
    """The retriever the flags ask for; behind the on-disk cache when ``cache`` and it has a fingerprint.

    ``probe``: make one test search first (as ``sleuth train`` does), so a retriever that is down or
    a mistyped ``--retriever-url`` is a one-line error (a ``ConfigError`` naming it and the flag)
    before any model is loaded, not an eval whose every search failed."""
    from sleuth.build import probe_retriever  # lazy: torch (~2 s) at `sleuth --help`
    from sleuth.config import Config, RetrievalConfig  # lazy: pydantic (~0.2 s) at `sleuth --help`
    from sleuth.eval.evaluate import DiskCachedRetriever  # lazy: pydantic, as sleuth.config
    from sleuth.retrieval.factory import build_retriever  # lazy: pydantic, as sleuth.config

    if args.no_search:
        return None
    web = getattr(args, "web", None)
    cfg = RetrievalConfig(kind="web" if web else "url" if args.retriever_url else "bm25", index_dir=args.index,
                          corpus=args.corpus, url=args.retriever_url, topk=args.topk, web_provider=web or "serper",
                          web_base_url=getattr(args, "web_base_url", None))  # fmt: skip
    if args.index:
        cfg.kind = desc["kind"].split(" ")[0]
    retriever = build_retriever(cfg)  # a URL reads its bearer token from $SLEUTH_RETRIEVAL_TOKEN
    if probe:  # before the cache, which would keep the test query
        flag = ("--web" if web else "--retriever-url" if args.retriever_url else "--index" if args.index
                else "--corpus")
        probe_retriever(retriever, Config(retrieval=cfg), fix=flag)
    if cache and desc.get("fingerprint"):
        root = Path(cache_dir) if cache_dir else cache_root()
        retriever = DiskCachedRetriever(retriever, root / "retrieval_cache.sqlite", desc["fingerprint"])
    return retriever


def resolve_dtype(args, out=None) -> str:
    """``--dtype auto`` -> the dtype an eval already in ``out`` ran in (a resume continues in it), else
    bfloat16 on a CUDA device that supports it, else float32 (set on ``args``)."""
    if args.dtype == "auto" and out is not None:
        import json

        setting = Path(out) / "setting.json"
        try:
            recorded = json.loads(setting.read_text()).get("dtype") if setting.is_file() else None
        except (OSError, ValueError, AttributeError):
            recorded = None  # check_setting names a damaged file
        if recorded in ("float32", "bfloat16", "float16"):
            args.dtype = recorded
    if args.dtype == "auto":
        import torch  # lazy: torch (~2 s) at `sleuth --help`

        from sleuth.models import pick_device  # lazy: as above

        device = pick_device(args.device)  # a bad --device: a ConfigError naming it
        args.dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return args.dtype


def load_model(args):
    """``(model, tokenizer)``; a model that cannot be loaded (offline hub name, broken files) is a
    clear input error, not a traceback."""
    from sleuth.models import load_policy  # lazy: torch (~2 s) at `sleuth --help`

    resolve_dtype(args)
    try:
        return load_policy(args.model, dtype=args.dtype, device=args.device)
    except OSError as e:
        raise UserError(f"could not load model {args.model!r}: {e}") from None
