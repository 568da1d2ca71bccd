"""What a project image does on a GPU host, without Docker: `ngcx-runtime serve` optimizes the model
into the persistent plan cache on its first start (keyed by the GPU's architecture), turns ready
only after the load and a warm-up inference, answers like the FP32 model within FP16's tolerance,
and on the second start loads the cached plan; a handler wraps the GPU engine the same way.

Runs where torch sees a GPU (the lent H100/H200); skipped with the reason elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA GPU (no GPU here; runs on the lent GPU)")

HANDLER = '''
import numpy as np


class Double:
    """Pre-processing around the GPU engine: the model's own signature, inputs scaled by 2."""

    def load(self, context):
        self.engine = context.engine

    def predict(self, inputs):
        return self.engine.infer({"x": (inputs["x"] * 2).astype(np.float32)})
'''


def export_model(folder: Path):
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    example = torch.randn(2, 3, 32, 32)

    class Named(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net(x)

    ep = torch.export.export(Named().eval(), (example,), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))
    path = folder / "model.pt2"
    torch.export.save(ep, str(path))
    return path, net


def serve(args: list[str], cache: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """Start serve; (process, URL, lines printed until it reported ready)."""
    env = {**os.environ, "NGCX_RUNTIME_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.cli", "serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines, url, deadline = [], None, time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if url is None and (m := re.search(r"listening at (http://\S+?)[\s(]", line)):
            url = m.group(1)
            assert not ready(url), "ready before the load and warm-up"
        if "serving model" in line:
            return proc, url, lines
    proc.kill()
    raise AssertionError("\n".join(lines))


def ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5).status == 200
    except OSError:
        return False


def infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """One JSON request in the model's own input name and datatype (an FP16 plan takes FP16)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}", timeout=30) as r:
        spec = json.loads(r.read())["inputs"][0]
    body = json.dumps({"inputs": [{"name": spec["name"], "datatype": spec["datatype"], "shape": list(x.shape),
                                   "data": x.ravel().tolist()}]}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body),
                                    timeout=60) as r:
            out = json.loads(r.read())["outputs"][0]
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{exc.code}: {exc.read()[:500]!r} (inputs {spec})") from None
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@needs_gpu
def test_first_start_builds_the_gpu_plan_second_start_loads_it(tmp_path):
    import torch

    model, net = export_model(tmp_path)
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    want = net(torch.from_numpy(x)).detach().numpy()
    cache = tmp_path / "plans"
    args = [str(model), "--name", "net", "--precision", "fp16", "--batch-profile", "1,8"]
    proc, url, lines = serve(args, cache)
    try:
        assert ready(url)
        got = infer(url, "net", x)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
    finally:
        stop(proc)
    first = [ln for ln in lines if ln.startswith("plan:")]
    assert first and "cache miss" in first[0] and "pytorch fp16" in first[0], lines
    entries = sorted(p.name for p in cache.iterdir())
    proc, url, lines = serve(args, cache)
    try:
        np.testing.assert_allclose(infer(url, "net", x), got, rtol=1e-3, atol=1e-3)
    finally:
        stop(proc)
    second = [ln for ln in lines if ln.startswith("plan:")]
    assert second and second[0].startswith("plan: cache hit"), lines
    assert sorted(p.name for p in cache.iterdir()) == entries
    print(f"GPU plan: {first[0]} | {second[0]}")


@needs_gpu
def test_a_handler_wraps_the_gpu_engine(tmp_path):
    import torch

    model, net = export_model(tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    (app / "double.py").write_text(HANDLER)
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = net(torch.from_numpy(x * 2)).detach().numpy()
    proc, url, _ = serve([str(model), "--name", "dbl", "--handler", "double:Double", "--app-dir", str(app),
                          "--precision", "fp16", "--batch-profile", "1,8"], tmp_path / "plans")
    try:
        np.testing.assert_allclose(infer(url, "dbl", x), want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
    finally:
        stop(proc)
