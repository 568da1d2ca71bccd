"""Prometheus metrics of `ngcx-runtime serve` (issue 12, item 1), read by prometheus_client's own parser.

What an operator notices: a Prometheus scrape of /metrics (serving port) or of --metrics-port
parses, uses Triton's names and labels, and its counters match what the clients did: successes,
failures (bad requests), inferences (batch sizes summed) and executions (engine calls, fewer
than requests when concurrent requests were merged), plus durations and the pending gauge. GPU
families appear where NVML is (checked on a GPU host) and are absent, not zero, elsewhere.
"""

from __future__ import annotations

import ctypes
import http.client
import threading

import models
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
requests = pytest.importorskip("requests")
parser = pytest.importorskip("prometheus_client.parser")

from ngcx_runtime.metrics import GpuGauges, ModelSample, render  # noqa: E402
from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

TIMEOUT = 30
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """metric family -> {label tuple: value}, through the real text-format parser (which names a
    counter's samples NAME_total; the exposition itself keeps Triton's names, checked below)."""
    r = requests.get(url, timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out: dict[str, dict[tuple, float]] = {}
    for family in parser.text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(family.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def nvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def post(url: str, x: np.ndarray) -> requests.Response:
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return requests.post(f"{url}/v2/models/conv/infer", json=body, timeout=TIMEOUT)


@pytest.fixture()
def server(tmp_path):
    engine = load(models.conv_net(tmp_path / "conv.onnx"), backend="onnxruntime")
    handle = start_server(engine, "127.0.0.1", 0, max_batch=32, max_queue_delay_ms=300, metrics_port=0)
    yield handle
    handle.stop()


LABELS = (("model", "conv"), ("version", "1"))


def test_counters_match_the_requests_sent(server):
    xs = [models.sample_inputs("conv", 2, seed=i)["input"] for i in range(8)]
    results: list = [None] * len(xs)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(server.url, xs[i])))
               for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert all(r is not None and r.status_code == 200 for r in results)
    solo = post(server.url, models.sample_inputs("conv", 3, seed=99)["input"])
    assert solo.status_code == 200
    bad = requests.post(f"{server.url}/v2/models/conv/infer", data=b'{"inputs": [', timeout=TIMEOUT)
    wrong = post(server.url, np.zeros((1, 3, 8, 16), np.float32))
    assert bad.status_code == 400 and wrong.status_code == 400

    m = scrape(f"{server.url}/metrics")
    for name in COUNTERS:
        assert set(m[name]) == {LABELS}, f"{name} has labels model and version"
    assert m["nv_inference_request_success"][LABELS] == 9
    assert m["nv_inference_request_failure"][LABELS] == 2
    assert m["nv_inference_count"][LABELS] == 8 * 2 + 3
    execs = m["nv_inference_exec_count"][LABELS]
    assert 2 <= execs < 9, "concurrent requests were merged: fewer executions than requests"
    assert execs == server.stats()["engine_calls"]
    for name in COUNTERS[4:]:
        assert m[name][LABELS] > 0, name
    # the merged requests waited up to 300 ms for company: queue time is most of their duration
    assert m["nv_inference_queue_duration_us"][LABELS] > 100_000
    assert m["nv_inference_request_duration_us"][LABELS] > m["nv_inference_queue_duration_us"][LABELS]
    assert m["nv_inference_pending_request_count"][LABELS] == 0
    assert ("nv_gpu_utilization" in m) == nvml_present()


def test_the_metrics_port_serves_the_same_exposition_and_nothing_else(server):
    assert post(server.url, models.sample_inputs("conv", 1)["input"]).status_code == 200
    on_port = scrape(server.metrics_url)
    assert server.metrics_url.endswith("/metrics")
    assert int(server.metrics_url.split("/")[2].split(":")[1]) != server.port, "a port of its own"
    assert on_port["nv_inference_request_success"][LABELS] == 1
    base = server.metrics_url.removesuffix("/metrics")
    r = requests.get(f"{base}/v2/models/conv", timeout=TIMEOUT)
    assert r.status_code == 404 and "metrics are at /metrics" in r.json()["error"]
    r = requests.post(server.metrics_url, data=b"x", timeout=TIMEOUT)
    assert r.status_code == 405
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    conn.request("HEAD", "/metrics")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    import socket

    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:   # not HTTP at all
        sock.sendall(b"\x16\x03\x01 garbage\r\n\r\n")
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"HTTP/1.1 400") and b'"error"' in reply
    assert scrape(server.metrics_url)["nv_inference_request_success"][LABELS] == 1


def test_pending_requests_are_visible_while_they_wait(server):
    """Two requests wait out the 300 ms queue delay together: a scrape meanwhile counts them pending."""
    xs = [models.sample_inputs("conv", 1, seed=i)["input"] for i in range(2)]
    threads = [threading.Thread(target=post, args=(server.url, x)) for x in xs]
    for t in threads:
        t.start()
    seen = 0.0
    for _ in range(40):
        seen = max(seen, scrape(f"{server.url}/metrics")["nv_inference_pending_request_count"][LABELS])
        if seen == 2:
            break
    for t in threads:
        t.join(TIMEOUT)
    assert seen == 2
    assert scrape(f"{server.url}/metrics")["nv_inference_pending_request_count"][LABELS] == 0


