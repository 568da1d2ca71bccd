"""Property-based tests of the KServe v2 request parser and response builder (issue 8, item 2).

Why: protocol.py turns a network peer's bytes into numpy arrays, so every malformed document
must become one ProtocolError (a 4xx with a one-line, bounded message), never another exception
(a 500) and never a silently different tensor. Hypothesis drives parse_header /
parse_infer_request in-process (no sockets): valid requests of every datatype the engine map
supports must round-trip exactly (JSON flat, JSON nested and binary tensor encodings), mutated
ones (wrong types, missing keys, huge / negative / bool shapes, wrong binary_data_size, NaN,
huge ints, unicode names, deep nesting) and random binary tails must fail cleanly, and
build_response must be readable by tritonclient's own response parser.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ngcx_runtime.engine import KSERVE_TO_NUMPY, TensorSpec
from ngcx_runtime.protocol import InferRequest, ProtocolError, build_response, parse_header, parse_infer_request

MESSAGE_MAX = 600                  # an error line a person can read; peer data inside it is quoted briefly
DATATYPES = sorted(KSERVE_TO_NUMPY)
TRIED: Counter = Counter()         # inputs tried per property, printed at the end (pytest -s)
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    for name, n in sorted(TRIED.items()):
        print(f"\nfuzz-protocol: {name}: {n} inputs tried")


@dataclass
class Case:
    """A model's input specs and one valid request for it: the JSON doc, binary tail, expected arrays."""

    specs: list[TensorSpec]
    doc: dict[str, Any]
    binary: bytes | None
    arrays: dict[str, np.ndarray]


OUT_SPECS = [TensorSpec("out", "FP32", (-1,))]


# -- strategies --

# A model's own tensor names come from its file, not from a peer: any printable unicode. (The
# peer's names in mutated requests are anything at all: NASTY below.)
MODEL_NAMES = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=12)


@st.composite
def specs_and_arrays(draw) -> tuple[list[TensorSpec], dict[str, np.ndarray]]:
    names = draw(st.lists(MODEL_NAMES, min_size=1, max_size=3, unique=True))
    specs, arrays = [], {}
    for name in names:
        datatype = draw(st.sampled_from(DATATYPES))
        dims = draw(st.lists(st.integers(0, 4), max_size=3))
        dynamic = draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
        specs.append(TensorSpec(name, datatype, tuple(-1 if d else n for n, d in zip(dims, dynamic, strict=True))))
        arrays[name] = draw(hnp.arrays(KSERVE_TO_NUMPY[datatype], tuple(dims)))
    return specs, arrays


def _json_input(name: str, datatype: str, arr: np.ndarray, nested: bool) -> dict[str, Any]:
    data = arr.tolist() if nested and arr.ndim else arr.reshape(-1).tolist()
    return {"name": name, "datatype": datatype, "shape": list(arr.shape), "data": data}


def _binary_input(name: str, datatype: str, arr: np.ndarray) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(arr.shape),
            "parameters": {"binary_data_size": arr.nbytes}}


@st.composite
def valid_cases(draw) -> Case:
    """A valid request; each input JSON (flat or nested) or binary, in a random order."""
    specs, arrays = draw(specs_and_arrays())
    order = draw(st.permutations(specs))
    items, blobs = [], []
    for spec in order:
        arr = arrays[spec.name]
        if draw(st.booleans()):
            items.append(_binary_input(spec.name, spec.datatype, arr))
            blobs.append(arr.astype(arr.dtype.newbyteorder("<")).tobytes())
        else:
            items.append(_json_input(spec.name, spec.datatype, arr, draw(st.booleans())))
    doc: dict[str, Any] = {"inputs": items}
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=10))
    binary = b"".join(blobs) if blobs or draw(st.booleans()) else None
    return Case(specs, doc, binary, arrays)


_RAW = "\x00raw-json\x00"           # placeholder for a raw JSON text spliced in after json.dumps


@dataclass(frozen=True)
class RawJSON:
    """JSON text json.dumps cannot produce (too deep, too many digits): spliced into the body."""

    text: str


def _deep(depth: int, open_: str = "[", close: str = "]") -> RawJSON:
    return RawJSON(open_ * depth + "0" + close * depth)


