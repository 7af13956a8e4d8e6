"""``sleuth view`` driven in a real browser: headless Chromium (Debian's ``chromium``) through
Playwright, on a real run (a short demo: the tiny model trained with and without search) and a real
eval of it, plus one logged sample whose question, answer, passages and segments carry HTML and
script. Each test saves a screenshot of its view (to ``$SLEUTH_SCREENSHOTS`` when set, else a
temporary directory).

Marked ``browser``: where neither Chromium nor Playwright is installed and cannot be (not root, no
apt-get, no package index), the tests are skipped with the reason; CI installs both (.ci/run).
``SLEUTH_INSTALL_BROWSER=0`` stops the set-up from installing anything."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sleuth.cli import main
from sleuth.retrieval.serve_cli import ServerThread
from sleuth.view.app import create_app
from sleuth.view.store import Source

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1800)]  # a hang guard: installs can be slow

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                  "--disable-background-networking", "--disable-component-update"]
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


def _install(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(cmd)}: {e}"
    return "" if done.returncode == 0 else f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()[-300:]}"


def _ensure_browser():
    """Chromium and Playwright, installed where missing and allowed; else a skip naming what failed."""
    allowed = os.environ.get("SLEUTH_INSTALL_BROWSER", "1") != "0"
    problems = []
    if _chromium() is None and allowed and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        problems.append(_install(["apt-get", "install", "-y", "-q", "chromium"]))
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        if allowed:
            problems.append(_install([sys.executable, "-m", "pip", "install", "-q", "playwright"]))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright); " + "; ".join(p for p in problems if p))
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium (apt-get install chromium); " + "; ".join(p for p in problems if p))
    return sync_playwright, chromium


@pytest.fixture(scope="module")
def browser():
    sync_playwright, chromium = _ensure_browser()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = Path(os.environ.get("SLEUTH_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A short demo (the tiny model trained with search and without), an eval of the trained run,
    and one more logged sample made of HTML and script (a copy of a real one)."""
    root = tmp_path_factory.mktemp("view")
    demo = root / "demo"
    assert main(["demo", "--out", str(demo), "--steps", "6", "--eval-limit", "8", "--set", "train.questions_per_step=4",
                 "--set", "rollout.group_size=2"]) == 0
    world = demo / "world"
    assert main(["eval", "--model", str(demo / "with_search"), "--data", str(world / "test.jsonl"), "--corpus",
                 str(world / "corpus.jsonl"), "--out", str(root / "eval"), "--limit", "24", "--no-cache"]) == 0
    rows = [json.loads(line) for line in (demo / "with_search" / "samples.jsonl").read_text().splitlines()]
    evil = copy.deepcopy(next(r for r in rows if r["segments"]))
    evil.update(step=rows[-1]["step"], question_id="evil/1", question=f"evil question {XSS}", answer=XSS,
                golden_answers=[XSS], data_source="evil", queries=[XSS])
    for seg in evil["segments"]:
        seg["text"] = f"segment {XSS}"
    evil["turns_detail"] = [{"text": XSS, "action": "search", "query": XSS, "passage_ids": ["p<b>1</b>"],
                             "titles": [XSS], "searches": [{"query": XSS, "passages": [
                                 {"id": "p<b>1</b>", "title": XSS, "text": f"passage {XSS}"}]}]}]
    evil_run = root / "evil"  # a copy of the run with the sample added (the other views stay the demo's own)
    shutil.copytree(demo / "with_search", evil_run, ignore=shutil.ignore_patterns("checkpoints"))
    with open(evil_run / "samples.jsonl", "a") as f:
        f.write(json.dumps(evil) + "\n")
    return {"with_search": demo / "with_search", "no_search": demo / "no_search", "eval": root / "eval",
            "evil": evil_run, "evil_index": len(rows)}


@pytest.fixture()
def page(browser):
    """A fresh page that records script errors, console errors and dialogs (none may happen)."""
    pg = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    yield pg
    pg.close()
    assert not problems, problems  # a CSP violation, a failed fetch or an alert() is a failure


def _serve(*dirs):
    return ServerThread(create_app([Source(d) for d in dirs]))


def _open(page, url):
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)


