"""Live charts of a deployment: one bounded scraper per served endpoint, reading ngcx-runtime's /metrics.

Why threads: the scrape goes through project/client.py's Client, blocking http.client with the
deployment's key and its pinned TLS certificate (core/tls.py), the one code path that may carry a
key. One daemon thread per endpoint runs fetch, parse, sleep the rest of the interval: a scraper
never has two fetches in flight, so an endpoint that hangs costs one thread blocked for at most the
socket timeout (per connect or read), delays only its own chart, and never piles up requests.
Threads are capped (MAX_SCRAPERS); an endpoint beyond the cap is reported, not watched.

Why prometheus_client's parser: the exposition is Prometheus text (runtime/metrics.py writes it by
hand, Triton's names); a real parser reads escaped label values, NaN and exponents the way Prometheus
does, where a regex would misread them. It is imported only when a scrape is parsed, so importing
this module costs nothing.

What a chart point is (point()): the change between two scrapes, as rates and means over that
interval: requests/s, errors/s, p50/p99 from the histogram's bucket deltas
(nv_inference_request_duration_histogram_us, interpolated as Prometheus' histogram_quantile does),
mean and queue latency, inferences per execution (batching), and the GPU gauges of the latest scrape.
"""

from __future__ import annotations

import http.client
import math
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

MAX_SCRAPERS = 256
HISTOGRAM = "nv_inference_request_duration_histogram_us"
# parse() key -> family summed over models and versions (counters, then the pending gauge)
COUNTERS: dict[str, str] = {
    "success": "nv_inference_request_success",
    "failure": "nv_inference_request_failure",
    "inferences": "nv_inference_count",
    "executions": "nv_inference_exec_count",
    "request_us": "nv_inference_request_duration_us",
    "queue_us": "nv_inference_queue_duration_us",
}
PENDING = "nv_inference_pending_request_count"

Fetch = Callable[["Target", float], tuple[int, bytes]]


@dataclass(frozen=True)
class Target:
    """One endpoint to watch: id (the dashboard's key for it, e.g. the deployment id), its base URL
    (http(s)://HOST:PORT), the bearer key and the pinned certificate's SHA-256 fingerprint (Client's pin)."""

    id: int | str
    endpoint: str
    key: str | None = None
    pin: str | None = None


class MetricsError(ValueError):
    """The text is not ngcx-runtime's metrics (not Prometheus text, or no nv_inference_* families)."""


