"""`ngcx-runtime serve` over real sockets with a real ONNX Runtime engine.

What a user notices: stock tritonclient (binary tensors, JSON tensors) and plain HTTP/JSON get
the same numbers ONNX Runtime computes directly; concurrent requests are merged into fewer
engine calls; every bad request gets one clear {"error": ...} and the server keeps serving.
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
from pathlib import Path

import models
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
requests = pytest.importorskip("requests")

from ngcx_runtime.serve import ServeError, start_server  # noqa: E402

TIMEOUT = 30  # seconds, for every client call


# -- models and engines --


def add_mul_model(path: Path) -> Path:
    """Two inputs a, b [N, -1] -> sum = a + b, prod = a * b. Width is free, so requests of
    different widths must never be merged, and mismatched widths make ORT itself fail."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])],
        "add_mul",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", "W"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", "W"]),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", "W"]),
            helper.make_tensor_value_info("prod", TensorProto.FLOAT, ["N", "W"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def cast_model(path: Path, batch_dim: str | int = "N") -> Path:
    """x INT64 [batch, 4] -> y = Cast(x, FP16): non-FP32 types on the wire, both directions."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)],
        "cast",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [batch_dim, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [batch_dim, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def load_engine(path: Path):
    """The runtime's own loader (plan.load) on a raw .onnx: a real ONNX Runtime engine."""
    from ngcx_runtime.plan import load

    return load(path, backend="onnxruntime")


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """ONNX Runtime run directly, without the server."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def conv_path(tmp_path_factory) -> Path:
    return models.conv_net(tmp_path_factory.mktemp("serve") / "conv.onnx")


@pytest.fixture(scope="module")
def addmul_path(tmp_path_factory) -> Path:
    return add_mul_model(tmp_path_factory.mktemp("serve") / "addmul.onnx")


@pytest.fixture(scope="module")
def conv_server(conv_path):
    handle = start_server(load_engine(conv_path), "127.0.0.1", 0, max_batch=64, max_queue_delay_ms=1)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def addmul_server(addmul_path):
    """Long queue delay so concurrent requests reliably meet; small body limit for the 413 case."""
    handle = start_server(
        load_engine(addmul_path), "127.0.0.1", 0, name="addmul", max_batch=16, max_queue_delay_ms=300, max_body_mb=0.05
    )
    yield handle
    handle.stop()


def triton(handle) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(
        f"127.0.0.1:{handle.port}", connection_timeout=TIMEOUT, network_timeout=TIMEOUT
    )


# -- health and metadata through tritonclient --


def test_tritonclient_health_and_metadata(conv_server):
    c = triton(conv_server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("conv")
    assert c.is_model_ready("conv", "1") and not c.is_model_ready("conv", "2")
    assert not c.is_model_ready("no-such-model")
    assert c.get_model_repository_index() == [{"name": "conv", "version": "1", "state": "READY"}]
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    meta = c.get_model_metadata("conv")
    assert meta["name"] == "conv" and meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    stats = c.get_inference_statistics("conv")["model_stats"][0]
    assert stats["name"] == "conv" and stats["version"] == "1" and "inference_stats" in stats
    config = c.get_model_config("conv")
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [3, 16, 16]


# -- inference: tritonclient binary, tritonclient JSON, raw JSON, raw binary --


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_tritonclient_binary_infer_matches_onnxruntime(conv_server, conv_path, compression):
    x = models.sample_inputs("conv", 5, seed=1)["input"]
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)  # binary_data=True: tritonclient's default
    res = triton(conv_server).infer(
        "conv",
        [inp],
        request_id="req-7",
        request_compression_algorithm=compression,
        response_compression_algorithm=compression,
    )
    np.testing.assert_allclose(
        res.as_numpy("logits"), reference(conv_path, {"input": x})["logits"], rtol=1e-5, atol=1e-5
    )
    resp = res.get_response()
    assert resp["id"] == "req-7" and resp["outputs"][0]["parameters"]["binary_data_size"] == 5 * 10 * 4


def test_tritonclient_json_infer_matches_onnxruntime(conv_server, conv_path):
    x = models.sample_inputs("conv", 3, seed=2)["input"]
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    out = httpclient.InferRequestedOutput("logits", binary_data=False)
    res = triton(conv_server).infer("conv", [inp], outputs=[out], model_version="1")
    assert "data" in res.get_response()["outputs"][0]
    np.testing.assert_allclose(
        res.as_numpy("logits"), reference(conv_path, {"input": x})["logits"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_raw_http_json_infer(conv_server, conv_path, layout):
    x = models.sample_inputs("conv", 2, seed=3)["input"]
    data = x.reshape(-1).tolist() if layout == "flat" else x.tolist()
    body = {"id": "abc", "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": data}]}
    r = requests.post(f"{conv_server.url}/v2/models/conv/infer", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["id"] == "abc" and doc["model_name"] == "conv"
    if layout == "flat":  # the same body, streamed (Transfer-Encoding: chunked)
        raw = json.dumps(body).encode()
        chunked = requests.post(
            f"{conv_server.url}/v2/models/conv/infer",
            timeout=TIMEOUT,
            data=(raw[i : i + 1000] for i in range(0, len(raw), 1000)),
        )
        assert chunked.status_code == 200 and chunked.json() == doc, chunked.text
    (out,) = doc["outputs"]
    assert out["name"] == "logits" and out["shape"] == [2, 10] and out["datatype"] == "FP32"
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, reference(conv_path, {"input": x})["logits"], rtol=1e-5, atol=1e-5)


def test_raw_binary_gzip_both_ways_and_output_selection(addmul_server, addmul_path):
    """A hand-built binary request, gzip-compressed, asking for one output in binary."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 2.0, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}}
                for n in ("a", "b")
            ],
            "outputs": [{"name": "prod", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = gzip.compress(header + a.tobytes() + b.tobytes())
    r = requests.post(
        f"{addmul_server.url}/v2/models/addmul/infer",
        data=body,
        timeout=TIMEOUT,
        headers={
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Encoding": "gzip",
            "Accept-Encoding": "gzip",
        },
    )
    assert r.status_code == 200, r.text
    assert r.headers["Content-Encoding"] == "gzip"  # requests has already decompressed r.content
    hlen = int(r.headers["Inference-Header-Content-Length"])
    doc = json.loads(r.content[:hlen])
    assert [o["name"] for o in doc["outputs"]] == ["prod"]
    prod = np.frombuffer(r.content[hlen:], dtype=np.float32).reshape(doc["outputs"][0]["shape"])
    np.testing.assert_array_equal(prod, reference(addmul_path, {"a": a, "b": b})["prod"])


# -- dynamic batching --


def _concurrent(fn, args_list):
    """Run fn(*args) for each args at once (a barrier releases them together); return results."""
    barrier = threading.Barrier(len(args_list), timeout=TIMEOUT)
    results: list = [None] * len(args_list)

    def worker(i, args):
        barrier.wait()
        try:
            results[i] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


def test_concurrent_requests_are_merged_into_fewer_engine_calls(conv_path):
    handle = start_server(load_engine(conv_path), "127.0.0.1", 0, max_batch=32, max_queue_delay_ms=400)
    try:
        n = 8
        xs = [models.sample_inputs("conv", 2, seed=10 + i)["input"] for i in range(n)]

        def call(x):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return triton(handle).infer("conv", [inp]).as_numpy("logits")

        outs = _concurrent(call, [(x,) for x in xs])
        for x, out in zip(xs, outs, strict=True):
            assert not isinstance(out, Exception), out
            ref = reference(conv_path, {"input": x})["logits"]
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        s = handle.stats()
        assert s["requests"] == n and s["success"] == n
        assert s["engine_calls"] < n, s
        assert max(s["batch_sizes"]) > 2 and s["batched_requests"] >= 2, s
        assert s["inferences"] == 2 * n
    finally:
        handle.stop()


def test_requests_with_different_non_batch_dims_are_not_merged(addmul_server, addmul_path):
    before = addmul_server.stats()
    widths = [3, 5, 3, 5, 3, 5]
    feeds = [{"a": np.full((1, w), i, np.float32), "b": np.full((1, w), 2, np.float32)} for i, w in enumerate(widths)]

    def call(f):
        body = {
            "inputs": [
                {"name": n, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()}
                for n, v in f.items()
            ]
        }
        return requests.post(f"{addmul_server.url}/v2/models/addmul/infer", json=body, timeout=TIMEOUT)

    results = _concurrent(call, [(f,) for f in feeds])
    for f, r in zip(feeds, results, strict=True):
        assert not isinstance(r, Exception) and r.status_code == 200, getattr(r, "text", r)
        out = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}
        ref = reference(addmul_path, f)
        np.testing.assert_array_equal(out["sum"], ref["sum"])
        np.testing.assert_array_equal(out["prod"], ref["prod"])
    after = addmul_server.stats()
    calls = after["engine_calls"] - before["engine_calls"]
    assert 2 <= calls < len(widths), after  # one call per width at best, never one mixed call


def test_request_above_max_batch_is_refused(conv_server):
    x = np.zeros((65, 3, 16, 16), np.float32)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(Exception, match="exceeds the server's max batch 64"):
        triton(conv_server).infer("conv", [inp])


def test_max_batch_above_engine_bound_is_a_clear_startup_error(conv_path):
    engine = load_engine(conv_path)
    engine.max_batch = 8
    with pytest.raises(ServeError, match="exceeds the engine's max batch 8"):
        start_server(engine, "127.0.0.1", 0, max_batch=16)


# -- robustness: a bad-input corpus on ONE keep-alive session, then a good request --


def _json_input(name="input", shape=(1, 3, 16, 16), datatype="FP32", data=None, **extra):
    n = int(np.prod(shape))
    return {
        "name": name,
        "shape": list(shape),
        "datatype": datatype,
        "data": [0.5] * n if data is None else data,
        **extra,
    }


def _req(*inputs, **top):
    return json.dumps({"inputs": list(inputs), **top}).encode()


def _binary(header: dict, payload: bytes, hlen_delta: int = 0):
    h = json.dumps(header).encode()
    return h + payload, {"Inference-Header-Content-Length": str(len(h) + hlen_delta)}


_bin_hdr = {
    "inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", "parameters": {"binary_data_size": 3072}}]
}

