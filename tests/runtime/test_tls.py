"""TLS on every port (--tls-cert / --tls-key) with a self-signed certificate made here, pinned by its SHA-256.

What a client notices: the HTTP port (stdlib transport and uvicorn), the gRPC port and the metrics
port all speak TLS 1.2 or later with the one certificate, whose fingerprint the client checks; keys
travel inside it. What an attacker notices: a plain-HTTP request to a TLS port gets no answer, a
client that connects and says nothing is dropped after the handshake timeout, and neither stops
the server or keeps a connection slot for long.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import ssl
import threading
import time
import warnings

import models
import numpy as np
import pytest
from certs import peer_fingerprint, pinning_context, self_signed
from keyring import KEYS, USER, USER_KEY

from ngcx_runtime import tls
from ngcx_runtime.access import AccessConfig

pytest.importorskip("onnxruntime")
pytest.importorskip("cryptography")

from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

TIMEOUT = 30
INFER = json.dumps({"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]})


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return load(models.mlp(tmp_path_factory.mktemp("tls-model") / "mlp.onnx"), backend="onnxruntime")


def tls_access(pem, base: AccessConfig = KEYS) -> AccessConfig:
    cert, key, _ = pem
    return AccessConfig(**{**base.__dict__, "tls_cert": str(cert), "tls_key": str(key)})


@pytest.fixture(scope="module", params=["stdlib", "uvicorn"])
def server(request, pem, engine):
    if request.param == "uvicorn":
        pytest.importorskip("uvicorn")
    handle = start_server(engine, "127.0.0.1", 0, name="mlp", grpc_port=0, metrics_port=0, access=tls_access(pem),
                          transport=request.param)
    handle.transport = request.param
    yield handle
    handle.stop()


def https(port: int) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT, context=pinning_context())


def get(conn: http.client.HTTPSConnection, method: str, path: str, body: str | None = None,
        headers: dict | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    return r.status, r.read()


def test_https_serves_with_the_pinned_certificate_and_the_key_inside(server, pem):
    assert server.url.startswith("https://") and server.metrics_url.startswith("https://")
    conn = https(server.port)
    assert get(conn, "GET", "/v2/health/ready") == (200, b'{"ready":true}')
    assert peer_fingerprint(conn.sock) == pem[2]
    assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
    assert get(conn, "GET", "/v2/models/mlp")[0] == 401
    for _ in range(5):                                   # keep-alive: one TLS connection, many requests
        status, body = get(conn, "POST", "/v2/models/mlp/infer", INFER, USER)
        assert status == 200 and json.loads(body)["outputs"][0]["shape"] == [1, 10]
    conn.close()


def test_tls_below_1_2_is_refused(server, pem):
    assert tls.server_context(pem[0], pem[1]).minimum_version == ssl.TLSVersion.TLSv1_2
    if server.transport == "uvicorn":
        assert server._server.server.config.ssl.minimum_version == ssl.TLSVersion.TLSv1_2, "uvicorn got ours"
    ctx = pinning_context()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as raw, \
            pytest.raises((ssl.SSLError, OSError)), ctx.wrap_socket(raw) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100) == b""


def test_the_metrics_port_speaks_tls(server, pem):
    port = int(server.metrics_url.rsplit(":", 1)[1].split("/")[0])
    conn = https(port)
    conn.connect()
    assert peer_fingerprint(conn.sock) == pem[2]
    status, body = get(conn, "GET", "/metrics")
    assert status == 401 and USER_KEY not in body.decode()
    conn = https(port)
    status, body = get(conn, "GET", "/metrics", headers=USER)
    assert status == 200 and b"nv_inference_request_success" in body


def test_grpc_speaks_tls_with_the_same_certificate(server, pem):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    import grpc
    from tritonclient.utils import InferenceServerException

    if server.transport == "uvicorn":
        pytest.skip("the gRPC port is the same whichever HTTP transport runs beside it: checked once")
    presented = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", server.grpc_port)))
    assert hashlib.sha256(presented).hexdigest() == pem[2], "the gRPC port presents the same certificate"
    client = grpcclient.InferenceServerClient(server.grpc_target, ssl=True, root_certificates=str(pem[0]))
    assert client.is_server_live()
    with pytest.raises(InferenceServerException) as exc:
        client.get_server_metadata()
    assert exc.value.status() == "StatusCode.UNAUTHENTICATED"
    inp = grpcclient.InferInput("x", [1, 32], "FP32")
    inp.set_data_from_numpy(np.full((1, 32), 0.5, np.float32))
    result = client.infer("mlp", [inp], headers={"authorization": f"Bearer {USER_KEY}"})
    assert result.as_numpy("y").shape == (1, 10)
    client.close()
    plain = grpc.insecure_channel(server.grpc_target)            # a plaintext client gets no service
    with pytest.raises(grpc.FutureTimeoutError):
        grpc.channel_ready_future(plain).result(timeout=2)
    plain.close()


def _plain_http(port: int) -> bytes:
    """A plain-HTTP request to a TLS port: what comes back before the server closes (or resets) it."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        try:
            while chunk := s.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
    return got


def test_a_plain_http_client_gets_nothing_and_the_server_keeps_serving(server):
    port = int(server.metrics_url.rsplit(":", 1)[1].split("/")[0])
    for target in (server.port, port):
        for _ in range(20):
            start = time.monotonic()
            answer = _plain_http(target)
            assert b"HTTP/" not in answer and b"live" not in answer, answer[:80]
            assert time.monotonic() - start < 4, "the connection is closed at once, not after a timeout"
    conn = https(server.port)
    assert get(conn, "GET", "/v2/health/live")[0] == 200
    assert get(conn, "POST", "/v2/models/mlp/infer", INFER, USER)[0] == 200


def test_silent_clients_are_dropped_after_the_handshake_timeout_and_hold_no_slot(pem, engine, monkeypatch):
    """Three connection slots, three clients that connect and say nothing: after the handshake timeout
    the slots are free again and a real client is served (stdlib transport; uvicorn handshakes on
    its event loop, where a silent client holds no thread)."""
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT_S", 0.5)
    handle = start_server(engine, "127.0.0.1", 0, name="mlp", max_connections=3, access=tls_access(pem),
                          transport="stdlib")
    try:
        silent = [socket.create_connection(("127.0.0.1", handle.port), timeout=TIMEOUT) for _ in range(3)]
        start = time.monotonic()
        for s in silent:
            s.settimeout(5)
            assert s.recv(100) == b"", "the server closes a connection that never handshakes"
        assert time.monotonic() - start < 3
        for s in silent:
            s.close()
        results: list[int] = []

        def client() -> None:
            conn = https(handle.port)
            results.append(get(conn, "POST", "/v2/models/mlp/infer", INFER, USER)[0])
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert results == [200, 200, 200]
        assert len(handle._app.connections) <= 3
    finally:
        handle.stop()
    deadline = time.monotonic() + 5
    while handle._app.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle._app.connections, "every connection, TLS or accepted, left the count"


def test_without_tls_flags_nothing_changes(engine):
    handle = start_server(engine, "127.0.0.1", 0, name="mlp")
    try:
        assert handle.url.startswith("http://")
        conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=TIMEOUT)
        conn.request("GET", "/v2/models/mlp")
        assert conn.getresponse().status == 200, "no key configured: open, as before"
    finally:
        handle.stop()
