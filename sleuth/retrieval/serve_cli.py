"""``sleuth serve``: run the retrieval HTTP service; plus helpers to run it in-process.

``ServerThread`` runs an app with uvicorn on a loopback port in a background thread (tests,
benchmarks, a trainer that wants its own server); ``run_server`` binds, prints the URL and blocks.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
import time

from sleuth.errors import UserError
from sleuth.retrieval.cli import add_prefix_flags
from sleuth.retrieval.index import build_index, describe_prefixes, load_index

TOKEN_ENV = "SLEUTH_RETRIEVAL_TOKEN"  # = sleuth.retrieval.client.TOKEN_ENV (not imported: keeps --help fast)


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A bound TCP socket (port 0 picks a free one); uvicorn listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when the listening
    # socket says TCP; without it small responses wait ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot bind {host}:{port}: {e.strerror}; pick another --port") from None
    return sock


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _uvicorn_server(app, **kwargs):
    import uvicorn  # lazy: sleuth --help start-up

    opts = {"log_level": "warning", "access_log": False, "lifespan": "off"} | kwargs
    return uvicorn.Server(uvicorn.Config(app, **opts))


class ServerThread:
    """Serve ``app`` on ``host:port`` (default: a free loopback port) in a daemon thread.

    Use as a context manager; ``url`` is the server root (``url + "/retrieve"`` is the endpoint).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **uvicorn_kwargs):
        self.app, self.host, self.port = app, host, port
        self.uvicorn_kwargs = uvicorn_kwargs
        self.server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    def start(self, timeout_s: float = 10.0) -> "ServerThread":
        sock = bind_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self.server = _uvicorn_server(self.app, **self.uvicorn_kwargs)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start within {timeout_s}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.server is not None and self._thread is not None:
            self.server.should_exit = True
            self._thread.join(timeout_s)

    def __enter__(self) -> "ServerThread":
        return self if self.server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(app, host: str = "127.0.0.1", port: int = 8000, on_ready=print) -> None:
    """Bind, report the endpoint through ``on_ready``, and serve until interrupted."""
    sock = bind_socket(host, port)
    port = sock.getsockname()[1]
    on_ready(f"serving Search-R1 /retrieve at {_url(host, port)}/retrieve (stats: {_url(host, port)}/stats)")
    _uvicorn_server(app).run(sockets=[sock])


def _load_retriever(args, tmp_dir: str):
    """Open ``--index DIR``, or build a BM25 index of ``--corpus FILE`` into ``tmp_dir``."""
    if bool(args.index) == bool(args.corpus):
        raise UserError("give exactly one of --index DIR (from `sleuth index build`) or --corpus FILE.jsonl")
    if args.corpus:
        from sleuth.retrieval.corpus import CorpusError  # lazy: sleuth --help start-up (pyarrow)

        if args.query_prefix is not None or args.passage_prefix is not None:
            raise UserError("--query-prefix/--passage-prefix apply to a dense --index; --corpus serves BM25")
        print(f"building a BM25 index of {args.corpus} (temporary; use `sleuth index build` to keep one)",
              file=sys.stderr)
        try:
            build_index(args.corpus, "bm25", tmp_dir, show_progress=False)
        except CorpusError as e:
            raise UserError(str(e)) from None
        return load_index(tmp_dir)
    devices = [d.strip() for d in args.search_devices.split(",") if d.strip()] if args.search_devices else None
    try:
        return load_index(args.index, kind=args.kind, device=args.device, query_prefix=args.query_prefix,
                          passage_prefix=args.passage_prefix, search_devices=devices)
    except UserError as e:  # an input error (a SleuthError) with --search-devices: name the flag too
        if devices is None:
            raise
        raise UserError(f"--search-devices {args.search_devices}: {e}") from None


def _serve(args) -> int:
    from sleuth.retrieval.search_service import ServerLimits  # lazy: sleuth --help start-up (starlette)
    from sleuth.retrieval.server import make_app  # lazy: sleuth --help start-up (fastapi)

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0-65535)")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        print(f"sleuth serve: warning: listening on {args.host} without a token "
              f"(set --token or {TOKEN_ENV})", file=sys.stderr)
    limits = ServerLimits(
        max_queries=args.max_queries, max_topk=args.max_topk, default_topk=args.topk,
        cache_size=args.cache_size, cache_bytes=int(args.cache_mb * 2**20),
        body_timeout_s=args.body_timeout, request_timeout_s=args.request_timeout, batching=not args.no_batching,
    )
    with tempfile.TemporaryDirectory(prefix="sleuth-serve-") as tmp_dir:
        retriever = _load_retriever(args, tmp_dir)
        prefixes = describe_prefixes(retriever)
        if prefixes:
            print(prefixes, file=sys.stderr)
        # uvicorn stops on SIGINT/SIGTERM and then re-raises the signal; turn both into a clean exit.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            run_server(make_app(retriever, token=token, limits=limits), args.host, args.port,
                       on_ready=lambda line: print(line, flush=True))
        except OSError as e:
            raise UserError(str(e)) from None
        except KeyboardInterrupt:
            print("sleuth serve: stopped", file=sys.stderr)
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def register(sub) -> None:
    """Add ``sleuth serve``."""
    p = sub.add_parser("serve", help="serve an index over HTTP (Search-R1 /retrieve contract)")
    p.add_argument("--index", metavar="DIR", help="index directory written by `sleuth index build`")
    p.add_argument("--corpus", metavar="FILE", help="or: a jsonl corpus to BM25-index on the fly (temporary)")
    p.add_argument("--kind", default=None, choices=["bm25", "dense", "hybrid"],
                   help="open one side of a hybrid index")
    p.add_argument("--device", default=None, help="encoder device for dense indexes, e.g. cpu or cuda")
    p.add_argument("--search-devices", default=None, metavar="DEV[,DEV...]",
                   help="search a dense index with torch on these devices (e.g. cuda:0,cuda:1) instead of faiss on "
                        "the CPU: its vectors (decoded, for SQ/PQ codes) in float16 row shards there (wiki-18 with "
                        "e5: Flat 32 GB, PCAR256,SQ6 10.7 GB); Flat, SQ and PQ indexes, not IVF or HNSW")
    add_prefix_flags(p, building=False)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = pick a free one; default 8000)")
    p.add_argument("--token", default=None, help=f"require 'Authorization: Bearer T' (default: ${TOKEN_ENV})")
    p.add_argument("--topk", type=int, default=3, help="passages per query when a request sends topk=null")
    p.add_argument("--max-queries", type=int, default=1024, help="queries allowed in one request")
    p.add_argument("--max-topk", type=int, default=100, help="largest topk a request may ask for")
    p.add_argument("--cache-size", type=int, default=10000, help="server LRU entries (0 = off)")
    p.add_argument("--cache-mb", type=float, default=256,
                   help="memory the server cache may hold, in MiB (approximate; 0 = off; default 256)")
    p.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="seconds a client has to send its request body; slower ones get 408 (default 30)")
    p.add_argument("--request-timeout", type=float, default=25.0, metavar="SECONDS",
                   help="seconds a request's search may take; longer ones get 504, and Sleuth's client then sends "
                        "fewer queries per request (default 25, under the client's 30)")
    p.add_argument("--no-batching", action="store_true", help="one retriever call per request")
    p.set_defaults(func=_serve)