NASTY = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["x" * 5000, "\n\r\u2028\x00", "\ud800", "FP32", "BYTES", "BF16", "ñame"]),
    st.lists(st.integers(-3, 2**40), max_size=6),
    st.lists(st.booleans(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-2, 3), max_size=3),
    st.builds(_deep, st.integers(1, 3000)),
    st.builds(_deep, st.integers(1, 3000), st.just('{"a":'), st.just("}")),
    st.integers(100, 4400).map(lambda n: RawJSON("7" * n)),             # 4300+ digits: int() refuses
    st.sampled_from([RawJSON("NaN"), RawJSON("-Infinity"), RawJSON("1e999"), RawJSON("-0.0")]),
)


def _slots(node: Any, path: tuple = ()) -> list[tuple]:
    """Every (path) into a JSON doc: dict keys and list indexes, the root included."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _slots(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):
            out += _slots(v, (*path, i))
    return out


def _set(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


def encode(doc: Any) -> bytes:
    """json.dumps, with RawJSON leaves spliced in as their text."""
    raws: list[str] = []

    def hook(o: Any) -> Any:
        if isinstance(o, RawJSON):
            raws.append(o.text)
            return _RAW
        raise TypeError(type(o).__name__)

    text = json.dumps(doc, default=hook)
    for raw in raws:
        text = text.replace(json.dumps(_RAW), raw, 1)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def mutated_cases(draw) -> tuple[Case, bytes, bytes | None]:
    """A valid case with 1-3 mutations (replace or delete anywhere), plus a maybe-mangled binary tail."""
    case = draw(valid_cases())
    doc: Any = json.loads(json.dumps(case.doc))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_slots(doc)))
        delete = bool(path) and draw(st.booleans())
        try:
            doc = _set(doc, path, draw(NASTY), delete)
        except (TypeError, KeyError, IndexError):     # the path went away with an earlier mutation
            continue
    binary = case.binary
    if draw(st.booleans()):
        binary = draw(st.one_of(st.none(), st.binary(max_size=64),
                                st.just((binary or b"")[:-1]), st.just((binary or b"") + b"\x00")))
    return case, encode(doc), binary


# -- the properties --

def parse(specs: list[TensorSpec], body: bytes, binary: bytes | None, batchable: bool = False) -> InferRequest:
    doc = parse_header(body)
    view = None if binary is None else memoryview(binary)
    return parse_infer_request(doc, view, specs, OUT_SPECS, "fuzz", batchable)


def assert_clean(exc: ProtocolError) -> None:
    """What a client reads: a 4xx, one line, bounded, with the message the exception carries."""
    assert 400 <= exc.status < 500, (exc.status, exc.message[:200])
    assert exc.message and "\n" not in exc.message and "\r" not in exc.message, exc.message[:300]
    assert len(exc.message) <= MESSAGE_MAX, (len(exc.message), exc.message[:300])
    json.dumps({"error": exc.message})                  # the server can always send it


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, (name, got[name], arr)
        np.testing.assert_array_equal(got[name], arr)


@FUZZ
@given(valid_cases())
def test_a_valid_request_round_trips_to_the_encoded_arrays(case: Case):
    TRIED["valid request round trip (JSON flat/nested + binary, all datatypes)"] += 1
    req = parse(case.specs, encode(case.doc), case.binary)
    assert_same(req.inputs, case.arrays)
    assert req.id == case.doc.get("id")
    assert req.outputs == [("out", False)]


@settings(FUZZ, max_examples=600)
@given(mutated_cases())
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,' + b"7" * 4000 + b'],"data":[1,2]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":["' + b"y" * 5000 + b'", 1]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"' + b"n\\n" * 3000 + b'","datatype":"FP32","shape":[1,2],"data":[1,2]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"' + b"D" * 5000 + b'","shape":[1,2],"data":[1,2]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":' + json.dumps([1] * 3000).encode()
          + b',"data":[1,2]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, 2))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":"'
          + b"9" * 5000 + b'"}}]}', b""))
@example((Case([TensorSpec("x", "FP32", (-1, 32))], {}, None, {}),   # str(element count) raised ValueError: a 500
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":[' + b"7" * 4299 + b',32],"data":[1]}]}', None))
@example((Case([TensorSpec("x", "FP32", (-1, -1))], {}, None, {}),
          b'{"inputs":[{"name":"x","datatype":"FP32","shape":[9223372036854775807,9223372036854775807],'
          b'"parameters":{"binary_data_size":0}}]}', b""))
def test_a_mutated_request_parses_or_fails_with_one_clean_4xx(mutated):
    """Never another exception (a 500), never an unbounded or multi-line error message."""
    TRIED["mutated request (wrong types, missing keys, huge/neg/bool shapes, NaN, deep, unicode)"] += 1
    case, body, binary = mutated
    try:
        req = parse(case.specs, body, binary, batchable=bool(case.specs) and all(
            s.shape and s.shape[0] == -1 for s in case.specs))
    except ProtocolError as exc:
        assert_clean(exc)
        return
    by_name = {s.name: s for s in case.specs}
    for name, arr in req.inputs.items():       # whatever parses matches the model's specs
        spec = by_name[name]
        assert arr.dtype == KSERVE_TO_NUMPY[spec.datatype] and arr.ndim == len(spec.shape)
        assert all(w < 0 or g == w for g, w in zip(arr.shape, spec.shape, strict=True))


@FUZZ
@given(st.binary(max_size=512))
@example(b"\xff\xfe{\x00}\x00")                 # a UTF-16 BOM: json.loads decodes it
@example(b"[" * 100_000)
@example(b'{"inputs": ' + b"{" * 10_000)
def test_random_bytes_are_a_clean_4xx(body: bytes):
    TRIED["random bytes as the request body"] += 1
    try:
        parse([TensorSpec("x", "FP32", (-1, 4))], body, None)
    except ProtocolError as exc:
        assert_clean(exc)


@FUZZ
@given(valid_cases(), st.binary(max_size=256), st.integers(-64, 64))
def test_a_random_binary_tail_is_taken_exactly_or_refused(case: Case, tail: bytes, cut: int):
    """The declared binary_data_size must cover the tail exactly: a short or long tail is a 4xx."""
    TRIED["valid header + random binary tail"] += 1
    binary = (case.binary or b"")
    binary = binary[:cut] if cut < 0 else binary + tail[:cut]
    try:
        req = parse(case.specs, encode(case.doc), binary)
    except ProtocolError as exc:
        assert_clean(exc)
        assert binary != (case.binary or b""), "a valid request was refused"
        return
    assert binary == (case.binary or b"")
    assert_same(req.inputs, case.arrays)


@FUZZ
@given(st.sampled_from(DATATYPES), st.integers(1, 6), st.data())
@example("BOOL", 1, None)          # "false" was taken as True: numpy turns any non-empty string into True
def test_strings_or_null_in_json_data_are_refused_not_converted(datatype, n, data):
    TRIED["strings / null inside JSON data"] += 1
    values: list[Any] = [1] * n
    if data is None:
        values = ["false"]
    else:
        values[data.draw(st.integers(0, n - 1))] = data.draw(st.one_of(
            st.none(), st.text(max_size=5), st.sampled_from(["false", "0", "1.5", "NaN", "1e3"])))
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [len(values)], "data": values}]}
    with pytest.raises(ProtocolError) as info:
        parse([TensorSpec("x", datatype, (-1,))], json.dumps(doc).encode(), None)
    assert_clean(info.value)


# -- responses through tritonclient's own parser --

@st.composite
def results(draw) -> tuple[dict[str, np.ndarray], list[tuple[str, bool]], str | None]:
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3, unique=True))
    arrays = {n: draw(hnp.arrays(KSERVE_TO_NUMPY[draw(st.sampled_from(DATATYPES))],
                                 hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)))
              for n in names}
    return arrays, [(n, draw(st.booleans())) for n in names], draw(st.none() | st.text(max_size=8))


@FUZZ
@given(results())
def test_a_response_round_trips_through_tritonclient(res):
    TRIED["build_response -> tritonclient InferResult"] += 1
    httpclient = pytest.importorskip("tritonclient.http")
    arrays, outputs, rid = res
    req = InferRequest(id=rid, inputs={}, outputs=outputs)
    pieces, header_len = build_response("fuzz", "1", req, arrays)
    body = b"".join(bytes(p) for p in pieces)
    result = httpclient.InferResult.from_response_body(body, header_length=header_len)
    assert result.get_response()["model_name"] == "fuzz"
    assert result.get_response().get("id") == rid
    for name, arr in arrays.items():
        got = result.as_numpy(name)
        assert got is not None and got.shape == arr.shape, (name, got, arr)
        np.testing.assert_array_equal(got.astype(arr.dtype), arr)
