"""Benchmark the retrieval server: throughput and latency under concurrent clients, and the
bad-request matrix.

    .venv/bin/python bench/server.py [--json] [--quick] [--no-combine]

The server runs in its own process (BM25 over ``../shared/data/corpus/wiki_dev.jsonl`` via
``build_index``/``load_index``; InMemory over a corpus slice if the index module is missing) and
the clients run here on asyncio + httpx. Server cache off, so every query is searched. Scenarios:

* ``direct``: the retriever called in this process in batches of 64 (the baseline for ratios);
* ``batched`` / ``batched_nomb``: 8 clients sending 64-query requests, micro-batcher on / off;
* ``c200``: 200 concurrent clients sending 1-query requests (failures must be 0);
* ``bad_requests``: non-JSON, wrong types, empty list, huge topk, 10k queries: all 4xx, and a
  good request answered after each.

The store fix: ``CorpusStore.get_many`` calls ``Table.take`` per query; on a multi-chunk table that
costs ~2.5 ms, which caps BM25 at a few hundred queries/s. Unless ``--no-combine``, the bench also
runs the server with the table's chunks combined at load (what the fix in corpus.py would do), so
the server's own capacity is visible. Every loop is bounded in count and time.

With ``--scale-json FILE`` (``bench/retrieval_scale.py --json``'s output), each variant also prints
a batched line extrapolated to wiki-18's 21M passages, marked so: the server's own cost per query
measured here (batched over HTTP minus direct) plus the BM25 search cost at 21M that file
extrapolates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"
CORPUS = SHARED / "corpus" / "wiki_dev.jsonl"


def open_retriever(index_dir: str | None, combine: bool):
    """The benchmarked retriever: the BM25 index, or InMemory over 2,000 corpus passages."""
    if index_dir is None:
        from sleuth.retrieval.memory import InMemoryRetriever
        from sleuth.types import Passage

        rows = [json.loads(line) for _, line in zip(range(2000), CORPUS.open())]
        return InMemoryRetriever([Passage.from_contents(r["id"], r["contents"]) for r in rows])
    from sleuth.retrieval.index import load_index

    retriever = load_index(index_dir)
    store = getattr(retriever, "store", None)
    if combine and store is not None and hasattr(store, "table"):
        store.table = store.table.combine_chunks()
    return retriever


def serve_process(index_dir, combine, batching, conn) -> None:
    """Child process: load the retriever, serve it on a free loopback port, report the port."""
    from sleuth.retrieval.search_service import ServerLimits
    from sleuth.retrieval.serve_cli import _uvicorn_server, bind_socket
    from sleuth.retrieval.server import make_app

    app = make_app(open_retriever(index_dir, combine), limits=ServerLimits(cache_size=0, batching=batching))
    sock = bind_socket("127.0.0.1", 0)
    conn.send(sock.getsockname()[1])
    _uvicorn_server(app).run(sockets=[sock])


class Server:
    """A server child process as a context manager; ``url`` once it answers /health."""

    def __init__(self, index_dir, combine, batching):
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve_process, args=(index_dir, combine, batching, child), daemon=True)
        self.proc.start()
        if not parent.poll(120):
            raise RuntimeError("server process did not start in 120 s")
        self.url = f"http://127.0.0.1:{parent.recv()}"

    def __enter__(self):
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(self.url + "/health", timeout=1).raise_for_status()
                return self
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.join(10)

    def cpu_s(self) -> float | None:
        """CPU seconds the server process has used (Linux /proc; None elsewhere)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


def measured(srv, coro):
    """Run a load; add the server's CPU seconds and queries per server CPU-second (a capacity
    figure that other processes on a busy machine do not distort)."""
    before = srv.cpu_s()
    res = asyncio.run(coro)
    after = srv.cpu_s()
    if before is not None and after is not None and after > before:
        res["server_cpu_s"] = round(after - before, 2)
        res["queries_per_server_cpu_s"] = round(res["queries"] / (after - before), 1)
    return res


def pct(values, p):
    """Nearest-rank percentile in milliseconds."""
    if not values:
        return None
    v = sorted(values)
    return round(1000 * v[max(0, math.ceil(p / 100 * len(v)) - 1)], 2)


