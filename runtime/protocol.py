"""KServe v2 / Triton HTTP inference bodies: parse requests, build responses (runtime.md §8).

Why a module of its own: the wire format (JSON tensors, nested or flat, plus Triton's binary
tensor extension) is pure data handling that the tests can exercise without sockets, and the
HTTP layer stays about connections (transport.py), routing and errors (routes.py).

Performance rules for large bodies (ResNet-50 batch 256 is ~77 MB FP16 per request): binary
inputs become np.frombuffer views over the received buffer (no copy), binary outputs are written
as memoryviews of the output arrays (no JSON-encoding of floats).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import jsonbody, jsontensor, wirejson
from .engine import BYTES, BYTES_DTYPE, KSERVE_TO_NUMPY, NUMPY_TO_KSERVE, TensorSpec

# Datatypes the protocol knows but numeric engines cannot take: rejected with a clear message.
# BYTES is accepted where the model declares it (handlers); BF16 never.
_KNOWN_UNSUPPORTED = {"BYTES", "BF16"}
_LEN_BYTES = 4               # Triton's binary BYTES element: 4-byte little-endian length, then the bytes
# Largest dimension a request may declare (int64, as Triton): a bigger one can never match a body, and
# the element count of a few 4000-digit dims cannot even be printed (int -> str limit), which was a 500.
_DIM_MAX = 2**63 - 1


class ProtocolError(Exception):
    """A request the server answers with an HTTP error status and {"error": message}."""

    def __init__(self, message: str, status: int = 400, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers          # extra response headers (a 401's WWW-Authenticate)


class SharedMemoryIO(Protocol):
    """What parsing needs from the system shared-memory registry (shm.py): bytes in, bytes out."""

    def read(self, name: Any, offset: int, size: int, where: str) -> np.ndarray: ...

    def write(self, name: Any, offset: int, byte_size: int, data: memoryview, where: str) -> None: ...


@dataclass
class InferRequest:
    """One parsed inference request: numpy inputs keyed by name and what to send back."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]]          # (output name, send as binary)
    batch: int = 0                           # dim 0 of the inputs (0 for unbatchable models)
    parameters: dict[str, Any] = field(default_factory=dict)
    shm_outputs: dict[str, tuple[Any, int, int]] = field(default_factory=dict)   # name -> (region, offset, size)


