"""Dynamic batching: merge concurrent requests along dim 0, run the engine once, split results.

Why: one small request cannot fill a GPU; merging what arrives within a short window raises
throughput at a bounded latency cost (the seeds' MPS + batching lesson, Triton's dynamic
batcher). One worker thread owns each engine, so an engine's infer() is never called
concurrently (the Engine contract), while HTTP threads keep parsing the next requests. A model
with N instances (--instances-per-gpu on every GPU, Triton's instance groups) has N engines and N
workers behind ONE queue: batches are formed one at a time, each by the least busy instance that is
free to take one (fewest batches launched and not yet answered; the lowest index on a tie), so a
host's GPUs fill evenly instead of the first GPU's pipelined instance taking every batch while the
others idle (issue 50). A pipelined instance (infer_async) keeps its two batches in flight as before.

Rules: requests merge only when every input has the same dtype and the same non-batch dims
(the batch key); a batch never exceeds max_batch; the oldest request waits at most
max_queue_delay_ms for company, unless the requests at hand add up to one of the preferred batch
sizes (Triton's preferred_batch_size): then the largest such batch runs at once, or unless it is
alone: after LONE_STREAK batches in a row that were one request with nothing else of the model in
flight (Stats.in_flight: received and not yet answered), a request that again finds nothing else
in flight runs at once. Why: a single client's request waits the whole window for company that
cannot come (issue 24: 1 ms of a 2 ms round trip at 1 client; bench serve-peers). Under load some
other request is always in flight, so the streak never builds and the window applies as before;
the first request after a lull pays the window, as it did, until the streak builds again. Requests larger
than max_batch are refused before they get here. Inputs are merged on dim 0; each output is split
on its own batch axis (layout.py measured it at load: an LSTM's [time, batch, C] output splits on
dim 1). If a merged batch's outputs still do not split (a layout the probe could not see, such as
[batch * time, C]), its requests are run again one by one and merging stops for this model: the
clients get their answers, never a 500.

Counters (Stats) follow Triton's statistics: per request, the queue time and the input / infer /
output times of the batch it ran in; per engine call, the batch size; per successful request, its
duration in a fixed histogram (REQUEST_BUCKETS_US, for p50/p99 from scrapes: a bisect on a 19-tuple
inside the lock already taken). The hot path takes one uncontended lock per request and one per batch.
"""

from __future__ import annotations

import _thread
import queue
import threading
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .engine import Engine
from .errors import InvalidInput

# Upper bounds (le) of the request-duration histogram, microseconds: 100 us .. 60 s, 1-2-5 steps
# (then 30 s, 60 s), so a quantile read from the buckets is within one step (x2.5 at most) of the true one.
REQUEST_BUCKETS_US: tuple[int, ...] = (
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000, 60_000_000)
_REQUEST_BUCKETS_NS: tuple[int, ...] = tuple(us * 1000 for us in REQUEST_BUCKETS_US)
# Lone batches in a row before a lone request stops waiting for company (module docstring). Eight, not
# one: a fresh server's first requests, and a burst after one warm-up request, still merge.
LONE_STREAK = 8


def _empty_buckets() -> list[int]:
    return [0] * (len(REQUEST_BUCKETS_US) + 1)


