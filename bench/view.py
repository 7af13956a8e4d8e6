"""``sleuth view`` on a large run: how long a run with 100k logged samples takes to open, against
reading the whole file (what a viewer that loads every sample does), measured in the same run.

    .venv/bin/python bench/view.py [--json] [--samples 100000] [--no-browser] [--keep DIR]

A run directory is generated in a temporary directory (removed at the end unless ``--keep``):
``--samples`` rows of ``samples.jsonl`` in the current format (a prompt, four segments with roles,
two searches with three passages each; questions from ``../shared/data``'s NQ and HotpotQA dev files and passage
texts from its ``wiki_dev`` corpus when present, else generated words; about 7 KB a row, as
SmolLM2 runs log) and a ``metrics.jsonl`` of one row per 32 samples. Figures:

* ``open_s``: from opening the directory (``Source``, the app) to the page's first render served:
  the page, its two files, ``/api/info``, ``/api/metrics`` and the first ``/api/samples`` page,
  over HTTP on loopback; goal < 2 s;
* ``browser_open_s`` (when Playwright and Chromium are installed, not with ``--no-browser``): the
  same with a fresh server, in headless Chromium (started beforehand), until the page marks itself
  rendered with its first 50 rows;
* ``index_s``: until every row is indexed (filters see all of them); ``filter_s``: one filtered,
  full-text query over all rows; ``page_kb``: the first page's JSON (what the browser gets) against
  ``file_mb``;
* ``baseline_load_s``: ``json.loads`` of every line of the file; ``speedup`` = baseline / open.

The last stdout line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sleuth.retrieval.serve_cli import ServerThread  # noqa: E402
from sleuth.view.app import create_app  # noqa: E402
from sleuth.view.store import Source  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
STOPS = ["answered"] * 8 + ["max_turns", "max_tokens", "invalid_action"]


def _texts(rng: random.Random) -> tuple[list[str], list[str]]:
    questions, passages = [], []
    for path in [DATA / "dev" / "nq.jsonl", DATA / "dev" / "hotpotqa.jsonl"]:
        if not path.is_file():
            continue
        with open(path) as f:
            questions += [json.loads(line)["question"] for line, _ in zip(f, range(2000))]
    corpus = DATA / "corpus" / "wiki_dev.jsonl"
    if corpus.is_file():
        with open(corpus) as f:
            passages = [json.loads(line)["contents"] for line, _ in zip(f, range(5000))]
    words = "the of a in search answer film river born city team song war album season".split()
    if not questions:
        questions = [" ".join(rng.choice(words) for _ in range(9)) + "?" for _ in range(2000)]
    if not passages:
        passages = [" ".join(rng.choice(words) for _ in range(110)) for _ in range(2000)]
    return questions, passages


def generate(out: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    questions, passages = _texts(rng)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "samples.jsonl", "w") as f:
        for i in range(n):
            q = rng.choice(questions)
            found = [rng.sample(range(len(passages)), 3) for _ in range(2)]
            info = ["<information>" + "\n".join(f"Doc {j + 1}{passages[p][:500]}" for j, p in enumerate(ps))
                    + "</information>" for ps in found]
            answer = q.split()[-1]
            turns = [{"text": f"<search> {q} </search>", "action": "search", "query": q,
                      "passage_ids": [str(p) for p in ps], "titles": [passages[p].split("\n")[0] for p in ps],
                      "searches": [{"query": q, "passages": [{"id": str(p), "title": passages[p].split("\n")[0],
                                                               "text": passages[p][:300]} for p in ps]}]}
                     for ps in found]
            row = {"step": i // 32 + 1, "question_id": f"nq/dev/{i % 3000}", "data_source": rng.choice(["nq", "hotpotqa"]),
                   "question": q, "golden_answers": [answer], "answer": answer if rng.random() < 0.3 else "x",
                   "em": float(rng.random() < 0.3), "cover_em": 0.0, "f1": 0.0, "searches": 2, "turns": 3,
                   "retrieval_hit": 1.0, "tokens": 600, "sampled_tokens": 120, "invalid": 0,
                   "stop_reason": rng.choice(STOPS), "queries": [q, q], "sample_index": i % 4,
                   "reward": rng.choice([0.0, 0.2, 1.0]), "passage_ids": [t["passage_ids"] for t in turns],
                   "turns_detail": turns, "prompt": {"n_tokens": 150, "text": "Answer the question... " * 20 + q},
                   "segments": [{"kind": "sampled", "role": "sampled", "n_tokens": 30, "text": turns[0]["text"]},
                                {"kind": "injected", "role": "information", "n_tokens": 300, "text": info[0]},
                                {"kind": "sampled", "role": "sampled", "n_tokens": 30, "text": turns[1]["text"]},
                                {"kind": "injected", "role": "information", "n_tokens": 300, "text": info[1]},
                                {"kind": "sampled", "role": "sampled", "n_tokens": 20,
                                 "text": f"<answer> {answer} </answer>"}]}
            f.write(json.dumps(row) + "\n")
    with open(out / "metrics.jsonl", "w") as f:
        for step in range(1, n // 32 + 1):
            f.write(json.dumps({"step": step, "reward/mean": rng.random(), "rollout/searches_mean": 2.0,
                                "rollout/trajectories": 32.0, "rollout/stop/answered": 28.0}) + "\n")
    (out / "config.yaml").write_text("model:\n  name_or_path: bench\n")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()


def first_render(url: str) -> tuple[float, int]:
    """The requests the page makes before it first renders; seconds and the samples page's bytes."""
    t0 = time.perf_counter()
    for path in ("/", "/static/app.js", "/static/style.css", "/api/info", "/api/metrics?src=0&since=0"):
        _get(url + path)
    page = _get(url + "/api/samples?src=0&offset=0&limit=50")
    assert len(json.loads(page)["rows"]) == 50
    return time.perf_counter() - t0, len(page)