def _element_count(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _check_shape(raw: Any, spec: TensorSpec, where: str) -> list[int]:
    """A request shape must be a list of non-negative ints matching the model's rank and fixed dims."""
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise ProtocolError(f"{where}: 'shape' must be a list of integers, got {_brief(raw)}")
    if any(d < 0 for d in raw):
        raise ProtocolError(f"{where}: shape {_brief(raw)} has a negative dimension")
    if any(d > _DIM_MAX for d in raw):
        raise ProtocolError(f"{where}: shape {_brief(raw)} has a dimension above {_DIM_MAX}")
    if len(raw) != len(spec.shape):
        raise ProtocolError(f"{where}: shape {_brief(raw)} has rank {len(raw)}, the model expects rank "
                            f"{len(spec.shape)} {_fmt_shape(spec.shape)}")
    for i, (got, want) in enumerate(zip(raw, spec.shape, strict=True)):
        if want >= 0 and got != want:
            raise ProtocolError(f"{where}: shape {_brief(raw)} does not match the model's "
                                f"{_fmt_shape(spec.shape)} at dimension {i} (expected {want}, got {_brief(got)})")
    return raw


def _brief(value: Any, limit: int = 80) -> str:
    """A peer's value quoted in an error line: bounded in length, whatever its size or depth."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError, TypeError):
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def peer_text(text: str, limit: int = 80) -> str:
    """A peer's name inside an error: as is when short and printable, else escaped and cut (one line)."""
    if len(text) <= limit and text.isprintable():
        return text
    return repr(text[:limit])[1:-1] + ("..." if len(text) > limit else "")


def _quoted(name: str, limit: int = 60) -> str:
    """A peer's name in an error line: 'name' when short and printable, else escaped and cut (one line)."""
    return f"'{name}'" if len(name) <= limit and name.isprintable() else _brief(name, limit)


def _fmt_shape(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_datatype(raw: Any, spec: TensorSpec, where: str) -> np.dtype:
    if not isinstance(raw, str):
        raise ProtocolError(f"{where}: 'datatype' must be a string such as \"{spec.datatype}\"")
    if raw == BYTES and spec.datatype == BYTES:
        return BYTES_DTYPE
    if spec.datatype == BYTES:
        raise ProtocolError(f"{where}: datatype {_quoted(raw)} does not match the model's BYTES; send strings "
                            "as BYTES")
    if raw in _KNOWN_UNSUPPORTED:
        raise ProtocolError(f"{where}: datatype {raw} is not supported by this numeric model; "
                            f"send {spec.datatype}")
    if raw not in KSERVE_TO_NUMPY:
        raise ProtocolError(f"{where}: unknown datatype {_quoted(raw)}; the model expects {spec.datatype}")
    if raw != spec.datatype:
        raise ProtocolError(f"{where}: datatype {raw} does not match the model's {spec.datatype}")
    # The wire is little-endian (binary extension); a no-op on x86/ARM hosts.
    return KSERVE_TO_NUMPY[raw].newbyteorder("<")


def _json_tensor(data: Any, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """JSON 'data' is row-major, flat or nested; its element count must equal the shape's.

    Only numbers and booleans: numpy would turn "1.5" into 1.5, null into NaN and any non-empty
    string (even "false") into True for a BOOL input (issue 8). BYTES take strings instead.
    Numbers go into numpy in one conversion (jsontensor.py: measured at image size, issue 50).
    """
    if not isinstance(data, list | np.ndarray):    # an array: jsonbody.py read the list's numbers already
        raise ProtocolError(f"{where}: 'data' must be a JSON list of values (flat or nested), "
                            f"got {_brief(data, 40)}")
    if dtype == BYTES_DTYPE:
        return _json_bytes(data, shape, where)
    try:
        arr = jsontensor.from_json(data, dtype)
    except jsontensor.BadTensor as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    need = _element_count(shape)
    if arr.size != need:
        raise ProtocolError(f"{where}: 'data' has {arr.size} elements but shape {_brief(shape)} needs "
                            f"{_brief(need, 40)}")
    return arr.reshape(shape)


def _json_bytes(data: Any, shape: list[int], where: str) -> np.ndarray:
    """BYTES as JSON: a (flat or nested) list of strings, each becoming its UTF-8 bytes."""
    flat: list[bytes] = []
    stack = [data]
    while stack:                                  # iterative: a deeply nested list is no RecursionError
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            try:
                flat.append(item.encode("utf-8"))
            except UnicodeEncodeError:
                raise ProtocolError(f"{where}: 'data' holds a string that is not valid Unicode (a lone "
                                    "surrogate); send such bytes as binary data") from None
        else:
            raise ProtocolError(f"{where}: BYTES 'data' must be a list of strings, got {_brief(item, 40)}")
    need = _element_count(shape)
    if len(flat) != need:
        raise ProtocolError(f"{where}: 'data' has {len(flat)} elements but shape {_brief(shape)} needs "
                            f"{_brief(need, 40)}")
    arr = np.empty(len(flat), dtype=object)
    arr[:] = flat
    return arr.reshape(shape)


def parse_header(raw: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The JSON part of a request; one clear error when it is not a JSON object."""
    if not len(raw):
        raise ProtocolError("the request body is empty; send a JSON inference request with an 'inputs' list")
    try:
        doc = jsonbody.read(raw)                   # image-sized float tensors straight into numpy, else None
        if doc is None:
            doc = wirejson.loads(raw)
    except wirejson.NestedTooDeeply:
        raise ProtocolError("the JSON request body is nested too deeply; tensors need at most one "
                            "level per dimension (or send 'data' flat)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed JSON in the request body: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("the request body must be a JSON object with an 'inputs' list")
    return doc


def parse_infer_request(doc: dict[str, Any], binary: memoryview | None, inputs: list[TensorSpec],
                        outputs: list[TensorSpec], model: str, batchable: bool,
                        shm: SharedMemoryIO | None = None) -> InferRequest:
    """Validate a decoded request against the model's specs and build numpy inputs.

    binary is the body after the JSON header (binary tensor extension) or None. Binary inputs
    are taken from it in the order they appear in the JSON, as zero-copy views. Inputs and
    outputs naming a shared_memory_region go through shm (None: the extension is not offered).
    """
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("the request needs a non-empty 'inputs' list")
    specs = {s.name: s for s in inputs}
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"inputs[{i}] must be an object with a 'name'")
        name = item["name"]
        where = f"input {_quoted(name)}"
        if name not in specs:
            raise ProtocolError(f"{where}: model '{model}' has no such input; its inputs are "
                                f"{', '.join(sorted(specs))}")
        if name in feeds:
            raise ProtocolError(f"{where} is given twice")
        spec = specs[name]
        shape = _check_shape(item.get("shape"), spec, where)
        dtype = _check_datatype(item.get("datatype"), spec, where)
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise ProtocolError(f"{where}: 'parameters' must be an object")
        size = params.get("binary_data_size")
        if params.get("shared_memory_region") is not None:
            if size is not None or "data" in item:
                raise ProtocolError(f"{where} names a shared memory region and also carries data; give one")
            feeds[name] = _shm_tensor(shm, params, dtype, shape, where)
        elif size is not None:
            feeds[name], offset = _binary_tensor(binary, offset, size, dtype, shape, where)
        elif "data" in item:
            feeds[name] = _json_tensor(item["data"], dtype, shape, where)
        else:
            raise ProtocolError(f"{where} has neither 'data' nor parameters.binary_data_size")
    carried = 0 if binary is None else len(binary)
    if offset != carried:
        raise ProtocolError(f"binary data: the inputs declare {offset} bytes but the body carries "
                            f"{carried} bytes after the JSON header")
    missing = [n for n in specs if n not in feeds]
    if missing:
        raise ProtocolError(f"missing input(s) {', '.join(missing)} for model '{model}'")
    batch = _batch_of(feeds, model) if batchable else 0
    shm_outputs: dict[str, tuple[Any, int, int]] = {}
    chosen = _requested_outputs(doc, outputs, model, shm_outputs)
    if shm_outputs and shm is None:
        raise ProtocolError("outputs to shared memory need the system shared memory extension, which this "
                            "server does not offer")
    return InferRequest(id=_request_id(doc), inputs=feeds, outputs=chosen, batch=batch,
                        parameters=doc.get("parameters") or {}, shm_outputs=shm_outputs)


def _shm_params(params: dict[str, Any], where: str) -> tuple[Any, int, int]:
    """(region, offset, byte_size) of a tensor in shared memory, the numbers checked."""
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _DIM_MAX:
            raise ProtocolError(f"{where}: {key} must be a non-negative integer, got {_brief(value)}")
    return params["shared_memory_region"], offset, size


def _shm_tensor(shm: SharedMemoryIO | None, params: dict[str, Any], dtype: np.dtype, shape: list[int],
                where: str) -> np.ndarray:
    """An input read from a registered shared memory region (its byte size must match the shape)."""
    if shm is None:
        raise ProtocolError(f"{where} names a shared memory region, but this server does not offer the "
                            "system shared memory extension")
    region, offset, size = _shm_params(params, where)
    if dtype == BYTES_DTYPE:
        return _binary_bytes(memoryview(shm.read(region, offset, size, where)), 0, size, shape, where)
    need = _element_count(shape) * dtype.itemsize
    if size != need:
        raise ProtocolError(f"{where}: shared_memory_byte_size {size} does not match shape {_brief(shape)} "
                            f"{NUMPY_TO_KSERVE[dtype.newbyteorder('=')]} ({_brief(need, 40)} bytes)")
    buf = shm.read(region, offset, size, where)
    return np.frombuffer(buf, dtype=dtype, count=_element_count(shape)).reshape(shape)


def _binary_tensor(binary: memoryview | None, offset: int, size: Any, dtype: np.dtype, shape: list[int],
                   where: str) -> tuple[np.ndarray, int]:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ProtocolError(f"{where}: binary_data_size must be a non-negative integer, got {_brief(size)}")
    if dtype == BYTES_DTYPE:
        return _binary_bytes(binary, offset, size, shape, where), offset + size
    need = _element_count(shape) * dtype.itemsize
    if size != need:
        raise ProtocolError(f"{where}: binary_data_size {_brief(size, 40)} does not match shape {_brief(shape)} "
                            f"{NUMPY_TO_KSERVE[dtype.newbyteorder('=')]} ({_brief(need, 40)} bytes)")
    _check_span(binary, offset, size, where)
    arr = np.frombuffer(binary, dtype=dtype, count=_element_count(shape), offset=offset).reshape(shape)
    return arr, offset + size


def _check_span(binary: memoryview | None, offset: int, size: int, where: str) -> None:
    """The body after the JSON header carries bytes offset..offset+size of this input."""
    if binary is None:
        raise ProtocolError(f"{where} declares binary_data_size but the request has no "
                            "Inference-Header-Content-Length header (binary tensor extension)")
    if offset + size > len(binary):
        raise ProtocolError(f"binary data: {where} needs bytes {offset}..{offset + size} but the body "
                            f"carries only {len(binary)} bytes after the JSON header")


def _binary_bytes(binary: memoryview | None, offset: int, size: int, shape: list[int], where: str) -> np.ndarray:
    """Triton's binary BYTES: per element a 4-byte little-endian length and the bytes, `size` bytes in all."""
    _check_span(binary, offset, size, where)
    need = _element_count(shape)
    if need > size // _LEN_BYTES:               # every element takes at least its 4 length bytes
        raise ProtocolError(f"{where}: shape {_brief(shape)} needs {_brief(need, 40)} BYTES elements but "
                            f"binary_data_size {size} cannot hold that many length prefixes")
    chunk = binary[offset:offset + size]
    arr = np.empty(need, dtype=object)
    pos = 0
    for i in range(need):
        if pos + _LEN_BYTES > size:
            raise ProtocolError(f"{where}: binary BYTES data ends after {i} of {need} elements")
        n = int.from_bytes(chunk[pos:pos + 4], "little")
        if pos + 4 + n > size:
            raise ProtocolError(f"{where}: binary BYTES element {i} claims {n} bytes but only {size - pos - 4} "
                                "remain in its binary_data_size")
        arr[i] = bytes(chunk[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != size:
        raise ProtocolError(f"{where}: binary_data_size {size} holds {size - pos} bytes beyond its {need} "
                            "BYTES elements")
    return arr.reshape(shape)


def _batch_of(feeds: dict[str, np.ndarray], model: str) -> int:
    sizes = {a.shape[0] for a in feeds.values()}
    if len(sizes) != 1:
        raise ProtocolError(f"inputs of model '{model}' disagree on the batch size (dimension 0): "
                            f"{sorted(sizes)}")
    return sizes.pop()


def _request_id(doc: dict[str, Any]) -> str | None:
    rid = doc.get("id")
    if rid is None:
        return None
    if not isinstance(rid, str):
        raise ProtocolError("'id' must be a string")
    return rid


def _requested_outputs(doc: dict[str, Any], outputs: list[TensorSpec], model: str,
                       shm_outputs: dict[str, tuple[Any, int, int]] | None = None) -> list[tuple[str, bool]]:
    """Which outputs to return and how: per-output binary_data overrides binary_data_output; an output
    naming a shared_memory_region is recorded in shm_outputs (written there, not into the body)."""
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError("'parameters' must be an object")
    default_binary = bool(params.get("binary_data_output", False))
    raw = doc.get("outputs")
    if raw is None:
        return [(s.name, default_binary) for s in outputs]
    if not isinstance(raw, list):
        raise ProtocolError("'outputs' must be a list of objects with a 'name'")
    known = {s.name for s in outputs}
    chosen: list[tuple[str, bool]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"outputs[{i}] must be an object with a 'name'")
        if item["name"] not in known:
            raise ProtocolError(f"requested output {_quoted(item['name'])}: model '{model}' has no such output; "
                                f"its outputs are {', '.join(sorted(known))}")
        oparams = item.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise ProtocolError(f"output {_quoted(item['name'])}: 'parameters' must be an object")
        if oparams.get("shared_memory_region") is not None and shm_outputs is not None:
            shm_outputs[item["name"]] = _shm_params(oparams, f"output {_quoted(item['name'])}")
        chosen.append((item["name"], bool(oparams.get("binary_data", default_binary))))
    return chosen


def build_response(model: str, version: str, req: InferRequest, results: dict[str, np.ndarray],
                   shm: SharedMemoryIO | None = None) -> tuple[list[bytes | memoryview], int | None]:
    """Response pieces to write in order, and the JSON header length when binary data follows.

    Binary outputs are memoryviews of the (C-contiguous) result arrays: no copy, no float
    formatting. Without binary outputs the body is plain JSON and the header length is None.
    Outputs in req.shm_outputs are written into their shared memory region through shm.
    """
    outs: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    finite = True                   # no NaN / Infinity in the JSON data: the fast encoder may write it
    for name, binary in req.outputs:
        arr = results[name]
        if name in req.shm_outputs:
            outs.append(_shm_output(name, arr, req.shm_outputs[name], shm))
            continue
        if arr.dtype.kind in "OSU":
            entry, blob = _bytes_output(name, arr, binary)
            outs.append(entry)
            if blob is not None:
                blobs.append(blob)
            continue
        datatype = NUMPY_TO_KSERVE.get(arr.dtype.newbyteorder("="))
        if datatype is None:
            raise ProtocolError(f"output '{name}' has numpy dtype {arr.dtype}, which KServe v2 cannot carry",
                                status=500)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            arr = np.ascontiguousarray(arr)
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": arr.nbytes}
            blobs.append(memoryview(arr).cast("B") if arr.nbytes else memoryview(b""))
        else:
            entry["data"], fin = jsontensor.to_json(arr)         # a finite array goes to orjson as it is
            finite = finite and fin
        outs.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": outs}
    if req.id is not None:
        doc["id"] = req.id
    header = wirejson.dumps(doc, finite)
    if not blobs:
        return [header], None
    return [header, *blobs], len(header)


def output_bytes(name: str, arr: np.ndarray) -> tuple[str, list[int], bytes]:
    """(datatype, shape, raw bytes) of one output, as gRPC's raw_output_contents carry it: little-endian,
    row-major; BYTES elements length-prefixed as in the binary tensor extension."""
    if arr.dtype.kind in "OSU":
        entry, blob = _bytes_output(name, arr, True)
        return BYTES, entry["shape"], blob or b""
    datatype = NUMPY_TO_KSERVE.get(arr.dtype.newbyteorder("="))
    if datatype is None:
        raise ProtocolError(f"output '{name}' has numpy dtype {arr.dtype}, which KServe v2 cannot carry", status=500)
    arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return datatype, list(arr.shape), arr.tobytes()


def shm_output(name: str, arr: np.ndarray, where_to: tuple[Any, int, int], shm: SharedMemoryIO | None) -> dict:
    """Write one output into its shared memory region; returns its description (name, datatype, shape,
    parameters) for the response."""
    return _shm_output(name, arr, where_to, shm)


def _shm_output(name: str, arr: np.ndarray, where_to: tuple[Any, int, int], shm: SharedMemoryIO | None) -> dict:
    """Write one output into its shared memory region; the response carries only its description."""
    if shm is None:
        raise ProtocolError("outputs to shared memory need the system shared memory extension")
    region, offset, size = where_to
    if arr.dtype.kind in "OSU":
        entry, blob = _bytes_output(name, arr, True)
        data = memoryview(blob or b"")
    else:
        datatype = NUMPY_TO_KSERVE.get(arr.dtype.newbyteorder("="))
        if datatype is None:
            raise ProtocolError(f"output '{name}' has numpy dtype {arr.dtype}, which KServe v2 cannot carry", 500)
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        entry = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        data = memoryview(arr).cast("B") if arr.nbytes else memoryview(b"")
    shm.write(region, offset, size, data, f"output {_quoted(name)}")
    entry["parameters"] = {"shared_memory_region": region, "shared_memory_byte_size": data.nbytes}
    if offset:
        entry["parameters"]["shared_memory_offset"] = offset
    return entry


def _as_bytes(value: Any, name: str) -> bytes:
    """One BYTES output element: bytes as they are, str as UTF-8; anything else is the engine's bug."""
    if isinstance(value, bytes | bytearray | memoryview | np.bytes_):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    raise ProtocolError(f"output '{name}' holds a {type(value).__name__}, not bytes or str; a BYTES output "
                        "must be a numpy object array of bytes", status=500)


def _bytes_output(name: str, arr: np.ndarray, binary: bool) -> tuple[dict[str, Any], bytes | None]:
    """A BYTES output: length-prefixed binary, or JSON strings (bytes must then be UTF-8 text)."""
    items = [_as_bytes(v, name) for v in arr.reshape(-1).tolist()]
    entry: dict[str, Any] = {"name": name, "datatype": BYTES, "shape": list(arr.shape)}
    if binary:
        blob = b"".join(len(b).to_bytes(4, "little") + b for b in items)
        entry["parameters"] = {"binary_data_size": len(blob)}
        return entry, blob
    try:
        entry["data"] = [b.decode("utf-8") for b in items]
    except UnicodeDecodeError:
        raise ProtocolError(f"output '{name}' holds bytes that are not UTF-8 text, which JSON cannot carry; "
                            "request it as binary data (binary_data: true)") from None
    return entry, None
