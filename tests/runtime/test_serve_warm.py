"""`ngcx-runtime serve` start-up: listen at once, ready only when loaded AND warmed up, plans cached.

What an operator notices: a container's liveness probe passes immediately while its readiness
probe stays 503 until the first real request would be fast (the model is loaded and one warm-up
inference has run); the second start of the same model and precision reuses the optimized plan
(one line says so and the cache does not grow); fp16 / int8 plans answer close to fp32.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import models
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
requests = pytest.importorskip("requests")

from ngcx_runtime.serve import load_engine, start_loading  # noqa: E402

TIMEOUT = 30
CLI = [sys.executable, "-m", "ngcx_runtime.cli", "serve"]


class SlowEngine:
    """Wraps a real engine; counts calls so the test sees the warm-up happen before readiness."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.backend, self.device = inner.name, inner.backend, inner.device
        self.precision, self.inputs, self.outputs, self.max_batch = (inner.precision, inner.inputs,
                                                                     inner.outputs, inner.max_batch)
        self.calls: list[tuple[int, ...]] = []
        self.threads: list[threading.Thread] = []

    def infer(self, feeds):
        self.calls.append(feeds["x"].shape)
        self.threads.append(threading.current_thread())
        return self.inner.infer(feeds)


def test_ready_only_after_load_and_warm_up(tmp_path):
    model = models.mlp(tmp_path / "mlp.onnx")
    gate = threading.Event()
    engines: list[SlowEngine] = []

    def slow_load():
        gate.wait(TIMEOUT)                       # "loading" lasts until the test has looked
        engines.append(SlowEngine(load_engine(model)))
        return engines[0]

    handle = start_loading(slow_load, port=0, name="mlp")
    try:
        url = handle.url
        assert requests.get(f"{url}/v2/health/live", timeout=TIMEOUT).status_code == 200
        assert requests.get(f"{url}/v2/health/ready", timeout=TIMEOUT).status_code == 503
        assert requests.get(f"{url}/v2/models/mlp/ready", timeout=TIMEOUT).status_code == 503
        x = models.sample_inputs("mlp", 2)["x"]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 32], "data": x.ravel().tolist()}]}
        r = requests.post(f"{url}/v2/models/mlp/infer", json=body, timeout=TIMEOUT)
        assert r.status_code == 503 and "is loading" in r.json()["error"]
        gate.set()
        assert handle.wait_loaded(TIMEOUT) is True
        # the warm-up at batch 1 (dynamic dims = 1), then the batch-axis probe at batch 2 (layout.py)
        assert engines[0].calls == [(1, 32), (2, 32)], "warm-up and probe ran before ready"
        assert requests.get(f"{url}/v2/health/ready", timeout=TIMEOUT).status_code == 200
        assert requests.get(f"{url}/v2/models/mlp/ready", timeout=TIMEOUT).json()["ready"] is True
        r = requests.post(f"{url}/v2/models/mlp/infer", json=body, timeout=TIMEOUT)
        assert r.status_code == 200
        assert handle.stats()["engine_calls"] == 1, "the warm-up is not counted as a served request"
    finally:
        handle.stop()


def test_the_thread_that_loaded_and_warmed_up_a_model_lives_on_while_it_serves(tmp_path):
    """torch keeps a compiled model's CUDA graphs in the loading thread's thread-local storage; that
    thread ending while the batcher replayed them was the SIGSEGV at start of bench/results/gpu/starts/
    (runtime/loading.py). The load and warm-up run on one thread, and it is still there after serving."""
    model = models.mlp(tmp_path / "mlp.onnx")
    loaders: list[threading.Thread] = []
    engines: list[SlowEngine] = []

    def load():
        loaders.append(threading.current_thread())
        engines.append(SlowEngine(load_engine(model)))
        return engines[0]

    handle = start_loading(load, port=0, name="mlp")
    try:
        assert handle.wait_loaded(TIMEOUT) is True
        x = models.sample_inputs("mlp", 1)["x"]
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 32], "data": x.ravel().tolist()}]}
        assert requests.post(f"{handle.url}/v2/models/mlp/infer", json=body, timeout=TIMEOUT).status_code == 200
        loader = loaders[0]
        assert loader is not threading.main_thread() and loader.name.startswith("ngcx-load")
        assert engines[0].threads[:2] == [loader, loader], "the warm-up (where torch captures graphs) ran there too"
        loader.join(timeout=0.5)                  # a thread that ends with its load is gone well before this
        assert loader.is_alive(), "the thread that loaded the model ended while the model is served"
    finally:
        handle.stop()


SLOW_HANDLER = '''
import time
import numpy as np


class Slow:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]

    def load(self, context):
        time.sleep(2.0)

    def predict(self, inputs):
        return {"y": inputs["x"] + 1}
'''


def _start(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, queue.Queue]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    return proc, lines


