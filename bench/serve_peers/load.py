"""Closed-loop clients against one server: CLIENTS connections, each sending the same request back to back.

Why processes of threads: the clients must not share the server's interpreter, and on 2 cores one process of
32 threads is itself a bottleneck past a few thousand requests/s; PROCS forked processes split the clients.
Every client keeps one HTTP/1.1 connection alive (http.client), as a real client would. Counted: answers 200
(the latency of each), and everything else as an error with its first line.
"""

from __future__ import annotations

import http.client
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass

PROCS = 2


@dataclass
class Result:
    requests: int
    seconds: float
    latencies_ms: list[float]
    errors: list[str]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float | None:
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _client(port: int, body: bytes, headers: dict[str, str], start: float, warm: float, end: float,
            out: list, errors: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while time.monotonic() < end:
        sent = time.monotonic()
        try:
            conn.request("POST", "/v2/models/model/infer", body, headers)
            reply = conn.getresponse()
            data = reply.read()
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        if sent >= warm:
            if reply.status == 200:
                out.append((time.monotonic() - sent) * 1000.0)
            else:
                errors.append(f"HTTP {reply.status}: {data[:120]!r}")
    conn.close()


def _proc(port: int, body: bytes, headers: dict[str, str], clients: int, start: float, warm: float, end: float,
          queue: mp.Queue) -> None:
    out: list[float] = []
    errors: list[str] = []
    threads = [threading.Thread(target=_client, args=(port, body, headers, start, warm, end, out, errors))
               for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((out, errors[:20]))


def run(port: int, body: bytes, headers: dict[str, str], clients: int, seconds: float, warm: float = 1.0) -> Result:
    """`clients` connections for warm + seconds; what is answered after the warm-up counts."""
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    start = time.monotonic()
    warm_until, end = start + warm, start + warm + seconds
    split = [clients // PROCS + (1 if i < clients % PROCS else 0) for i in range(min(PROCS, clients))]
    procs = [ctx.Process(target=_proc, args=(port, body, headers, n, start, warm_until, end, queue)) for n in split]
    for p in procs:
        p.start()
    latencies, errors = [], []
    for _ in procs:
        got, errs = queue.get(timeout=seconds + warm + 120)
        latencies += got
        errors += errs
    for p in procs:
        p.join(30)
    return Result(len(latencies), seconds, latencies, errors)
