"""User handlers (`handler: module:Class`) served by `ngcx-runtime serve`.

What a user notices: a handler that takes text (BYTES) and returns JSON text works from stock
tritonclient, binary and JSON alike, and concurrent text requests are batched like tensors; a
handler that pre/post-processes an ONNX model gets the model's optimized engine and its
signature; a broken handler is one line naming its file:line, the server stays live but never
ready, and the process exits 2 so an orchestrator sees it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import models
import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
requests = pytest.importorskip("requests")

from ngcx_runtime.errors import RuntimeUserError  # noqa: E402
from ngcx_runtime.handler import load_handler  # noqa: E402
from ngcx_runtime.serve import start_loading, start_server  # noqa: E402

TIMEOUT = 30
CLI = [sys.executable, "-m", "ngcx_runtime.cli", "serve"]

TEXT_HANDLER = '''
import json
import numpy as np

from ngcx_runtime.handler import InvalidInput


class Shout:
    """BYTES in, JSON text (BYTES) and a length (INT64) out; batch along dim 0."""

    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "reply", "datatype": "BYTES", "shape": [-1]},
               {"name": "length", "datatype": "INT64", "shape": [-1]}]

    def load(self, context):
        self.loaded = context.engine is None

    def predict(self, inputs):
        try:
            texts = [t.decode("utf-8") for t in inputs["text"]]
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"input 'text' is not UTF-8 ({exc.reason})") from None
        reply = np.array([json.dumps({"upper": t.upper(), "loaded": self.loaded}).encode() for t in texts],
                         dtype=object)
        return {"reply": reply, "length": np.array([len(t) for t in texts], dtype=np.int64)}
'''

MODEL_HANDLER = '''
import numpy as np


class Softmax:
    """Pre/post-processing around the project's model: no signature of its own (the model's is used)."""

    def load(self, context):
        self.engine = context.engine
        self.model_name = context.model_path.name

    def predict(self, inputs):
        logits = self.engine.infer({"x": inputs["x"] * 2.0})["y"]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {"y": (e / e.sum(axis=1, keepdims=True)).astype(np.float32)}
'''


def write_app(folder: Path, source: str, module: str = "app_handler") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(source).lstrip())
    return folder


def softmax_reference(model: Path, x: np.ndarray) -> np.ndarray:
    logits = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x * 2.0})[0]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    """The text handler, served in-process; a long queue delay so concurrent requests merge."""
    app = write_app(tmp_path_factory.mktemp("text-app"), TEXT_HANDLER, "text_handler")
    engine = load_handler("text_handler:Shout", app, name="shout")
    with start_server(engine, port=0, max_batch=16, max_queue_delay_ms=200) as handle:
        yield handle


def _client(handle) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"{handle.host}:{handle.port}", network_timeout=TIMEOUT,
                                            connection_timeout=TIMEOUT)


def _text_infer(handle, texts: list[bytes], binary: bool):
    inp = httpclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    outs = [httpclient.InferRequestedOutput("reply", binary_data=binary),
            httpclient.InferRequestedOutput("length", binary_data=binary)]
    return _client(handle).infer("shout", [inp], outputs=outs)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_in_json_text_out_through_tritonclient(text_server, binary):
    texts = ["hello", "grüße ✓", "", "a,b\tc"]
    result = _text_infer(text_server, [t.encode() for t in texts], binary)
    replies = result.as_numpy("reply")
    assert replies.shape == (4,)
    got = [json.loads(r if isinstance(r, str) else r.decode()) for r in replies]
    assert [g["upper"] for g in got] == [t.upper() for t in texts]
    assert all(g["loaded"] for g in got), "load(context) ran before the first request"
    assert result.as_numpy("length").tolist() == [len(t) for t in texts]


def test_binary_bytes_keep_every_byte(text_server):
    """Binary BYTES carry raw bytes (length-prefixed), not text: NUL and 4-byte lengths round-trip."""
    long_text = ("x" * 70000).encode()      # a length above 65535 needs all 4 length bytes
    result = _text_infer(text_server, [b"a\x00b", long_text], binary=True)
    assert result.as_numpy("length").tolist() == [3, 70000]
    assert json.loads(result.as_numpy("reply")[1])["upper"] == "X" * 70000


def test_concurrent_text_requests_are_batched_and_each_gets_its_own_answer(text_server):
    before = text_server.stats()
    results: dict[int, list[str]] = {}

    def send(i: int) -> None:
        texts = [f"req{i}-{j}".encode() for j in range(i % 3 + 1)]
        out = _text_infer(text_server, texts, binary=i % 2 == 0).as_numpy("reply")
        results[i] = [json.loads(r)["upper"] for r in out]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert results == {i: [f"REQ{i}-{j}" for j in range(i % 3 + 1)] for i in range(6)}
    after = text_server.stats()
    assert after["batched_requests"] > before["batched_requests"], "BYTES requests were never merged"
    assert after["engine_calls"] - before["engine_calls"] < 6


def test_a_bad_request_is_a_400_and_never_fails_the_requests_merged_with_it(text_server):
    """InvalidInput from predict(): 400 to that client; the batch it was merged into runs again without it."""
    before = text_server.stats()
    answers: dict[int, object] = {}

    def send(i: int) -> None:
        texts = [b"\xff\xfe not utf-8"] if i == 3 else [f"ok{i}".encode()]
        try:
            answers[i] = json.loads(_text_infer(text_server, texts, binary=True).as_numpy("reply")[0])["upper"]
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own error type
            answers[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    bad = answers.pop(3)
    assert answers == {i: f"OK{i}" for i in (0, 1, 2, 4, 5)}
    assert getattr(bad, "status", lambda: None)() == "400" and "is not UTF-8" in str(bad), repr(bad)
    after = text_server.stats()
    assert after["batched_requests"] > before["batched_requests"], "the six requests were never merged"


def test_text_server_metadata_says_bytes(text_server):
    meta = requests.get(f"{text_server.url}/v2/models/shout", timeout=TIMEOUT).json()
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["platform"] == "python"


def test_bytes_json_data_must_be_strings(text_server):
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["ok", 3]}]}
    r = requests.post(f"{text_server.url}/v2/models/shout/infer", json=body, timeout=TIMEOUT)
    assert r.status_code == 400
    assert "strings" in r.json()["error"]
    ok = requests.post(f"{text_server.url}/v2/models/shout/infer", timeout=TIMEOUT, json={
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["still serving"]}]})
    assert ok.status_code == 200 and json.loads(ok.json()["outputs"][0]["data"][0])["upper"] == "STILL SERVING"


@pytest.fixture(scope="module")
def model_app(tmp_path_factory):
    root = tmp_path_factory.mktemp("model-app")
    return models.mlp(root / "mlp.onnx"), write_app(root / "app", MODEL_HANDLER, "softmax_handler")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_numeric_handler_wraps_the_onnx_engine(model_app, binary):
    from ngcx_runtime.plan import load

    model, app = model_app
    engine = load_handler("softmax_handler:Softmax", app, engine=load(model, backend="onnxruntime"),
                          model_path=model, name="mlp")
    assert [s.name for s in engine.inputs] == ["x"] and [s.name for s in engine.outputs] == ["y"]
    x = models.sample_inputs("mlp", 3)["x"]
    with start_server(engine, port=0) as handle:
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = _client(handle).infer("mlp", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)])
        got = out.as_numpy("y")
        # A numeric engine behind a handler still refuses text with the clear 400.
        bad = requests.post(f"{handle.url}/v2/models/mlp/infer", timeout=TIMEOUT, json={
            "inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 32], "data": ["1"] * 32}]})
    np.testing.assert_allclose(got, softmax_reference(model, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
    assert bad.status_code == 400 and "BYTES is not supported" in bad.json()["error"]


# -- broken handlers --

def test_import_failure_names_the_handlers_file_and_line(tmp_path):
    app = write_app(tmp_path, "import numpy\n\nRATE = 1 / 0\n", "bad_import")
    with pytest.raises(RuntimeUserError) as err:
        load_handler("bad_import:Handler", app)
    msg = str(err.value)
    assert f"{app / 'bad_import.py'}:3" in msg and "ZeroDivisionError" in msg and "\n" not in msg


def test_syntax_error_and_missing_pieces_are_one_line_each(tmp_path):
    write_app(tmp_path, "class Handler:\n    def predict(self, inputs)\n        return inputs\n", "bad_syntax")
    write_app(tmp_path, "class Other:\n    pass\n", "no_class")
    write_app(tmp_path, "import not_installed_pkg_xyz\n", "missing_dep")
    cases = {
        "bad_syntax:Handler": [f"{tmp_path / 'bad_syntax.py'}:2", "SyntaxError"],
        "no_class:Handler": ["no class 'Handler'"],
        "nowhere:Handler": ["no module 'nowhere'"],
        "missing_dep:Handler": [f"{tmp_path / 'missing_dep.py'}:1", "not_installed_pkg_xyz"],
        "no-colon": ["expected module:Class"],
    }
    for spec, fragments in cases.items():
        with pytest.raises(RuntimeUserError) as err:
            load_handler(spec, tmp_path)
        assert all(f in str(err.value) for f in fragments), (spec, str(err.value))
        assert "\n" not in str(err.value)


FAILING_LOAD = '''
class Handler:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]

    def load(self, context):
        raise FileNotFoundError("vocab.txt is missing")

    def predict(self, inputs):
        return inputs
'''


def test_load_failure_keeps_the_server_live_but_never_ready(tmp_path):
    app = write_app(tmp_path, FAILING_LOAD, "failing_load")
    handle = start_loading(lambda: load_handler("failing_load:Handler", app, name="words"), port=0, name="words")
    try:
        assert handle.wait_loaded(TIMEOUT) is False
        assert "vocab.txt is missing" in str(handle.load_error)
        assert f"{app / 'failing_load.py'}:6" in str(handle.load_error)
        assert requests.get(f"{handle.url}/v2/health/live", timeout=TIMEOUT).status_code == 200
        assert requests.get(f"{handle.url}/v2/health/ready", timeout=TIMEOUT).status_code == 503
        assert requests.get(f"{handle.url}/v2/models/words/ready", timeout=TIMEOUT).status_code == 503
        r = requests.post(f"{handle.url}/v2/models/words/infer", timeout=TIMEOUT, json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]})
        assert r.status_code == 503 and "failed to load" in r.json()["error"]
    finally:
        handle.stop()


@pytest.mark.parametrize("source, line, fragment", [
    (FAILING_LOAD, 6, "vocab.txt is missing"),
    ("import numpy\nRATE = 1 / 0\n", 2, "ZeroDivisionError"),
], ids=["load", "import"])
def test_cli_exits_2_with_one_line_when_the_handler_fails(tmp_path, source, line, fragment):
    app = write_app(tmp_path, source, "broken")
    start = time.monotonic()
    r = subprocess.run([*CLI, "--handler", "broken:Handler", "--app-dir", str(app), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{app / 'broken.py'}:{line}" in r.stderr and fragment in r.stderr
    assert "listening" in r.stdout, "the server listened before loading"
    assert time.monotonic() - start < 30


COUNTING = '''
import numpy as np


class Count:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]

    def __init__(self):
        self.seen = []

    def predict(self, inputs):
        self.seen.append(inputs["text"].tolist())
        return {"text": inputs["text"]}
'''


@pytest.mark.parametrize("warmup, expected", [
    ('    warmup_inputs = {"text": np.array([b"warm"], dtype=object)}\n', [[b"warm"]]),
    ("", []),
], ids=["warmup_inputs", "bytes-without"])
def test_warm_up_uses_warmup_inputs_and_skips_bytes_without_them(tmp_path, warmup, expected):
    app = write_app(tmp_path, COUNTING + warmup, "counting")
    engines = []

    def loader():
        engines.append(load_handler("counting:Count", app, name="count"))
        return engines[0]

    handle = start_loading(loader, port=0, name="count")
    try:
        assert handle.wait_loaded(TIMEOUT) is True
        assert engines[0].handler.seen == expected
        assert requests.get(f"{handle.url}/v2/health/ready", timeout=TIMEOUT).status_code == 200
    finally:
        handle.stop()


# -- the BYTES wire format, without sockets --

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ngcx_runtime.engine import TensorSpec  # noqa: E402
from ngcx_runtime.protocol import InferRequest, ProtocolError, build_response, parse_infer_request  # noqa: E402

TEXT_SPEC = [TensorSpec("t", "BYTES", (-1,))]


def _parse_binary(blob: bytes, shape: list[int], size: int | None = None):
    doc = {"inputs": [{"name": "t", "datatype": "BYTES", "shape": shape,
                       "parameters": {"binary_data_size": len(blob) if size is None else size}}]}
    return parse_infer_request(doc, memoryview(blob), TEXT_SPEC, TEXT_SPEC, "m", batchable=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20), st.booleans())
def test_bytes_round_trip_through_the_wire_format(items, binary):
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    req = InferRequest(id=None, inputs={}, outputs=[("t", binary)])
    try:
        pieces, hlen = build_response("m", "1", req, {"t": arr})
    except ProtocolError as exc:                       # JSON cannot carry bytes that are not UTF-8
        assert not binary and exc.status == 400 and "binary" in exc.message
        return
    out = json.loads(pieces[0])["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [len(items)]
    if binary:
        parsed = _parse_binary(b"".join(bytes(p) for p in pieces[1:]), [len(items)])
        assert parsed.inputs["t"].tolist() == items
    else:
        assert [s.encode() for s in out["data"]] == items


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 20), st.integers(-2, 70))
def test_random_binary_bytes_parse_or_give_one_clean_400(blob, n, size):
    try:
        parsed = _parse_binary(blob, [n], size if size >= 0 else None)
    except ProtocolError as exc:
        assert exc.status == 400 and "\n" not in exc.message
        return
    got = parsed.inputs["t"]
    assert got.shape == (n,) and all(isinstance(b, bytes) for b in got)
    assert sum(4 + len(b) for b in got) == len(blob)