def browser_open(run: Path) -> float | None:
    """Seconds from opening the directory to the page rendered in headless Chromium (browser started first)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                                                              "--disable-background-networking"])
        page = b.new_page()
        page.goto("about:blank")
        t0 = time.perf_counter()
        source = Source(run)
        with ServerThread(create_app([source])) as server:
            page.goto(server.url + "/#trajectories")
            page.wait_for_selector("body[data-ready='1']", timeout=120_000)
            took = time.perf_counter() - t0
            assert page.locator("#list tbody tr").count() == 50
            source.samples.wait()
        b.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="generate into this directory and keep it")
    args = ap.parse_args()
    tmp = None
    run = args.keep or Path(tmp := tempfile.mkdtemp(prefix="sleuth-bench-view-")) / "run"
    try:
        if not (run / "samples.jsonl").is_file():
            generate(run, args.samples)
        size = (run / "samples.jsonl").stat().st_size
        _get_all = lambda: [json.loads(line) for line in open(run / "samples.jsonl", "rb")]  # noqa: E731
        t0 = time.perf_counter()
        _get_all()
        baseline = time.perf_counter() - t0

        t0 = time.perf_counter()
        source = Source(run)
        with ServerThread(create_app([source])) as server:
            served, page_bytes = first_render(server.url)
            open_s = time.perf_counter() - t0
            source.samples.wait()
            index_s = time.perf_counter() - t0
            assert len(source.samples) == args.samples
            t1 = time.perf_counter()
            hits = json.loads(_get(server.url + "/api/samples?src=0&stop_reason=max_turns&q=the&em=0"))["total"]
            filter_s = time.perf_counter() - t1
        browser_s = None if args.no_browser else browser_open(run)
        result = {"samples": args.samples, "file_mb": round(size / 2**20, 1), "open_s": round(open_s, 3),
                  "served_s": round(served, 3), "browser_open_s": None if browser_s is None else round(browser_s, 3),
                  "index_s": round(index_s, 2), "filter_s": round(filter_s, 3), "filter_hits": hits,
                  "page_kb": round(page_bytes / 1024, 1), "baseline_load_s": round(baseline, 2),
                  "speedup": round(baseline / open_s, 1), "goal_open_s": 2.0, "open_met": open_s < 2.0
                  and (browser_s is None or browser_s < 2.0)}
        if not args.json:
            for k, v in result.items():
                print(f"{k:>16}: {v}")
        print(json.dumps(result))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
