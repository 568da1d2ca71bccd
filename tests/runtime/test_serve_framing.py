"""Request framing of `ngcx-runtime serve` as an attacker drives it (issue 8, RFC 9112 §6).

What a user notices: a request whose body boundary is ambiguous is answered with one 4xx and
the connection closes, so nothing smuggled inside it is ever run; an oversized body is refused
before the client uploads it; a pathological JSON body is a 400, never a 500; and after every
bad request the server still answers a correct one with the engine's own numbers.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import models
import numpy as np
import pytest
import rawhttp

ort = pytest.importorskip("onnxruntime")

from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

LIMIT_MB = 0.05                          # 52,428 bytes: small, so "far over the limit" is cheap
INFER = "/v2/models/mlp/infer"
STATS = "/v2/models/mlp/stats"


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    return models.mlp(tmp_path_factory.mktemp("framing") / "mlp.onnx")


@pytest.fixture(scope="module")
def server(mlp_path):
    handle = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp",
                          max_batch=8, max_queue_delay_ms=0, max_body_mb=LIMIT_MB)
    yield handle
    handle.stop()


def good_body(seed: int = 0) -> tuple[bytes, np.ndarray]:
    """A valid JSON request and the output ONNX Runtime computes for it directly."""
    x = models.sample_inputs("mlp", 1, seed)["x"]
    return rawhttp.infer_json("mlp", {"x": x.ravel().tolist()}, {"x": [1, 32]}), x


def expected(mlp_path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def assert_still_serving(server, mlp_path: Path) -> None:
    body, x = good_body(seed=7)
    ex = rawhttp.exchange(server.port, rawhttp.request("POST", INFER, body), expect=1)
    assert [r.status for r in ex.responses] == [200], ex
    got = np.asarray(ex.responses[0].json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(got, expected(mlp_path, x).ravel(), rtol=1e-5, atol=1e-6)


def smuggled() -> bytes:
    """A request hidden inside another's body: if it is ever answered, framing was lenient."""
    return rawhttp.request("GET", STATS)


# -- Content-Length --

@pytest.mark.parametrize("value", ["-5", "+5", "1_0", "0x10", " 1 0", "5, 6", "\u00b2", "1e2",
                                   "99999999999999999999999"])
def test_a_content_length_that_is_not_plain_digits_is_a_400_and_closes(server, mlp_path, value):
    """RFC 9112 §6.3: anything but digits is unrecoverable. A negative length once re-ran the
    connection's previous body and then parsed the real body as a second request."""
    first, _ = good_body()
    attack = smuggled()
    raw = (rawhttp.request("POST", INFER, first)
           + rawhttp.request("POST", INFER, attack, {"Content-Length": value}))
    ex = rawhttp.exchange(server.port, raw)
    statuses = [r.status for r in ex.responses]
    assert statuses == [200, 400], (value, statuses)
    assert "Content-Length" in ex.responses[1].json()["error"]
    assert ex.closed, "the connection must close: the body boundary is unknown"
    assert_still_serving(server, mlp_path)


def test_identical_repeated_content_lengths_are_one_length(server):
    body, _ = good_body()
    n = str(len(body))
    ex = rawhttp.exchange(server.port, rawhttp.request("POST", INFER, body, {"Content-Length": f"{n}, {n}"}),
                          expect=1)
    assert [r.status for r in ex.responses] == [200]


# -- Transfer-Encoding --

def _chunked(payload: bytes, size_line: str | None = None) -> bytes:
    return f"{size_line or format(len(payload), 'x')}\r\n".encode() + payload + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize(("coding", "status"), [("xchunked", 400), ("chunked, gzip", 400),
                                                 ("gzip, chunked", 501), ("identity", 400)])
def test_a_transfer_encoding_other_than_chunked_is_refused_and_closes(server, mlp_path, coding, status):
    """`"chunked" in value` once took `xchunked` for chunked: a front proxy would disagree."""
    body, _ = good_body()
    ex = rawhttp.exchange(server.port, rawhttp.request("POST", INFER, _chunked(body) + smuggled(),
                                                       {"Transfer-Encoding": coding}))
    assert [r.status for r in ex.responses] == [status], (coding, ex)
    assert "Transfer-Encoding" in ex.responses[0].json()["error"]
    assert ex.closed
    assert_still_serving(server, mlp_path)


