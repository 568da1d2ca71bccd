"""Prometheus metrics with Triton's names and labels: /metrics on the serving port and on --metrics-port.

Why Triton's names (nv_inference_*, nv_gpu_*, nv_energy_consumption; labels model="..." and
version="..." or gpu_uuid="..."): dashboards and alerts written for Triton work against
ngcx-runtime unchanged, and batching efficiency reads as nv_inference_count / nv_inference_exec_count
(inferences per engine call). One family is ours, not Triton's:
nv_inference_request_duration_histogram_us, successful requests' durations in fixed buckets
(batching.REQUEST_BUCKETS_US, 100 us .. 60 s), because the cumulative duration counter gives only a
mean and a dashboard wants p50/p99 (histogram_quantile over the bucket deltas between two scrapes).
The instance families are ours too: nv_inference_instance_* with a device label (device="cuda:1"),
the engine calls, inferences and engine time of a model's instances on each device, and the batches
in flight there, so a user of a multi-GPU host sees every GPU working (issue 50: serve places its
instances on every visible GPU; Triton has no per-instance metric to follow).

Why the text format is written here: the runtime ships in images whose only Python dependency is
numpy; prometheus_client is used by the tests alone, to parse what this module writes.

The metrics port asks the server's access policy first (server.py passes the check: the bearer
key, as /metrics of the serving port needs), for an unknown path too, and speaks TLS with the
serving port's certificate when one is configured.

Cost: the counters are the batcher's Stats (batching.py): one uncontended lock per request and per
batch on the hot path; the histogram adds a bisect on a 19-tuple and one list increment inside the
request's lock, no lock of its own. A scrape snapshots them under that lock for a few microseconds;
NVML is read only when scraped, and a host without NVML simply has no nv_gpu_* families.

Semantics (Triton's): durations are cumulative microseconds; request duration counts successful
requests from the start of reading the body to the answer being ready; queue, compute input
(merge), compute infer (engine) and compute output (split) durations are each successful
request's share of the batch it ran in, so a batch of 8 adds its engine time 8 times. The
histogram observes the same request durations: its _count is nv_inference_request_success and its
_sum nv_inference_request_duration_us, read in the same snapshot.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .batching import REQUEST_BUCKETS_US
from .protocol import ProtocolError
from .tls import TlsServerMixin

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# metric, type, help, Stats key, divisor (ns -> us)
INFERENCE: tuple[tuple[str, str, str, str, int], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     "success", 1),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
     "failed", 1),
    ("nv_inference_count", "counter", "Number of inferences performed (a request of batch N counts N)",
     "inferences", 1),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (merged requests run as one)",
     "engine_calls", 1),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
     "request_ns", 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
     "queue_ns", 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds", "compute_input_ns", 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds", "compute_infer_ns", 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds", "compute_output_ns", 1000),
)
HISTOGRAM = ("nv_inference_request_duration_histogram_us", "histogram",
             "Duration of successful inference requests in microseconds (ngcx-runtime; not in Triton)")
_LE: tuple[str, ...] = (*(str(us) for us in REQUEST_BUCKETS_US), "+Inf")
PENDING = ("nv_inference_pending_request_count", "gauge",
           "Instantaneous number of pending requests awaiting execution per-model")
# metric, type, help, key of the device's row in Stats.snapshot()["devices"], divisor (ns -> us)
INSTANCE: tuple[tuple[str, str, str, str, int], ...] = (
    ("nv_inference_instance_exec_count", "counter",
     "Model executions run by the model's instances on this device (ngcx-runtime; not in Triton)", "engine_calls", 1),
    ("nv_inference_instance_count", "counter",
     "Inferences run by the model's instances on this device (ngcx-runtime; not in Triton)", "inferences", 1),
    ("nv_inference_instance_compute_duration_us", "counter",
     "Cumulative engine-call duration of the model's instances on this device in microseconds (ngcx-runtime; not "
     "in Triton)", "compute_ns", 1000),
)
IN_FLIGHT = ("nv_inference_instance_batches_in_flight", "gauge",
             "Batches launched and not yet answered by the model's instances on this device (ngcx-runtime; not in "
             "Triton)")
GPU: tuple[tuple[str, str, str], ...] = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the server started"),
)


@dataclass(frozen=True)
class ModelSample:
    """One served model version at scrape time: its Stats snapshot and queued requests."""

    name: str
    version: str
    stats: dict[str, Any]
    pending: int
    busy: dict[str, int] = field(default_factory=dict)   # device -> batches in flight (Batcher.busy)


def escape(value: str) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**pairs: str) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(models: Iterable[ModelSample], gpus: GpuGauges | None = None) -> str:
    """The whole exposition: every inference family for every model version, then the GPU families."""
    models = list(models)
    lines: list[str] = []
    for metric, kind, text, key, divisor in INFERENCE:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        for m in models:
            lines.append(f"{metric}{_labels(model=m.name, version=m.version)} {int(m.stats.get(key, 0)) // divisor}")
    metric, kind, text = HISTOGRAM
    lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
    for m in models:
        lines += _histogram(metric, m)
    metric, kind, text = PENDING
    lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
    lines += [f"{metric}{_labels(model=m.name, version=m.version)} {m.pending}" for m in models]
    lines += _instances(models)
    samples = gpus.samples() if gpus is not None else []
    for metric, kind, text in GPU:
        rows = [(s["gpu_uuid"], s[metric]) for s in samples if s.get(metric) is not None]
        if rows:
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            lines += [f"{metric}{_labels(gpu_uuid=uuid)} {_number(v)}" for uuid, v in rows]
    return "\n".join(lines) + "\n"


def _instances(models: list[ModelSample]) -> list[str]:
    """The per-device families: one sample per model version and device its instances ran on."""
    lines: list[str] = []
    for metric, kind, text, key, divisor in INSTANCE:
        lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        for m in models:
            for device, row in sorted((m.stats.get("devices") or {}).items()):
                labels = _labels(model=m.name, version=m.version, device=device)
                lines.append(f"{metric}{labels} {int(row.get(key, 0)) // divisor}")
    metric, kind, text = IN_FLIGHT
    lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
    for m in models:
        for device, n in sorted(m.busy.items()):
            lines.append(f"{metric}{_labels(model=m.name, version=m.version, device=device)} {int(n)}")
    return lines


def _histogram(metric: str, m: ModelSample) -> list[str]:
    """One model version's _bucket lines (cumulative, le in microseconds), _sum and _count."""
    counts = m.stats.get("request_buckets") or [0] * len(_LE)
    name, version = escape(m.name), escape(m.version)
    lines, total = [], 0
    for le, n in zip(_LE, counts, strict=True):
        total += int(n)
        lines.append(f'{metric}_bucket{{model="{name}",version="{version}",le="{le}"}} {total}')
    labels = _labels(model=m.name, version=m.version)
    lines.append(f"{metric}_sum{labels} {int(m.stats.get('request_ns', 0)) // 1000}")
    lines.append(f"{metric}_count{labels} {total}")
    return lines