def parse(text: str) -> dict[str, Any]:
    """Cumulative totals of one scrape, summed over models, versions and GPUs.

    Keys: success, failure, inferences, executions, request_us, queue_us, pending (numbers);
    buckets: [(le_us, cumulative count)] ascending, +Inf last (empty when the runtime has no
    histogram); gpu_util (mean over GPUs, 0..1), gpu_mem_used, gpu_mem_total (bytes), gpu_power
    (watts, summed): None where no GPU family is exposed. MetricsError (one line) otherwise."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MetricsError(f"not Prometheus text ({first[:120]})") from None
    by_name: dict[str, list[Any]] = {}          # samples by family (untyped lines come one family each)
    for family in families:
        by_name.setdefault(family.name, []).extend(family.samples)
    if not any(name.startswith("nv_inference_") for name in by_name):
        raise MetricsError("no nv_inference_* families: is this ngcx-runtime's /metrics?")

    def total(name: str) -> float:
        return sum(_finite(s.value) for s in by_name.get(name, ()) if not s.name.endswith("_created"))

    def gauges(name: str) -> list[float] | None:
        return [s.value for s in by_name.get(name, ()) if math.isfinite(s.value)] or None

    out: dict[str, Any] = {key: total(name) for key, name in COUNTERS.items()}
    out["pending"] = total(PENDING)
    per_le: dict[float, float] = {}
    for s in by_name.get(HISTOGRAM, ()):
        if s.name == f"{HISTOGRAM}_bucket" and "le" in s.labels:
            try:
                le = float(s.labels["le"])
            except ValueError:
                raise MetricsError(f"{HISTOGRAM} has a bucket le={s.labels['le']!r}") from None
            per_le[le] = per_le.get(le, 0) + _finite(s.value)
    out["buckets"] = sorted(per_le.items())
    util = gauges("nv_gpu_utilization")
    out["gpu_util"] = sum(util) / len(util) if util else None
    for key, name in (("gpu_mem_used", "nv_gpu_memory_used_bytes"), ("gpu_mem_total", "nv_gpu_memory_total_bytes"),
                      ("gpu_power", "nv_gpu_power_usage")):
        values = gauges(name)
        out[key] = sum(values) if values else None
    return out


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets, +Inf last: linear inside the
    bucket the rank falls in (from 0 for the first); a rank in +Inf gives the highest finite le. None
    when the buckets count nothing."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


_ZERO: dict[str, Any] = {**dict.fromkeys(COUNTERS, 0), "buckets": []}


def point(prev: dict[str, Any], cur: dict[str, Any], dt: float, t: float) -> dict[str, Any]:
    """The chart point for the interval between two parse() results dt seconds apart, stamped t (unix s).

    rps, errors: successes / failures per second; p50_ms, p99_ms: from the histogram's bucket deltas
    (None when no request finished in the interval, or there is no histogram); mean_ms, queue_ms: per
    successful request; batch: inferences per execution (None without one); pending, gpu_util (%),
    gpu_mem_gb, gpu_mem_total_gb (GiB), gpu_power_w: the latest scrape's gauges. A counter that went
    down means the server restarted: the point then counts cur alone."""
    restarted = any(cur[k] < prev.get(k, 0) for k in COUNTERS) or _bucket_reset(prev.get("buckets", []),
                                                                                 cur["buckets"])
    base = _ZERO if restarted else prev
    d = {k: cur[k] - base.get(k, 0) for k in COUNTERS}
    before = dict(base.get("buckets", []))
    delta = [(le, n - before.get(le, 0)) for le, n in cur["buckets"]]
    p50, p99 = quantile(0.5, delta), quantile(0.99, delta)
    ok = d["success"]
    gib = 1 << 30
    return {
        "t": t, "rps": ok / dt if dt > 0 else None, "errors": d["failure"] / dt if dt > 0 else None,
        "p50_ms": p50 / 1000 if p50 is not None else None, "p99_ms": p99 / 1000 if p99 is not None else None,
        "mean_ms": d["request_us"] / ok / 1000 if ok > 0 else None,
        "queue_ms": d["queue_us"] / ok / 1000 if ok > 0 else None,
        "batch": d["inferences"] / d["executions"] if d["executions"] > 0 else None,
        "pending": cur["pending"],
        "gpu_util": cur["gpu_util"] * 100 if cur.get("gpu_util") is not None else None,
        "gpu_mem_gb": cur["gpu_mem_used"] / gib if cur.get("gpu_mem_used") is not None else None,
        "gpu_mem_total_gb": cur["gpu_mem_total"] / gib if cur.get("gpu_mem_total") is not None else None,
        "gpu_power_w": cur.get("gpu_power"),
    }


def _bucket_reset(prev: list[tuple[float, float]], cur: list[tuple[float, float]]) -> bool:
    """Another bucket layout, or any bucket that went down: a restarted (or upgraded) server."""
    if not prev:
        return False
    before = dict(prev)
    return [le for le, _ in prev] != [le for le, _ in cur] or any(n < before[le] for le, n in cur)


def client_fetch(target: Target, timeout: float) -> tuple[int, bytes]:
    """GET /metrics through project/client.py's Client (the key, only to the pinned certificate)."""
    from ..project.client import Client

    client = Client(target.endpoint, timeout=timeout, key=target.key, pin=target.pin)
    try:
        return client.get("/metrics")
    finally:
        client.close()


def explain(exc: BaseException, timeout: float) -> str:
    """One line a user acts on, for a fetch that raised."""
    if isinstance(exc, TimeoutError):
        return f"did not answer within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "refused the connection: is the server running, on this port?"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError):
        return "closed the connection without an answer"
    if isinstance(exc, http.client.HTTPException):
        return f"did not answer HTTP ({type(exc).__name__})"
    if isinstance(exc, OSError):
        return f"cannot connect: {exc.strerror or exc}"
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def explain_status(status: int) -> str:
    if status in (401, 403):
        return f"HTTP {status}: the key was refused"
    if status == 404:
        return "HTTP 404: no /metrics here (is this an ngcx-runtime endpoint?)"
    return f"HTTP {status}"


