"""Triton's system shared-memory extension (issue 12, item 4) and its bad input (item 8).

What a user notices: tritonclient's own shared_memory utilities create /dev/shm regions, the
server registers them, reads inputs from and writes outputs into them (results equal ONNX
Runtime's, also merged under concurrency and across a repository of two models); a region that
does not exist, is too small, is addressed past its end, or shrinks after registering is a 4xx
and never takes the server down; peers that are not on this host are refused.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import models
import numpy as np
import pytest
from concurrency import concurrently

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
requests = pytest.importorskip("requests")

from tritonclient.utils import InferenceServerException  # noqa: E402

from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_repository, start_server  # noqa: E402

TIMEOUT = 30
PREFIX = f"/ngcx_test_{os.getpid()}_"


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def client_of(handle, host: str = "127.0.0.1") -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"{host}:{handle.port}", connection_timeout=TIMEOUT,
                                            network_timeout=TIMEOUT)


class Regions:
    """Shared memory objects made with tritonclient's own library, destroyed at the end."""

    def __init__(self):
        self.handles = []

    def make(self, tag: str, size: int):
        handle = shm.create_shared_memory_region(tag, PREFIX + tag, size)
        self.handles.append(handle)
        return handle

    def close(self):
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture()
def regions():
    made = Regions()
    yield made
    made.close()


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    return models.mlp(tmp_path_factory.mktemp("shm") / "mlp.onnx")


@pytest.fixture()
def server(mlp_path):
    handle = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", max_batch=16,
                          max_queue_delay_ms=200)
    yield handle
    handle.stop()


def shm_infer(client, model: str, in_name: str, out_name: str, x: np.ndarray, regions: Regions, tag: str,
              out_bytes: int) -> np.ndarray:
    """Input through one region, output through another, as tritonclient's shm examples do."""
    rin = regions.make(f"{tag}_in", x.nbytes)
    rout = regions.make(f"{tag}_out", out_bytes)
    shm.set_shared_memory_region(rin, [x])
    client.register_system_shared_memory(f"{tag}_in", PREFIX + f"{tag}_in", x.nbytes)
    client.register_system_shared_memory(f"{tag}_out", PREFIX + f"{tag}_out", out_bytes)
    inp = httpclient.InferInput(in_name, list(x.shape), "FP32")
    inp.set_shared_memory(f"{tag}_in", x.nbytes)
    out = httpclient.InferRequestedOutput(out_name, binary_data=True)
    out.set_shared_memory(f"{tag}_out", out_bytes)
    res = client.infer(model, [inp], outputs=[out])
    meta = res.get_output(out_name)        # Triton's shm examples read this, then the region
    assert meta["parameters"]["shared_memory_region"] == f"{tag}_out"
    assert "data" not in meta and "binary_data_size" not in meta["parameters"], "not in the body"
    return shm.get_contents_as_numpy(rout, np.float32, meta["shape"])