def _wait_line(proc: subprocess.Popen, lines: queue.Queue, pattern: str, seen: list[str]) -> re.Match:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    proc.kill()
    pytest.fail(f"no line matching {pattern!r}: {''.join(seen)}")


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def test_process_is_live_at_once_and_ready_after_a_slow_load(tmp_path, plan_cache):
    (tmp_path / "slow_handler.py").write_text(textwrap.dedent(SLOW_HANDLER).lstrip())
    env = {**os.environ, "NGCX_RUNTIME_CACHE": str(plan_cache)}
    proc, lines = _start([*CLI, "--handler", "slow_handler:Slow", "--app-dir", str(tmp_path), "--port", "0",
                          "--name", "slow"], env)
    seen: list[str] = []
    try:
        url = _wait_line(proc, lines, r"listening at (http://127\.0\.0\.1:\d+)", seen).group(1)
        assert requests.get(f"{url}/v2/health/live", timeout=TIMEOUT).status_code == 200
        assert requests.get(f"{url}/v2/health/ready", timeout=TIMEOUT).status_code == 503
        statuses = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not statuses or statuses[-1] != 200):
            statuses.append(requests.get(f"{url}/v2/models/slow/ready", timeout=TIMEOUT).status_code)
            time.sleep(0.1)
        assert statuses[0] == 503 and statuses[-1] == 200, statuses
        r = requests.post(f"{url}/v2/models/slow/infer", timeout=TIMEOUT, json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
        assert r.json()["outputs"][0]["data"] == [2, 3]
    finally:
        assert _stop(proc) == 0


def _serve_once(model: Path, env: dict[str, str], extra: list[str]) -> str:
    """Start, wait until serving, answer one request, SIGTERM; the `plan:` line it printed."""
    proc, lines = _start([*CLI, str(model), "--port", "0", *extra], env)
    seen: list[str] = []
    try:
        url = _wait_line(proc, lines, r"(http://127\.0\.0\.1:\d+)/v2/models/", seen).group(1)
        assert requests.get(f"{url}/v2/health/ready", timeout=TIMEOUT).status_code == 200
    finally:
        assert _stop(proc) == 0
    plan = [ln for ln in seen if ln.startswith("plan:")]
    assert len(plan) == 1, seen
    return plan[0]


def test_second_start_loads_the_cached_plan(tmp_path, plan_cache):
    model = models.conv_net(tmp_path / "conv.onnx")
    env = {**os.environ, "NGCX_RUNTIME_CACHE": str(plan_cache)}
    first = _serve_once(model, env, ["--precision", "fp16", "--batch-profile", "1,8"])
    assert "cache miss" in first and re.search(r"built in \d+\.\d s", first), first
    entries = sorted(p.name for p in plan_cache.iterdir())
    assert len(entries) == 1
    second = _serve_once(model, env, ["--precision", "fp16", "--batch-profile", "1,8"])
    assert second.startswith("plan: cache hit"), second
    assert sorted(p.name for p in plan_cache.iterdir()) == entries, "the second start built a new plan"
    # Another precision is another plan.
    third = _serve_once(model, env, ["--precision", "fp32", "--batch-profile", "1,8"])
    assert "cache miss" in third and len(list(plan_cache.iterdir())) == 2


# -- reduced precision, served, against ONNX Runtime fp32 --
#
# Tolerances. fp16 keeps 11 significant bits (relative rounding 2**-11 ~ 4.9e-4) for weights and
# every activation; through three conv layers (27..72-term dot products) and a GAP + Gemm the
# rounding errors add up to about 1e-3 of the logits' scale, so |fp16 - fp32| <= 1e-2 * max|fp32|
# leaves a 10x margin while still catching a wrong layer (errors of order 1). int8 keeps 256
# levels per tensor range (per-channel weights, calibrated activations): each quantized
# activation is off by up to half a step (~0.2% of its range), accumulated over 4 quantized
# layers to a few % of the logits' range; we allow 10% of the fp32 logits' range and require the
# predicted class to match on at least 90% of samples, which a broken calibration (wrong scales:
# errors of 100%+) fails. Measured here (ORT CPU): fp16 2.5e-4 of max|fp32|, int8 1.3% of the range, argmax
# agreement 100%: both bounds keep a margin of 8x or more for other CPUs / ORT versions.


def _reference(model: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def _served(model: Path, x: np.ndarray, **options) -> tuple[np.ndarray, str]:
    handle = start_loading(lambda: load_engine(model, **options), port=0, name="conv")
    try:
        assert handle.wait_loaded(120) is True, handle.load_error
        client = httpclient.InferenceServerClient(f"{handle.host}:{handle.port}", network_timeout=TIMEOUT)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = client.infer("conv", [inp]).as_numpy("logits")
        precision = requests.get(f"{handle.url}/v2/models/conv/config", timeout=TIMEOUT).json()["parameters"]
        return out, precision["precision"]
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory) -> Path:
    return models.conv_net(tmp_path_factory.mktemp("conv") / "conv.onnx")


def test_fp16_plan_is_close_to_fp32(conv_model):
    x = models.sample_inputs("conv", 8, seed=3)["input"]
    ref = _reference(conv_model, x)
    got, precision = _served(conv_model, x, precision="fp16", batch_profile=[1, 8])
    assert precision == "fp16" and got.dtype == np.float32
    err = np.abs(got - ref).max()
    assert err <= 1e-2 * np.abs(ref).max(), err
    assert err > 0, "fp16 output is bit-identical to fp32: the plan was not converted"


def test_int8_plan_with_calibration_is_close_to_fp32(conv_model, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=models.sample_inputs("conv", 64, seed=7)["input"])
    x = models.sample_inputs("conv", 32, seed=3)["input"]
    ref = _reference(conv_model, x)
    got, precision = _served(conv_model, x, precision="int8", batch_profile=[1, 32], calibration=calib)
    assert precision == "int8"
    span = ref.max() - ref.min()
    assert np.abs(got - ref).max() <= 0.10 * span
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9
    assert not np.allclose(got, ref, rtol=0, atol=1e-6), "int8 output equals fp32: nothing was quantized"


def test_int8_without_calibration_is_one_line_exit_2(conv_model, plan_cache):
    r = subprocess.run([*CLI, str(conv_model), "--precision", "int8", "--port", "0"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "NGCX_RUNTIME_CACHE": str(plan_cache)})
    assert r.returncode == 2 and "--calibration-data" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not plan_cache.exists() or not [p for p in plan_cache.iterdir() if not p.name.startswith(".")]
