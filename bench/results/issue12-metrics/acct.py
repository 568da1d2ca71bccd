"""Cost of the per-request metrics accounting added in issue 12 (what the hot path now does more)."""
import sys
import time
import timeit

sys.path.insert(0, sys.argv[1])
from ngcx_runtime.batching import Stats  # noqa: E402

s = Stats()


def per_request() -> None:
    t0 = time.monotonic_ns()
    s.count_request()
    s.count_success(time.monotonic_ns() - t0)


def per_batch() -> None:           # what _account does more per batch: 3 timestamps, 3 adds
    t = (time.monotonic(), time.monotonic(), time.monotonic(), time.monotonic())
    with s.lock:
        s.compute_input_ns += int((t[1] - t[0]) * 1e9)
        s.compute_infer_ns += int((t[2] - t[1]) * 1e9)
        s.compute_output_ns += int((t[3] - t[2]) * 1e9)


n = 200_000
for name, fn in (("per request", per_request), ("per batch", per_batch)):
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print(f"{name}: {best:.3f} us")