def test_tritonclient_infers_through_shared_memory_both_ways(server, mlp_path, regions):
    client = client_of(server)
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    x = models.sample_inputs("mlp", 3)["x"]
    y = shm_infer(client, "mlp", "x", "y", x, regions, "a", 3 * 10 * 4)
    np.testing.assert_allclose(y, reference(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status["a_in"] == {"name": "a_in", "key": PREFIX + "a_in", "offset": 0, "byte_size": x.nbytes}
    assert set(status) == {"a_in", "a_out"}
    # input from shared memory, output in the body (binary), at an offset inside a larger region
    big = regions.make("big", 4096)
    shm.set_shared_memory_region(big, [x], offset=1024)
    client.register_system_shared_memory("big", PREFIX + "big", 2048, offset=512)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_shared_memory("big", x.nbytes, offset=512)
    got = client.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, reference(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    client.unregister_system_shared_memory("a_in")
    assert {r["name"] for r in client.get_system_shared_memory_status()} == {"a_out", "big"}
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_concurrent_shared_memory_requests_are_merged_and_each_gets_its_own_answer(server, mlp_path, regions):
    n = 6
    xs = [models.sample_inputs("mlp", 2, seed=20 + i)["x"] for i in range(n)]
    results = concurrently(lambda i: shm_infer(client_of(server), "mlp", "x", "y", xs[i], regions, f"c{i}",
                                               2 * 10 * 4), n, TIMEOUT)
    for x, y in zip(xs, results, strict=True):
        assert isinstance(y, np.ndarray), y
        np.testing.assert_allclose(y, reference(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    s = server.stats()
    assert s["success"] == n and s["engine_calls"] < n, s


def test_a_repository_of_two_models_through_shared_memory(tmp_path, regions):
    conv = models.conv_net(tmp_path / "repo" / "conv" / "1" / "model.onnx")
    mlp = models.mlp(tmp_path / "repo" / "mlp" / "1" / "model.onnx")
    handle = start_repository(tmp_path / "repo", "127.0.0.1", 0)
    try:
        assert handle.wait_loaded(TIMEOUT)
        client = client_of(handle)
        x = models.sample_inputs("conv", 2)["input"]
        got = shm_infer(client, "conv", "input", "logits", x, regions, "conv", 2 * 10 * 4)
        np.testing.assert_allclose(got, reference(conv, {"input": x})["logits"], rtol=1e-5, atol=1e-5)
        v = models.sample_inputs("mlp", 1)["x"]
        got = shm_infer(client, "mlp", "x", "y", v, regions, "mlp", 10 * 4)
        np.testing.assert_allclose(got, reference(mlp, {"x": v})["y"], rtol=1e-5, atol=1e-5)
    finally:
        handle.stop()


# -- bad input: one keep-alive session, then good requests --

def _in(region: str, size: int, offset: int | None = None, **extra) -> dict:
    params = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset is not None:
        params["shared_memory_offset"] = offset
    return {"name": "x", "shape": [1, 32], "datatype": "FP32", "parameters": params, **extra}


def _req(inp: dict, outputs: list | None = None) -> bytes:
    doc: dict = {"inputs": [inp]}
    if outputs is not None:
        doc["outputs"] = outputs
    return json.dumps(doc).encode()


def _reg(key, byte_size=128, offset=None, **extra) -> bytes:
    doc = {"key": key, "byte_size": byte_size, **extra}
    if offset is not None:
        doc["offset"] = offset
    return json.dumps(doc).encode()


REG = "/v2/systemsharedmemory/region/{}/register"
INFER = "/v2/models/mlp/infer"
OUT_SMALL = [{"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 8}}]
OUT_PAST = [{"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 40,
                                         "shared_memory_offset": 100}}]
BAD = [
    ("no-such-object", "POST", REG.format("r1"), _reg(PREFIX + "missing"), 400, "no shared memory object"),
    ("traversal-key", "POST", REG.format("r1"), _reg("/../../etc/passwd"), 400, "must name a shared-memory object"),
    ("slash-key", "POST", REG.format("r1"), _reg("a/b"), 400, "must name a shared-memory object"),
    ("key-not-string", "POST", REG.format("r1"), _reg(5), 400, "must name a shared-memory object"),
    ("too-big", "POST", REG.format("r1"), _reg(PREFIX + "in", byte_size=1 << 20), 400, "which has only 128 bytes"),
    ("offset-past", "POST", REG.format("r1"), _reg(PREFIX + "in", byte_size=64, offset=100), 400,
     "which has only 128 bytes"),
    ("zero-size", "POST", REG.format("r1"), _reg(PREFIX + "in", byte_size=0), 400, "'byte_size' must be an integer"),
    ("negative-offset", "POST", REG.format("r1"), _reg(PREFIX + "in", offset=-1), 400, "'offset' must be an integer"),
    ("size-string", "POST", REG.format("r1"), _reg(PREFIX + "in", byte_size="128"), 400, "'byte_size' must be"),
    ("unknown-field", "POST", REG.format("r1"), _reg(PREFIX + "in", device_id=0), 400, "unknown register field"),
    ("not-json", "POST", REG.format("r1"), b"{", 400, "malformed JSON"),
    ("duplicate", "POST", REG.format("in"), _reg(PREFIX + "in"), 400, "'in' is already registered"),
    ("unregister-unknown", "POST", "/v2/systemsharedmemory/region/nope/unregister", b"", 400,
     "no shared memory region 'nope'"),
    ("status-unknown", "GET", "/v2/systemsharedmemory/region/nope/status", b"", 404, "no shared memory region"),
    ("register-get", "GET", REG.format("r1"), b"", 405, "use POST"),
    ("status-post", "POST", "/v2/systemsharedmemory/status", b"", 405, "use GET"),
    ("unknown-shm-path", "GET", "/v2/systemsharedmemory/regions", b"", 404, "unknown path"),
    ("cuda", "POST", "/v2/cudasharedmemory/region/g/register", b"{}", 400, "CUDA shared memory is not available"),
    ("infer-unknown-region", "POST", INFER, _req(_in("nope", 128)), 400, "no shared memory region 'nope'"),
    ("infer-size-mismatch", "POST", INFER, _req(_in("in", 64)), 400,
     "shared_memory_byte_size 64 does not match shape [1, 32] FP32 (128 bytes)"),
    ("infer-offset-past", "POST", INFER, _req(_in("in", 128, offset=8)), 400, "lie past its end (128 bytes"),
    ("infer-offset-junk", "POST", INFER, _req(_in("in", 128, offset="8")), 400,
     "shared_memory_offset must be a non-negative integer"),
    ("infer-region-number", "POST", INFER, _req(_in(7, 128)), 400, "shared_memory_region must be a string"),
    ("infer-shm-and-data", "POST", INFER, _req(_in("in", 128, data=[0.0] * 32)), 400, "also carries data"),
    ("output-too-small", "POST", INFER, _req(_in("in", 128), OUT_SMALL), 400,
     "needs 40 bytes but shared_memory_byte_size is 8"),
    ("output-past-end", "POST", INFER, _req(_in("in", 128), OUT_PAST), 400, "lie past its end"),
]


def test_bad_shared_memory_requests_are_4xx_and_the_server_keeps_serving(server, mlp_path, regions):
    x = models.sample_inputs("mlp", 1)["x"]
    rin = regions.make("in", 128)
    shm.set_shared_memory_region(rin, [x])
    regions.make("out", 128)
    client = client_of(server)
    client.register_system_shared_memory("in", PREFIX + "in", 128)
    client.register_system_shared_memory("out", PREFIX + "out", 128)
    session = requests.Session()
    failures = []
    for case, method, path, body, status, fragment in BAD:
        r = session.request(method, f"{server.url}{path}", data=body, timeout=TIMEOUT)
        try:
            msg = r.json()["error"]
        except (ValueError, KeyError):
            msg = f"<no error: {r.text[:80]!r}>"
        if r.status_code != status or fragment not in msg or "\n" in msg:
            failures.append(f"{case}: got {r.status_code} {msg!r}, want {status} containing {fragment!r}")
    assert not failures, "\n".join(failures)
    assert {r["name"] for r in client.get_system_shared_memory_status()} == {"in", "out"}
    inp = httpclient.InferInput("x", [1, 32], "FP32")
    inp.set_shared_memory("in", 128)
    np.testing.assert_allclose(client.infer("mlp", [inp]).as_numpy("y"), reference(mlp_path, {"x": x})["y"],
                               rtol=1e-5, atol=1e-5)


def test_an_object_shrunk_after_registering_is_a_400_not_a_crash(server, regions):
    """mmap would die of SIGBUS here; the server reads with pread and answers 400."""
    regions.make("shrink", 128)
    client = client_of(server)
    client.register_system_shared_memory("shrink", PREFIX + "shrink", 128)
    os.truncate(f"/dev/shm/{(PREFIX + 'shrink').lstrip('/')}", 16)
    inp = httpclient.InferInput("x", [1, 32], "FP32")
    inp.set_shared_memory("shrink", 128)
    with pytest.raises(InferenceServerException, match="it shrank after registering") as err:
        client.infer("mlp", [inp])
    assert err.value.status() == "400"
    assert client.is_server_live()
    ok = httpclient.InferInput("x", [1, 32], "FP32")
    ok.set_data_from_numpy(models.sample_inputs("mlp", 1)["x"])
    assert client.infer("mlp", [ok]).as_numpy("y").shape == (1, 10)


def test_shared_memory_off_refuses_every_use(mlp_path, regions):
    handle = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", shared_memory="off")
    try:
        regions.make("off", 128)
        client = client_of(handle)
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException, match="disabled on this server"):
            client.register_system_shared_memory("off", PREFIX + "off", 128)
        r = requests.post(f"{handle.url}{INFER}", data=_req(_in("off", 128)), timeout=TIMEOUT)
        assert r.status_code == 400 and "does not offer the system shared memory extension" in r.json()["error"]
    finally:
        handle.stop()


def _outward_ip() -> str | None:
    """This host's non-loopback address (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_local_policy_refuses_peers_that_are_not_on_loopback(mlp_path, regions):
    ip = _outward_ip()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    handle = start_server(load(mlp_path, backend="onnxruntime"), "0.0.0.0", 0, name="mlp")
    try:
        regions.make("peer", 128)
        local, remote = client_of(handle), client_of(handle, ip)
        with pytest.raises(InferenceServerException, match="only for clients on this host") as err:
            remote.register_system_shared_memory("peer", PREFIX + "peer", 128)
        assert err.value.status() == "403"
        local.register_system_shared_memory("peer", PREFIX + "peer", 128)
        r = requests.post(f"http://{ip}:{handle.port}{INFER}", data=_req(_in("peer", 128)), timeout=TIMEOUT)
        assert r.status_code == 403, r.text
        inp = httpclient.InferInput("x", [1, 32], "FP32")
        inp.set_shared_memory("peer", 128)
        assert local.infer("mlp", [inp]).as_numpy("y").shape == (1, 10)
    finally:
        handle.stop()


def test_reused_read_buffers_never_mix_requests(server, mlp_path, regions):
    """A serving thread reuses its input buffers across requests (shm.py, _buffer): requests of
    shrinking and growing sizes on one connection, each answered with its own numbers."""
    client = client_of(server)
    region = regions.make("reuse", 4 * 32 * 4)
    client.register_system_shared_memory("reuse", PREFIX + "reuse", 4 * 32 * 4)
    for i, batch in enumerate((4, 1, 3, 2, 4)):
        x = models.sample_inputs("mlp", batch, seed=60 + i)["x"]
        shm.set_shared_memory_region(region, [x])
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_shared_memory("reuse", x.nbytes)
        got = client.infer("mlp", [inp]).as_numpy("y")
        np.testing.assert_allclose(got, reference(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_large_read_buffers_are_offered_for_page_locking_page_aligned_and_once(monkeypatch):
    """Inputs of PIN_MIN_BYTES or more are read into a page-aligned buffer that is offered to the GPU side for
    page-locking once (shm.py, _buffer; CudaSharedMemory.pin_host), smaller ones never; without a GPU
    (this host) pin_host declines and the buffer is still used."""
    from ngcx_runtime import cuda_shm
    from ngcx_runtime import shm as server_shm

    monkeypatch.delattr(server_shm._BUFFERS, "pool", raising=False)    # this thread's pool starts empty
    offered: list[tuple[int, int, bool]] = []

    def pin(view: np.ndarray, owner: np.ndarray) -> bool:
        offered.append((view.ctypes.data, view.nbytes, view.base is owner))
        return False

    small = server_shm._buffer(0, server_shm.PIN_MIN_BYTES - 1, pin)
    big = server_shm._buffer(1, server_shm.PIN_MIN_BYTES, pin)
    again = server_shm._buffer(1, server_shm.PIN_MIN_BYTES - 4096, pin)   # reused: not offered again
    assert small.nbytes == server_shm.PIN_MIN_BYTES - 1 and again is big
    assert len(offered) == 1
    ptr, size, owned = offered[0]
    assert size == server_shm.PIN_MIN_BYTES and ptr % server_shm.PAGE == 0 and owned and ptr == big.ctypes.data
    if not cuda_shm.CudaSharedMemory().available():                         # no GPU: declined, nothing pinned
        owner = np.empty(server_shm.PIN_MIN_BYTES, np.uint8)
        assert cuda_shm.CudaSharedMemory().pin_host(owner, owner) is False
