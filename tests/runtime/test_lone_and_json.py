"""Issue 24's two serving changes, as a client sees them.

- A lone client stops paying the batching window: after LONE_STREAK requests in a row that found
  nothing else in flight, a request runs at once; a burst of concurrent requests still merges.
- JSON tensors go through orjson (runtime/wirejson.py) with the standard library's meaning:
  NaN / -Infinity in a request are read, a -inf output comes back as -Infinity (not null), and
  both codecs read and write the same documents.
"""

from __future__ import annotations

import http.client
import json
import math
import time
from pathlib import Path

import models
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from test_serve import _concurrent, _json_input, _req, add_mul_model, load_engine  # noqa: E402

from ngcx_runtime import wirejson  # noqa: E402
from ngcx_runtime.batching import LONE_STREAK  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

WINDOW_MS = 250        # long enough that a request that waited is unmistakable next to one that did not
PACE_S = 0.3           # each engine call of the burst test: longer than a loaded 2-core CI staggers 8 threads


def _post(port: int, path: str, body: bytes) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.monotonic()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, data, time.monotonic() - start


def _stats(port: int, model: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/v2/models/{model}/stats")
    doc = json.loads(conn.getresponse().read())
    conn.close()
    return doc["model_stats"][0]


def _engine_calls(port: int, model: str) -> int:
    return sum(int(b["compute_infer"]["count"]) for b in _stats(port, model)["batch_stats"])


class Paced:
    """A real ONNX Runtime engine whose every call takes PACE_S longer.

    Why: the burst test's 8 threads leave one barrier, but on a loaded 2-core CI machine their requests
    can reach the server milliseconds apart while the conv net answers in about one; each that found
    nothing else in flight ran alone (a CI run: 5 engine calls). A GPU model's call takes tens of
    milliseconds, so a burst overlaps the first call, as it does here once a call lasts PACE_S.
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def infer(self, feeds):
        time.sleep(PACE_S)
        return self.inner.infer(feeds)


def _conv_server(tmp_path: Path, wrap=lambda engine: engine):
    return start_server(wrap(load_engine(models.conv_net(tmp_path / "conv.onnx"))), "127.0.0.1", 0,
                        name="conv", max_batch=8, max_queue_delay_ms=WINDOW_MS)


@pytest.fixture()
def conv_server(tmp_path: Path):
    handle = _conv_server(tmp_path)
    yield handle
    handle.stop()


@pytest.fixture()
def paced_server(tmp_path: Path):
    handle = _conv_server(tmp_path, Paced)
    yield handle
    handle.stop()


def test_a_lone_client_waits_the_window_only_until_the_streak_then_runs_at_once(conv_server):
    body = _req(_json_input())
    path = "/v2/models/conv/infer"
    waited = [_post(conv_server.port, path, body) for _ in range(LONE_STREAK)]
    assert all(status == 200 for status, _, _ in waited)
    assert all(seconds >= WINDOW_MS / 1000 * 0.9 for _, _, seconds in waited), \
        f"a fresh server's first lone requests wait for company: {[round(s, 3) for _, _, s in waited]}"
    quick = [_post(conv_server.port, path, body) for _ in range(5)]
    assert all(status == 200 for status, _, _ in quick)
    assert max(seconds for _, _, seconds in quick) < WINDOW_MS / 1000 / 2, \
        f"after {LONE_STREAK} lone requests a lone one runs at once: {[round(s, 3) for _, _, s in quick]}"


def test_after_the_streak_a_burst_still_merges(paced_server):
    body = _req(_json_input())
    path = "/v2/models/conv/infer"
    for _ in range(LONE_STREAK + 1):
        assert _post(paced_server.port, path, body)[0] == 200
    before = _engine_calls(paced_server.port, "conv")
    answers = _concurrent(_post, [(paced_server.port, path, body)] * 8)
    assert all(not isinstance(a, Exception) and a[0] == 200 for a in answers), answers
    calls = _engine_calls(paced_server.port, "conv") - before
    assert calls <= 3, f"8 concurrent requests ran in {calls} engine calls: the window must still merge them"


def test_non_finite_values_travel_both_ways_as_the_standard_library_writes_them(tmp_path: Path):
    handle = start_server(load_engine(add_mul_model(tmp_path / "am.onnx")), "127.0.0.1", 0, name="am",
                          max_batch=4, max_queue_delay_ms=0)
    try:
        a = [[-math.inf, math.nan, 1.5, math.inf]]
        b = [[1.0, 2.0, 3.0, 0.0]]
        body = json.dumps({"inputs": [_json_input("a", (1, 4), data=a), _json_input("b", (1, 4), data=b)]})
        assert "-Infinity" in body and "NaN" in body       # what Python's json (and tritonclient) send
        status, data, _ = _post(handle.port, "/v2/models/am/infer", body.encode())
        assert status == 200, data
        text = data.decode()
        assert "-Infinity" in text and "null" not in text, text
        out = {o["name"]: np.asarray(o["data"], dtype=np.float32) for o in json.loads(text)["outputs"]}
        np.testing.assert_array_equal(out["sum"], np.asarray(a, np.float32).ravel() + np.asarray(b, np.float32).ravel())
        assert math.isnan(out["prod"][1]) and out["prod"][0] == -math.inf
    finally:
        handle.stop()


DOCS = [b'{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[0.1,-2.5e-08]}],"id":"r\\u00e9"}',
        b'[NaN, -Infinity, Infinity, 1]', b'{"a": {"b": [[[1, 2], [3, 4]]]}}', b'[18446744073709551615, -1]']


@pytest.fixture(params=["orjson", "stdlib"])
def codec(request):
    wirejson.use(request.param == "orjson")
    yield request.param
    wirejson.use(True)


@pytest.mark.parametrize("raw", DOCS)
def test_both_codecs_read_what_the_standard_library_reads(codec, raw):
    got, want = wirejson.loads(raw), json.loads(raw)
    assert json.dumps(got) == json.dumps(want)             # NaN != NaN: compare the texts
    assert wirejson.loads(memoryview(raw)) is not None


@pytest.mark.parametrize("raw", [b"{", b'{"a": 1,}', b"\xff\xfe", b""])
def test_both_codecs_refuse_bad_json_with_a_value_error(codec, raw):
    with pytest.raises(ValueError):
        wirejson.loads(raw)


def test_both_codecs_say_too_deep_for_a_document_past_the_parsers_depth(codec):
    with pytest.raises(wirejson.NestedTooDeeply):
        wirejson.loads(b"[" * 200_000 + b"]" * 200_000)


def test_both_codecs_write_the_same_values_and_non_finite_as_the_standard_library(codec):
    doc = {"model_name": "m", "outputs": [{"name": "y", "data": [0.1, -3.0, 1e-30, 7]}], "id": "r\u00e9"}
    assert json.loads(wirejson.dumps(doc)) == doc
    assert wirejson.dumps({"data": [-math.inf]}, finite=False) == b'{"data":[-Infinity]}'