class GpuGauges:
    """NVML readings per GPU for the nv_gpu_* families; empty where NVML is absent.

    Energy is reported since this object was made (Triton: since the server started): NVML's
    counter runs since the driver loaded. A reading a GPU does not support is left out, not zero.
    """

    def __init__(self, nvml_factory: Callable[[], Any] | None = None) -> None:
        self.reason: str | None = None
        self._nvml: Any = None
        self._lock = threading.Lock()
        self._uuids: list[str] = []
        self._energy0: dict[int, int] = {}
        try:
            if nvml_factory is None:
                from .probe import Nvml

                nvml_factory = Nvml
            nvml = nvml_factory()
            self._uuids = [nvml.uuid(i) for i in range(nvml.count())]
        except (OSError, AttributeError) as exc:
            self.reason = f"NVML unavailable ({exc})"
            return
        self._nvml = nvml
        for i in range(len(self._uuids)):
            with contextlib.suppress(OSError, AttributeError):
                self._energy0[i] = nvml.energy_mj(i)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def samples(self) -> list[dict[str, Any]]:
        """One dict per GPU: gpu_uuid and each metric name -> value (None when unsupported)."""
        if self._nvml is None:
            return []
        out = []
        with self._lock:
            for i, uuid in enumerate(self._uuids):
                out.append({"gpu_uuid": uuid, **self._read(i)})
        return out

    def _read(self, i: int) -> dict[str, Any]:
        nvml = self._nvml
        row: dict[str, Any] = dict.fromkeys(name for name, _, _ in GPU)
        with contextlib.suppress(OSError, AttributeError):
            row["nv_gpu_utilization"] = nvml.utilization(i)
        with contextlib.suppress(OSError, AttributeError):
            row["nv_gpu_memory_used_bytes"], row["nv_gpu_memory_total_bytes"] = nvml.memory(i)
        with contextlib.suppress(OSError, AttributeError):
            row["nv_gpu_power_usage"] = nvml.power_mw(i) / 1000.0
        if i in self._energy0:
            with contextlib.suppress(OSError, AttributeError):
                row["nv_energy_consumption"] = (nvml.energy_mj(i) - self._energy0[i]) / 1000.0
        return row

    def close(self) -> None:
        with self._lock:
            if self._nvml is not None:
                with contextlib.suppress(OSError, AttributeError):
                    self._nvml.close()
                self._nvml = None


