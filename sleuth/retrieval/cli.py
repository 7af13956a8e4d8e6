"""``sleuth index build`` and ``sleuth search`` (thin: parse -> build/load -> call).

    sleuth index build --corpus FILE --kind bm25|dense|hybrid [--encoder NAME_OR_PATH]
                       [--query-prefix P] [--passage-prefix P] [--faiss FACTORY] --out DIR [--json]
    sleuth search --index DIR | --url URL [--token T] "query" ["query" ...] [-k 3] [--json]

With ``--json`` the last stdout line is one JSON summary object. Progress bars go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

from sleuth.errors import UserError
from sleuth.output import output_dir, print_json_line
from sleuth.retrieval.base import RetrievalError
from sleuth.retrieval.index import build_index, describe_prefixes, load_index


def add_prefix_flags(p, building: bool) -> None:
    """``--query-prefix`` / ``--passage-prefix`` (for build, search and serve)."""
    if building:
        p.add_argument("--query-prefix", default=None, metavar="TEXT",
                       help="text put before each query, e.g. 'query: ' for e5 (default: detected from "
                            "the encoder; '' for none); recorded in the index")
        p.add_argument("--passage-prefix", default=None, metavar="TEXT",
                       help="text put before each passage, e.g. 'passage: ' for e5 (default: detected)")
    else:
        p.add_argument("--query-prefix", default=None, metavar="TEXT",
                       help="dense query prefix instead of the one the index was built with (warns if it differs)")
        p.add_argument("--passage-prefix", default=None, metavar="TEXT",
                       help="refuse a dense index built with another passage prefix")


def register(sub) -> None:
    """Add the ``index`` and ``search`` commands."""
    p_index = sub.add_parser("index", help="build or import retrieval indexes")
    index_sub = p_index.add_subparsers(dest="index_command", metavar="SUBCOMMAND")
    p_index.set_defaults(func=lambda a: p_index.print_help() or 2)
    b = index_sub.add_parser("build", help="ingest a jsonl corpus and build a bm25/dense/hybrid index")
    b.add_argument("--corpus", required=True, help="jsonl corpus: {id, contents} or {id, title, text}")
    b.add_argument("--kind", required=True, choices=["bm25", "dense", "hybrid"])
    b.add_argument("--out", required=True, help="index directory to write")
    b.add_argument("--encoder", default=None,
                   help="sentence-transformers name or path (default all-MiniLM-L6-v2)")
    add_prefix_flags(b, building=True)
    b.add_argument("--faiss", default="auto",
                   help="faiss factory string, e.g. Flat (exact), HNSW32, SQ8, or PCAR256,SQ6 (1/8 of Flat's memory, "
                        "recall@3 ~0.96 with MiniLM); default auto: Flat up to 1M passages, PCAR256,SQ6 beyond "
                        "(recall against exact search measured and printed)")
    b.add_argument("--faiss-search-params", default=None,
                   help="faiss ParameterSpace string, e.g. nprobe=32 (default: chosen per factory)")
    b.add_argument("--cache-dir", default=None, help="embedding cache directory (default OUT/dense/embeddings)")
    b.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    b.add_argument("--device", default=None, help="encoder device: cpu, cuda, cuda:N or auto (default)")
    b.add_argument("--encode-dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                   help="the encoder's weights while it encodes passages (default auto: float16 on a CUDA device, "
                        "float32 elsewhere); queries are always encoded in float32")
    b.add_argument("--skip-bad", action="store_true", help="skip (and count) malformed corpus lines")
    b.add_argument("--shard", default=None, metavar="I/N",
                   help="dense: encode only share I of N of the embeddings into --cache-dir (run the N shards as "
                        "separate processes, e.g. one per GPU, each with its own --out), then build the index by "
                        "running without --shard with the same --cache-dir")
    b.add_argument("--overwrite", action="store_true",
                   help="replace an existing Sleuth index in --out (other directories are never written into)")
    b.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    b.set_defaults(func=_build)

    m = index_sub.add_parser("import", help="use a faiss index built elsewhere (Search-R1's e5_Flat.index) and "
                                            "its corpus as a dense index, without re-encoding")
    m.add_argument("--faiss", required=True, help="the faiss index file (linked, never copied or changed)")
    m.add_argument("--corpus", required=True, help="the jsonl corpus it was built from: vector i = line i")
    m.add_argument("--encoder", required=True, help="the encoder it was built with, e.g. intfloat/e5-base-v2")
    m.add_argument("--out", required=True, help="index directory to write")
    add_prefix_flags(m, building=True)
    m.add_argument("--device", default=None, help="encoder device: cpu, cuda, cuda:N or auto (default)")
    m.add_argument("--skip-bad", action="store_true", help="skip (and count) malformed corpus lines")
    m.add_argument("--overwrite", action="store_true", help="replace an existing Sleuth index in --out")
    m.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    m.set_defaults(func=_import)

    s = sub.add_parser("search", help="search an index and print the top passages")
    s.add_argument("queries", nargs="+", metavar="QUERY", help="one or more queries")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", help="index directory written by `sleuth index build`")
    where.add_argument("--url", help="a Search-R1 /retrieve server (e.g. `sleuth serve`) instead of --index")
    s.add_argument("--token", default=None,
                   help="bearer token of a --url server started with `sleuth serve --token` "
                        "(default: $SLEUTH_RETRIEVAL_TOKEN)")
    s.add_argument("-k", type=int, default=3, help="passages per query (default 3)")
    s.add_argument("--kind", default=None, choices=["bm25", "dense", "hybrid"],
                   help="open one side of a hybrid index")
    s.add_argument("--rerank", default=None, metavar="CROSS_ENCODER",
                   help="rerank the top --rerank-top-n with this cross-encoder (name or path)")
    s.add_argument("--rerank-top-n", type=int, default=20, help="candidates the cross-encoder rescores")
    s.add_argument("--device", default=None, help="encoder device: cpu, cuda, cuda:N or auto (default)")
    add_prefix_flags(s, building=False)
    s.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    s.set_defaults(func=_search)


def _build(args: argparse.Namespace) -> int:
    shard = parse_shard(args.shard) if args.shard else None
    out = output_dir(args.out)
    try:
        meta = build_index(
            args.corpus, args.kind, out, encoder=args.encoder, faiss_factory=args.faiss,
            faiss_search_params=args.faiss_search_params, cache_dir=args.cache_dir,
            skip_bad=args.skip_bad, overwrite=args.overwrite, batch_size=args.batch_size,
            device=args.device, show_progress=True, query_prefix=args.query_prefix,
            passage_prefix=args.passage_prefix, shard=shard, encode_dtype=args.encode_dtype)
    except FileExistsError as e:  # an index already there: the message says --overwrite
        raise UserError(str(e)) from None
    if shard is not None:
        d = meta["dense"]
        print(f"encoded shard {shard[0]}/{shard[1]} of {d['chunks']} embedding chunks into {args.cache_dir} "
              f"({d['encode_seconds']} s); once every shard has run, build the index: the same command "
              "without --shard")
        if args.json:
            print_json_line({"command": "index build", "out": str(args.out), "shard": list(shard),
                             "chunks": d["chunks"], "encode_seconds": d["encode_seconds"]})
        return 0
    line = f"built {meta['kind']} index of {meta['n_passages']} passages in {args.out} ({meta['build_seconds']} s)"
    if meta["corpus"]["n_skipped"]:
        line += f"; skipped {meta['corpus']['n_skipped']} bad lines, e.g. {meta['corpus']['skipped_examples'][0]}"
    if "recall" in meta:
        r = meta["recall"]
        line += f"; dense recall@{r['k']} vs exact = {r['value']}"
    print(line)
    if "encoder" in meta:
        print(f"encoder {meta['encoder']}: query prefix {meta['query_prefix']!r}, passage prefix "
              f"{meta['passage_prefix']!r} ({meta['prefix_source']})")
    if args.json:
        print_json_line({"command": "index build", "out": str(args.out), **{k: meta[k] for k in (
            "kind", "n_passages", "build_seconds") }, "n_skipped": meta["corpus"]["n_skipped"],
            "recall": meta.get("recall"), "encoder": meta.get("encoder"),
            "query_prefix": meta.get("query_prefix"), "passage_prefix": meta.get("passage_prefix"),
            "faiss_factory": meta.get("faiss_factory")})
    return 0


def _import(args: argparse.Namespace) -> int:
    from sleuth.retrieval.faiss_import import import_faiss  # lazy: faiss, sentence-transformers

    out = output_dir(args.out)
    try:
        meta = import_faiss(args.faiss, args.corpus, args.encoder, out, query_prefix=args.query_prefix,
                            passage_prefix=args.passage_prefix, overwrite=args.overwrite, skip_bad=args.skip_bad,
                            device=args.device, show_progress=True)  # fmt: skip
    except FileExistsError as e:  # input errors (CorpusError, FaissImportError) are SleuthErrors already
        raise UserError(str(e)) from None
    print(f"imported {meta['faiss_index_type']} index of {meta['n_passages']} passages into {args.out} "
          f"(linked to {meta['imported_from']}); encoder {meta['encoder']}: query prefix {meta['query_prefix']!r}, "
          f"passage prefix {meta['passage_prefix']!r} ({meta['prefix_source']})")
    if args.json:
        print_json_line({"command": "index import", "out": str(args.out), "kind": "dense",
                         **{k: meta[k] for k in ("n_passages", "dim", "faiss_index_type", "imported_from", "encoder",
                                                 "query_prefix", "passage_prefix")}})  # fmt: skip
    return 0


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; a UserError naming the input otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r}: give I/N, e.g. 0/4 for the first of 4 shares") from None
    if not 0 <= i < n:
        raise UserError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


def open_retriever(args: argparse.Namespace):
    """The retriever a ``search`` invocation asks for (an index dir or a server, optionally reranked)."""
    if args.url:
        from sleuth.retrieval.client import RemoteRetriever, env_token  # lazy: sleuth --help start-up (httpx)

        if args.query_prefix is not None or args.passage_prefix is not None:
            raise UserError("--query-prefix/--passage-prefix apply to --index; a --url server uses "
                            "its own index's prefixes (give them to `sleuth serve`)")
        retriever = RemoteRetriever(args.url, token=env_token(args.token))
    else:
        retriever = load_index(args.index, kind=args.kind, device=args.device,
                               query_prefix=args.query_prefix, passage_prefix=args.passage_prefix)
    if args.rerank:
        from sleuth.retrieval.rerank import CrossEncoderReranker  # lazy: sleuth --help start-up (numpy, pyarrow)

        retriever = CrossEncoderReranker(retriever, args.rerank, top_n=args.rerank_top_n, device=args.device)
    return retriever


def _search(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise UserError(f"-k must be >= 1, got {args.k}")
    if args.rerank_top_n < 1:
        raise UserError(f"--rerank-top-n must be >= 1, got {args.rerank_top_n}")
    retriever = open_retriever(args)
    prefixes = describe_prefixes(retriever)
    if prefixes:
        print(prefixes, file=sys.stderr)
    t0 = time.perf_counter()
    try:
        results = retriever.search(list(args.queries), args.k)
    except RetrievalError as e:
        raise UserError(f"search on {args.url or args.index} failed: {e}") from None
    seconds = time.perf_counter() - t0
    for q, passages in zip(args.queries, results):
        print(f"query: {q}")
        if not passages:
            print("  (no passages: the query has no searchable term)")
        for rank, p in enumerate(passages, start=1):
            snippet = " ".join(p.text.split()[:30])
            score = "" if p.score is None else f" (score {p.score:.4f})"
            print(f"  {rank}. [{p.id}] {p.title}{score}\n     {snippet}")
    if args.json:
        print_json_line({"command": "search", "index": args.index and str(args.index), "url": args.url,
                         "k": args.k,
                         "seconds": round(seconds, 4),
                         "results": [{"query": q, "passages": [
                             {"id": p.id, "title": p.title, "score": p.score, "text": p.text} for p in ps]}
                             for q, ps in zip(args.queries, results)]})
    return 0
