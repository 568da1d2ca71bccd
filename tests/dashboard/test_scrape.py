"""The dashboard's scrapers (cli/dashboard/scrape.py): what a user watching a deployment's charts notices.

Against a real ngcx-runtime server on loopback (the runtime tests' small ONNX model, behind a bearer
key): the endpoint reads healthy and its chart gets points with requests/s and p50 <= p99. An
endpoint that accepts and never answers reads unhealthy within about timeout + interval, while the
real one keeps charting (a hung endpoint delays only itself, and its scraper never piles up
requests); garbage, a refused port and a refused key each read unhealthy with a reason to act on.
The chart arithmetic (point, parse) is checked on numbers worked out by hand.
"""

from __future__ import annotations

import http.server
import importlib.util
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ngcx.dashboard import scrape
from ngcx.dashboard.scrape import MetricsError, Scrapers, Target, parse, point, quantile

from .running import until

pytest.importorskip("prometheus_client")
requests = pytest.importorskip("requests")
pytest.importorskip("onnxruntime")

TIMEOUT = 30
KEY = "dashboard-test-key-0123456789abcdef"


def _runtime_models():
    """tests/runtime/models.py (the shared ONNX model builders), loaded by path: no sys.path change."""
    spec = importlib.util.spec_from_file_location("runtime_test_models",
                                                  Path(__file__).resolve().parent.parent / "runtime" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


models = _runtime_models()


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """running.until at a finer poll (the scrapers here tick every 0.1 s)."""
    return until(predicate, timeout, every=0.02, what=what)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[object]:
    """ngcx-runtime serving the conv model on a free loopback port; every path but health needs KEY."""
    from ngcx_runtime.access import AccessConfig
    from ngcx_runtime.keys import sha256_hex
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    folder = tmp_path_factory.mktemp("scrape")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGCX_RUNTIME_CACHE", str(folder / "plan-cache"))
        engine = load(models.conv_net(folder / "conv.onnx"), backend="onnxruntime")
        handle = start_server(engine, "127.0.0.1", 0, max_batch=8, max_queue_delay_ms=1,
                              access=AccessConfig(auth_key_sha256=(sha256_hex(KEY),)))
        yield handle
        handle.stop()


def infer(url: str, n: int) -> None:
    for i in range(n):
        x = models.sample_inputs("conv", 1 + i % 3, seed=i)["input"]
        body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        r = requests.post(f"{url}/v2/models/conv/infer", json=body, timeout=TIMEOUT,
                          headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text


@pytest.fixture()
def scrapers() -> Iterator[Callable[..., Scrapers]]:
    """scrapers(**kwargs) -> a Scrapers closed when the test ends."""
    made: list[Scrapers] = []

    def make(**kwargs: object) -> Scrapers:
        made.append(Scrapers(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _healthy(s: Scrapers, id_: object) -> bool:
    return s.health(id_)["state"] == "healthy"


def _busy_point(s: Scrapers, id_: object) -> dict | None:
    return next((p for p in s.points(id_) if p["rps"]), None)


# -- against a real server --

def test_a_real_runtime_reads_healthy_and_charts_requests_and_latency_quantiles(server, scrapers):
    s = scrapers(interval=0.2, timeout=2.0)
    s.sync([Target("real", server.url, KEY, None), Target("wrong-key", server.url, "not-the-key", None)])
    wait_until(lambda: _healthy(s, "real"), 10, "the real endpoint reads healthy")
    infer(server.url, 12)
    p = wait_until(lambda: _busy_point(s, "real"), 10, "a point with requests/s > 0")
    assert p["rps"] > 0 and p["errors"] == 0
    assert p["p50_ms"] is not None and 0 < p["p50_ms"] <= p["p99_ms"] < TIMEOUT * 1000
    assert p["mean_ms"] > 0 and p["queue_ms"] >= 0 and p["batch"] >= 1
    assert p["pending"] in (0, 1), "a gauge at scrape time: at most the one request the test has in flight"
    assert abs(p["t"] - time.time()) < 30
    assert s.points("real", since=p["t"]) == [q for q in s.points("real") if q["t"] > p["t"]]
    health = s.health("real")
    assert health["reason"] == "" and health["checked"] > 0
    wrong = wait_until(lambda: s.health("wrong-key")["state"] == "unhealthy" and s.health("wrong-key"), 10,
                       "a wrong key reads unhealthy")
    assert wrong["reason"] == "HTTP 401: the key was refused"


class HangingServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (nor closes): a hung endpoint."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()
        self.thread.join(5)


def test_a_hung_endpoint_reads_unhealthy_in_time_and_the_others_keep_charting(server, scrapers):
    hang = HangingServer()
    try:
        interval, timeout = 0.2, 1.0
        s = scrapers(interval=interval, timeout=timeout)
        started = time.monotonic()
        s.sync([Target("hung", f"http://127.0.0.1:{hang.port}", KEY, None), Target("real", server.url, KEY, None)])
        health = wait_until(lambda: s.health("hung")["state"] == "unhealthy" and s.health("hung"),
                            timeout + interval + 2.0, "the hung endpoint reads unhealthy")
        assert health["reason"] == "did not answer within 1 s"
        # while the hung one is retried, the real one keeps producing points, many per hung fetch
        before = len(s.points("real"))
        infer(server.url, 6)
        wait_until(lambda: _busy_point(s, "real") and len(s.points("real")) >= before + 5, 10,
                   "five more points of the real endpoint")
        assert s.health("hung")["state"] == "unhealthy" and _healthy(s, "real")
        elapsed = time.monotonic() - started
        assert len(hang.accepted) <= elapsed / timeout + 1, "one fetch at a time: no pile-up on a hung endpoint"
    finally:
        hang.close()


@pytest.fixture()
def answering() -> Iterator[Callable[[int, bytes], str]]:
    """answering(status, body) -> the URL of a plain HTTP server that answers every GET with them."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def make(status: int, body: bytes) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:              # noqa: N802 - http.server's naming
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_garbage_a_stranger_a_refused_port_and_a_missing_path_each_read_unhealthy_with_the_reason(answering,
                                                                                                   scrapers):
    s = scrapers(interval=0.1, timeout=2.0)
    s.sync([
        Target("garbage", answering(200, b"<html><body>hello</body></html>"), None, None),
        Target("stranger", answering(200, b"# TYPE up gauge\nup 1\n"), None, None),
        Target("refused", f"http://127.0.0.1:{_free_port()}", None, None),
        Target("missing", answering(404, b"{}"), None, None),
        Target("unpinned", "https://127.0.0.1:1", KEY, None),
    ])
    want = {
        "garbage": "metrics do not parse: not Prometheus text",
        "stranger": "metrics do not parse: no nv_inference_* families: is this ngcx-runtime's /metrics?",
        "refused": "refused the connection",
        "missing": "HTTP 404: no /metrics here",
        "unpinned": "its certificate is not pinned",
    }
    for id_, reason in want.items():
        health = wait_until(lambda id_=id_: s.health(id_)["state"] == "unhealthy" and s.health(id_), 10,
                            f"{id_} reads unhealthy")
        assert reason in health["reason"], (id_, health)
        assert s.points(id_) == []


# -- the scrapers' bookkeeping, with a fetch of the test's own --

METRICS = b"# TYPE nv_inference_request_success counter\nnv_inference_request_success{model=\"m\",version=\"1\"} 1\n"


def test_a_scraper_never_runs_two_fetches_at_once(scrapers):
    lock, inflight, peak, calls = threading.Lock(), [0], [0], [0]
    release = threading.Event()

    def slow(target: Target, timeout: float) -> tuple[int, bytes]:
        with lock:
            inflight[0] += 1
            calls[0] += 1
            peak[0] = max(peak[0], inflight[0])
        release.wait(0.3)                          # much longer than the interval
        with lock:
            inflight[0] -= 1
        return 200, METRICS

    s = scrapers(interval=0.01, timeout=0.3, fetch=slow)
    s.sync([Target(1, "http://a", None, None)])
    wait_until(lambda: calls[0] >= 3, 5, "three fetches")
    assert peak[0] == 1


def test_sync_starts_new_ids_stops_gone_ones_restarts_a_changed_endpoint_and_caps_the_count(scrapers):
    seen: list[str] = []
    lock = threading.Lock()

    def fetch(target: Target, timeout: float) -> tuple[int, bytes]:
        with lock:
            seen.append(target.endpoint)
        return 200, METRICS

    s = scrapers(interval=60.0, timeout=1.0, fetch=fetch)      # one fetch each, then a long wait
    s.sync([Target("a", "http://a", None, None), Target("b", "http://b", None, None)])
    wait_until(lambda: _healthy(s, "a") and _healthy(s, "b"), 5, "both scraped")
    s.sync([Target("b", "http://b", None, None), Target("a", "http://a2", "k", None)])   # b unchanged, a moved
    wait_until(lambda: "http://a2" in seen, 5, "the moved endpoint scraped")
    assert sorted(seen) == ["http://a", "http://a2", "http://b"], "b kept its scraper (no second fetch)"
    s.sync([Target("b", "http://b", None, None)])
    assert s.health("a") == {"state": "unknown", "reason": "not watched", "checked": 0.0}
    assert s.points("a") == []

    many = [Target(i, f"http://h{i}", None, None) for i in range(scrape.MAX_SCRAPERS + 2)]
    s.sync(many)
    assert s.health(scrape.MAX_SCRAPERS + 1)["reason"] == "too many endpoints to watch"
    assert s.health(scrape.MAX_SCRAPERS + 1)["state"] == "unknown"
    wait_until(lambda: _healthy(s, scrape.MAX_SCRAPERS - 1), 10, "the last watched endpoint scraped")
    started = time.monotonic()
    s.close()
    assert time.monotonic() - started < 5, "close joins within its bound"
    assert threading.active_count() < scrape.MAX_SCRAPERS, "the threads ended"
    assert s.health(0)["state"] == "unknown"


# -- the chart arithmetic --

def _scrape(success: float, buckets: list[tuple[float, float]], **more: float) -> dict:
    base = {"success": success, "failure": 0, "inferences": success, "executions": success, "request_us": 0,
            "queue_us": 0, "pending": 0, "buckets": buckets, "gpu_util": None, "gpu_mem_used": None,
            "gpu_mem_total": None, "gpu_power": None}
    return {**base, **more}


INF = math.inf


def test_quantiles_interpolate_inside_the_bucket_the_rank_falls_in_over_the_interval_only():
    prev = _scrape(100, [(100, 50), (200, 100), (500, 100), (INF, 100)], request_us=10_000)
    # in the interval: 10 requests, all in (100, 200]; 10 more in (200, 500]
    cur = _scrape(120, [(100, 50), (200, 110), (500, 120), (INF, 120)], request_us=14_000, queue_us=2_000,
                  inferences=160, executions=110, failure=3, pending=2, gpu_util=0.5,
                  gpu_mem_used=2 * 2**30, gpu_mem_total=8 * 2**30, gpu_power=150.0)
    p = point(prev, cur, 2.0, 1000.0)
    assert p["t"] == 1000.0 and p["rps"] == 10 and p["errors"] == 1.5
    assert p["p50_ms"] == pytest.approx(0.2)                      # rank 10 of 20: the top of (100, 200]
    assert p["p99_ms"] == pytest.approx((200 + 300 * (19.8 - 10) / 10) / 1000)
    assert p["mean_ms"] == pytest.approx(0.2) and p["queue_ms"] == pytest.approx(0.1)
    assert p["batch"] == pytest.approx(60 / 10)
    assert p["pending"] == 2 and p["gpu_util"] == 50 and p["gpu_mem_gb"] == 2 and p["gpu_mem_total_gb"] == 8
    assert p["gpu_power_w"] == 150.0


def test_quantile_edges_first_bucket_infinite_bucket_and_nothing():
    assert quantile(0.5, [(100, 10), (INF, 10)]) == pytest.approx(50)        # from 0 in the first bucket
    assert quantile(0.99, [(100, 0), (60e6, 0), (INF, 4)]) == 60e6          # +Inf: the highest finite le
    assert quantile(0.5, [(100, 0), (INF, 0)]) is None
    assert quantile(0.5, []) is None


def test_an_idle_interval_has_no_latency_and_a_counter_reset_counts_the_new_process_alone():
    same = _scrape(10, [(100, 10), (INF, 10)])
    idle = point(same, same, 1.0, 1.0)
    assert idle["rps"] == 0 and idle["p50_ms"] is None and idle["p99_ms"] is None and idle["mean_ms"] is None
    assert idle["batch"] is None and idle["queue_ms"] is None
    before = _scrape(1000, [(100, 400), (200, 1000), (INF, 1000)], request_us=150_000)
    after = _scrape(4, [(100, 4), (200, 4), (INF, 4)], request_us=200, inferences=4, executions=2)
    p = point(before, after, 1.0, 2.0)
    assert p["rps"] == 4 and p["p50_ms"] == pytest.approx(0.05) and p["mean_ms"] == pytest.approx(0.05)
    assert p["batch"] == 2
    assert point(_scrape(5, []), _scrape(9, []), 1.0, 3.0)["p99_ms"] is None, "a runtime without the histogram"


def test_parse_sums_models_and_gpus_from_what_the_runtime_renders():
    from ngcx_runtime.batching import Stats
    from ngcx_runtime.metrics import ModelSample, render

    a, b = Stats(), Stats()
    for ns in (150_000, 150_000, 3_000_000):
        a.count_success(ns)
    b.count_success(400_000)
    b.count_failure()
    text = render([ModelSample("a", "1", a.snapshot(), 1), ModelSample("b", "2", b.snapshot(), 2)])
    text += ('nv_gpu_utilization{gpu_uuid="GPU-0"} 0.2\nnv_gpu_utilization{gpu_uuid="GPU-1"} 0.6\n'
             'nv_gpu_memory_used_bytes{gpu_uuid="GPU-0"} 100\nnv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 50\n'
             'nv_gpu_power_usage{gpu_uuid="GPU-0"} 70.5\nnv_gpu_power_usage{gpu_uuid="GPU-1"} 29.5\n')
    m = parse(text)
    assert m["success"] == 4 and m["failure"] == 1 and m["pending"] == 3
    assert m["request_us"] == 150 + 150 + 3000 + 400
    buckets = dict(m["buckets"])
    assert buckets[100] == 0 and buckets[200] == 2 and buckets[500] == 3 and buckets[5000] == 4
    assert buckets[INF] == 4 and m["buckets"][-1][0] == INF
    assert m["gpu_util"] == pytest.approx(0.4) and m["gpu_mem_used"] == 150 and m["gpu_power"] == 100
    assert m["gpu_mem_total"] is None
    assert parse(render([]))["gpu_util"] is None, "no GPU families: None, not 0"


@pytest.mark.parametrize(("text", "reason"), [
    ("<html><body>sign in</body></html>", "not Prometheus text"),
    ('{"error": "unauthorized"}', "not Prometheus text"),
    ("", "no nv_inference_\\* families"),
    ("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 12\n", "no nv_inference_\\* families"),
])
def test_parse_refuses_what_is_not_the_runtimes_metrics_in_one_line(text, reason):
    with pytest.raises(MetricsError, match=reason) as caught:
        parse(text)
    assert "\n" not in str(caught.value)
