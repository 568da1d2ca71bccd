"""JSON tensors read and written with the standard library's meaning, at any size (runtime/jsontensor.py, issue 50).

What a client notices: the tensor the model gets from a JSON body is exactly what Python's json + numpy make of
that body (NaN / Infinity / -Infinity, exponents, odd whitespace, nested or flat, ints vs floats per datatype),
a body that cannot be the tensor is one 400 line (never a 500), and the JSON answer reads back as the same
tensor, with non-finite values spelled as the standard library spells them. Every test runs with each reader:
orjson, the standard library alone (as a checkout without orjson has it), and simdjson's route for float tensors
(runtime/jsonbody.py, taken here from the smallest body on, so each case below goes through it or is handed back).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ngcx_runtime import jsonbody, wirejson  # noqa: E402
from ngcx_runtime.engine import KSERVE_TO_NUMPY, TensorSpec  # noqa: E402
from ngcx_runtime.protocol import (  # noqa: E402
    InferRequest,
    ProtocolError,
    build_response,
    parse_header,
    parse_infer_request,
)

FLOATS = ("FP16", "FP32", "FP64")
INTS = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")


@pytest.fixture(params=["orjson", "stdlib", "simdjson"], autouse=True)
def codec(request):
    wirejson.use(request.param != "stdlib")
    jsonbody.use(request.param == "simdjson", min_bytes=0)
    yield request.param
    wirejson.use(wirejson.orjson is not None)
    jsonbody.use(jsonbody.simdjson is not None)


def _parse(body: bytes | str, datatype: str = "FP32", shape: tuple[int, ...] = (-1,)) -> np.ndarray:
    """The tensor a model declaring one input `x` of `datatype` and `shape` gets from `body`."""
    raw = body.encode() if isinstance(body, str) else body
    spec = TensorSpec("x", datatype, shape)
    req = parse_infer_request(parse_header(raw), None, [spec], [TensorSpec("y", datatype, shape)], "m", False)
    return req.inputs["x"]


def _body(data_text: str, datatype: str = "FP32", shape: list[int] | None = None) -> str:
    """A request whose data is spliced in as text (so literals json.dumps would not write can be sent)."""
    shape_text = json.dumps(shape if shape is not None else [len(json.loads(data_text))])
    return '{"inputs": [{"name": "x", "datatype": "' + datatype + '", "shape": ' + shape_text + ', "data": ' \
        + data_text + "}]}"


def _stdlib(data_text: str, datatype: str) -> np.ndarray:
    """What the standard library and numpy make of the same text: the meaning to keep."""
    return np.asarray(json.loads(data_text), dtype=KSERVE_TO_NUMPY[datatype])


def _refused(body: str, datatype: str = "FP32", shape: tuple[int, ...] = (-1,)) -> str:
    with pytest.raises(ProtocolError) as info:
        _parse(body, datatype, shape)
    assert info.value.status == 400 and "\n" not in info.value.message
    return info.value.message


# -- reading: the standard library's meaning --

ODD_NUMBERS = [
    "[NaN, Infinity, -Infinity, 0.0, -0.0]",
    "[1e5, 1E-5, -2.5e+3, 1e308, 5e-324, 1.7976931348623157e308, 3.4028235e38, 1e39]",
    "[ \t1.5 ,\n-2 ,\r\n3e0\t]",
    "[0.1, 0.2, 0.30000000000000004, 16777217, 9007199254740993, -1]",
    "[123456789012345678901234567890, 1e-400, -1e-400]",
    "[true, false, 1, 0.5]",
]


@pytest.mark.parametrize("datatype", FLOATS)
@pytest.mark.parametrize("text", ODD_NUMBERS)
def test_float_tensors_get_exactly_what_json_and_numpy_make_of_the_text(text, datatype):
    with np.errstate(over="ignore"):
        want = _stdlib(text, datatype)
        got = _parse(_body(text, datatype), datatype)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)                 # NaN == NaN here; -0.0 == 0.0, so also the bits:
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("datatype", INTS)
def test_integer_tensors_take_the_integers_their_type_holds(datatype):
    info = np.iinfo(KSERVE_TO_NUMPY[datatype])
    text = json.dumps([int(info.min), 0, 1, int(info.max)])
    got = _parse(_body(text, datatype), datatype)
    assert got.tolist() == [int(info.min), 0, 1, int(info.max)]
    assert got.dtype == KSERVE_TO_NUMPY[datatype]


@pytest.mark.parametrize("datatype", ["INT8", "UINT8", "INT32", "UINT64"])
def test_an_integer_out_of_the_types_range_is_a_400_naming_it(datatype):
    info = np.iinfo(KSERVE_TO_NUMPY[datatype])
    for bad in (int(info.max) + 1, int(info.min) - 1):
        message = _refused(_body(json.dumps([0, bad]), datatype), datatype)
        assert f"out of {KSERVE_TO_NUMPY[datatype].name}'s range" in message


def test_floats_in_an_integer_tensor_keep_numpys_meaning_and_nan_is_a_400():
    assert _parse(_body("[1.9, -1.9, 2]", "INT32"), "INT32").tolist() == [1, -1, 2]   # numpy truncates
    assert "NaN" in _refused(_body("[1, NaN]", "INT32"), "INT32")


def test_bool_tensors_take_true_false_and_numbers_as_numpy_reads_them():
    assert _parse(_body("[true, false, 0, 2, 0.0, 0.5]", "BOOL"), "BOOL").tolist() == [
        True, False, False, True, False, True]


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "BOOL"])
def test_nested_and_flat_data_give_the_same_tensor(datatype):
    dtype = KSERVE_TO_NUMPY[datatype]
    arr = (np.arange(24).reshape(2, 3, 4) % (2 if datatype == "BOOL" else 100)).astype(dtype)
    for data in (arr.tolist(), arr.reshape(-1).tolist(), arr.reshape(6, 4).tolist()):
        got = _parse(_body(json.dumps(data), datatype, [2, 3, 4]), datatype, (2, 3, 4))
        np.testing.assert_array_equal(got, arr)
        assert got.shape == (2, 3, 4) and got.dtype == dtype


def test_an_image_sized_request_is_read_exactly_flat_and_nested():
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    for data in (x.ravel().tolist(), x.tolist()):
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": data}]})
        got = _parse(body, "FP32", (-1, 3, 224, 224))
        assert got.shape == x.shape and got.tobytes() == x.tobytes()


def test_an_image_sized_request_of_finite_values_is_read_exactly_flat_and_nested():
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for data in (x.ravel().tolist(), x.tolist(), x.astype(np.float64).ravel().tolist()):
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": data}]})
        got = _parse(body, "FP32", (-1, 3, 224, 224))
        want = np.asarray(json.loads(body)["inputs"][0]["data"], dtype=np.float32)
        assert got.shape == x.shape and got.tobytes() == want.tobytes()


def test_bytes_tensors_still_take_strings():
    got = _parse(_body('["a", "\\u00e9", ""]', "BYTES"), "BYTES")
    assert got.tolist() == [b"a", "é".encode(), b""]


# -- refusing: one 400 line, never a 500 --

@pytest.mark.parametrize(("text", "shape", "says"), [
    ("[1, 2, 3]", [4], "'data' has 3 elements but shape [4] needs 4"),
    ("[[1, 2], [3]]", [3], "rectangular"),
    ("[1, [2, 3]]", [3], "rectangular"),
    ('["1.5", 2]', [2], "not strings or null"),
    ('["x"]', [1], "not strings or null"),
    ("[1, null]", [2], "not strings or null"),
    ('[{"a": 1}]', [1], "not strings or null"),
    ("[[], [1]]", [1], "rectangular"),
    ('{"a": 1}', [1], "must be a JSON list"),
    ("1.5", [1], "must be a JSON list"),
])
def test_data_that_cannot_be_the_tensor_is_one_400_line(text, shape, says):
    assert says in _refused(_body(text, "FP32", shape))


@pytest.mark.parametrize("body", [
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1,, 2]}]}',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1 2]}]}',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [.5, 1]}]}',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [01, 1]}]}',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [nan, inf]}]}',
    '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e]}]}',
])
def test_malformed_json_numbers_are_a_400_as_the_standard_library_refuses_them(body):
    with pytest.raises(ValueError):
        json.loads(body)
    assert _refused(body).startswith("malformed JSON in the request body")


def test_a_wrong_datatype_for_the_model_is_a_400():
    assert "does not match the model's FP32" in _refused(_body("[1, 2]", "INT32"), "FP32")


# -- answering: the same tensor back, non-finite as the standard library writes it --

def _answer(arrays: dict[str, np.ndarray]) -> dict:
    req = InferRequest(id="r", inputs={}, outputs=[(n, False) for n in arrays])
    pieces, header_len = build_response("m", "1", req, arrays)
    assert header_len is None
    return json.loads(b"".join(bytes(p) for p in pieces))


@pytest.mark.parametrize("datatype", [*FLOATS, *INTS, "BOOL"])
def test_a_json_answer_reads_back_as_the_same_tensor(datatype):
    dtype = KSERVE_TO_NUMPY[datatype]
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((2, 1000)) * 100).astype(dtype) if datatype != "BOOL" else rng.random((2, 5)) > .5
    out = _answer({"y": arr})["outputs"][0]
    assert out["datatype"] == datatype and out["shape"] == list(arr.shape)
    back = np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
    assert back.tobytes() == arr.tobytes()


def test_non_finite_answers_are_spelled_as_the_standard_library_spells_them_next_to_finite_ones():
    odd = np.array([np.nan, np.inf, -np.inf, 1.5], dtype=np.float32)
    req = InferRequest(id=None, inputs={}, outputs=[("odd", False), ("fine", False)])
    pieces, _ = build_response("m", "1", req, {"odd": odd, "fine": np.arange(3, dtype=np.float32)})
    text = b"".join(bytes(p) for p in pieces).decode()
    assert '"data":[NaN,Infinity,-Infinity,1.5]' in text and "null" not in text
    doc = json.loads(text)
    assert doc["outputs"][1]["data"] == [0.0, 1.0, 2.0]
    back = np.asarray(doc["outputs"][0]["data"], dtype=np.float32)
    assert math.isnan(back[0]) and back[1:].tolist() == [math.inf, -math.inf, 1.5]


def test_a_big_endian_or_strided_output_is_written_with_its_values():
    arr = np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2]
    out = _answer({"y": arr})["outputs"][0]
    assert out["data"] == arr.astype(np.float32).ravel().tolist() and out["shape"] == [3, 2]
