"""Property-based tests of the HTTP framing of `ngcx-runtime serve`, in-process and live (issue 8, item 2).

Why: framing decides where the next request on a keep-alive connection starts, so a lenient
parse is request smuggling and a hang is a denial of service. In-process, hypothesis drives
framing.request_framing (headers parsed by http.client, as the server does) and
framing.read_chunked over io.BytesIO: valid chunked encodings decode to their payload without
reading past their end; mutated ones raise only ProtocolError / ConnectionError. Live, random
bytes and mutated valid requests go to a real server on 127.0.0.1: it never answers 5xx to
them, never hangs, keeps answering a correct request (checked against ONNX Runtime) on a new
connection after each, and its thread count returns to baseline. Pipelining, HTTP/1.0 and
`Expect: 100-continue` are checked as plain examples. The atheris harness (fuzz_atheris.py)
runs here as a bounded subprocess.
"""

from __future__ import annotations

import gzip
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import models
import numpy as np
import pytest
import rawhttp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ngcx_runtime.framing import LINE_MAX, FramingError, read_chunked, request_framing
from ngcx_runtime.protocol import ProtocolError

ort = pytest.importorskip("onnxruntime")

from ngcx_runtime.codings import decompress  # noqa: E402
from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

INFER = "/v2/models/mlp/infer"
LIMIT_MB = 0.05
LIMIT = int(LIMIT_MB * 2**20)
TRIED: Counter = Counter()
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LIVE = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
ALLOWED_5XX = {501, 505}     # RFC refusals of an unsupported method / HTTP version / transfer coding


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    for name, n in sorted(TRIED.items()):
        print(f"\nfuzz-http: {name}: {n} inputs tried")


def headers_of(lines: list[tuple[str, str]]) -> http.client.HTTPMessage:
    raw = "".join(f"{k}: {v}\r\n" for k, v in lines).encode("latin-1") + b"\r\n"
    return http.client.parse_headers(io.BytesIO(raw))


# -- request_framing --

HEADER_VALUE = st.one_of(
    st.integers(0, 10**20).map(str),
    st.sampled_from(["-5", "+5", "1_0", "0x10", " 7 ", "\t7", "5, 5", "5,6", "", ",", "1e3", "07", "chunked",
                     "gzip, chunked", "chunked, gzip", "Chunked", " chunked ", "identity", "xchunked", "chunked,"]),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\r\n:"), max_size=24),
)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["Content-Length", "Transfer-Encoding", "content-length",
                                           "TRANSFER-ENCODING", "Host"]), HEADER_VALUE), max_size=4))
@example([("Content-Length", "-5")])
@example([("Transfer-Encoding", "chunke" + "2], 0.5" * 800)])     # atheris: the whole header was quoted
@example([("Content-Length", ",".join(map(str, range(2000))))])
@example([("Content-Length", "\u00b2")])
@example([("Transfer-Encoding", "chunked"), ("Content-Length", "3")])
def test_request_framing_is_strict_or_refuses(lines):
    """A length is digits only and all lengths agree; chunked is the only (last) coding; else FramingError."""
    TRIED["request_framing headers"] += 1
    headers = headers_of(lines)
    lengths = [p for v in headers.get_all("Content-Length") or [] for p in v.split(",")]
    codings = [c.strip().lower() for v in headers.get_all("Transfer-Encoding") or [] for c in v.split(",")]
    try:
        framing = request_framing(headers)
    except FramingError as exc:
        assert exc.status in (400, 501) and "\n" not in exc.message and len(exc.message) < 300
        return
    if codings:
        assert framing.chunked and codings == ["chunked"] and framing.close == bool(lengths)
        return
    assert not framing.chunked
    assert all(p.strip(" \t").isascii() and p.strip(" \t").isdigit() for p in lengths), lengths
    assert {int(p) for p in lengths} <= {framing.length} and (lengths or framing.length == 0)


# -- read_chunked --

@st.composite
def chunked_bodies(draw) -> tuple[bytes, bytes]:
    """(payload, a valid chunked encoding of it) with random chunk sizes, extensions and trailers."""
    payload = draw(st.binary(max_size=2048))
    out, i = [], 0
    while i < len(payload):
        n = draw(st.integers(1, max(1, len(payload) - i)))
        size = format(n, draw(st.sampled_from(["x", "X"]))).rjust(draw(st.integers(0, 4)), "0")
        ext = draw(st.sampled_from(["", ";a=b", ";x", ' ; q="1"']))
        out.append(f"{size}{ext}\r\n".encode() + payload[i:i + n] + b"\r\n")
        i += n
    trailers = draw(st.lists(st.sampled_from([b"X-T: 1\r\n", b"Checksum: abc\r\n"]), max_size=3))
    return payload, b"".join(out) + b"0\r\n" + b"".join(trailers) + b"\r\n"


