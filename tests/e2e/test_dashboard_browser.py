"""`ngcx dashboard` in a real headless Chromium (Debian's, driven by playwright) over a real state (issue 23).

The state holds real deployments: the example project served by a local container and by a host of the
emulated AWS (its real SDK against moto, its endpoint https with a pinned certificate and a key), plus two
records whose endpoints misbehave (one accepts and never answers, one answers garbage). What a user sees:
every page renders; a chart moves when the model gets traffic; a new deployment appears without a reload;
destroy from the page removes the container; a browser without the token gets nothing; the misbehaving
endpoints are marked unhealthy and the page keeps working. Screenshots of each page go to
$NGCX_DASHBOARD_SCREENSHOTS when set (the README's come from there), else to the test's tmp folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard.running import Dashboard, until
from deploy_helpers import Load, access

from ngcx.core.engine import containers

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Misbehaving:
    """Two loopback endpoints: one accepts and never answers, one answers 200 with text that is not metrics."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hang, self.garbage = self._listen(self._hang), self._listen(self._garbage)

    def _listen(self, handle: Any) -> socket.socket:
        sock = socket.create_server(("127.0.0.1", 0))
        sock.settimeout(0.2)
        threading.Thread(target=self._serve, args=(sock, handle), daemon=True).start()
        return sock

    def _serve(self, sock: socket.socket, handle: Any) -> None:
        held = []
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = sock.accept()
                held.append(conn)
                handle(conn)
        for conn in held:
            conn.close()
        sock.close()

    @staticmethod
    def _hang(conn: socket.socket) -> None:
        pass                                  # keep the connection open, never answer

    @staticmethod
    def _garbage(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.recv(65536)
            body = b"<html>\x00\xff this is not prometheus {{{"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            conn.close()

    def url(self, sock: socket.socket) -> str:
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def body(project: Path) -> bytes:
    """The example's inference request, as JSON."""
    import json

    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    array = example.inputs["image"]
    return json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.reshape(-1).tolist()}]}).encode()


def fake_ready(endpoint: str, image: str) -> int:
    """A ready deployment record whose endpoint is `endpoint` (the store's own API, as a deploy writes it)."""
    from ngcx.deploy import store
    from ngcx.deploy.common import READY, DeployConfig

    record = store.create_intent(DeployConfig(cloud="local", image=image, pull_ref=None, registry=None, labels={},
                                              model="convnet"))
    return store.update(record.id, status=READY, endpoint=endpoint, pid=None).id


@pytest.fixture(scope="module")
def world(aws, project, docker_client, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A local and an AWS deployment of the project, two misbehaving records, and the dashboard over them."""
    from ngcx.deploy import store

    saved = os.environ.get("NGCX_STATE_DIR")
    os.environ["NGCX_STATE_DIR"] = aws.env["NGCX_STATE_DIR"]
    bad = Misbehaving()
    made: list[int] = []
    try:
        built = aws.ngcx("build")                                      # cached: records the build in this store
        assert built.returncode == 0, built.stderr[-2000:]
        tested = aws.ngcx("test", "ngcx-app/onnx-zero-code:latest")    # its results, for the image page
        assert tested.returncode == 0, tested.stderr[-2000:]
        local = aws.ngcx("deploy", "--cloud", "local")
        assert local.returncode == 0, local.stderr[-2000:]
        on_aws = aws.deploy()
        assert on_aws.returncode == 0, on_aws.stderr[-2000:]
        local_rec = next(r for r in store.records() if r.cloud == "local" and r.status == "ready")
        aws_rec = next(r for r in store.records() if r.cloud == "aws" and r.status == "ready")
        made += [fake_ready(bad.url(bad.hang), "hangs:latest"), fake_ready(bad.url(bad.garbage), "garbage:latest")]
        shots = Path(os.environ.get("NGCX_DASHBOARD_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
        shots.mkdir(parents=True, exist_ok=True)
        with Dashboard(aws.env, cwd=project) as dash:
            yield {"dash": dash, "local": local_rec, "aws": aws_rec, "hang": made[0], "garbage": made[1],
                   "shots": shots, "project": project, "env": aws.env}
    finally:
        bad.stop.set()
        for record_id in made:
            store.mark_destroyed(record_id, "test over")
        for record in store.records():
            if record.cloud in ("local", "aws") and record.status == "ready" and record.id not in made:
                aws.ngcx("deployments", "destroy", str(record.id), "--yes")
        if saved is None:
            os.environ.pop("NGCX_STATE_DIR", None)
        else:
            os.environ["NGCX_STATE_DIR"] = saved


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--no-proxy-server"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, world) -> Iterator[Any]:
    """A tab past the token; no page it visits may log a console error (issue 46: /favicon.ico was a 404)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda msg: errors.append(f"{tab.url}: {msg.text}") if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(f"{tab.url}: {exc}"))
    tab.goto(world["dash"].url)                     # the printed URL: the token becomes a cookie
    yield tab
    context.close()
    assert not errors, errors


def row(tab: Any, record_id: int) -> Any:
    return tab.locator(f'#deployments tr[data-id="{record_id}"]')


