"""A replica's service-level figures from its own /metrics: requests, errors and p99 over a window (issue 49).

Why the replicas' own metrics and not the balancer's: every ngcx replica serves ngcx-runtime's Prometheus text
(runtime/metrics.py, Triton's names) with the same key as its inferences, on every target alike, while the
balancers' own figures differ per cloud (CloudWatch, ALB access logs, haproxy's stats) and the local one has
none a canary could split by version. What a window reads is the change between two scrapes of each replica:
- requests = the delta of nv_inference_request_success + nv_inference_request_failure (a ProtocolError,
  i.e. a 4xx or a 500 from the engine, counts as a failure: runtime/routes.py `counted`);
- errors = the delta of nv_inference_request_failure;
- p99 = Prometheus' histogram_quantile(0.99) over the delta of nv_inference_request_duration_histogram_us
  (successful requests only, buckets 100 us .. 60 s: batching.REQUEST_BUCKETS_US), summed over replicas.
A replica restarted inside the window (its counters went down) counts from zero again, as Prometheus' rate().

Why prometheus_client's parser when it is installed (the dashboard extra ships it): it reads escaped label
values, NaN and exponents the way Prometheus does. ngcx without the dashboard extra has no prometheus_client,
so a small parser of the lines runtime/metrics.py writes (NAME{LABELS} VALUE) reads them instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
HISTOGRAM = "nv_inference_request_duration_histogram_us"
_LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$')
_LE = re.compile(r'le="([^"]*)"')


@dataclass(frozen=True)
class Scrape:
    """One replica's cumulative counters at one moment: successes, failures, histogram {le_us: cumulative}."""

    success: float = 0.0
    failure: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Figures:
    """What a group of replicas did over a window: requests, errors, and successful requests' p99 (ms)."""

    requests: int = 0
    errors: int = 0
    p99_ms: float | None = None
    tail: tuple[tuple[float, float], ...] = ()     # the p99's histogram: cumulative (le ms, successes), +Inf last

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def slower_than(self, ms: float) -> tuple[int, int]:
        """(successful requests slower than `ms`, all of them) from the histogram, linear inside the bucket `ms`
        falls in (as quantile() reads it); (0, 0) without one."""
        if not self.tail or self.tail[-1][1] <= 0:
            return 0, 0
        total, below = self.tail[-1][1], 0.0
        lower_le, lower_count = 0.0, 0.0
        for le, count in self.tail:
            if ms < le:
                below = lower_count if math.isinf(le) else \
                    lower_count + (count - lower_count) * (ms - lower_le) / (le - lower_le)
                break
            lower_le, lower_count = le, count
        else:
            below = total
        return round(total - below), round(total)

    def as_json(self) -> dict[str, float | int | None]:
        return {"requests": self.requests, "errors": self.errors, "error_rate": round(self.error_rate, 5),
                "p99_ms": None if self.p99_ms is None else round(self.p99_ms, 2)}


def parse(text: str) -> Scrape:
    """The three families a window needs, summed over models and versions."""
    samples = list(_samples(text))
    total = {SUCCESS: 0.0, FAILURE: 0.0}
    buckets: dict[float, float] = {}
    for name, labels, value in samples:
        if not math.isfinite(value):
            continue
        if name in total:
            total[name] += value
        elif name == f"{HISTOGRAM}_bucket" and "le" in labels:
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    return Scrape(total[SUCCESS], total[FAILURE], buckets)


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        yield from _small_parser(text)
        return
    for family in text_string_to_metric_families(text):
        for s in family.samples:      # a counter's samples come named NAME_total from this parser
            name = family.name if family.type == "counter" and s.name == f"{family.name}_total" else s.name
            yield name, dict(s.labels), float(s.value)


def _small_parser(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """NAME{LABELS} VALUE lines; only the `le` label is read (the one a window needs), comments skipped."""
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if line.startswith("#") or match is None:
            continue
        name, labels, value = match.groups()
        le = _LE.search(labels or "")
        try:
            yield name, ({"le": le.group(1)} if le else {}), float(value)
        except ValueError:
            continue


def delta(before: Scrape, after: Scrape) -> Scrape:
    """after - before; a counter that went down (the replica restarted) counts from zero (Prometheus' reset)."""
    if after.success < before.success or after.failure < before.failure:
        return after
    return Scrape(after.success - before.success, after.failure - before.failure,
                  {le: n - before.buckets.get(le, 0.0) for le, n in after.buckets.items()})


def figures(deltas: Iterable[Scrape]) -> Figures:
    """Several replicas' window deltas as one group's figures."""
    success = failure = 0.0
    buckets: dict[float, float] = {}
    for d in deltas:
        success, failure = success + d.success, failure + d.failure
        for le, n in d.buckets.items():
            buckets[le] = buckets.get(le, 0.0) + n
    ordered = sorted(buckets.items())
    p99 = quantile(0.99, ordered)
    return Figures(int(success + failure), int(failure), None if p99 is None else p99 / 1000.0,
                   tuple((le / 1000.0, n) for le, n in ordered))


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets, +Inf last: linear inside the bucket
    the rank falls in; a rank in +Inf gives the highest finite le. None when the buckets count nothing."""
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