@FAST
@given(chunked_bodies(), st.binary(max_size=64))
def test_a_valid_chunked_body_decodes_and_stops_at_its_end(body, after):
    """The decoded bytes are the payload, and nothing of the next request is consumed."""
    TRIED["read_chunked round trip"] += 1
    payload, encoded = body
    rfile = io.BytesIO(encoded + after)
    assert read_chunked(rfile, 1 << 20, "1 MB") == payload
    assert rfile.tell() == len(encoded)


@st.composite
def mutated_chunked(draw) -> bytes:
    _, data = draw(chunked_bodies())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip" and pos < len(data):
            data = data[:pos] + bytes([data[pos] ^ draw(st.integers(1, 255))]) + data[pos + 1:]
        elif op == "insert":
            data = data[:pos] + draw(st.sampled_from([b"-", b"+", b"_", b" ", b"\r\n", b";", b"ffffffffffffffff",
                                                      b"0\r\n\r\n", b"x" * 2000])) + data[pos:]
        elif op == "delete":
            data = data[:pos] + data[pos + draw(st.integers(1, 8)):]
        else:
            data = data[:pos]
    return data


@FAST
@given(st.one_of(mutated_chunked(), st.binary(max_size=512)))
@example(b"-5\r\nhello\r\n0\r\n\r\n")
@example(b"5\r\nhello" + b"x" * 5000)
@example(b"0\r\n" + b"T: 1\r\n" * 40 + b"\r\n")
@example(b"fffffffffffffff\r\n")
def test_a_mutated_chunked_body_fails_cleanly_within_its_bytes(data):
    """Only ProtocolError (framing, 413) or ConnectionError (the bytes ran out); never past the data."""
    TRIED["read_chunked mutated / random"] += 1
    rfile = io.BytesIO(data)
    start = time.monotonic()
    try:
        out = read_chunked(rfile, 4096, "4 KB")
    except ProtocolError as exc:
        assert exc.status in (400, 413) and "\n" not in exc.message
    except ConnectionError:
        pass
    else:
        assert len(out) <= 4096
    assert rfile.tell() <= len(data) and time.monotonic() - start < 2.0
    assert LINE_MAX < 4096


# -- Content-Encoding (codings.decompress) --

def compress(payload: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(payload)
    if coding == "deflate":
        return zlib.compress(payload)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)         # raw deflate, as some clients send it
    return c.compress(payload) + c.flush()


@FAST
@given(st.binary(max_size=4096), st.sampled_from(["gzip", "deflate", "raw deflate"]), st.integers(0, 64))
@example(b"x" * 100, "gzip", 10)          # a cut-off stream was accepted as the bytes zlib had so far
def test_a_compressed_body_decodes_whole_or_is_refused(payload, coding, cut):
    """Only a complete stream within the limit decodes (to the payload); a truncated one is a 400."""
    TRIED["Content-Encoding bodies (valid, truncated)"] += 1
    data = compress(payload, coding)
    data = data[:len(data) - cut] if cut else data
    encoding = "gzip" if coding == "gzip" else "deflate"
    try:
        out = decompress(memoryview(data), encoding, 1 << 20, "1 MB")
    except ProtocolError as exc:
        assert exc.status == 400 and cut, (exc.message, cut)
        return
    assert out == payload


@FAST
@given(st.binary(max_size=512), st.sampled_from(["gzip", "deflate"]))
@example(gzip.compress(b"\0" * (1 << 22)), "gzip")    # a 4 MB bomb against a 64 KB limit
def test_random_or_bomb_compressed_bodies_are_a_clean_4xx(data, encoding):
    TRIED["Content-Encoding random / bombs"] += 1
    try:
        out = decompress(memoryview(data), encoding, 64 * 1024, "64 KB")
    except ProtocolError as exc:
        assert exc.status in (400, 413)
        return
    assert len(out) <= 64 * 1024


# -- a live server --

@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    return models.mlp(tmp_path_factory.mktemp("fuzz-http") / "mlp.onnx")


