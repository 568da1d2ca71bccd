"""The threads that load models: started once, alive as long as the server process.

Why no load runs in a thread that ends: torch.compile(mode="reduce-overhead") keeps its CUDA-graph
trees in the loading thread's C++ thread-local storage (torch 2.11 `_stash_obj_in_tls`, excerpt in
bench/results/gpu/starts/preload_ab/torch_cudagraph_trees_tls.txt), and a thread's thread-local storage is torn
down as the thread exits, while the batcher threads go on replaying those graphs. e63d613's ResNet-18
servers loaded in a thread that returned once the model was ready; they died with SIGSEGV at that
moment (no Python frame on the crashing thread, the load thread gone from the dump) in 4 of 4 runs of
their harness, and in 0 of 4 with that thread kept waiting after its load (bench/results/gpu/starts/
README.md, arms bare and park). So start-up loads and repository loads (asked over HTTP or gRPC, whose
handler threads end with their connection) all run here.

Daemon threads by hand rather than concurrent.futures.ThreadPoolExecutor: the executor joins its
workers at interpreter exit, so a server stopped during a long compile would wait for it. A load
never waits behind another (as when each had a thread of its own): a new thread starts whenever
every one is busy, so a process keeps as many as the most loads it ever ran at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoadThreads:
    """Never-ending daemon threads, one more whenever a load comes and every one is busy."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0          # threads waiting for a job, less the jobs already handed to them
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run fn(*args) on a load thread at once; the future holds its result or exception."""
        future: Future[T] = Future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                thread = threading.Thread(target=self._work, name=f"ngcx-load-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._jobs.put((future, fn, args))
        return future

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on a load thread and wait for it; a load thread's own call (a start-up load
        of the repository) runs in place."""
        if threading.current_thread() in self._threads:
            return fn(*args)
        return self.submit(fn, *args).result()

    def _work(self) -> None:
        while True:
            _run_one(*self._jobs.get())
            with self._lock:
                self._idle += 1


def _run_one(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """One job; its own frame, so the worker keeps no reference to a finished model or its error."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller, who decides
        future.set_exception(exc)
    else:
        future.set_result(result)


LOADS = LoadThreads()
