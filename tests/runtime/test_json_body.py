"""Which JSON bodies take simdjson's route into numpy (runtime/jsonbody.py, issue 50 item 5), and that it holds
under concurrent requests.

What a client notices: nothing but speed. test_json_tensors.py checks every reading rule through this route
too; here, that an image-sized float tensor really skips the Python floats (its "data" arrives as one array),
that every body the route could read differently is handed back to the old reader (None), and that requests
parsed at once on many threads each get their own tensor.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ngcx_runtime import jsonbody  # noqa: E402
from ngcx_runtime.engine import TensorSpec  # noqa: E402
from ngcx_runtime.protocol import ProtocolError, parse_header, parse_infer_request  # noqa: E402

pytestmark = pytest.mark.skipif(jsonbody.simdjson is None, reason="pysimdjson is not installed (pip install .)")


@pytest.fixture(autouse=True)
def from_any_size():
    jsonbody.use(True, min_bytes=0)
    yield
    jsonbody.use(True)


def _body(data, datatype: str = "FP32", shape=None, **extra) -> bytes:
    item = {"name": "x", "datatype": datatype, "shape": shape or [len(data)], "data": data}
    return json.dumps({"id": "r1", "inputs": [item], **extra}).encode()


def test_an_image_sized_float_tensor_arrives_as_one_array_with_the_rest_of_the_request_as_json_reads_it():
    x = np.random.default_rng(0).standard_normal(3 * 224 * 224).astype(np.float32)
    raw = _body(x.tolist(), shape=[1, 3, 224, 224], outputs=[{"name": "y", "parameters": {"binary_data": False}}],
                parameters={"tags": ["a", "b"]})
    jsonbody.use(True)                                   # the shipped threshold: a 3 MB body is above it
    doc = jsonbody.read(raw)
    assert doc is not None and isinstance(doc["inputs"][0]["data"], np.ndarray)
    expected = json.loads(raw)
    assert {k: v for k, v in doc.items() if k != "inputs"} == {k: v for k, v in expected.items() if k != "inputs"}
    assert {k: v for k, v in doc["inputs"][0].items() if k != "data"} == \
        {k: v for k, v in expected["inputs"][0].items() if k != "data"}
    assert doc["inputs"][0]["data"].astype(np.float32).tobytes() == x.tobytes()


def test_a_small_body_stays_on_the_old_reader():
    jsonbody.use(True)
    assert jsonbody.read(_body([1.0, 2.0])) is None


@pytest.mark.parametrize(("raw", "why"), [
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [NaN, 1]}]}', "NaN: simdjson refuses"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, [2], 3]}]}', "an inner array"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [[1, 2]]}]}', "nested"),
    (b'{"id": "a[b", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', "[ in a string"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e400]}]}', "past a double"),
    (b'[1, 2]', "not an object"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}', "not JSON"),
])
def test_a_body_the_route_might_read_differently_is_handed_back(raw, why):
    assert jsonbody.read(raw) is None, why


def test_non_numbers_and_other_datatypes_keep_their_lists():
    mixed = jsonbody.read(_body([1.5, True]))
    assert mixed["inputs"][0]["data"] == [1.5, True]
    ints = jsonbody.read(_body([1, 2], "INT64"))
    assert ints["inputs"][0]["data"] == [1, 2]
    text = jsonbody.read(_body(["a["], "BYTES"))
    assert text["inputs"][0]["data"] == ["a["]


def test_an_inner_array_is_still_refused_as_before():
    spec = TensorSpec("x", "FP32", (3,))
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, [2], 3]}]}'
    with pytest.raises(ProtocolError) as info:
        parse_infer_request(parse_header(raw), None, [spec], [TensorSpec("y", "FP32", (3,))], "m", False)
    assert info.value.status == 400 and "rectangular" in info.value.message


def test_requests_parsed_at_once_on_many_threads_each_get_their_own_tensor():
    rng = np.random.default_rng(2)
    tensors = [rng.standard_normal(20_000).astype(np.float32) for _ in range(16)]
    bodies = [_body(t.tolist()) for t in tensors]
    spec = [TensorSpec("x", "FP32", (-1,))]

    def one(i: int) -> bool:
        for _ in range(5):
            req = parse_infer_request(parse_header(bodies[i]), None, spec, [TensorSpec("y", "FP32", (-1,))], "m", False)
            if req.inputs["x"].tobytes() != tensors[i].tobytes():
                return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(one, range(len(bodies))))
    assert len(jsonbody._parsers) <= jsonbody.POOL


def test_a_key_given_twice_is_read_as_json_reads_it():
    raw = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "data": [2]}]}'
    assert jsonbody.read(raw) is None
    spec = [TensorSpec("x", "FP32", (1,))]
    req = parse_infer_request(parse_header(raw), None, spec, [TensorSpec("y", "FP32", (1,))], "m", False)
    assert req.inputs["x"].tolist() == [2.0]
