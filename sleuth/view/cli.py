"""``sleuth view DIR [DIR ...]``: a run's (or an eval's) curves and trajectories in the browser.

The first directory is the one shown; more directories can be compared with it question by question
(a baseline eval against a trained one, or two runs). Serves on 127.0.0.1 by default and prints the
address; read-only (see ``sleuth.view.app``).
"""

from __future__ import annotations

import sys

from sleuth.errors import UserError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(sub) -> None:
    p = sub.add_parser("view", help="browse a run's curves and trajectories (or an eval's) in the browser",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("dirs", nargs="+", metavar="DIR",
                   help="a run directory (sleuth train/sft --out) or an eval directory (sleuth eval --out); "
                        "more than one: compared question by question")
    p.add_argument("--port", type=int, default=8765, help="TCP port (0 picks a free one; default 8765)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only). Anything else shows "
                        "your runs to the network")
    p.set_defaults(func=_view)


def _view(args) -> int:
    from sleuth.retrieval.serve_cli import _url, _uvicorn_server, bind_socket  # lazy: sleuth --help start-up
    from sleuth.view.app import create_app  # lazy: sleuth --help start-up (fastapi)
    from sleuth.view.store import Source, ViewError  # lazy: sleuth --help start-up

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0-65535)")
    try:
        sources = [Source(d) for d in args.dirs]
    except ViewError as e:
        raise UserError(str(e)) from None
    names = [s.name for s in sources]
    for k, s in enumerate(sources):  # two directories of the same name: tell them apart in the page
        if names.count(s.name) > 1:
            s.name = f"{s.name} ({k + 1})"
    loopback = args.host in LOOPBACK
    if not loopback:
        print(f"sleuth view: warning: listening on {args.host}: anyone who can reach this address can read "
              "these runs (prompts, answers, passages)", file=sys.stderr)
    sock = bind_socket(args.host, args.port)
    url = _url(args.host, sock.getsockname()[1])
    print(f"sleuth view: {', '.join(str(s.path) for s in sources)} at {url}/ (Ctrl-C to stop)", flush=True)
    _uvicorn_server(create_app(sources, loopback_only=loopback)).run(sockets=[sock])
    return 0