class Conn:
    """One keep-alive HTTP/1.1 connection on asyncio streams: a minimal load-generator client
    (httpx's async pool, not the server, is the bottleneck at 200 connections)."""

    def __init__(self, url):
        hostport = url.split("//", 1)[1]
        self.host, self.port = hostport.split(":")[0], int(hostport.split(":")[1])
        self.reader = self.writer = None

    async def post(self, path, body: bytes):
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        return int(status_line.split()[1]), payload

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def load(url, bodies, clients, time_limit_s):
    """``clients`` connections send ``bodies`` (each at most once) until done or out of time."""
    queue = [json.dumps(b).encode() for b in reversed(bodies)]
    counts = [len(b["queries"]) for b in reversed(bodies)]
    lat, fails, nq = [], [], 0
    deadline = time.monotonic() + time_limit_s

    async def worker():
        nonlocal nq
        conn = Conn(url)
        try:
            while queue and time.monotonic() < deadline:
                body, n = queue.pop(), counts.pop()
                t0 = time.perf_counter()
                try:
                    status, payload = await asyncio.wait_for(conn.post("/retrieve", body), 60)
                    ok = status == 200 and len(json.loads(payload)["result"]) == n
                    why = status
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                    ok, why = False, repr(e)
                    conn.close()
                    conn = Conn(url)
                lat.append(time.perf_counter() - t0)
                if ok:
                    nq += n
                else:
                    fails.append(str(why)[:80])
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": len(lat), "queries": nq, "failed": len(fails),
            "fail_examples": fails[:3], "seconds": round(wall, 3), "queries_per_s": round(nq / wall, 1),
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def bad_request_matrix(url):
    """Each bad request must get a 4xx, and the server must answer a good one right after."""
    import httpx

    cases = {
        "non_json": b"{not json",
        "wrong_types": json.dumps({"queries": "who", "topk": "3"}).encode(),
        "empty_list": json.dumps({"queries": []}).encode(),
        "huge_topk": json.dumps({"queries": ["who"], "topk": 10**9}).encode(),
        "10k_queries": json.dumps({"queries": ["who wrote hamlet"] * 10000}).encode(),
    }
    out = {}
    with httpx.Client(timeout=30) as http:
        for name, body in cases.items():
            r = http.post(url + "/retrieve", content=body, headers={"content-type": "application/json"})
            good = http.post(url + "/retrieve", json={"queries": ["who wrote hamlet"], "topk": 1})
            out[name] = {"status": r.status_code, "message": r.json().get("detail", "")[:90],
                         "served_after": good.status_code == 200}
    return out


def run_server_scenarios(index_dir, combine, questions, quick):
    """Batched (micro-batcher on and off) and 200-client runs against fresh server processes."""
    n_batched = 20 if quick else 60
    batches = [{"queries": [questions[(i * 64 + j) % len(questions)] for j in range(64)], "topk": 3,
                "return_scores": True} for i in range(n_batched)]
    singles = [{"queries": [q], "topk": 3, "return_scores": True}
               for q in (questions * 2)[: 400 if quick else 1000]]
    res = {}
    with Server(index_dir, combine, batching=True) as srv:
        asyncio.run(load(srv.url, batches[:4], 4, 30))  # warm up
        res["batched"] = measured(srv, load(srv.url, batches, 8, 120))
        res["c200"] = measured(srv, load(srv.url, singles, 200, 120))
        res["bad_requests"] = bad_request_matrix(srv.url)
        import httpx

        res["server_stats"] = httpx.get(srv.url + "/stats").json()
    with Server(index_dir, combine, batching=False) as srv:
        asyncio.run(load(srv.url, batches[:4], 4, 30))
        res["batched_nomb"] = measured(srv, load(srv.url, batches, 8, 120))
        res["c200_nomb"] = measured(srv, load(srv.url, singles, 200, 120))
    return res