CONV, ADDM = "/models/conv/infer", "/models/addmul/infer"

# (case id, server, method, path suffix after /v2, body, extra headers, status, message fragment)
BAD = [
    ("malformed-json", "conv", "POST", CONV, b'{"inputs": [', {}, 400, "malformed JSON"),
    ("not-an-object", "conv", "POST", CONV, b"[1, 2]", {}, 400, "must be a JSON object"),
    ("empty-body", "conv", "POST", CONV, b"", {}, 400, "the request body is empty"),
    ("no-inputs", "conv", "POST", CONV, b'{"inputs": []}', {}, 400, "non-empty 'inputs'"),
    ("unknown-model", "conv", "POST", "/models/nope/infer", _req(_json_input()), {}, 404, "unknown model 'nope'"),
    (
        "unknown-version",
        "conv",
        "POST",
        "/models/conv/versions/7/infer",
        _req(_json_input()),
        {},
        404,
        "no version '7'",
    ),
    ("unknown-path", "conv", "GET", "/nothing/here", b"", {}, 404, "unknown path /v2/nothing/here"),
    ("outside-v2", "conv", "GET", "/../elsewhere", b"", {}, 404, "unknown path"),
    ("post-metrics", "conv", "POST", "/../metrics", b"{}", {}, 405, "method POST is not allowed on /metrics"),
    ("wrong-method", "conv", "PUT", "/models/conv", b"", {}, 405, "method PUT is not allowed"),
    (
        "unknown-input",
        "conv",
        "POST",
        CONV,
        _req(_json_input(name="image")),
        {},
        400,
        "input 'image': model 'conv' has no such input; its inputs are input",
    ),
    ("missing-input", "addmul", "POST", ADDM, _req(_json_input("a", (1, 2))), {}, 400, "missing input(s) b"),
    ("duplicate-input", "conv", "POST", CONV, _req(_json_input(), _json_input()), {}, 400, "given twice"),
    (
        "wrong-rank",
        "conv",
        "POST",
        CONV,
        _req(_json_input(shape=(1, 3, 16))),
        {},
        400,
        "has rank 3, the model expects rank 4",
    ),
    (
        "wrong-dim",
        "conv",
        "POST",
        CONV,
        _req(_json_input(shape=(1, 3, 8, 16))),
        {},
        400,
        "at dimension 2 (expected 16, got 8)",
    ),
    (
        "negative-dim",
        "conv",
        "POST",
        CONV,
        _req(_json_input(shape=(-1, 3, 16, 16), data=[])),
        {},
        400,
        "negative dimension",
    ),
    (
        "wrong-dtype",
        "conv",
        "POST",
        CONV,
        _req(_json_input(datatype="FP64")),
        {},
        400,
        "datatype FP64 does not match the model's FP32",
    ),
    (
        "bytes-dtype",
        "conv",
        "POST",
        CONV,
        _req(_json_input(datatype="BYTES")),
        {},
        400,
        "datatype BYTES is not supported",
    ),
    ("bogus-dtype", "conv", "POST", CONV, _req(_json_input(datatype="FLOAT")), {}, 400, "unknown datatype 'FLOAT'"),
    (
        "data-too-short",
        "conv",
        "POST",
        CONV,
        _req(_json_input(data=[1.0] * 5)),
        {},
        400,
        "'data' has 5 elements but shape [1, 3, 16, 16] needs 768",
    ),
    (
        "data-not-numbers",
        "conv",
        "POST",
        CONV,
        _req(_json_input(data=["x"] * 768)),
        {},
        400,
        "'data' must hold numbers (or true/false), not strings or null",
    ),
    (
        "ragged-nested",
        "addmul",
        "POST",
        ADDM,
        _req(_json_input("a", (2, 2), data=[[1, 2], [3]]), _json_input("b", (2, 2))),
        {},
        400,
        "rectangular",
    ),
    (
        "no-data",
        "conv",
        "POST",
        CONV,
        _req({"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32"}),
        {},
        400,
        "neither 'data' nor parameters.binary_data_size",
    ),
    (
        "batch-disagrees",
        "addmul",
        "POST",
        ADDM,
        _req(_json_input("a", (1, 2)), _json_input("b", (2, 2))),
        {},
        400,
        "disagree on the batch size",
    ),
    (
        "unknown-output",
        "conv",
        "POST",
        CONV,
        _req(_json_input(), outputs=[{"name": "probs"}]),
        {},
        400,
        "requested output 'probs': model 'conv' has no such output",
    ),
    (
        "binary-size-vs-shape",
        "conv",
        "POST",
        CONV,
        *_binary({"inputs": [{**_bin_hdr["inputs"][0], "parameters": {"binary_data_size": 3000}}]}, b"\0" * 3000),
        400,
        "binary_data_size 3000 does not match shape [1, 3, 16, 16] FP32 (3072 bytes)",
    ),
    (
        "binary-body-short",
        "conv",
        "POST",
        CONV,
        *_binary(_bin_hdr, b"\0" * 1000),
        400,
        "the body carries only 1000 bytes",
    ),
    (
        "binary-body-long",
        "conv",
        "POST",
        CONV,
        *_binary(_bin_hdr, b"\0" * 4000),
        400,
        "declare 3072 bytes but the body carries 4000",
    ),
    (
        "binary-without-header",
        "conv",
        "POST",
        CONV,
        json.dumps(_bin_hdr).encode(),
        {},
        400,
        "no Inference-Header-Content-Length",
    ),
    ("header-length-too-big", "conv", "POST", CONV, *_binary(_bin_hdr, b"\0" * 3072, 5000), 400, "outside the body"),
    (
        "header-length-junk",
        "conv",
        "POST",
        CONV,
        _req(_json_input()),
        {"Inference-Header-Content-Length": "ten"},
        400,
        "'ten' is not a plain decimal number",
    ),
    ("bad-gzip", "conv", "POST", CONV, b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    (
        "unknown-encoding",
        "conv",
        "POST",
        CONV,
        _req(_json_input()),
        {"Content-Encoding": "br"},
        400,
        "unsupported Content-Encoding 'br'",
    ),
    ("oversized-body", "addmul", "POST", ADDM, b"0" * 200_000, {}, 413, "exceeds the limit of 0.05 MB (52428 bytes)"),
    (
        "oversized-chunked",
        "addmul",
        "POST",
        ADDM,
        [b"0" * 30_000] * 3,
        {},
        413,
        "chunked request body exceeds the limit",
    ),
    (
        "bad-chunk-size",
        "conv",
        "POST",
        CONV,
        b"zz\r\nxx\r\n0\r\n\r\n",
        {"Transfer-Encoding": "chunked"},
        400,
        "malformed chunk size line",
    ),
    (
        "gzip-bomb",
        "addmul",
        "POST",
        ADDM,
        gzip.compress(b" " * 1_000_000),
        {"Content-Encoding": "gzip"},
        413,
        "decompressed request body exceeds the limit",
    ),
    ("empty-batch", "conv", "POST", CONV, _req(_json_input(shape=(0, 3, 16, 16), data=[])), {}, 400, "batch size 0"),
    # the repository extension on a server of one model: the index answers, load / unload refuse (model
    # control is off by default; with it on they need a repository: test_grpc.py)
    ("single-load", "conv", "POST", "/repository/models/conv/load", b"", {}, 403, "--model-control-mode none"),
    ("single-unload", "conv", "POST", "/repository/models/conv/unload", b"{}", {}, 403, "--model-control-mode none"),
    ("repo-unknown", "conv", "POST", "/repository/models/conv/delete", b"", {}, 404, "unknown path"),
    ("index-get", "conv", "GET", "/repository/index", b"", {}, 405, "use POST"),
    ("index-junk", "conv", "POST", "/repository/index", b"{", {}, 400, "malformed JSON"),
    ("extra-infer-path", "conv", "POST", "/models/conv/x/infer", _req(_json_input()), {}, 404, "unknown path"),
]


def test_bad_input_corpus_gets_clear_errors_and_server_keeps_serving(conv_server, addmul_server):
    servers = {"conv": conv_server, "addmul": addmul_server}
    session = requests.Session()  # one keep-alive connection per server across all cases
    failures = []
    for case, srv, method, path, body, headers, status, fragment in BAD:
        url = f"{servers[srv].url}/v2{path}"
        data = iter(body) if isinstance(body, list) else body  # a list goes out chunked
        r = session.request(method, url, data=data, headers=headers, timeout=TIMEOUT)
        try:
            msg = r.json()["error"]
        except ValueError:
            msg = f"<not JSON: {r.text[:80]!r}>"
        if r.status_code != status or fragment not in msg:
            failures.append(f"{case}: got {r.status_code} {msg!r}, want {status} containing {fragment!r}")
    assert not failures, "\n".join(failures)
    x = models.sample_inputs("conv", 1)["input"]
    good = session.post(
        f"{conv_server.url}/v2/models/conv/infer",
        timeout=TIMEOUT,
        json={"inputs": [_json_input(data=x.ravel().tolist())]},
    )
    assert good.status_code == 200 and good.json()["outputs"][0]["shape"] == [1, 10]
    index = session.post(f"{conv_server.url}/v2/repository/index", timeout=TIMEOUT)
    assert index.status_code == 200 and index.json() == [{"name": "conv", "version": "1", "state": "READY"}]


def test_oversized_upload_is_refused_before_the_body_with_expect_100(addmul_server):
    """curl's `Expect: 100-continue`: the 413 arrives without the client sending its body."""
    conn = http.client.HTTPConnection("127.0.0.1", addmul_server.port, timeout=TIMEOUT)
    conn.putrequest("POST", "/v2/models/addmul/infer")
    conn.putheader("Content-Length", str(10**9))
    conn.putheader("Expect", "100-continue")
    conn.endheaders()  # no body sent at all
    r = conn.getresponse()
    assert r.status == 413 and "exceeds the limit" in json.loads(r.read())["error"]


def test_garbage_on_the_socket_gets_a_v2_error_and_the_server_survives(conv_server):
    import socket

    with socket.create_connection(("127.0.0.1", conv_server.port), timeout=TIMEOUT) as s:
        s.sendall(b"\x16\x03\x01 this is not HTTP\r\n\r\n")  # e.g. a TLS client on the plain port
        chunks = []
        while chunk := s.recv(65536):  # the server closes after an unparsable request
            chunks.append(chunk)
        reply = b"".join(chunks).decode("latin-1")
    status_line, _, rest = reply.partition("\r\n")
    assert status_line.split()[1] == "400"
    assert "error" in json.loads(rest.split("\r\n\r\n", 1)[1])
    assert triton(conv_server).is_server_live()


def test_unknown_http_method_gets_v2_error(conv_server):
    conn = http.client.HTTPConnection("127.0.0.1", conv_server.port, timeout=TIMEOUT)
    conn.request("BREW", "/v2")
    r = conn.getresponse()
    assert r.status == 501 and "method BREW is not supported" in json.loads(r.read())["error"]


def test_engine_exception_is_a_500_and_the_server_keeps_serving(addmul_server):
    """Widths 3 and 5 pass the spec check ([N, -1]) but ONNX Runtime cannot broadcast them."""
    bad = {"inputs": [_json_input("a", (1, 3)), _json_input("b", (1, 5))]}
    r = requests.post(f"{addmul_server.url}/v2/models/addmul/infer", json=bad, timeout=TIMEOUT)
    assert r.status_code == 500
    assert r.json()["error"].startswith("engine 'addmul' failed: ")
    before = addmul_server.stats()
    ok = {"inputs": [_json_input("a", (1, 3)), _json_input("b", (1, 3))]}
    r = requests.post(f"{addmul_server.url}/v2/models/addmul/infer", json=ok, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 1.0, 1.0]
    after = addmul_server.stats()
    assert after["success"] == before["success"] + 1 and after["failed"] == before["failed"]


def test_stop_refuses_new_connections_and_readiness_reports_it(conv_path):
    handle = start_server(load_engine(conv_path), "127.0.0.1", 0)
    assert triton(handle).is_server_ready()
    handle.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{handle.url}/v2/health/live", timeout=5)


@pytest.mark.parametrize("binary", [True, False])
def test_int64_in_fp16_out_round_trip(tmp_path, binary):
    handle = start_server(load_engine(cast_model(tmp_path / "cast.onnx")), "127.0.0.1", 0)
    try:
        x = np.array([[1, -2, 3, 2**11 + 1], [0, 5, 6, 60001]], dtype=np.int64)  # 2049, 60001 round in FP16
        inp = httpclient.InferInput("x", [2, 4], "INT64")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("y", binary_data=binary)
        res = triton(handle).infer("cast", [inp], outputs=[out])
        y = res.as_numpy("y")
        assert y.dtype == np.float16 and res.get_output("y")["datatype"] == "FP16"
        np.testing.assert_array_equal(y, x.astype(np.float16))
    finally:
        handle.stop()


def test_static_batch_model_is_never_merged(tmp_path):
    """A model whose dim 0 is fixed cannot be concatenated: each request runs alone."""
    handle = start_server(
        load_engine(cast_model(tmp_path / "cast.onnx", batch_dim=2)), "127.0.0.1", 0, max_queue_delay_ms=300
    )
    try:
        assert triton(handle).get_model_config("cast")["max_batch_size"] == 0
        xs = [np.full((2, 4), i, np.int64) for i in range(4)]

        def call(x):
            inp = httpclient.InferInput("x", [2, 4], "INT64")
            inp.set_data_from_numpy(x)
            return triton(handle).infer("cast", [inp]).as_numpy("y")

        for x, y in zip(xs, _concurrent(call, [(x,) for x in xs]), strict=True):
            assert not isinstance(y, Exception), y
            np.testing.assert_array_equal(y, x.astype(np.float16))
        s = handle.stats()
        assert s["engine_calls"] == 4 and s["batched_requests"] == 0, s
    finally:
        handle.stop()


def test_model_name_with_a_slash_is_refused(conv_path):
    with pytest.raises(ServeError, match="without '/'"):
        start_server(load_engine(conv_path), "127.0.0.1", 0, name="a/b")