@dataclass
class Stats:
    """Counters the server exposes (/v2/models/NAME/stats) and the tests assert on.

    Kept per server (no module-level state); guarded by one lock because HTTP threads and the
    batch worker both update it.
    """

    requests: int = 0               # inference requests received (any outcome)
    success: int = 0
    failed: int = 0
    engine_calls: int = 0
    batched_requests: int = 0       # requests that shared an engine call with at least one other
    inferences: int = 0             # samples (sum of batch sizes) run by the engine
    batch_sizes: Counter = field(default_factory=Counter)     # merged batch size -> engine calls
    requests_per_call: Counter = field(default_factory=Counter)
    queue_ns: int = 0
    compute_ns: int = 0
    last_inference_ms: int = 0
    request_ns: int = 0             # successful requests: body read to response ready, summed
    compute_input_ns: int = 0       # per successful request, its batch's merge time (summed)
    compute_infer_ns: int = 0       # ... its batch's engine time
    compute_output_ns: int = 0      # ... its batch's output check and split time
    # successful requests per duration bucket, NOT cumulative: index i counts durations in
    # (REQUEST_BUCKETS_US[i-1], REQUEST_BUCKETS_US[i]]; the last one those above 60 s (+Inf)
    request_buckets: list[int] = field(default_factory=_empty_buckets)
    in_flight: int = 0              # requests received and not yet answered (the batcher's "is company coming?")
    # per device of the model's instances ("cuda:1", "cpu"): [engine calls, inferences, engine-call ns], for
    # /metrics' device label (a user sees every GPU working)
    devices: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_request(self) -> None:
        with self.lock:
            self.requests += 1
            self.in_flight += 1

    def count_success(self, ns: int) -> None:
        """An answer is ready to send (counted before sending, so a client that got it sees it counted)."""
        with self.lock:
            self.in_flight -= 1
            self.success += 1
            self.request_ns += ns
            self.request_buckets[bisect_left(_REQUEST_BUCKETS_NS, ns)] += 1

    def count_failure(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.failed += 1

    def count_abandoned(self) -> None:
        """A request that ended as neither (a 500, a dropped connection): no longer in flight."""
        with self.lock:
            self.in_flight -= 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests, "success": self.success, "failed": self.failed,
                "engine_calls": self.engine_calls, "batched_requests": self.batched_requests,
                "inferences": self.inferences, "batch_sizes": dict(self.batch_sizes),
                "requests_per_call": dict(self.requests_per_call), "queue_ns": self.queue_ns,
                "compute_ns": self.compute_ns, "last_inference_ms": self.last_inference_ms,
                "request_ns": self.request_ns, "compute_input_ns": self.compute_input_ns,
                "compute_infer_ns": self.compute_infer_ns, "compute_output_ns": self.compute_output_ns,
                "request_buckets": list(self.request_buckets),
                "devices": {d: {"engine_calls": c[0], "inferences": c[1], "compute_ns": c[2]}
                            for d, c in self.devices.items()},
            }


class EngineFailure(Exception):
    """engine.infer() raised or returned something unusable; the server answers 500."""


class ShuttingDown(EngineFailure):
    """The batcher has stopped (server draining); the server answers 503."""


class BadRequest(EngineFailure):
    """The engine (a handler) refused this request's data with InvalidInput; the server answers 400."""


class SplitError(EngineFailure):
    """A merged batch's output does not have the merged batch on its batch axis."""


class _Pending:
    """One queued request: its inputs, batch key, and a slot for the result."""

    __slots__ = ("feeds", "batch", "key", "enqueued", "done", "result", "error", "bad_input")

    def __init__(self, feeds: dict[str, np.ndarray], batch: int, key: tuple):
        self.feeds = feeds
        self.batch = batch
        self.key = key
        self.enqueued = time.monotonic()
        self.done = _thread.allocate_lock()   # held until the answer is in: the request's thread blocks on it
        self.done.acquire()
        self.result: dict[str, np.ndarray] | None = None
        self.error: str | None = None
        self.bad_input = False


def batch_key(feeds: dict[str, np.ndarray]) -> tuple:
    """Requests with equal keys can be concatenated along dim 0 (one input, the common case, without a sort)."""
    if len(feeds) == 1:
        for name, a in feeds.items():
            return ((name, a.dtype.str, a.shape[1:]),)
    return tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items()))


