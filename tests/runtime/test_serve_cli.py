"""`ngcx-runtime serve` as a process: SIGTERM drains in-flight requests and exits 0; bad flags exit 2.

What an operator notices: a rolling restart (SIGTERM from Docker or Kubernetes) does not drop
the request being answered, and a typo gets one line, not a traceback.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import models
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

FRONT_ENDS = {
    "ngcx-runtime serve": [sys.executable, "-m", "ngcx_runtime.cli", "serve"],
    "python -m ngcx_runtime.serve": [sys.executable, "-m", "ngcx_runtime.serve"],
}


def _start(cmd: list[str]) -> tuple[subprocess.Popen, str, queue.Queue]:
    """Start the server on a free port; return it, its base URL, and a queue of its stdout lines."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = re.search(r"(http://127\.0\.0\.1:\d+)/v2/models/", line)
        if m:
            return proc, m.group(1), lines
    proc.kill()
    pytest.fail(f"server did not start: {''.join(seen)}")


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
def test_a_crash_in_native_code_leaves_every_threads_stack_in_the_log(tmp_path, front_end):
    """A segfault (here: the signal a bad pointer in CUDA or a compiled kernel raises) is not silent."""
    model = models.conv_net(tmp_path / "conv.onnx")
    proc, _, lines = _start([*FRONT_ENDS[front_end], str(model), "--port", "0"])
    proc.send_signal(signal.SIGSEGV)
    assert proc.wait(30) == -signal.SIGSEGV
    log = _drain(lines, proc)
    assert "Fatal Python error: Segmentation fault" in log
    assert "Thread 0x" in log and "File " in log                      # every thread's stack, with its files


def _drain(lines: queue.Queue, proc: subprocess.Popen) -> str:
    """Every line the (ended) process wrote."""
    out = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            out.append(lines.get(timeout=0.5))
        except queue.Empty:
            if proc.poll() is not None and lines.empty():
                break
    return "".join(out)


@pytest.mark.parametrize("front_end", list(FRONT_ENDS))
def test_sigterm_drains_the_in_flight_request_and_exits_0(tmp_path, front_end):
    model = models.conv_net(tmp_path / "conv.onnx")
    # A long queue delay keeps a lone request in flight long enough to send SIGTERM mid-request.
    cmd = [*FRONT_ENDS[front_end], str(model), "--port", "0", "--max-batch", "8", "--max-queue-delay-ms", "3000"]
    proc, url, lines = _start(cmd)
    try:
        x = models.sample_inputs("conv", 1)["input"]
        body = json.dumps(
            {"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x.ravel().tolist()}]}
        ).encode()
        result: dict = {}

        def send():
            req = urllib.request.Request(f"{url}/v2/models/conv/infer", data=body, method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                result["status"], result["doc"], result["t"] = r.status, json.load(r), time.monotonic()

        t = threading.Thread(target=send)
        t.start()
        time.sleep(0.7)
        assert t.is_alive(), "the request finished before SIGTERM; the test proves nothing"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert result.get("status") == 200, result
        assert result["t"] >= sent
        out = np.asarray(result["doc"]["outputs"][0]["data"], np.float32)
        assert out.shape == (10,) and np.isfinite(out).all()
        assert proc.wait(timeout=30) == 0
        rest = []
        while not lines.empty():
            rest.append(lines.get())
        assert any("draining" in ln for ln in rest), rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_bad_flags_give_one_line_and_exit_2(tmp_path):
    model = models.conv_net(tmp_path / "conv.onnx")
    cases = [
        ([str(tmp_path / "missing.onnx")], "no such model"),
        ([str(model), "--max-batch", "0"], "--max-batch 0 must be at least 1"),
    ]
    for extra, fragment in cases:
        r = subprocess.run(
            [*FRONT_ENDS["ngcx-runtime serve"], *extra, "--port", "0"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
