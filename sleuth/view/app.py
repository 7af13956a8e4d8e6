"""The viewer's web app: the page, its two static files, and a read-only JSON API over the opened
directories (:class:`~sleuth.view.store.Source`).

Safe by default: only ``GET`` routes; the page and its assets come from a fixed table of files
shipped in the package (no path from a request ever reaches the file system); a record is read by
its row number in an index, never by a name; every response carries a Content-Security-Policy that
allows only the page's own script and style (no inline script runs, whatever a model wrote); the
page puts model output and passages into the document as text, never as HTML. Requests whose
``Host`` is not a loopback name are refused while the server listens on loopback (a DNS-rebinding
page on another site cannot read a run through the user's browser).

API (``src`` is a directory's position in the order given on the command line):

* ``GET /api/info``: each directory's kind, file names, row counts, indexing state, config or
  eval setting, eval results, and the filter facets.
* ``GET /api/metrics?src=&since=``: ``metrics.jsonl`` rows from ``since`` on (the page polls it).
* ``GET /api/samples?src=&offset=&limit=&...``: one page of the rows that pass the filters
  (:class:`~sleuth.view.store.Filter`), newest step first, with the total.
* ``GET /api/sample?src=&i=``: one whole record.
* ``GET /api/compare?qid=&limit=``: every directory's records of one question (steps side by side).
* ``GET /api/pairs?a=&b=&offset=&limit=&changed=``: two directories' records matched by question
  id (a baseline eval against a trained one), with EM on each side.
"""

from __future__ import annotations

from importlib import resources
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from sleuth.view.store import Filter, Source

# The page and its assets: name -> (file in sleuth/view/static, media type). Nothing else is served.
ASSETS = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
MAX_PAGE = 500
MAX_COMPARE = 200


def _asset(name: str) -> bytes:
    return resources.files("sleuth.view").joinpath("static", name).read_bytes()


def _host_name(host_header: str) -> str:
    """``Host`` without its port (``[::1]:8000`` -> ``[::1]``, ``localhost:80`` -> ``localhost``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def _row_summary(src: Source, i: int) -> dict:
    c = src.samples.cols
    return {"i": i, "step": c.step[i], "question_id": c.qid[i], "data_source": c.source[i], "reward": c.reward[i],
            "em": c.em[i], "f1": c.f1[i], "stop_reason": c.stop[i], "searches": c.searches[i],
            "question": c.question[i], "answer": c.answer[i]}


def create_app(sources: list[Source], *, loopback_only: bool = True) -> FastAPI:
    """The app over ``sources``; ``loopback_only`` refuses requests whose Host is not a loopback name."""
    app = FastAPI(title="sleuth view", docs_url=None, redoc_url=None, openapi_url=None)
    for s in sources:
        s.poke()

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if loopback_only and _host_name(request.headers.get("host", "")) not in LOOPBACK_HOSTS:
            response: Response = JSONResponse({"detail": "this viewer answers loopback host names only"},
                                              status_code=400)
        elif request.method not in ("GET", "HEAD"):
            response = JSONResponse({"detail": "the viewer is read-only"}, status_code=405)
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    def page(path: str):
        name, media = ASSETS[path]
        return lambda: Response(_asset(name), media_type=media)

    for path in ASSETS:
        app.add_api_route(path, page(path), methods=["GET"], include_in_schema=False)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon():
        return Response(status_code=204)

    def source(src: int) -> Source:
        if not 0 <= src < len(sources):
            raise HTTPException(404, f"no directory {src}: {len(sources)} opened")
        s = sources[src]
        s.poke()  # pick up what a running job appended
        return s

    @app.get("/api/info")
    def info():
        for s in sources:
            s.poke()
        return {"sources": [s.info() for s in sources]}

    @app.get("/api/metrics")
    def metrics(src: int = 0, since: Annotated[int, Query(ge=0)] = 0):
        s = source(src)
        rows = s.metrics.rows[since:]
        return {"rows": rows, "next": since + len(rows), "generation": s.metrics.generation}

    @app.get("/api/samples")
    def samples(
        src: int = 0,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        data_source: str | None = None,
        stop_reason: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        reward_min: float | None = None,
        reward_max: float | None = None,
        em: float | None = None,
        searches_min: int | None = None,
        searches_max: int | None = None,
        q: Annotated[str | None, Query(max_length=500)] = None,
        question_id: str | None = None,
        order: Annotated[str, Query(pattern="^(newest|oldest)$")] = "newest",
    ):
        s = source(src)
        n = len(s.samples)
        flt = Filter(data_source or None, stop_reason or None, step_min, step_max, reward_min, reward_max, em,
                     searches_min, searches_max, q or None, question_id or None)
        hits = flt.matches(s.samples.cols, n)
        if order == "newest":
            hits.reverse()
        return {"total": len(hits), "indexed_rows": n, "complete": s.samples.complete,
                "rows": [_row_summary(s, i) for i in hits[offset : offset + limit]]}

    @app.get("/api/sample")
    def sample(src: int = 0, i: Annotated[int, Query(ge=0)] = 0):
        s = source(src)
        if i >= len(s.samples):
            raise HTTPException(404, f"no row {i} in {s.samples.path.name} ({len(s.samples)} rows)")
        return {"i": i, "source": src, "record": s.samples.read(i)}

    @app.get("/api/compare")
    def compare(qid: Annotated[str, Query(min_length=1)], limit: Annotated[int, Query(ge=1, le=MAX_COMPARE)] = 24):
        out = []
        for k, s in enumerate(sources):
            s.poke()
            rows = s.samples.cols.by_qid.get(qid, [])
            rows = [i for i in rows if i < len(s.samples)]
            out.append({"source": k, "name": s.name, "total": len(rows),
                        "records": [{"i": i, **s.samples.read(i)} for i in rows[:limit]]})
        return {"question_id": qid, "sources": out}

    @app.get("/api/pairs")
    def pairs(a: int = 0, b: int = 1, offset: Annotated[int, Query(ge=0)] = 0,
              limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50, changed: bool = False):
        sa, sb = source(a), source(b)
        ca, cb = sa.samples.cols, sb.samples.cols
        na, nb = len(sa.samples), len(sb.samples)
        rows, gained, lost = [], 0, 0
        for qid, ia in ca.by_qid.items():
            ia = [i for i in ia if i < na]
            ib = [i for i in cb.by_qid.get(qid, []) if i < nb]
            if not ia or not ib:
                continue
            ea, eb = ca.em[ia[-1]], cb.em[ib[-1]]  # the last record of each (an eval has one)
            gained += (ea or 0) < (eb or 0)
            lost += (ea or 0) > (eb or 0)
            if changed and ea == eb:
                continue
            rows.append({"question_id": qid, "question": ca.question[ia[-1]], "data_source": ca.source[ia[-1]],
                         "a": {"i": ia[-1], "em": ea, "answer": ca.answer[ia[-1]]},
                         "b": {"i": ib[-1], "em": eb, "answer": cb.answer[ib[-1]]}})
        return {"total": len(rows), "gained": gained, "lost": lost, "rows": rows[offset : offset + limit]}

    return app
