"""The server's pipelined path: engines with infer_async (launch now, wait later).

On a GPU the PyTorch engine stages batch N+1 while batch N computes (bench/results/gpu/resnet50/h100). Here the
same batcher path runs against a real ONNX Runtime engine whose infer_async computes on a worker
thread: outputs must equal ONNX Runtime's own, failures must become a 500 without stalling the
pipeline, and stop() must finish what was launched.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import models
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
requests = pytest.importorskip("requests")

from test_serve import _concurrent, _json_input, add_mul_model, load_engine, reference, triton  # noqa: E402

from ngcx_runtime.serve import start_server  # noqa: E402

TIMEOUT = 30
LOAD_CALLS = 2   # start_server warms up at batch 1 and probes the batch axis at batch 2, through infer()


class LaunchThenWait:
    """A real ORT engine (plan.load) with infer_async: compute starts on a worker thread at
    launch; the returned function waits for it. Counts how the batcher used it."""

    def __init__(self, engine, delay_s: float = 0.0):
        self._engine = engine
        self._delay_s = delay_s
        self._pool = ThreadPoolExecutor(max_workers=2)
        self.launched = 0
        self.direct = 0
        self.lock = threading.Lock()
        for attr in ("name", "backend", "device", "precision", "inputs", "outputs", "max_batch"):
            setattr(self, attr, getattr(engine, attr))

    def infer(self, feeds):
        with self.lock:
            self.direct += 1
        return self._engine.infer(feeds)

    def infer_async(self, feeds):
        with self.lock:
            self.launched += 1
        future = self._pool.submit(self._compute, feeds)
        return lambda: future.result(timeout=TIMEOUT)

    def _compute(self, feeds):
        if self._delay_s:
            threading.Event().wait(self._delay_s)  # a slow device: keeps batches in flight
        return self._engine.infer(feeds)


@pytest.fixture()
def conv_path(tmp_path: Path) -> Path:
    return models.conv_net(tmp_path / "conv.onnx")


def test_pipelined_engine_serves_correct_merged_batches(conv_path):
    engine = LaunchThenWait(load_engine(conv_path))
    handle = start_server(engine, "127.0.0.1", 0, max_batch=32, max_queue_delay_ms=50)
    try:
        xs = [models.sample_inputs("conv", 2, seed=40 + i)["input"] for i in range(12)]

        def call(x):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return triton(handle).infer("conv", [inp]).as_numpy("logits")

        outs = _concurrent(call, [(x,) for x in xs])
        for x, out in zip(xs, outs, strict=True):
            assert not isinstance(out, Exception), out
            np.testing.assert_allclose(out, reference(conv_path, {"input": x})["logits"], rtol=1e-5, atol=1e-5)
        stats = handle.stats()
        assert stats["success"] == 12 and stats["inferences"] == 24
        # infer() ran only at load: the warm-up and the batch-axis probe (layout.py)
        assert engine.launched == stats["engine_calls"] and engine.direct == LOAD_CALLS
    finally:
        handle.stop()


def test_failure_at_wait_time_is_a_500_and_the_pipeline_keeps_going(tmp_path):
    path = add_mul_model(tmp_path / "addmul.onnx")
    engine = LaunchThenWait(load_engine(path))
    handle = start_server(engine, "127.0.0.1", 0, name="addmul", max_batch=8, max_queue_delay_ms=1)
    try:
        url = f"{handle.url}/v2/models/addmul/infer"
        bad = {"inputs": [_json_input("a", (1, 3)), _json_input("b", (1, 5))]}  # ORT fails inside the worker
        r = requests.post(url, json=bad, timeout=TIMEOUT)
        assert r.status_code == 500 and r.json()["error"].startswith("engine 'addmul' failed: ")
        ok = {"inputs": [_json_input("a", (2, 3)), _json_input("b", (2, 3))]}
        for _ in range(3):
            r = requests.post(url, json=ok, timeout=TIMEOUT)
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0] * 6
        assert engine.launched == 4 and engine.direct == LOAD_CALLS
    finally:
        handle.stop()


def test_stop_finishes_launched_batches(conv_path):
    engine = LaunchThenWait(load_engine(conv_path), delay_s=0.4)
    handle = start_server(engine, "127.0.0.1", 0, max_batch=4, max_queue_delay_ms=1)
    x = models.sample_inputs("conv", 4, seed=7)["input"]
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(
        requests.post(f"{handle.url}/v2/models/conv/infer", json=body, timeout=TIMEOUT).status_code))
        for _ in range(3)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    while engine.launched < 2 and not deadline.wait(0.01):
        pass  # until at least two batches are launched (one computing, one queued)
    handle.stop(drain=True)  # must wait for the launched batches, not drop them
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(results) == [200, 200, 200]
    assert engine.launched == 3