@pytest.fixture(scope="module")
def session(mlp_path):
    return ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def server(mlp_path):
    handle = start_server(load(mlp_path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp",
                          max_batch=8, max_queue_delay_ms=0, max_body_mb=LIMIT_MB)
    handle.baseline_threads = threading.active_count()
    yield handle
    handle.stop()


def json_request(seed: int, batch: int = 1, headers: dict[str, str] | None = None) -> tuple[bytes, np.ndarray]:
    x = models.sample_inputs("mlp", batch, seed)["x"]
    body = rawhttp.infer_json("mlp", {"x": x.ravel().tolist()}, {"x": [batch, 32]})
    return rawhttp.request("POST", INFER, body, headers), x


def binary_request(seed: int, batch: int = 1) -> tuple[bytes, np.ndarray]:
    x = models.sample_inputs("mlp", batch, seed)["x"]
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [batch, 32],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}).encode()
    return rawhttp.request("POST", INFER, head + x.tobytes(),
                           {"Inference-Header-Content-Length": str(len(head))}), x


def assert_correct(resp: rawhttp.Response, x: np.ndarray, session) -> None:
    assert resp.status == 200, (resp.status, resp.body[:200])
    got = np.asarray(resp.json()["outputs"][0]["data"], dtype=np.float32)
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0].ravel(), rtol=1e-5, atol=1e-6)


def assert_still_serving(server, session, seed: int = 3) -> None:
    raw, x = json_request(seed)
    ex = rawhttp.exchange(server.port, raw, expect=1, total=10.0)
    assert len(ex.responses) == 1, ex
    assert_correct(ex.responses[0], x, session)


def baseline_threads(before: int, bound_s: float = 5.0) -> int:
    """Thread count once idle connections are gone (polled up to bound_s)."""
    deadline = time.monotonic() + bound_s
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return threading.active_count()