def _answered(item: _Pending) -> None:
    """Wake the request's thread; a repeated call never raises (Event.set twice did not either).

    Why a bare lock and not threading.Event: an Event is a Condition over a lock, and each wait()
    allocates one more lock. Under an 8-client binary MLP load on the 2-core bench machine, py-spy
    --gil put Condition.wait / notify / __init__ at ~20 % of the server's GIL samples, most of it these
    per-request Events. This change alone, that load: 2,130 -> 2,260 req/s at 8 clients, 1,951 -> 2,087 at
    32 (medians of 3 interleaved 5 s runs; 1,505 and 1,537 before headers.py). On the H100's ResNet-50 bs 1
    load it showed no gain (bench/results/gpu/targets/README.md, 2026-11-26).
    """
    if item.done.locked():
        item.done.release()


class _Instance:
    """One engine of a model with its worker thread (and, for engines with infer_async, the finisher
    thread that waits for launched batches), so N instances run N batches at once."""

    def __init__(self, batcher: Batcher, engine: Engine, index: int):
        self.engine = engine
        self.index = index
        self.device = str(getattr(engine, "device", "") or "cpu")
        # busy = launched - landed: batches taken and not yet answered. Each counter has one writer (launched:
        # the worker; landed: the finisher, or the worker of an engine without infer_async), so neither needs
        # a lock of its own; the dispatch reads them under the batcher's condition (Batcher._turn).
        self.launched = 0
        self.landed = 0
        # Engines with infer_async (the PyTorch engine on a GPU) get two batches in flight: the
        # worker stages and launches batch N+1 while a finisher thread waits for batch N.
        self.pipelined = callable(getattr(engine, "infer_async", None))
        self.inflight: queue.Queue = queue.Queue(maxsize=1)
        self.finisher = threading.Thread(target=batcher._finish_loop, args=(self,), name=f"ngcx-finisher-{index}",
                                         daemon=True)
        self.worker = threading.Thread(target=batcher._run, args=(self,), name=f"ngcx-batcher-{index}", daemon=True)

    @property
    def busy(self) -> int:
        return self.launched - self.landed


