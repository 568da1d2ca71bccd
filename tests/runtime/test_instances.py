"""Model instances (--instances, Triton's instance_group) and several server processes behind one
port (--processes, --mps) (issue 12, item 3).

What a user notices: N instances run N requests at once (a handler that takes 0.3 s answers four
clients in about 0.3 s instead of 1.2 s), each answer still correct and counted once; a repository
config's instance_group is honoured and reported by /config; `--processes N` spreads connections
over N processes on one port and stops them all on SIGTERM; where MPS cannot run, `--mps` is one
line and exit 2 before anything starts. MPS itself needs a GPU: tests/gpu/test_serve_mps_cuda_shm_instances.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import models
import numpy as np
import pytest
from concurrency import concurrently
from keyring import ADMIN, ADMIN_KEY, USER, USER_KEY

ort = pytest.importorskip("onnxruntime")
requests = pytest.importorskip("requests")

from ngcx_runtime import mps  # noqa: E402
from ngcx_runtime.keys import sha256_hex  # noqa: E402
from ngcx_runtime.serve import load_engine, start_loading, start_repository  # noqa: E402

TIMEOUT = 60
REPO = Path(__file__).resolve().parents[2]
SLOW = '''
import os, threading, time
import numpy as np

class Slow:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    outputs = [{"name": "who", "datatype": "INT64", "shape": [-1, 1]}]

    def load(self, context):
        self.tag = id(self) % 100000

    def predict(self, inputs):
        if float(inputs["x"].ravel()[0]) >= 0:      # the warm-up (zeros) is quick
            time.sleep(0.3) if inputs["x"].ravel()[0] > 0 else None
        return {"who": np.full((len(inputs["x"]), 1), self.tag, np.int64)}
'''


def infer(url: str, x: float) -> int:
    doc = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}
    r = requests.post(f"{url}/v2/models/slow/infer", json=doc, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][0]


def concurrent(url: str, n: int) -> tuple[float, list[int]]:
    t0 = time.monotonic()
    who = concurrently(lambda i: infer(url, 1.0), n, TIMEOUT)
    return time.monotonic() - t0, who


@pytest.mark.parametrize("instances", [1, 4])
def test_n_instances_run_n_requests_at_once(tmp_path, instances):
    (tmp_path / "slowmod.py").write_text(SLOW)

    def loader(device=None):
        return load_engine(None, handler="slowmod:Slow", app_dir=tmp_path, name="slow", device=device)

    handle = start_loading(loader, "127.0.0.1", 0, name="slow", max_batch=1, devices=(None,) * instances)
    try:
        assert handle.wait_loaded(TIMEOUT), handle.load_error
        seconds, who = concurrent(handle.url, 4)
        assert len(set(who)) == instances, who          # every instance served, each answer from one of them
        if instances == 1:
            assert seconds >= 1.15, seconds             # 4 x 0.3 s, one after another
        else:
            assert seconds < 0.9, seconds               # side by side (0.3 s plus overhead)
        s = handle.stats()
        assert s["success"] == 4 and s["engine_calls"] >= 4, s
        config = requests.get(f"{handle.url}/v2/models/slow/config", timeout=TIMEOUT).json()
        assert config["instance_group"] == [{"name": "slow", "kind": "KIND_CPU", "count": instances, "gpus": []}]
    finally:
        handle.stop()


def test_a_repository_config_instance_group_serves_correct_merged_answers(tmp_path):
    path = models.mlp(tmp_path / "repo" / "mlp" / "1" / "model.onnx")
    (tmp_path / "repo" / "mlp" / "config.json").write_text(json.dumps({
        "max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 20000},
        "instance_group": [{"count": 3, "kind": "KIND_CPU"}]}))
    models.conv_net(tmp_path / "repo" / "conv" / "1" / "model.onnx")
    handle = start_repository(tmp_path / "repo", "127.0.0.1", 0, devices=(None, None))   # conv: --instances 2
    try:
        assert handle.wait_loaded(TIMEOUT), handle.load_error
        config = requests.get(f"{handle.url}/v2/models/mlp/config", timeout=TIMEOUT).json()
        assert config["instance_group"] == [{"name": "mlp", "kind": "KIND_CPU", "count": 3, "gpus": []}]
        conv = requests.get(f"{handle.url}/v2/models/conv/config", timeout=TIMEOUT).json()
        assert conv["instance_group"][0]["count"] == 2
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        n = 24
        xs = [models.sample_inputs("mlp", 1, seed=i)["x"] for i in range(n)]

        def call(i: int) -> np.ndarray | str:
            doc = {"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": xs[i].ravel().tolist()}]}
            r = requests.post(f"{handle.url}/v2/models/mlp/infer", json=doc, timeout=TIMEOUT)
            return np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 10) if r.ok else r.text

        out = concurrently(call, n, TIMEOUT)
        for x, y in zip(xs, out, strict=True):
            assert isinstance(y, np.ndarray), y
            np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
        s = handle.stats("mlp")
        assert s["success"] == n and s["engine_calls"] < n, s
    finally:
        handle.stop()


def serve_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NGCX_RUNTIME_MPS"}
    return subprocess.run([sys.executable, "-m", "ngcx_runtime.serve", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


@pytest.mark.parametrize("flags, fragment", [
    (["--instances", "0"], "--instances 0 must be at least 1"),
    (["--gpus", "zero"], "--gpus 'zero': give distinct GPU indices"),
    (["--gpus", "0,0"], "--gpus '0,0': give distinct GPU indices"),
    (["--processes", "0"], "--processes 0 must be at least 1"),
    (["--processes", "2", "--mps", "2"], "give --mps N or --processes N, not both"),
])
def test_bad_instance_flags_are_one_line_and_exit_2(tmp_path, flags, fragment):
    path = models.mlp(tmp_path / "mlp.onnx")
    proc = serve_cli(str(path), "--port", "0", *flags)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr


@pytest.mark.parametrize(("value", "threads"), [("3", 3), ("", 0), ("0", 0), ("four", 0), ("-2", 0)])
def test_onnx_runtime_takes_its_thread_pool_size_from_omp_num_threads(tmp_path, monkeypatch, value, threads):
    """ONNX Runtime ignores OMP_NUM_THREADS by itself; a child of --processes N relies on it (0: one per core)."""
    from ngcx_runtime.backends import onnxruntime as ort_backend

    models.mlp(tmp_path / "model.onnx")
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    engine = ort_backend.load_model(tmp_path / "model.onnx", gpu=False, name="mlp")
    assert engine._sess.get_session_options().intra_op_num_threads == threads


@pytest.mark.skipif(mps.gpu_present(), reason="this host has a GPU: the refusal is for hosts without one")
def test_instances_on_a_gpu_without_one_fail_the_load_with_one_line(tmp_path):
    path = models.mlp(tmp_path / "mlp.onnx")
    proc = serve_cli(str(path), "--port", "0", "--gpus", "0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "an instance on GPU 0: this host has no GPU" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(mps.gpu_present(),
                    reason="this host has a GPU: MPS is proven in tests/gpu/test_serve_mps_cuda_shm_instances.py")
def test_mps_where_it_cannot_run_is_refused_with_one_line(tmp_path):
    path = models.mlp(tmp_path / "mlp.onnx")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t0 = time.monotonic()
    proc = serve_cli(str(path), "--port", str(port), "--mps", "2")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--mps: MPS is unavailable here: this host has no NVIDIA GPU" in lines[0]
    assert proc.stdout == "" and time.monotonic() - t0 < 30, "nothing started"
    env_proc = subprocess.run([sys.executable, "-m", "ngcx_runtime.serve", str(path), "--port", str(port)],
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "NGCX_RUNTIME_MPS": "3"})
    assert env_proc.returncode == 2 and "--mps: MPS is unavailable here" in env_proc.stderr, env_proc.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_processes_share_one_port_and_all_stop_on_sigterm(tmp_path):
    """... and every process gets the access settings: the keys file from the environment, the admin key
    and model control from the flags; and its share of the cores for its compute threads (runtime/mps.py:
    N pools of one thread per core cut the H100's --mps 4 batch-1 figure to an eighth)."""
    root = tmp_path / "repo"
    models.mlp(root / "mlp" / "1" / "model.onnx")
    port = _free_port()
    keys = tmp_path / "keys"
    keys.write_text(f"{sha256_hex(USER_KEY)}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NGCX_RUNTIME_MPS", "OMP_NUM_THREADS")}
    env["NGCX_RUNTIME_AUTH_KEYS"] = str(keys)
    proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.serve", str(root), "--port", str(port),
                             "--processes", "2", "--model-control-mode", "explicit", "--admin-key-sha256",
                             sha256_hex(ADMIN_KEY)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any("all 2 processes are serving" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        doc = {"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]}
        seen = []
        for _ in range(20):                     # a new connection each time: the kernel picks a process
            assert requests.post(f"{url}/v2/models/mlp/infer", json=doc, timeout=TIMEOUT).status_code == 401
            with requests.Session() as s:
                s.headers.update(USER)
                assert s.post(f"{url}/v2/models/mlp/infer", json=doc, timeout=TIMEOUT).status_code == 200
                stats = s.get(f"{url}/v2/models/mlp/stats", timeout=TIMEOUT).json()["model_stats"][0]
                seen.append(stats["inference_stats"]["success"]["count"])
        assert max(seen) < 20, f"one process answered every connection: {seen}"
        r = requests.post(f"{url}/v2/repository/models/mlp/unload", headers=ADMIN, timeout=TIMEOUT)
        assert r.status_code == 400 and "one of several processes" in r.json()["error"], r.text
        pids = {int(line.split()[0]) for line in subprocess.run(
            ["pgrep", "-f", "--", f"--port {port} --reuse-port"], capture_output=True, text=True).stdout.split()}
        assert len(pids) == 2, pids
        share = f"OMP_NUM_THREADS={max(1, len(os.sched_getaffinity(0)) // 2)}"
        for pid in pids:
            assert share in Path(f"/proc/{pid}/environ").read_text().split("\0"), share
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0, "".join(lines)
    reader.join(5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert any("[0] serve: stopped" in line for line in lines) and any("[1] serve: stopped" in line for line in lines)


@pytest.mark.skipif(mps.gpu_present(), reason="this host has a GPU: the refusal is for hosts without one")
def test_ngcx_run_mps_without_a_gpu_is_refused_before_docker_runs():
    import shutil

    docker = pytest.importorskip("docker")
    try:
        docker.from_env().images.get("ngcx/base:bookworm")
    except Exception as exc:  # noqa: BLE001 - no engine or no image here: nothing to run against
        pytest.skip(f"no local ngcx/base:bookworm image ({type(exc).__name__})")
    ngcx = shutil.which("ngcx", path=str(Path(sys.executable).parent))
    proc = subprocess.run([ngcx, "run", "--mps", "2", "ngcx/base:bookworm", "--", "true"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PATH": f"/usr/bin:{os.environ['PATH']}"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--mps needs the GPU" in proc.stderr and "drop --mps" in proc.stderr, proc.stderr