def test_curves_are_drawn_from_metrics_and_follow_a_running_job(page, runs, shots, tmp_path):
    run = tmp_path / "run"  # a copy: this test appends to its metrics
    shutil.copytree(runs["with_search"], run, ignore=shutil.ignore_patterns("checkpoints"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    with _serve(run) as server:
        _open(page, server.url + "/#curves")
        reward = page.locator("svg[data-chart='reward'] polyline[data-key='reward/mean']")
        assert reward.count() == 1
        assert len(reward.get_attribute("points").split()) == len(steps) == 6  # one point per logged step
        for chart in ("searches", "length", "stop", "kl", "entropy", "clip"):
            assert page.locator(f"svg[data-chart='{chart}'] .series").count() >= 1, chart
        page.locator("svg[data-chart='reward']").hover()
        assert page.locator(".chart[data-chart='reward'] .tip").inner_text().startswith("step ")
        page.screenshot(path=str(shots / "curves.png"))
        with open(run / "metrics.jsonl", "a") as f:  # the run logs another step: the page polls and redraws
            f.write(json.dumps({**rows[-1], "step": steps[-1] + 1}) + "\n")
        page.wait_for_function("""n => { const l = document.querySelector(
            "svg[data-chart='reward'] polyline[data-key='reward/mean']");
            return l && l.getAttribute('points').split(' ').length === n; }""", arg=len(steps) + 1)


def test_a_trajectory_opens_with_its_masks_and_searches(page, runs, shots):
    with _serve(runs["with_search"]) as server:
        _open(page, server.url + "/#trajectories")
        searched = [k for k, n in enumerate(page.locator("#list tbody tr td:nth-child(7)").all_inner_texts())
                    if int(n) >= 1]
        assert searched  # the demo's trained model searches
        page.locator("#list tbody tr").nth(searched[0]).click()
        page.wait_for_function("location.hash.includes('i=')")
        page.wait_for_selector("#detail .record")
        sampled, info = page.locator("#detail .seg.sampled"), page.locator("#detail .seg.information")
        assert sampled.count() >= 2 and info.count() >= 1
        assert sampled.first.locator(".label").inner_text().startswith("sampled · trained")
        assert "injected · not trained" in info.first.locator(".label").inner_text()
        assert page.locator("#detail .seg.prompt").count() == 1
        # the two kinds look different on the page (the colour of the mask)
        assert sampled.first.evaluate("e => getComputedStyle(e).borderLeftColor") != \
            info.first.evaluate("e => getComputedStyle(e).borderLeftColor")
        passage = page.locator("#detail .search details.passage").first
        passage.locator("summary").click()
        assert passage.locator("pre").inner_text().strip()  # the passage's text as retrieved
        page.screenshot(path=str(shots / "trajectories.png"))


def test_filters_and_find_narrow_the_list(page, runs, shots):
    with _serve(runs["with_search"]) as server:
        _open(page, server.url + "/#trajectories")
        total = int(page.locator("#page-info").inner_text().split(" of ")[1].split()[0])
        options = page.locator("#filters select[name=stop_reason] option").all()
        reason = options[1].get_attribute("value")  # the first stop reason in the run, "answered (11)"
        count = int(options[1].inner_text().rsplit("(", 1)[1].rstrip(")"))
        page.select_option("#filters select[name=stop_reason]", reason)
        page.wait_for_function("location.hash.includes('stop_reason=')")
        page.wait_for_function("""r => { const s = [...document.querySelectorAll('#list tbody td:nth-child(8)')];
            return s.length > 0 && s.every(x => x.textContent === r); }""", arg=reason)
        assert page.locator("#page-info").inner_text().endswith(f" of {count}")  # as many as the facet counted
        page.locator("#clear").click()
        page.wait_for_function("!location.hash.includes('stop_reason=')")
        word = page.locator("#list tbody tr td.q").first.inner_text().split()[-1].strip("?")
        page.fill("#filters input[name=q]", word)
        page.press("#filters input[name=q]", "Enter")
        page.wait_for_function("location.hash.includes('q=')")
        page.wait_for_function("""w => { const qs = [...document.querySelectorAll('#list tbody td.q')];
            return qs.length > 0 && qs.every(q => q.title.toLowerCase().includes(w)); }""", arg=word.lower())
        assert int(page.locator("#page-info").inner_text().split(" of ")[1].split()[0]) <= total
        page.screenshot(path=str(shots / "find.png"))


def test_html_in_a_sample_is_shown_as_text_and_never_runs(page, runs, shots):
    with _serve(runs["evil"]) as server:
        _open(page, server.url + f"/#trajectories?i={runs['evil_index']}")
        page.wait_for_selector("#detail .record")
        for summary in page.locator("#detail details").all():
            summary.locator("summary").click()
        assert page.evaluate("window.__xss") is None
        assert page.locator("#detail script, #detail img, #list script, #list img").count() == 0
        assert XSS in page.locator("#detail h2").inner_text()
        assert XSS in page.locator("#detail .seg.sampled pre").first.inner_text()
        assert f"passage {XSS}" in page.locator("#detail .passage pre").first.inner_text()
        assert XSS in page.locator("#list tbody tr").first.inner_text()  # the newest row: the list shows it too
        page.screenshot(path=str(shots / "xss.png"))


def test_compare_a_question_across_runs_and_steps(page, runs, shots):
    with _serve(runs["no_search"], runs["with_search"]) as server:
        _open(page, server.url + "/#compare?src=1")
        pairs = page.locator("#pairs tbody tr")
        assert pairs.count() >= 1
        pairs.first.click()
        page.wait_for_function("location.hash.includes('qid=')")
        page.wait_for_selector("#compare-out .col .seg")
        heads = page.locator("#compare-out .col h3").all_inner_texts()
        assert any(h.startswith("no_search") for h in heads) and any(h.startswith("with_search") for h in heads)
        page.screenshot(path=str(shots / "compare.png"))


def test_an_eval_directory_opens_with_its_tables(page, runs, shots):
    results = json.loads((runs["eval"] / "results.json").read_text())["summary"]
    with _serve(runs["eval"]) as server:
        _open(page, server.url + "/")
        assert page.evaluate("document.body.dataset.view") == "trajectories"  # an eval opens on its trajectories
        n = len((runs["eval"] / "trajectories.jsonl").read_text().splitlines())
        assert page.locator("#list tbody tr").count() == min(n, 50)
        assert page.locator("#page-info").inner_text().endswith(f" of {n}")
        _open(page, server.url + "/#setting")
        table = page.locator("#by-source tbody tr")
        assert table.count() == len(results["by_source"]) + 1
        first = table.first.locator("td").all_inner_texts()
        name = first[0]
        assert float(first[2]) == pytest.approx(results["by_source"][name]["em"], abs=1e-3)
        mode = json.loads((runs["eval"] / "results.json").read_text())["prompt_mode"]  # how the prompts were written
        assert f"prompts: {mode}" in page.locator("#setting-out").inner_text()
        page.screenshot(path=str(shots / "eval.png"))