def test_overview_shows_every_deployment_its_price_and_health(page, world):
    local, aws_rec = world["local"], world["aws"]
    assert "token" not in page.url                  # traded for the cookie, gone from the address bar
    page.wait_for_selector(f'#deployments tr[data-id="{aws_rec.id}"] .health.healthy', timeout=20_000)
    assert "healthy" in row(page, local.id).inner_text()
    aws_row = row(page, aws_rec.id).inner_text()
    assert "aws" in aws_row and "g5.xlarge" in aws_row and "USD/h" in aws_row and "A10G" in aws_row
    for record_id, reason in ((world["hang"], "did not answer"), (world["garbage"], "do not parse")):
        page.wait_for_selector(f'#deployments tr[data-id="{record_id}"] .health.unhealthy', timeout=20_000)
        assert reason in row(page, record_id).inner_text()
    assert int(page.locator("#attention .card").nth(1).locator("b").inner_text()) >= 2   # unhealthy, counted
    page.screenshot(path=str(world["shots"] / "overview.png"), full_page=True)


def test_a_new_deployment_shows_without_a_reload_within_2_s(page, world):
    from ngcx.deploy import store

    page.wait_for_selector(f'#deployments tr[data-id="{world["local"].id}"]')
    page.evaluate("window.__same_page = true")
    started = time.monotonic()
    new = fake_ready("http://127.0.0.1:9", "arrived:latest")
    try:
        page.wait_for_selector(f'#deployments tr[data-id="{new}"]', timeout=2_000)
        print(f"new deployment on the page {time.monotonic() - started:.2f} s after its commit")
        assert page.evaluate("window.__same_page") is True           # no reload: the live part was swapped
    finally:
        store.mark_destroyed(new, "test over")
    page.wait_for_selector(f'#deployments tr[data-id="{new}"]', state="detached", timeout=5_000)


def test_the_deployment_page_charts_live_metrics_under_traffic(page, world):
    local = world["local"]
    page.goto(f"{world['dash'].base}/deployments/{local.id}")
    charts = page.locator("#charts")
    until(lambda: int(charts.get_attribute("data-points") or 0) >= 2, 30, what="the first chart points")
    key, _ = access(world["project"], local.endpoint, world["env"])
    points = int(charts.get_attribute("data-points") or 0)
    with Load(local.endpoint, key, body(world["project"]), clients=2, rate=20) as load:
        load.settle(20)
        until(lambda: float(charts.get_attribute("data-last-rps") or 0) > 0, 20, what="requests/s above zero")
        until(lambda: int(charts.get_attribute("data-points") or 0) >= points + 8, 30, what="8 points under load")
        assert float(charts.get_attribute("data-last-mean-ms") or 0) > 0          # the latency chart's figure
    assert not page.locator("#chart-gpu_util").is_visible()                     # no NVML here: no GPU charts
    assert page.locator(".no-gpu").is_visible()
    assert [s.inner_text().split()[0] for s in page.locator(".timeline .seg").all()] == \
        ["api", "boot", "pull", "start", "ready"]
    until(lambda: "ready" in page.locator("#logs").inner_text().lower(), 30, what="the log tail")
    page.screenshot(path=str(world["shots"] / "deployment.png"), full_page=True)


def test_the_cloud_deployment_page_is_scraped_through_its_key_and_pinned_tls(page, world):
    aws_rec = world["aws"]
    page.goto(f"{world['dash'].base}/deployments/{aws_rec.id}")
    page.wait_for_selector("#summary .health.healthy", timeout=20_000)
    until(lambda: int(page.locator("#charts").get_attribute("data-points") or 0) >= 2, 30, what="points")
    assert "g5.xlarge" in page.locator("#summary").inner_text()


def test_image_and_catalog_pages_render(page, world):
    page.goto(f"{world['dash'].base}/images/{world['local'].image}")
    page.wait_for_selector("#pins")
    pins = page.locator("#pins").inner_text()
    assert "cudnn" in pins and "onnxruntime" in pins                          # the image's pin labels
    assert "0 failed" in page.locator("#tests").inner_text()                   # `ngcx test`'s recorded run
    assert page.locator("#layers tbody tr").count() > 5
    base_layer = page.locator("#layers tbody tr").first.locator("td").nth(3).inner_text()
    assert base_layer.strip(), "the base layer is shared with the catalog images it came from"
    page.screenshot(path=str(world["shots"] / "image.png"), full_page=True)
    page.goto(f"{world['dash'].base}/catalog")
    assert page.locator("table.matrix tbody tr").count() >= 5
    assert "CUDA" in page.locator("table.matrix thead").inner_text()
    page.screenshot(path=str(world["shots"] / "catalog.png"), full_page=True)


def test_a_browser_without_the_token_gets_nothing(browser, world):
    context = browser.new_context()
    tab = context.new_page()
    response = tab.goto(world["dash"].base + "/")
    assert response.status == 401 and "needs its token" in tab.content()
    assert "deployments" not in tab.content().lower()
    context.close()


def test_destroy_from_the_page_removes_the_container(page, world, docker_client):
    local = world["local"]
    assert docker_client.containers.get(local.container).status == "running"
    page.goto(f"{world['dash'].base}/deployments/{local.id}")
    page.click("button.act.destroy")
    page.click("#confirm-ok")
    page.wait_for_selector("#summary .status.destroyed", timeout=60_000)      # shown as it happens, no reload
    page.wait_for_selector("#jobs .job.done", timeout=60_000)                  # the command's end, exit 0
    assert not containers(docker_client, {"id": local.container})