def send_and_read(port: int, raw: bytes, half_close: bool) -> rawhttp.Exchange:
    """Send raw; read whatever comes back within a short idle bound; then close our side."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:                          # the server already answered and closed
            pass
        return rawhttp.read_responses(s, idle=0.25, total=5.0)


@st.composite
def mutated_requests(draw) -> bytes:
    raw = draw(st.sampled_from([json_request(1)[0], binary_request(2)[0],
                                json_request(4, headers={"Transfer-Encoding": "chunked"})[0].replace(
                                    b"Content-Length", b"X-Was-Length")]))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "header"]))
        if op == "flip" and pos < len(raw):
            raw = raw[:pos] + bytes([raw[pos] ^ draw(st.integers(1, 255))]) + raw[pos + 1:]
        elif op == "insert":
            raw = raw[:pos] + draw(st.binary(min_size=1, max_size=16)) + raw[pos:]
        elif op == "delete":
            raw = raw[:pos] + raw[pos + draw(st.integers(1, 64)):]
        elif op == "truncate":
            raw = raw[:pos]
        else:
            name = draw(st.sampled_from(["Content-Length", "Transfer-Encoding", "Expect", "Content-Encoding",
                                         "Inference-Header-Content-Length", "Connection", "Accept-Encoding"]))
            value = draw(HEADER_VALUE)
            raw = raw.replace(b"\r\n", f"\r\n{name}: {value}\r\n".encode("latin-1"), 1)
    return raw


@LIVE
@given(st.one_of(mutated_requests(), st.binary(max_size=300)), st.booleans())
@example(b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n", False)
@example(b"GET / HTTP/2.0\r\n\r\n", True)
@example(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", True)          # a TLS ClientHello
@example(b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: 40\r\n\r\n{\"inputs\":", True)
@example(b"POST /v2/models/" + b"m" * 20000 + b"/infer HTTP/1.1\r\nContent-Length: 0\r\n\r\n", False)
@example(b"GET /v2/models/mlp%0A%0Dx/versions/1%0A HTTP/1.1\r\n\r\n", True)
@example(b"GET /" + b"p" * 20000 + b" HTTP/1.1\r\n\r\n", True)
@example(b"GET / HTTP/1.1" + b"v" * 20000 + b"\r\n\r\n", True)
@example(b"GET / HTTP/1.1 " + b"w " * 5000 + b"\r\n\r\n", True)
def test_a_malformed_request_never_gets_a_5xx_and_the_server_keeps_serving(server, session, raw, half_close):
    """Also: every refusal is {"error": one line of bounded length}, whatever the peer sent."""
    TRIED["live: mutated requests / random bytes, then a correct request"] += 1
    ex = send_and_read(server.port, raw, half_close)
    bad = [r.status for r in ex.responses if r.status >= 500 and r.status not in ALLOWED_5XX]
    assert not bad, (raw[:300], [(r.status, r.body[:200]) for r in ex.responses])
    for r in ex.responses:
        if r.status >= 400:
            error = r.json()["error"]
            assert isinstance(error, str) and "\n" not in error and len(error) <= 600, (r.status, error[:300])
    assert_still_serving(server, session)


def test_threads_return_to_baseline_after_the_fuzzing(server, session):
    """Runs after the live property (file order): every connection thread has ended."""
    for seed in range(20):
        send_and_read(server.port, json_request(seed)[0][:-7], half_close=True)   # vanish mid-body
    assert_still_serving(server, session)
    after = baseline_threads(server.baseline_threads)
    print(f"\nfuzz-http: threads {server.baseline_threads} at start, {after} after the fuzzing")
    assert after == server.baseline_threads


# -- pipelining, HTTP/1.0, Expect --

def test_pipelined_requests_are_answered_in_order(server, session):
    reqs = [json_request(s) if s % 2 else binary_request(s) for s in range(8)]
    ex = rawhttp.exchange(server.port, b"".join(raw for raw, _ in reqs), expect=len(reqs), total=20.0)
    assert len(ex.responses) == len(reqs), ex
    for resp, (_, x) in zip(ex.responses, reqs, strict=True):
        assert_correct(resp, x, session)


def test_an_http_1_0_request_is_answered_and_closed(server, session):
    raw, x = json_request(5)
    raw = raw.replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    ex = rawhttp.exchange(server.port, raw, idle=5.0)
    assert len(ex.responses) == 1 and ex.closed, ex
    assert_correct(ex.responses[0], x, session)


def test_chunked_http_1_0_is_answered_and_closed_even_with_keep_alive(server, session):
    """RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing; close after it."""
    raw, x = json_request(7, headers={"Connection": "keep-alive"})
    head, body = raw.split(b"\r\n\r\n", 1)
    head = head.replace(b"HTTP/1.1", b"HTTP/1.0", 1).replace(b"Content-Length", b"Transfer-Encoding", 1)
    head = head.replace(f"Transfer-Encoding: {len(body)}".encode(), b"Transfer-Encoding: chunked")
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    ex = rawhttp.exchange(server.port, head + b"\r\n\r\n" + chunked + rawhttp.request("GET", "/v2"), idle=5.0)
    assert len(ex.responses) == 1 and ex.closed, ex
    assert_correct(ex.responses[0], x, session)


def test_expect_100_continue_gets_100_then_the_answer(server, session):
    raw, x = json_request(6, headers={"Expect": "100-continue"})
    head, body = raw.split(b"\r\n\r\n", 1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + b"\r\n\r\n")
        interim = rawhttp.read_responses(s, idle=5.0, expect=1)
        assert [r.status for r in interim.responses] == [100], interim
        s.sendall(body)
        final = rawhttp.read_responses(s, idle=5.0, expect=1)
    assert len(final.responses) == 1, final
    assert_correct(final.responses[0], x, session)


# -- atheris --

def libfuzzer_escape(token: str) -> str:
    """A libFuzzer dictionary entry: printable ASCII as is, the rest (and quote, backslash) as \\xNN."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\x{ord(c):02X}" for c in token)


def test_the_atheris_harness_finds_no_crash(tmp_path):
    """fuzz_atheris.py drives framing + protocol parsing in-process; a crash is a non-zero exit."""
    pytest.importorskip("atheris")
    harness = Path(__file__).with_name("fuzz_atheris.py")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, raw in enumerate([json_request(1)[0], binary_request(2)[0]]):
        (corpus / f"seed{i}").write_bytes(raw)
    tokens = ['"binary_data_size"', '"binary_data"', '"binary_data_output"', '"parameters"', '"shape"',
              '"datatype"', '"data"', '"inputs"', '"outputs"', '"name"', '"x"', '"a"', '"b"', '"FP32"', '"INT64"',
              '"FP16"', "Transfer-Encoding: chunked\r\n", "Content-Length: ", "Inference-Header-Content-Length: ",
              "\r\n0\r\n\r\n", "NaN", "1e999", "-1", "[[[["]
    (tmp_path / "http.dict").write_text("".join(f'"{libfuzzer_escape(t)}"\n' for t in tokens))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, str(harness), "-runs=400000", "-max_total_time=20", "-seed=1",
                           f"-dict={tmp_path}/http.dict",
                           f"-artifact_prefix={tmp_path}/", str(corpus)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    tail = (proc.stdout + proc.stderr)[-3000:]
    done = [ln for ln in tail.splitlines() if ln.startswith("Done ")]
    print(f"\nfuzz-http: atheris: {done[-1] if done else 'no summary'}")
    assert proc.returncode == 0, tail