class _Scraper:
    """One endpoint's loop and its readings; every field is read and written under the Scrapers' lock."""

    def __init__(self, target: Target, owner: Scrapers) -> None:
        self.target = target
        self.owner = owner
        self.stop = threading.Event()
        self.points: deque[dict[str, Any]] = deque(maxlen=owner.keep)
        self.health: dict[str, Any] = {"state": "unknown", "reason": "not scraped yet", "checked": 0.0}
        self.prev: tuple[float, dict[str, Any]] | None = None      # (monotonic s, parse()) of the last success
        self.thread = threading.Thread(target=self.run, name=f"ngcx-scrape-{target.id}", daemon=True)

    def run(self) -> None:
        interval = self.owner.interval
        while not self.stop.is_set():
            started = time.monotonic()
            self.once()
            self.stop.wait(max(0.0, interval - (time.monotonic() - started)))

    def once(self) -> None:
        timeout = self.owner.timeout
        parsed: dict[str, Any] | None = None
        reason = ""
        try:
            status, body = self.owner.fetch(self.target, timeout)
        except Exception as exc:   # noqa: BLE001 - any failure of one endpoint is its health, never the thread's end
            reason = explain(exc, timeout)
        else:
            if status != 200:
                reason = explain_status(status)
            else:
                try:
                    parsed = parse(body.decode("utf-8", "replace"))
                except MetricsError as exc:
                    reason = f"metrics do not parse: {exc}"
        now, wall = time.monotonic(), time.time()
        with self.owner.lock:
            if self.stop.is_set():
                return                       # replaced or closed while fetching: its readings are no one's
            if parsed is None:
                self.health = {"state": "unhealthy", "reason": reason, "checked": wall}
                self.prev = None             # the next point spans consecutive good scrapes only
                return
            self.health = {"state": "healthy", "reason": "", "checked": wall}
            if self.prev is not None:
                self.points.append(point(self.prev[1], parsed, now - self.prev[0], wall))
            self.prev = (now, parsed)


class Scrapers:
    """The scrapers of the endpoints the dashboard shows, one daemon thread each, at most MAX_SCRAPERS.

    fetch(target, timeout) -> (HTTP status, body): client_fetch by default (a fresh Client per scrape,
    closed after it); tests pass their own. Thread-safe: one lock guards every scraper's readings."""

    def __init__(self, interval: float = 1.0, timeout: float = 2.0, keep: int = 300,
                 fetch: Fetch | None = None) -> None:
        self.interval, self.timeout, self.keep = interval, timeout, keep
        self.fetch: Fetch = fetch or client_fetch
        self.lock = threading.Lock()
        self._scrapers: dict[int | str, _Scraper] = {}
        self._overflow: set[int | str] = set()
        self._closed = False

    def sync(self, targets: Iterable[Target]) -> None:
        """Watch exactly these targets: start a scraper for a new id (or one whose endpoint, key or pin
        changed), stop those of ids not given. Returns at once: a stopped scraper's thread ends after its
        current fetch (bounded by the timeout)."""
        wanted: dict[int | str, Target] = {t.id: t for t in targets}
        started: list[_Scraper] = []
        with self.lock:
            if self._closed:
                return
            for id_, scraper in list(self._scrapers.items()):
                if wanted.get(id_) != scraper.target:
                    scraper.stop.set()
                    del self._scrapers[id_]
            self._overflow = set()
            for id_, target in wanted.items():
                if id_ in self._scrapers:
                    continue
                if len(self._scrapers) >= MAX_SCRAPERS:
                    self._overflow.add(id_)
                    continue
                scraper = self._scrapers[id_] = _Scraper(target, self)
                started.append(scraper)
        for scraper in started:
            scraper.thread.start()

    def health(self, id: int | str) -> dict[str, Any]:  # noqa: A002 - the Target's field name
        """{state: healthy | unhealthy | unknown, reason: one line ('' when healthy), checked: unix s, 0 never}."""
        with self.lock:
            scraper = self._scrapers.get(id)
            if scraper is not None:
                return dict(scraper.health)
            reason = "too many endpoints to watch" if id in self._overflow else "not watched"
            return {"state": "unknown", "reason": reason, "checked": 0.0}

    def states(self) -> tuple[tuple[int | str, str], ...]:
        """Every watched endpoint's health state: the dashboard's pages change when one of these turns."""
        with self.lock:
            return tuple(sorted(((i, s.health["state"]) for i, s in self._scrapers.items()), key=str))

    def points(self, id: int | str, since: float = 0) -> list[dict[str, Any]]:  # noqa: A002
        """The kept chart points (oldest first) stamped after `since` (unix s)."""
        with self.lock:
            scraper = self._scrapers.get(id)
            return [dict(p) for p in scraper.points if p["t"] > since] if scraper is not None else []

    def close(self, wait: float | None = None) -> None:
        """Stop every scraper and join their threads, all within `wait` seconds (default timeout + 1)."""
        with self.lock:
            self._closed = True
            scrapers = list(self._scrapers.values())
            self._scrapers.clear()
            self._overflow.clear()
            for scraper in scrapers:
                scraper.stop.set()
        deadline = time.monotonic() + (self.timeout + 1.0 if wait is None else wait)
        for scraper in scrapers:
            if scraper.thread.is_alive():
                scraper.thread.join(max(0.0, deadline - time.monotonic()))