def direct(index_dir, combine, questions, quick):
    """Baseline: the retriever called in this process, batches of 64."""
    retriever = open_retriever(index_dir, combine)
    qs = questions[: 640 if quick else 1920]
    retriever.search(qs[:64], 3)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(qs), 64):
        retriever.search(qs[i : i + 64], 3)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"queries": len(qs), "queries_per_s": round(len(qs) / wall, 1),
            "queries_per_cpu_s": round(len(qs) / cpu, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON summary as the last line")
    ap.add_argument("--quick", action="store_true", help="fewer requests (about a third)")
    ap.add_argument("--no-combine", action="store_true", help="skip the combined-chunks store variant")
    ap.add_argument("--scale-json", default=None,
                    help="bench/retrieval_scale.py's JSON output: adds the batched line extrapolated to 21M passages")
    args = ap.parse_args()
    scale_qps = None
    if args.scale_json:
        scale = json.loads(Path(args.scale_json).read_text().strip().splitlines()[-1])
        scale_qps = scale["extrapolated_to_21M"]["queries_per_s_at_21M"]
    if not CORPUS.is_file():
        print(f"bench/server.py needs {CORPUS}", file=sys.stderr)
        return 2
    questions = [json.loads(line)["question"] for f in sorted((SHARED / "dev").glob("*.jsonl"))
                 for line in f.open() if line.strip()]
    report = {"bench": "server", "quick": args.quick, "corpus": str(CORPUS)}
    with tempfile.TemporaryDirectory(prefix="sleuth-bench-") as tmp:
        try:
            from sleuth.retrieval.index import build_index

            t0 = time.perf_counter()
            build_index(str(CORPUS), "bm25", tmp, show_progress=False)
            index_dir, report["retriever"] = tmp, "bm25"
            report["index_build_s"] = round(time.perf_counter() - t0, 2)
        except ImportError:
            index_dir, report["retriever"] = None, "memory (2,000 passages)"
        variants = [("as_is", False)] + ([] if args.no_combine or index_dir is None else [("combined", True)])
        for name, combine in variants:
            base = direct(index_dir, combine, questions, args.quick)
            res = run_server_scenarios(index_dir, combine, questions, args.quick)
            res["direct"] = base
            res["batched_over_direct"] = round(res["batched"]["queries_per_s"] / base["queries_per_s"], 2)
            if scale_qps:  # the server's own cost per query (HTTP, JSON, passages) plus search at 21M
                overhead_s = max(0.0, 1 / res["batched"]["queries_per_s"] - 1 / base["queries_per_s"])
                res["batched_at_21M_extrapolated"] = {
                    "queries_per_s": round(1 / (overhead_s + 1 / scale_qps), 1),
                    "server_overhead_ms_per_query": round(overhead_s * 1e3, 3),
                    "search_queries_per_s_at_21M": round(scale_qps, 1)}
                x = res["batched_at_21M_extrapolated"]
                print(f"[{name}] 21M passages (extrapolated, not measured): batched HTTP {x['queries_per_s']} q/s = "
                      f"server overhead {x['server_overhead_ms_per_query']} ms/query (measured here) + BM25 search at "
                      f"{x['search_queries_per_s_at_21M']} q/s (bench/retrieval_scale.py's extrapolation)")
            report[name] = res
            print(f"[{name}] direct {base['queries_per_s']} q/s | batched HTTP "
                  f"{res['batched']['queries_per_s']} q/s (p50 {res['batched']['p50_ms']} ms, p99 "
                  f"{res['batched']['p99_ms']} ms; micro-batcher off: {res['batched_nomb']['queries_per_s']} q/s)"
                  f" | 200 clients: {res['c200']['queries_per_s']} q/s, {res['c200']['failed']} failed, p50 "
                  f"{res['c200']['p50_ms']} ms, p99 {res['c200']['p99_ms']} ms (micro-batcher off: "
                  f"{res['c200_nomb']['queries_per_s']} q/s, p99 {res['c200_nomb']['p99_ms']} ms)")
            print(f"[{name}] per CPU-second (robust to a busy machine): direct "
                  f"{base['queries_per_cpu_s']} q/cpu-s; server batched "
                  f"{res['batched'].get('queries_per_server_cpu_s')} q/cpu-s (micro-batcher off "
                  f"{res['batched_nomb'].get('queries_per_server_cpu_s')}); server 200 clients "
                  f"{res['c200'].get('queries_per_server_cpu_s')} q/cpu-s (off "
                  f"{res['c200_nomb'].get('queries_per_server_cpu_s')})")
            bad = res["bad_requests"]
            print(f"[{name}] bad requests: " + ", ".join(
                f"{k}={v['status']}{'' if v['served_after'] else ' (server stopped answering!)'}" for k, v in bad.items()))
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
