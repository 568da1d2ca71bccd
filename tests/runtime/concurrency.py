"""Concurrent requests for the serving tests: call(i) for i in 0..n-1, each from its own thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def concurrently(call: Callable[[int], Any], n: int, timeout: float) -> list[Any]:
    """Start n threads at once, wait up to `timeout` for each; what each call returned, or the
    exception it raised (None for one still running)."""
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            out[i] = call(i)
        except Exception as exc:  # noqa: BLE001 - the caller asserts on it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out