# -- the separate metrics port (Triton's 8002) --

class _MetricsServer(TlsServerMixin, ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    render: Callable[[], str]
    check: Callable[[str, Any, bool], None] | None


class _MetricsHandler(BaseHTTPRequestHandler):
    """GET/HEAD /metrics; anything else a JSON error. One request per connection: a scraper
    reconnects cheaply, and no keep-alive framing has to be right on this port."""

    protocol_version = "HTTP/1.1"
    timeout = 30.0
    server: _MetricsServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_POST(self) -> None:
        if self._allowed(known=False):
            self._send(405, "application/json", json.dumps({"error": "only GET /metrics is served here"}).encode())

    do_PUT = do_DELETE = do_PATCH = do_POST

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = self.protocol_version   # garbage request line: still send a status line
        with contextlib.suppress(OSError):
            self._send(code, "application/json", json.dumps({"error": message or "bad request"}).encode())

    def _allowed(self, known: bool, send_body: bool = True) -> bool:
        """Ask check(peer, headers, known) first, for any path (an unknown one too: no probing
        without a key); False once its refusal has been answered."""
        if self.server.check is None:
            return True
        try:
            self.server.check(self.client_address[0], self.headers, known)
        except ProtocolError as exc:
            self._send(exc.status, "application/json", json.dumps({"error": exc.message}).encode(), send_body,
                       exc.headers)
            return False
        return True

    def _answer(self, send_body: bool) -> None:
        known = urlsplit(self.path).path.rstrip("/") == "/metrics"
        if not self._allowed(known, send_body):
            return
        if not known:
            self._send(404, "application/json", json.dumps({"error": "unknown path; metrics are at /metrics"})
                       .encode(), send_body)
            return
        self._send(200, CONTENT_TYPE, self.server.render().encode(), send_body)

    def _send(self, status: int, ctype: str, body: bytes, send_body: bool = True,
              headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        if send_body:
            self.wfile.write(body)


class MetricsServer:
    """The exposition on its own port, for scrapers kept apart from inference traffic."""

    def __init__(self, host: str, port: int, render_fn: Callable[[], str],
                 check: Callable[[str, Any, bool], None] | None = None, tls: Any = None):
        """check(peer, headers, known): asked before every answer, known=False for a path or method
        other than GET /metrics (server.py asks access.Policy about a statistics call, or one no
        route answers); a ProtocolError it raises is the answer instead. tls: an ssl.SSLContext
        (tls.py) to serve HTTPS with."""
        self._server = _MetricsServer((host, port), _MetricsHandler)
        self._server.render = render_fn
        self._server.check = check
        self._server.tls = tls
        self.host, self.port = self._server.server_address[:2]
        self.scheme = "https" if tls is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="ngcx-metrics", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)