class Batcher:
    """Queue + one worker thread per engine instance in front of the model's engines.

    engines: one Engine, or several (Triton's instance group, on one GPU or many): each has its own
    worker thread, so while one instance computes a batch the next batch forms and runs on another.
    Batches are formed one at a time, by the least busy free instance (_turn), so N instances never
    split the queue into N half-empty batches and no GPU idles while another queues two.

    output_axes: output name -> the axis its batch is on (default 0). preferred: batch sizes that
    run at once when the queued requests add up to one. on_unmerge(reason) is called once if a
    merged batch did not split and merging was turned off.
    """

    def __init__(self, engines: Engine | list[Engine], max_batch: int, max_queue_delay_ms: float, stats: Stats,
                 batchable: bool = True, name: str | None = None, *, output_axes: dict[str, int] | None = None,
                 preferred: tuple[int, ...] = (), on_unmerge: Callable[[str], None] | None = None):
        engines = list(engines) if isinstance(engines, list | tuple) else [engines]
        if not engines:
            raise ValueError("a batcher needs at least one engine")
        self.engine = engines[0]
        self.name = name or self.engine.name
        self.max_batch = max_batch
        self.delay_s = max(0.0, max_queue_delay_ms) / 1000.0
        self.stats = stats
        self.batchable = batchable
        self.output_axes = dict(output_axes or {})
        self.preferred = tuple(sorted(p for p in preferred if 1 <= p <= max_batch))
        self.on_unmerge = on_unmerge
        self.closed_reason = "the server is shutting down; retry against another replica"
        self._queue: deque[_Pending] = deque()
        self._gathering = 0             # requests taken off the queue, waiting for company
        self._collecting = False        # an instance is forming a batch; the others wait for it
        self._lone = 0                  # batches in a row that were one request with nothing else in flight
        self._cond = threading.Condition()
        self._stopping = False
        self._flush = False
        self.instances = [_Instance(self, engine, i) for i, engine in enumerate(engines)]
        self._multi = len(self.instances) > 1
        self._idle: list[_Instance] = []    # instances whose worker waits for a batch to take
        for inst in self.instances:
            if inst.pipelined:
                inst.finisher.start()
            inst.worker.start()

    def submit(self, feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        """Run one request (possibly merged with others); blocks until its outputs are ready."""
        item = _Pending(feeds, batch, batch_key(feeds) if self.batchable else ("solo", id(feeds)))
        with self._cond:
            if self._stopping:
                raise ShuttingDown(self.closed_reason)
            self._queue.append(item)
            # with several instances one may wait for another to finish forming a batch; wake the former too
            self._cond.notify_all() if len(self.instances) > 1 else self._cond.notify()
        item.done.acquire()
        if item.error is not None:
            raise (BadRequest if item.bad_input else EngineFailure)(item.error)
        assert item.result is not None
        return item.result

    def flush(self) -> None:
        """Stop waiting for company: queued requests run at once (used while draining)."""
        with self._cond:
            self._flush = True
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Requests waiting to execute (Triton's nv_inference_pending_request_count); read without a lock."""
        return len(self._queue) + self._gathering

    def busy(self) -> dict[str, int]:
        """Batches launched and not yet answered, per device (summed over its instances); read without a lock."""
        out: dict[str, int] = {}
        for inst in self.instances:
            out[inst.device] = out.get(inst.device, 0) + max(0, inst.busy)
        return out

    def stop(self, timeout: float = 30.0, reason: str | None = None) -> None:
        """Run what is queued (without waiting for the delay), then end the workers. Later submits get
        ShuttingDown(reason)."""
        with self._cond:
            if reason:
                self.closed_reason = reason
            self._stopping = True
            self._cond.notify_all()
        for inst in self.instances:
            inst.worker.join(timeout)
        for inst in self.instances:
            if inst.pipelined:
                inst.inflight.put(None)
                inst.finisher.join(timeout)

    def _run(self, inst: _Instance) -> None:
        while True:
            with self._cond:
                group = self._take(inst)
            if group is None:
                return
            if self._execute(group, inst, release=True) is False:
                inst.launched -= 1              # its launch failed: no finisher job will count it landed
            elif not inst.pipelined:
                inst.landed += 1

    def _take(self, inst: _Instance) -> list[_Pending] | None:
        """Wait (condition held) until this instance's turn to form a batch, form it and count it launched;
        None once stopping with nothing queued (nor being formed)."""
        self._idle.append(inst)
        try:
            while not (self._queue and not self._collecting and self._turn(inst)):
                if self._stopping and not self._queue and not self._collecting:
                    return None
                self._cond.wait()
        finally:
            self._idle.remove(inst)
        self._collecting = True
        try:
            group = self._collect()
            inst.launched += 1
        finally:
            self._collecting = False
            self._cond.notify_all()
        return group

    def _turn(self, inst: _Instance) -> bool:
        """The least busy waiting instance forms the next batch (lowest index on a tie)."""
        if len(self._idle) == 1:
            return True
        return min(self._idle, key=lambda i: (i.busy, i.index)) is inst

    def _collect(self) -> list[_Pending]:
        """Take the oldest request plus same-key requests until full or its delay has passed.

        Called with the condition held; waiting on it releases the lock so submitters can add.
        """
        first = self._queue.popleft()
        if not self.batchable:
            return [first]
        if self._lone >= LONE_STREAK and not self._queue and self.stats.in_flight <= 1:
            return [first]                          # alone: no company can come (module docstring)
        group = self._gather(first)
        alone = len(group) == 1 and self.stats.in_flight <= 1
        self._lone = self._lone + 1 if alone else 0
        return group

    def _gather(self, first: _Pending) -> list[_Pending]:
        """The first request plus same-key requests until full, a preferred size, or its delay has passed."""
        group, total = [first], first.batch
        deadline = first.enqueued + self.delay_s
        try:
            while total < self.max_batch:
                for item in list(self._queue):
                    if item.key == first.key and total + item.batch <= self.max_batch:
                        self._queue.remove(item)
                        group.append(item)
                        total += item.batch
                self._gathering = len(group)
                cut = self._preferred_cut(group)
                if cut:
                    for item in reversed(group[cut:]):      # back to the front, in their order
                        self._queue.appendleft(item)
                    return group[:cut]
                remaining = deadline - time.monotonic()
                if total >= self.max_batch or remaining <= 0 or self._stopping or self._flush:
                    break
                self._cond.wait(remaining)
        finally:
            self._gathering = 0
        return group

    def _preferred_cut(self, group: list[_Pending]) -> int:
        """Length of the longest prefix of group whose batch is a preferred size (0: none)."""
        if not self.preferred:
            return 0
        best, total = 0, 0
        for i, item in enumerate(group, 1):
            total += item.batch
            if total in self.preferred:
                best = i
        return best

    def _execute(self, group: list[_Pending], inst: _Instance, release: bool = False) -> bool:
        """Run one batch on inst. A pipelined instance launches it and hands it to its finisher (which counts it
        landed when `release`); False when the launch itself failed (its requests were answered here)."""
        start = time.monotonic()
        try:
            feeds = self._merge(group)
            merged = time.monotonic()
            if inst.pipelined:
                finish = inst.engine.infer_async(feeds)
                inst.inflight.put((group, finish, start, merged, release))  # blocks while two batches are in flight
                return True
            outputs = inst.engine.infer(feeds)
        except Exception as exc:  # noqa: BLE001 - any engine failure becomes a 500, never a dead worker
            self._fail_or_isolate(group, exc, start, inst)
            return False
        self._complete(group, outputs, start, merged, inst)
        return True

    def _fail_or_isolate(self, group: list[_Pending], exc: Exception, start: float, inst: _Instance) -> None:
        """A merged batch failed: run its requests one by one, so one client's bad data (or one
        input the engine chokes on) never fails the requests it happened to be merged with."""
        if len(group) == 1:
            self._fail(group, exc, start, inst)
            return
        self._account(group, start, ok=False, device=inst.device)
        for item in group:
            self._execute([item], inst)

    def _finish_loop(self, inst: _Instance) -> None:
        """Wait for an instance's launched batches in order and hand their outputs to the waiting requests."""
        while True:
            job = inst.inflight.get()
            if job is None:
                return
            group, finish, start, merged, release = job
            try:
                outputs = finish()
            except Exception as exc:  # noqa: BLE001
                self._fail(group, exc, start, inst)
            else:
                self._complete(group, outputs, start, merged, inst)
            if release:
                self._landed(inst)

    def _landed(self, inst: _Instance) -> None:
        """A pipelined instance answered a batch: with several instances the waiting workers compare busy counts
        again (one of them may be the least busy now), so the count changes under the condition."""
        if not self._multi:
            inst.landed += 1
            return
        with self._cond:
            inst.landed += 1
            self._cond.notify_all()

    def _complete(self, group: list[_Pending], outputs: Any, start: float, merged: float, inst: _Instance) -> None:
        inferred = time.monotonic()
        try:
            results = self._split(group, self._checked(outputs), self.output_axes)
        except SplitError as exc:
            if len(group) > 1:
                self._unmerge(group, str(exc), start, inst)
                return
            self._fail(group, exc, start, inst)
            return
        except Exception as exc:  # noqa: BLE001
            self._fail(group, exc, start, inst)
            return
        marks = (start, merged, inferred, time.monotonic())
        for item, res in zip(group, results, strict=True):
            item.result = res
        self._account(group, start, ok=True, marks=marks, device=inst.device)
        for item in group:
            _answered(item)

    def _unmerge(self, group: list[_Pending], why: str, start: float, inst: _Instance) -> None:
        """A merged batch did not split: stop merging for this model and run its requests again one
        by one (queued at the front, in their order), so each client still gets its own answer."""
        self._account(group, start, ok=False, device=inst.device)
        with self._cond:
            first = self.batchable
            self.batchable = False
            for item in reversed(group):
                item.key = ("solo", id(item))
                self._queue.appendleft(item)
            for item in self._queue:
                item.key = ("solo", id(item))
            self._cond.notify_all()
        if first and self.on_unmerge is not None:
            self.on_unmerge(f"a merged batch of {len(group)} requests did not split ({why}); requests now "
                            "run one by one")

    def _fail(self, group: list[_Pending], exc: Exception, start: float, inst: _Instance) -> None:
        bad_input = isinstance(exc, InvalidInput)
        msg = (str(exc) if bad_input else f"engine '{self.name}' failed: {type(exc).__name__}: {exc}")
        msg = " ".join(msg.split())[:1000] or type(exc).__name__
        for item in group:
            item.error = msg
            item.bad_input = bad_input
            _answered(item)
        self._account(group, start, ok=False, device=inst.device)

    @staticmethod
    def _merge(group: list[_Pending]) -> dict[str, np.ndarray]:
        if len(group) == 1:
            return group[0].feeds
        return {n: np.concatenate([g.feeds[n] for g in group], axis=0) for n in group[0].feeds}

    @staticmethod
    def _split(group: list[_Pending], outputs: dict[str, np.ndarray],
               axes: dict[str, int] | None = None) -> list[dict[str, np.ndarray]]:
        """Each request's slice of every output, along that output's batch axis (views, no copies)."""
        if len(group) == 1:
            return [outputs]
        axes = axes or {}
        total = sum(g.batch for g in group)
        for name, arr in outputs.items():
            axis = axes.get(name, 0)
            if arr.ndim <= axis or arr.shape[axis] != total:
                raise SplitError(f"output '{name}' has shape {list(arr.shape)}, expected batch {total} "
                                 f"in dimension {axis}")
        split: list[dict[str, np.ndarray]] = []
        start = 0
        for g in group:
            split.append({n: a[(slice(None),) * axes.get(n, 0) + (slice(start, start + g.batch),)]
                          for n, a in outputs.items()})
            start += g.batch
        return split

    @staticmethod
    def _checked(outputs: Any) -> dict[str, np.ndarray]:
        if not isinstance(outputs, dict) or not all(isinstance(a, np.ndarray) for a in outputs.values()):
            got = type(outputs).__name__
            raise EngineFailure(f"infer() returned {got}, expected dict[str, numpy.ndarray]")
        # The HTTP threads write responses while this worker already runs the next batch; an
        # engine that hands back views of reused (e.g. pinned) output buffers would corrupt them.
        # Copying outputs (small next to inputs: ResNet-50 bs 256 is 1 MB) makes that impossible.
        return {name: np.array(arr, copy=True, order="C") for name, arr in outputs.items()}

    def _account(self, group: list[_Pending], start: float, ok: bool,
                 marks: tuple[float, float, float, float] | None = None, device: str = "cpu") -> None:
        """One engine call: batch counters, and on success each request's share of Triton's durations.
        Successes and failures of requests are counted by the HTTP layer, which sends the answers."""
        end = time.monotonic()
        size = sum(max(g.batch, 1) for g in group)   # an unbatchable request counts as one
        n = len(group)
        s = self.stats
        with s.lock:
            s.engine_calls += 1
            s.inferences += size
            s.batch_sizes[size] += 1
            s.requests_per_call[n] += 1
            if n > 1:
                s.batched_requests += n
            s.compute_ns += int((end - start) * 1e9)
            row = s.devices.get(device)
            if row is None:
                row = s.devices[device] = [0, 0, 0]
            row[0] += 1
            row[1] += size
            row[2] += int((end - start) * 1e9)
            s.queue_ns += sum(int((start - g.enqueued) * 1e9) for g in group)
            s.last_inference_ms = int(time.time() * 1000)
            if ok and marks is not None:
                t0, t1, t2, t3 = marks
                s.compute_input_ns += n * int((t1 - t0) * 1e9)
                s.compute_infer_ns += n * int((t2 - t1) * 1e9)
                s.compute_output_ns += n * int((t3 - t2) * 1e9)
