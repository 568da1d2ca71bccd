"""dashboard: `ngcx dashboard`'s first paint, bytes and update latency with 200 deployments and 500 images (issue 23).

Usage: `.venv/bin/python -m bench dashboard --repeat 3` from the repository root (needs Debian's chromium and
playwright, as the tests do: scripts/setup.sh installs both; the suite puts tests/ on the import path itself).

What is real: a state store of the bench's own, filled through ngcx's own store API with 200 live deployments
(AWS, Alibaba Cloud and local rows with instance types from the offers tables; 150 ready, 30 stopped, 20 in
flight) plus 20 failed ones and 500 builds of distinct tags; the real `ngcx dashboard` process over it
(its ready rows' endpoints refuse connections, so every scraper runs and reports them unhealthy, as it would for
hosts that are gone); headless Chromium loading the overview.

The figures, per round (interleaved with the peer):
- first contentful paint of the overview (Chromium's PerformanceObserver, from navigation start), the first visit
  (the printed URL: the token is traded for a cookie by a redirect) and a later visit (cookie);
- bytes transferred for that page and everything it loads (navigation + resource transferSize, gzip on);
- update latency: a deployment row committed to the store by another process -> the row in the open page
  (a MutationObserver stamps it; the bench stamps the commit; one machine, one clock).
The peer: the same overview HTML and its assets as static files served by `python -m http.server` (the browser's
own cost of painting those bytes, with no server work): the ratio says what the dashboard's server adds.
Bounds from the issue: first paint < 1 s, < 500 KB, a change on the page within 2 s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Stats, SuiteResult, SuiteSkipped, ratio

DEPLOYMENTS = {"ready": 150, "stopped": 30, "booting": 20}
FAILED, IMAGES = 20, 500
CLOUDS = (("aws", "us-east-1", "us-east-1a", "g5.xlarge"), ("aliyun", "cn-hangzhou", "cn-hangzhou-i",
          "ecs.gn7i-c8g1.2xlarge"), ("local", None, None, None))
PAINT = """() => new Promise((done) => {
  const seen = performance.getEntriesByName("first-contentful-paint")[0];
  if (seen) { return done(seen.startTime); }
  new PerformanceObserver((list) => done(list.getEntries()[0].startTime)).observe({type: "paint", buffered: true});
})"""
BYTES = """() => performance.getEntriesByType("navigation").concat(performance.getEntriesByType("resource"))
  .reduce((sum, e) => sum + e.transferSize, 0)"""
WATCH = """(id) => { window.__seen = null; new MutationObserver(() => {
  if (!window.__seen && document.querySelector(`#deployments tr[data-id="${id}"]`)) { window.__seen = Date.now(); }
}).observe(document.body, {childList: true, subtree: true}); }"""


def fill(state: Path) -> None:
    """The store the dashboard reads: 200 live deployments, 20 failed ones, 500 builds (ngcx's own API)."""
    from ngcx.deploy import store
    from ngcx.deploy.common import FAILED as FAILED_STATUS
    from ngcx.deploy.common import DeployConfig
    from ngcx.state import db

    n = 0
    for status, count in [*DEPLOYMENTS.items(), (FAILED_STATUS, FAILED)]:
        for _ in range(count):
            cloud, region, zone, itype = CLOUDS[n % len(CLOUDS)]
            record = store.create_intent(DeployConfig(cloud=cloud, image=f"ngcx-app/model-{n % 40}:v{n}",
                                                      pull_ref=None, registry=None, labels={}, model="convnet",
                                                      region=region, zone=zone))
            store.update(record.id, status=status, instance_type=itype, pid=None, endpoint="http://127.0.0.1:9",
                         phases={"api": 2.1, "boot": 20.5, "pull": 31.0, "start": 1.2, "ready": 3.3},
                         detail="no capacity in any zone" if status == FAILED_STATUS else None)
            n += 1
    for i in range(IMAGES):
        db.record_build(image=f"model-{i % 40}", release=f"24.{i % 12:02d}", variant="runtime",
                        tag=f"ngcx-app/model-{i}:latest", image_id=f"sha256:{i:064x}", size_bytes=2_000_000_000 + i,
                        duration_s=30.0 + i % 7)


def _visit(browser: Any, url: str, then: str | None = None) -> tuple[float, int]:
    """(first contentful paint in s, bytes transferred) of one fresh browser context loading `url` (then `then`)."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url)
        if then:
            page.goto(then)
        return page.evaluate(PAINT) / 1000.0, int(page.evaluate(BYTES))
    finally:
        context.close()


def _update_latency(browser: Any, dash: Any) -> float:
    """Seconds from a deployment's commit (by this process) to its row in the open overview."""
    from ngcx.deploy import store
    from ngcx.deploy.common import DeployConfig

    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(dash.url)
        page.wait_for_selector("#deployments tr")
        time.sleep(1.0)                                   # let the page's own first refresh settle
        nxt = max(r.id for r in store.records(include_gone=True)) + 1
        page.evaluate(WATCH, nxt)
        committed = time.time()
        record = store.create_intent(DeployConfig(cloud="local", image="arrived:latest", pull_ref=None,
                                                  registry=None, labels={}, model="convnet"))
        assert record.id == nxt, (record.id, nxt)
        page.wait_for_function("() => window.__seen", timeout=10_000)
        seen = page.evaluate("window.__seen") / 1000.0
        store.mark_destroyed(record.id, "bench over")
        return seen - committed
    finally:
        context.close()


def _static_copy(dash: Any, folder: Path) -> Path:
    """The overview exactly as the dashboard renders it now, with its assets, as files (the peer serves them)."""
    status, _, body = dash.call("/")
    assert status == 200, status
    (folder / "static" / "vendor").mkdir(parents=True, exist_ok=True)
    (folder / "index.html").write_bytes(body)
    static = ROOT / "cli" / "dashboard" / "static"
    for name in ("dashboard.css", "dashboard.js"):
        shutil.copy(static / name, folder / "static" / name)
    return folder


def run(result: SuiteResult, work: Path, out: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        raise SuiteSkipped("playwright is not installed (pip install -e '.[test]')") from None
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SuiteSkipped("Debian's chromium is not installed (scripts/setup.sh installs it)")
    sys.path.insert(0, str(ROOT / "tests"))
    from dashboard.running import Dashboard

    state = work / "state"
    os.environ["NGCX_STATE_DIR"] = str(state)
    fill(state)
    env = {"NGCX_STATE_DIR": str(state), "AWS_ACCESS_KEY_ID": "", "ALIBABA_CLOUD_ACCESS_KEY_ID": ""}
    figures: dict[str, list[float]] = {k: [] for k in ("first", "again", "bytes", "static", "static_bytes", "update")}
    with Dashboard(env) as dash, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--no-proxy-server"])
        peer_dir = _static_copy(dash, work / "static-peer")
        peer = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=peer_dir,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = peer.stdout.readline() if peer.stdout else ""
            peer_url = f"http://127.0.0.1:{line.split('port ')[1].split(' ')[0]}/"
            for _ in range(result.repeat):
                paint, size = _visit(browser, dash.url)
                figures["first"].append(paint)
                figures["bytes"].append(size / 1000.0)
                figures["again"].append(_visit(browser, dash.url, then=dash.base + "/")[0])
                paint, size = _visit(browser, peer_url)
                figures["static"].append(paint)
                figures["static_bytes"].append(size / 1000.0)
                figures["update"].append(_update_latency(browser, dash))
        finally:
            peer.terminate()
            peer.wait(10)
            browser.close()
    _report(result, figures)


def _report(result: SuiteResult, f: dict[str, list[float]]) -> None:
    def m(name: str, tool: str, key: str, unit: str = "s", note: str = "") -> Measurement:
        command = "python -m http.server (static copy)" if tool == "static" else "ngcx dashboard --port 0"
        return Measurement(name, tool, unit, "lower", Stats.of(f[key]), command=f"chromium <- {command}", note=note)

    first = m("overview first paint, first visit (token -> cookie redirect)", "ngcx", "first")
    again = m("overview first paint, later visit (cookie)", "ngcx", "again")
    static = m("the same overview as static files (python -m http.server)", "static", "static",
               note="the browser's own cost of painting these bytes")
    size = m("overview bytes transferred (page + assets, gzip)", "ngcx", "bytes", "KB")
    static_size = m("the same page as static files, bytes (no gzip)", "static", "static_bytes", "KB")
    update = m("a new deployment committed -> its row on the open page", "ngcx", "update")
    result.measurements = [first, again, static, size, static_size, update]
    result.ratios = [ratio("overview first paint (cookie) / static files", again, static),
                     ratio("overview first paint (first visit) / static files", first, static)]
    result.extra.update(deployments=sum(DEPLOYMENTS.values()), failed=FAILED, images=IMAGES,
                        bounds={"first_paint_s": 1.0, "kb": 500, "update_s": 2.0})
    result.notes = [
        f"With {sum(DEPLOYMENTS.values())} live deployments (+{FAILED} failed) and {IMAGES} images: first paint "
        f"{first.wall.median:.3f} s on the first visit, {again.wall.median:.3f} s later (bound 1 s); "
        f"{size.wall.median:.0f} KB transferred (bound 500 KB); a new deployment on the open page "
        f"{update.wall.median:.2f} s after its commit (bound 2 s).",
        "The update latency is the store watcher's tick (0.5 s, cli/dashboard/events.py) plus the page's fetch "
        "and swap of its live parts; it varies with where the commit falls in the tick.",
    ]