def test_chunked_with_a_content_length_uses_chunked_and_closes(server, mlp_path):
    """RFC 9112 §6.3 item 3: Transfer-Encoding overrides Content-Length; the connection closes."""
    body, x = good_body()
    raw = rawhttp.request("POST", INFER, _chunked(body) + smuggled(),
                          {"Transfer-Encoding": "chunked", "Content-Length": "3"})
    ex = rawhttp.exchange(server.port, raw)
    assert [r.status for r in ex.responses] == [200] and ex.closed
    got = np.asarray(ex.responses[0].json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(got, expected(mlp_path, x).ravel(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size_line", ["-5", "+5", "0x5", "1_0", " ", "5 5", "f" * 20])
def test_a_malformed_chunk_size_is_a_400_and_closes(server, mlp_path, size_line):
    """int(x, 16) took `-5`, after which read(-5) waited for the client to close."""
    raw = rawhttp.request("POST", INFER, _chunked(b"hello", size_line) + smuggled(),
                          {"Transfer-Encoding": "chunked"})
    ex = rawhttp.exchange(server.port, raw, idle=3.0)
    assert [r.status for r in ex.responses] == [400], (size_line, ex)
    assert "chunk size" in ex.responses[0].json()["error"] and ex.closed
    assert_still_serving(server, mlp_path)


def test_a_chunk_longer_than_its_size_is_a_400(server, mlp_path):
    raw = rawhttp.request("POST", INFER, b"2\r\nhello\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"})
    ex = rawhttp.exchange(server.port, raw)
    assert [r.status for r in ex.responses] == [400] and "CRLF" in ex.responses[0].json()["error"]
    assert ex.closed
    assert_still_serving(server, mlp_path)


# -- oversized bodies --

def test_an_oversized_declared_body_is_refused_before_the_upload(server):
    """A client that waits for the answer before sending its body (no Expect header) once hung:
    the server read and discarded the whole declared body before answering 413."""
    declared = 10 * int(LIMIT_MB * 2**20)           # below the old 16x discard bound
    head = rawhttp.request("POST", INFER, b"", {"Content-Length": str(declared)})
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head)                             # headers only; the body never comes
        ex = rawhttp.read_responses(s, idle=5.0, total=10.0)
    assert [r.status for r in ex.responses] == [413], ex
    assert "exceeds the limit" in ex.responses[0].json()["error"] and ex.closed


def test_an_oversized_body_still_uploading_gets_the_413_not_a_reset(server, mlp_path):
    """The answer goes out first; the upload is then drained (bounded) so no reset destroys it."""
    declared = 4 * int(LIMIT_MB * 2**20)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(rawhttp.request("POST", INFER, b"", {"Content-Length": str(declared)}))
        s.sendall(b"0" * declared)
        ex = rawhttp.read_responses(s, idle=5.0, total=10.0)
    assert [r.status for r in ex.responses] == [413] and ex.closed
    assert_still_serving(server, mlp_path)


# -- pathological JSON --

@pytest.mark.parametrize("body", [
    b"[" * 200_000,
    b'{"inputs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [[[[[[1]]]]]], "data": [0]}]}).encode(),
], ids=["deep-array", "deep-inputs", "nested-shape"])
def test_deeply_nested_json_is_a_400_not_a_500(mlp_path, body):
    big = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", max_batch=8)
    try:
        ex = rawhttp.exchange(big.port, rawhttp.request("POST", INFER, body))
        assert [r.status for r in ex.responses] == [400], ex
        error = ex.responses[0].json()["error"]
        assert len(error) < 300, error
        assert_still_serving(big, mlp_path)
    finally:
        big.stop()


def test_deeply_nested_data_is_a_400(server, mlp_path):
    data: list = [0.0]
    for _ in range(60):
        data = [data]
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 32], "data": data}]}).encode()
    ex = rawhttp.exchange(server.port, rawhttp.request("POST", INFER, body))
    assert [r.status for r in ex.responses] == [400], ex
    assert_still_serving(server, mlp_path)


# -- connection limit --

def test_connections_past_the_limit_get_a_503_and_the_server_recovers(mlp_path):
    """Idle or slow clients (slowloris) hold one thread each: past --max-connections a new one is
    answered 503 at once and closed, instead of another thread; when they leave, service resumes."""
    limited = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", max_batch=8,
                           max_connections=3)
    try:
        holders = [socket.create_connection(("127.0.0.1", limited.port), timeout=10) for _ in range(3)]
        for s in holders:                               # slowloris: half a request line each, then nothing
            s.sendall(b"POST /v2/models/mlp/inf")
        with socket.create_connection(("127.0.0.1", limited.port), timeout=10) as extra:
            ex = rawhttp.read_responses(extra, idle=5.0, total=10.0)
        assert [r.status for r in ex.responses] == [503] and ex.closed, ex
        assert "--max-connections" in ex.responses[0].json()["error"]
        for s in holders:
            s.close()
        deadline = time.monotonic() + 10                # their threads see the close and let go
        while limited._app.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_still_serving(limited, mlp_path)
    finally:
        limited.stop()


# -- the header block (runtime/headers.py) --

@pytest.mark.parametrize("line", [b"no colon here", b"Transfer-Encoding : chunked", b" folded: x"])
def test_a_malformed_header_line_is_a_400_and_closes(server, mlp_path, line):
    """The email parser the stdlib used took such a line as the end of the headers: the Content-Length
    after it was lost, and the body (here a smuggled request) was read as the next request."""
    attack = smuggled()
    raw = (rawhttp.request("POST", INFER, good_body()[0])
           + b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n" + line
           + f"\r\nContent-Length: {len(attack)}\r\n\r\n".encode() + attack)
    ex = rawhttp.exchange(server.port, raw)
    assert [r.status for r in ex.responses] == [200, 400], ex
    assert "NAME: VALUE" in ex.responses[1].json()["error"]
    assert ex.closed, "the connection must close: where the request ends is unknown"
    assert_still_serving(server, mlp_path)


def test_every_answer_carries_the_current_date(server):
    """The Date header (RFC 9110 §6.6.1) is formatted once a second and shared by the connections' threads."""
    from email.utils import parsedate_to_datetime

    for _ in range(3):
        before = time.time()
        ex = rawhttp.exchange(server.port, rawhttp.request("GET", "/v2/health/live") * 2, expect=2)
        for response in ex.responses:
            sent = parsedate_to_datetime(response.headers["date"]).timestamp()
            assert int(before) <= sent <= time.time(), (before, response.headers["date"])
        time.sleep(0.4)
