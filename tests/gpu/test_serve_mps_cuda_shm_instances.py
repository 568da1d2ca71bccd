"""serve on a GPU: MPS processes, CUDA shared memory and engine instances (issue 12, items 3 and 4).

What a user notices on a GPU host: `serve --mps 2` starts (or joins) the MPS control daemon, its
two processes run their CUDA work through one MPS server and answer with the model's numbers,
and SIGTERM leaves no daemon behind that it started; tritonclient's cuda_shared_memory regions
(created in the client process) are registered over HTTP and gRPC and carry inputs and outputs;
two PyTorch instances on one GPU answer concurrent requests correctly. Skipped with the reason
where there is no GPU (this project's CI); run on the lent H100.
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
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # concurrency.py, beside the serving tests
from concurrency import concurrently  # noqa: E402

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA GPU (none here; runs on the lent GPU)")


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> tuple[Path, object]:
    """A small torch.export program (dynamic batch) and the module it came from (the reference)."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

        def forward(self, x):
            return self.body(x)

    torch.manual_seed(0)
    net = Net().eval()
    ep = torch.export.export(net, (torch.randn(2, 64),), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=256)},))
    path = tmp_path_factory.mktemp("gpu12") / "mlp.pt2"
    torch.export.save(ep, str(path))
    return path, net


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(args: list[str]) -> tuple[subprocess.Popen, list[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("NGCX_RUNTIME_MPS", None)
    proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env, start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def _wait_for(lines: list[str], proc: subprocess.Popen, mark: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not any(mark in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.2)


def _infer_json(url: str, x: np.ndarray) -> np.ndarray:
    import requests

    doc = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = requests.post(f"{url}/v2/models/mlp/infer", json=doc, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _stop(proc: subprocess.Popen, lines: list[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(120) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@needs_gpu
def test_mps_processes_share_the_gpu_and_answer_with_the_models_numbers(pt2, tmp_path):
    import shutil

    import torch

    from ngcx_runtime import mps

    if shutil.which(mps.MPS_CONTROL) is None:
        pytest.skip(f"{mps.MPS_CONTROL} is not installed on this GPU host")
    path, net = pt2
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"] = str(pipe), str(log)
    try:
        port = _free_port()
        proc, lines = _serve([str(path), "--port", str(port), "--mps", "2", "--name", "mlp"])
        try:
            _wait_for(lines, proc, "all 2 processes are serving")
            assert any("MPS daemon started" in line for line in lines), lines[:3]
            servers = mps.control("get_server_list", pipe, log).split()
            assert servers and all(s.isdigit() for s in servers), f"no MPS server: {servers}"
            clients = mps.control(f"get_client_list {servers[0]}", pipe, log).split()
            assert len(clients) >= 2, f"the MPS server has clients {clients}: both processes use the GPU through it"
            x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
            with torch.no_grad():
                want = net(torch.from_numpy(x)).numpy()
            for _ in range(8):                      # new connections: both processes answer
                np.testing.assert_allclose(_infer_json(f"http://127.0.0.1:{port}", x), want, rtol=1e-3, atol=1e-3)
            report = {"servers": servers, "clients": clients, "lines": [line for line in lines if "MPS" in line]}
            (Path(os.environ.get("NGCX_GPU_REPORT_DIR", tmp_path)) / "mps_proof.json").write_text(json.dumps(report))
        finally:
            _stop(proc, lines)
        assert not mps.daemon_running(pipe), "the daemon this server started is stopped with it"
    finally:
        os.environ.pop("CUDA_MPS_PIPE_DIRECTORY")
        os.environ.pop("CUDA_MPS_LOG_DIRECTORY")


@needs_gpu
def test_cuda_shared_memory_with_tritonclients_utilities_over_http_and_grpc(pt2):
    import base64

    import requests
    import torch

    grpcclient = pytest.importorskip("tritonclient.grpc")
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    path, net = pt2
    port, gport = _free_port(), _free_port()
    proc, lines = _serve([str(path), "--port", str(port), "--grpc-port", str(gport), "--name", "mlp"])
    url = f"http://127.0.0.1:{port}"
    handles = []
    try:
        _wait_for(lines, proc, "serving model 'mlp'")
        meta = requests.get(f"{url}/v2", timeout=30).json()
        assert "cuda_shared_memory" in meta["extensions"], meta
        x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        rin = cudashm.create_shared_memory_region("in", x.nbytes, 0)
        rout = cudashm.create_shared_memory_region("out", 4 * 10 * 4, 0)
        handles += [rin, rout]
        cudashm.set_shared_memory_region(rin, [x])
        # HTTP registration (tritonclient.http sends exactly this body)
        for name, region, size in (("in", rin, x.nbytes), ("out", rout, 160)):
            body = {"raw_handle": {"b64": cudashm.get_raw_handle(region).decode()}, "device_id": 0, "byte_size": size}
            r = requests.post(f"{url}/v2/cudasharedmemory/region/{name}/register", json=body, timeout=30)
            assert r.status_code == 200, r.text
        status = requests.get(f"{url}/v2/cudasharedmemory/status", timeout=30).json()
        assert {s["name"]: s["byte_size"] for s in status} == {"in": x.nbytes, "out": 160}
        doc = {"inputs": [{"name": "x", "shape": [4, 64], "datatype": "FP32",
                           "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": x.nbytes}}],
               "outputs": [{"name": list(_outputs(url))[0],
                            "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 160}}]}
        r = requests.post(f"{url}/v2/models/mlp/infer", json=doc, timeout=30)
        assert r.status_code == 200, r.text
        got = cudashm.get_contents_as_numpy(rout, np.float32, [4, 10])
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        # past the end and unknown regions are 400s, the server keeps serving
        doc["inputs"][0]["parameters"]["shared_memory_offset"] = 64
        assert "lie past its end" in requests.post(f"{url}/v2/models/mlp/infer", json=doc, timeout=30).text
        requests.post(f"{url}/v2/cudasharedmemory/unregister", timeout=30)
        # the same through tritonclient.grpc
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{gport}")
        client.register_cuda_shared_memory("gin", cudashm.get_raw_handle(rin), 0, x.nbytes)
        client.register_cuda_shared_memory("gout", cudashm.get_raw_handle(rout), 0, 160)
        assert set(client.get_cuda_shared_memory_status(as_json=True)["regions"]) == {"gin", "gout"}
        cudashm.set_shared_memory_region(rout, [np.zeros((4, 10), np.float32)])
        inp = grpcclient.InferInput("x", [4, 64], "FP32")
        inp.set_shared_memory("gin", x.nbytes)
        out = grpcclient.InferRequestedOutput(list(_outputs(url))[0])
        out.set_shared_memory("gout", 160)
        client.infer("mlp", [inp], outputs=[out])
        np.testing.assert_allclose(cudashm.get_contents_as_numpy(rout, np.float32, [4, 10]), want, rtol=1e-3,
                                   atol=1e-3)
        client.unregister_cuda_shared_memory()
        assert client.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
        bad = {"raw_handle": {"b64": base64.b64encode(b"\0" * 64).decode()}, "device_id": 0, "byte_size": 8}
        r = requests.post(f"{url}/v2/cudasharedmemory/region/bad/register", json=bad, timeout=30)
        assert r.status_code == 400 and "cannot open the CUDA IPC handle" in r.json()["error"], r.text
        np.testing.assert_allclose(_infer_json(url, x), want, rtol=1e-3, atol=1e-3)
    finally:
        for h in handles:
            cudashm.destroy_shared_memory_region(h)
        _stop(proc, lines)


def _outputs(url: str) -> list[str]:
    import requests

    return [o["name"] for o in requests.get(f"{url}/v2/models/mlp", timeout=30).json()["outputs"]]


@needs_gpu
def test_two_pytorch_instances_on_one_gpu_answer_concurrent_requests(pt2, tmp_path):
    import torch

    from ngcx_runtime.optimize import OptimizeOptions, optimize
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    path, net = pt2
    res = optimize(path, tmp_path / "plan", OptimizeOptions(precision="fp32", batch_profile=[1, 8]),
                   backend="pytorch")
    engines = [load(res.plan_dir, device=0), load(res.plan_dir, device=0)]
    handle = start_server(engines, "127.0.0.1", 0, name="mlp", max_queue_delay_ms=2)
    try:
        config = json.loads(_get(f"{handle.url}/v2/models/mlp/config"))
        assert config["instance_group"] == [{"name": "mlp", "kind": "KIND_GPU", "count": 2, "gpus": [0]}]
        n = 32
        xs = [np.random.default_rng(i).standard_normal((1, 64)).astype(np.float32) for i in range(n)]
        out = concurrently(lambda i: _infer_json(handle.url, xs[i]), n, 120)
        with torch.no_grad():
            for x, y in zip(xs, out, strict=True):
                assert isinstance(y, np.ndarray), y
                np.testing.assert_allclose(y, net(torch.from_numpy(x)).numpy(), rtol=1e-3, atol=1e-3)
        assert handle.stats()["success"] == n
    finally:
        handle.stop()


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@needs_gpu
def test_system_shared_memory_at_a_full_bucket_answers_with_the_models_numbers(tmp_path):
    """16 x 131072 FP32 (8 MB) through /dev/shm fills the plan's largest bucket: the server reads it into its
    page-locked buffer and the engine sends it to the GPU from there (issue 24, item 3). The answers are the
    model's, three requests after one another on each of four connections at once."""
    import requests
    import torch

    from ngcx_runtime.optimize import OptimizeOptions, optimize
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    torch.manual_seed(0)
    net = torch.nn.Linear(131072, 4).eval()
    batch = torch.export.Dim("b", min=1, max=16)
    ep = torch.export.export(net, (torch.randn(2, 131072),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(tmp_path / "wide.pt2"))
    res = optimize(tmp_path / "wide.pt2", tmp_path / "plan", OptimizeOptions(precision="fp32", batch_profile=[4, 16]),
                   backend="pytorch")
    engine = load(res.plan_dir, device=0)
    handle = start_server([engine], "127.0.0.1", 0, name="wide", max_queue_delay_ms=1)
    keys = [f"ngcxt_pinned_{os.getpid()}_{i}" for i in range(4)]

    def one(i: int) -> tuple[np.ndarray, list[np.ndarray]]:
        x = np.random.default_rng(i).standard_normal((16, 131072)).astype(np.float32)
        (Path("/dev/shm") / keys[i]).write_bytes(x.tobytes())
        session = requests.Session()
        done = session.post(f"{handle.url}/v2/systemsharedmemory/region/r{i}/register",
                            json={"key": "/" + keys[i], "offset": 0, "byte_size": x.nbytes}, timeout=60)
        assert done.status_code == 200, done.text
        doc = {"inputs": [{"name": engine.inputs[0].name, "shape": list(x.shape), "datatype": "FP32",
                           "parameters": {"shared_memory_region": f"r{i}", "shared_memory_byte_size": x.nbytes}}]}
        outs = []
        for _ in range(3):
            done = session.post(f"{handle.url}/v2/models/wide/infer", json=doc, timeout=60)
            assert done.status_code == 200, done.text
            out = done.json()["outputs"][0]
            outs.append(np.asarray(out["data"], np.float32).reshape(out["shape"]))
        return x, outs

    try:
        results = concurrently(one, 4, 180)
        assert not [r for r in results if not isinstance(r, tuple)], results
        with torch.no_grad():
            for x, outs in results:
                want = net(torch.from_numpy(x)).numpy()
                for got in outs:
                    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2)
    finally:
        handle.stop()
        for key in keys:
            (Path("/dev/shm") / key).unlink(missing_ok=True)