HISTOGRAM = "nv_inference_request_duration_histogram_us"


def test_the_request_duration_histogram_parses_is_cumulative_and_counts_every_success(server):
    """p50/p99 come from scrapes: the buckets (le in microseconds, 100 us .. 60 s, then +Inf) are
    cumulative, and _count / _sum are the success counter / the duration counter."""
    n = 7
    for i in range(n):
        assert post(server.url, models.sample_inputs("conv", 1, seed=i)["input"]).status_code == 200
    assert post(server.url, np.zeros((1, 3, 8, 16), np.float32)).status_code == 400   # a failure: not observed
    r = requests.get(f"{server.url}/metrics", timeout=TIMEOUT)
    fams = {f.name: f for f in parser.text_string_to_metric_families(r.text)}
    hist = fams[HISTOGRAM]
    assert hist.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in hist.samples if s.name == f"{HISTOGRAM}_bucket"]
    assert all(s.labels["model"] == "conv" and s.labels["version"] == "1" for s in hist.samples)
    les = [float(le) for le, _ in buckets]
    assert les[0] == 100 and les[-2] == 60_000_000 and les[-1] == float("inf") and 18 <= len(les) <= 24
    assert les == sorted(les), "buckets in ascending le"
    counts = [v for _, v in buckets]
    assert all(a <= b for a, b in zip(counts, counts[1:], strict=False)), f"cumulative: {counts}"
    (count,) = [s.value for s in hist.samples if s.name == f"{HISTOGRAM}_count"]
    (total,) = [s.value for s in hist.samples if s.name == f"{HISTOGRAM}_sum"]
    success = {s.name: s.value for s in fams["nv_inference_request_success"].samples}
    assert count == counts[-1] == n == next(iter(success.values()))
    assert total == fams["nv_inference_request_duration_us"].samples[0].value > 0
    assert f"\n{HISTOGRAM}_bucket{{model=\"conv\",version=\"1\",le=\"100\"}} " in r.text


def test_the_histogram_puts_each_duration_in_the_first_bucket_at_or_above_it():
    from ngcx_runtime.batching import REQUEST_BUCKETS_US, Stats

    stats = Stats()
    for us in (1, 100, 101, 1_000, 59_000_000, 61_000_000):       # le is inclusive: 100 us goes in le="100"
        stats.count_success(us * 1000)
    fams = {f.name: f for f in parser.text_string_to_metric_families(render([ModelSample("m", "1",
                                                                                       stats.snapshot(), 0)]))}
    cum = {float(s.labels["le"]): s.value for s in fams[HISTOGRAM].samples if s.name.endswith("_bucket")}
    assert cum[100] == 2 and cum[200] == 3 and cum[500] == 3 and cum[1000] == 4
    assert cum[REQUEST_BUCKETS_US[-1]] == 5 and cum[float("inf")] == 6


def test_label_values_are_escaped_so_any_model_name_parses():
    name = 'we"ird\\name\nwith newline'
    text = render([ModelSample(name, "2", {"success": 5, "request_ns": 12_345_678}, 1)])
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    (sample,) = fams["nv_inference_request_success"].samples
    assert sample.labels == {"model": name, "version": "2"} and sample.value == 5
    (dur,) = fams["nv_inference_request_duration_us"].samples
    assert dur.value == 12_345, "nanoseconds become whole microseconds"
    assert fams["nv_inference_request_success"].type == "counter"
    assert '\nnv_inference_request_success{model="' in text, "Triton's sample name, without _total"
    assert fams["nv_inference_pending_request_count"].type == "gauge"
    hist = {s.name: s for s in fams[HISTOGRAM].samples if "le" not in s.labels}
    assert hist[f"{HISTOGRAM}_count"].value == 0, "a snapshot without buckets renders empty ones"
    assert hist[f"{HISTOGRAM}_sum"].labels == {"model": name, "version": "2"}


@pytest.mark.gpu
def test_gpu_families_come_from_nvml():
    """On a GPU host: utilization, memory, power and energy per GPU, labelled with its UUID."""
    if not nvml_present():
        pytest.skip("no NVML (libnvidia-ml.so.1) on this host: nv_gpu_* are left out, checked above")
    gauges = GpuGauges()
    try:
        assert gauges.available, gauges.reason
        fams = {f.name: f for f in parser.text_string_to_metric_families(render([], gauges))}
        for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"):
            assert fams[name].samples, name
            assert all(s.labels["gpu_uuid"].startswith(("GPU-", "MIG-")) for s in fams[name].samples)
        total = fams["nv_gpu_memory_total_bytes"].samples[0].value
        used = fams["nv_gpu_memory_used_bytes"].samples[0].value
        assert total > 1 << 30 and 0 <= used <= total
        assert all(0.0 <= s.value <= 1.0 for s in fams["nv_gpu_utilization"].samples)
        if "nv_energy_consumption" in fams:
            assert all(s.value >= 0 for s in fams["nv_energy_consumption"].samples)
    finally:
        gauges.close()
