"""serve on every GPU of the host (issue 50, part 3), on a real GPU host.

What a user notices: `ngcx-runtime serve MODEL` with no placement flag puts an instance on every GPU the process
sees (Triton's KIND_GPU default) and says so; /v2/models/NAME/config's instance_group lists those GPUs; under
concurrent load every GPU runs batches (/metrics: nv_inference_instance_exec_count{device="cuda:N"}) and every
answer is the model's; --gpus keeps to the GPUs named and refuses one that is not there with one line;
CUDA_VISIBLE_DEVICES narrows the spread as CUDA does; --processes N shares the GPUs out between its processes.

Each test states how many GPUs it needs and is skipped with that reason on a host with fewer (this project's CI
has none; the lent machines had one H200 when this was written, so the tests needing two were never run there:
their logic is proven on the CPU by tests/runtime/test_placement.py). Throughput per GPU count:
bench/gpu/multi_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # concurrency.py, beside the serving tests
from concurrency import concurrently  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300


def _gpu_count() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _gpu_count()


def needs(n: int):
    return pytest.mark.skipif(n > GPUS, reason=f"needs {n} CUDA GPU(s) visible to torch; this host has {GPUS}")


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> tuple[Path, object]:
    """A small torch.export program (dynamic batch) and the module it came from (the reference)."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    net = Net().eval()
    ep = torch.export.export(net, (torch.randn(2, 64),), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=256)},))
    path = tmp_path_factory.mktemp("gpu50") / "mlp.pt2"
    torch.export.save(ep, str(path))
    return path, net


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    """`python -m ngcx_runtime.serve MODEL ARGS` on a free port, its output collected, SIGTERM-stopped."""

    def __init__(self, model: Path, *args: str, env: dict[str, str] | None = None, mark: str = "serving model '"):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", **(env or {})}
        full.pop("NGCX_RUNTIME_MPS", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.serve", str(model), "--name", "mlp",
                                      "--port", str(self.port), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=REPO, env=full, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        deadline = time.monotonic() + TIMEOUT
        while not any(mark in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.2)

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=30) as r:
            return r.read().decode()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(120) == 0, "".join(self.lines)[-3000:]
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)


def _infer(url: str, x: np.ndarray) -> np.ndarray:
    body = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    req = urllib.request.Request(f"{url}/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _device_calls(server: Served) -> dict[str, int]:
    calls: dict[str, int] = {}
    for line in server.get("/metrics").splitlines():
        if line.startswith("nv_inference_instance_exec_count{"):
            labels, _, value = line.rpartition(" ")
            calls[labels.split('device="', 1)[1].split('"', 1)[0]] = int(float(value))
    return calls


def _answers_match(server: Served, net: object, n: int = 64) -> None:
    import torch

    xs = [np.random.default_rng(i).standard_normal((1 + i % 4, 64)).astype(np.float32) for i in range(n)]
    out = concurrently(lambda i: _infer(server.url, xs[i]), n, 180)
    with torch.no_grad():
        for x, y in zip(xs, out, strict=True):
            assert isinstance(y, np.ndarray), y
            np.testing.assert_allclose(y, net(torch.from_numpy(x)).numpy(), rtol=1e-3, atol=1e-3)


def _report(name: str, doc: dict) -> None:
    folder = Path(os.environ.get("NGCX_GPU_REPORT_DIR", "")) if os.environ.get("NGCX_GPU_REPORT_DIR") else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"multi_gpu_{name}.json").write_text(json.dumps(doc, indent=1))


@needs(1)
def test_by_default_an_instance_serves_on_every_visible_gpu(pt2):
    path, net = pt2
    server = Served(path)
    try:
        config = json.loads(server.get("/v2/models/mlp/config"))
        assert config["instance_group"] == [{"name": "mlp", "kind": "KIND_GPU", "count": 1,
                                             "gpus": list(range(GPUS))}], config["instance_group"]
        ready = next(line for line in server.lines if "serving model 'mlp'" in line)
        assert f"{GPUS} instance{'s' if GPUS > 1 else ''} on " in ready and f"({GPUS} GPU" in ready, ready
        _answers_match(server, net)
        calls = _device_calls(server)
        assert set(calls) <= {f"cuda:{i}" for i in range(GPUS)} and sum(calls.values()) > 0, calls
        _report("default", {"gpus": GPUS, "instance_group": config["instance_group"], "device_exec_count": calls,
                            "ready_line": ready.strip()})
    finally:
        server.stop()


@needs(1)
def test_instances_per_gpu_and_a_gpu_that_is_not_there(pt2):
    path, net = pt2
    server = Served(path, "--instances-per-gpu", "2", "--gpus", "0")
    try:
        config = json.loads(server.get("/v2/models/mlp/config"))
        assert config["instance_group"] == [{"name": "mlp", "kind": "KIND_GPU", "count": 2, "gpus": [0]}]
        _answers_match(server, net, 32)
    finally:
        server.stop()
    proc = subprocess.run([sys.executable, "-m", "ngcx_runtime.serve", str(path), "--port", "0", "--gpus", str(GPUS)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"GPU {GPUS} is not visible here" in lines[0] and proc.stdout == "", proc.stderr


@needs(2)
def test_under_load_every_gpu_runs_batches(pt2):
    """128 concurrent clients, one batcher: each GPU's instance runs batches (the least busy takes the next)."""
    path, net = pt2
    server = Served(path, "--max-queue-delay-ms", "2")
    try:
        _answers_match(server, net, 128)
        calls = _device_calls(server)
        assert set(calls) == {f"cuda:{i}" for i in range(GPUS)}, calls
        assert min(calls.values()) > 0, f"a GPU ran no batch: {calls}"
        _report("under_load", {"gpus": GPUS, "device_exec_count": calls})
    finally:
        server.stop()


@needs(2)
def test_cuda_visible_devices_and_gpus_narrow_the_spread(pt2):
    path, net = pt2
    server = Served(path, env={"CUDA_VISIBLE_DEVICES": "1"})
    try:
        config = json.loads(server.get("/v2/models/mlp/config"))
        assert config["instance_group"][0]["gpus"] == [0], "CUDA numbers the one visible GPU 0"
        _answers_match(server, net, 16)
    finally:
        server.stop()
    server = Served(path, "--gpus", "1")
    try:
        config = json.loads(server.get("/v2/models/mlp/config"))
        assert config["instance_group"][0]["gpus"] == [1] and set(_device_calls(server)) <= {"cuda:1"}
    finally:
        server.stop()


@needs(2)
def test_processes_share_the_gpus_out(pt2):
    """--processes 2 on a host of G >= 2 GPUs: the two children serve on different GPUs, none idle."""
    path, net = pt2
    server = Served(path, "--processes", "2", mark="all 2 processes are serving")
    try:
        ready = [line for line in server.lines if "serving model 'mlp'" in line]
        assert len(ready) == 2, server.lines
        used = [set(part.strip() for part in line.split(" on ", 1)[1].split(" (")[0].split(",")) for line in ready]
        assert not (used[0] & used[1]), f"both processes on the same GPU: {used}"
        assert set().union(*used) == {f"cuda:{i}" for i in range(GPUS)}, used
        _answers_match(server, net, 32)
    finally:
        server.stop()
