"""A JSON request body whose float tensors go straight from the text into numpy: no Python float per value
(issue 50 item 5, the part jsontensor.py could not reach with orjson).

Why: at image size (3x224x224 FP32 as Python's json writes it, 3.1 MB, 150,528 values) orjson.loads builds
150,528 Python floats that one np.asarray then copies and the collector frees: 21-22 ms of the request on
one core, holding the GIL (jsontensor.py's measurements), which capped a JSON image point of `python -m bench
serve-peers` near 1.1-1.6x the best peer. simdjson (PyPI pysimdjson, a binding of the simdjson C++ parser)
parses the document into its own tape and `Array.as_buffer(of_type="d")` copies a numeric array's values
into one C buffer of doubles, with no Python object per value (the figures under MIN_BYTES below; the
end-to-end effect is bench serve-peers' image JSON points).

The standard library's meaning is kept by taking this route only where it cannot differ, and handing every
other body to wirejson.loads as before (`read` returns None):
- only a float tensor's (FP16/FP32/FP64) "data": simdjson reads each number correctly rounded to a double, as
  float(token) does, and an int as the double it is, so the cast into the tensor's dtype is np.asarray's;
- NaN / Infinity / -Infinity, numbers past a double's range, ints past 64 bits, invalid UTF-8, nesting
  deeper than simdjson's limit: simdjson refuses the body, so the old route reads it (and its errors are
  the ones clients already get);
- true/false, null, strings or objects among the values: as_buffer refuses them, that one "data" is read
  as a list (the old checks then apply);
- nested "data" (as_buffer would flatten [[1, 2], [3]] into three values where numpy refuses the ragged
  list): the body's count of "[" must equal the arrays this read kept as Python lists plus one per fast
  "data", so a fast "data" held no inner array. A "[" inside a string only makes the count larger: such a
  body takes the old route. A flat "data" is the protocol's canonical form (tritonclient sends it).
- bodies under MIN_BYTES: parse_header + parse_infer_request of a flat FP32 body took, orjson against this
  route, best of 15 in one process: 3.1 MB 9.05 vs 4.66 ms (1.94x), 253 KB 0.58 vs 0.35 ms, 16 KB 0.038 vs
  0.028 ms, 5 KB even, 1 KB 0.009 vs 0.012 ms; so from 8 KiB on.
A simdjson parser may not parse again while proxies of its last document live, and parsing holds the GIL
but conversions interleave between threads; so each read takes a parser from a small pool and gives it
back once its proxies are gone (about 7 MB of buffers per parser after an image-sized body: at most
POOL idle ones are kept).
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:                                          # like orjson (wirejson.py): every image has it, a checkout may not
    import simdjson
except ImportError:                            # pragma: no cover - the route is then off; tests run both
    simdjson = None  # type: ignore[assignment]

FLOATS = ("FP16", "FP32", "FP64")
MIN_BYTES = 8 * 1024            # where the route starts paying (module docstring)
POOL = 4
_parsers: list[Any] = []
_on = simdjson is not None
_min_bytes = MIN_BYTES


def use(on: bool, min_bytes: int = MIN_BYTES) -> None:
    """Turn the route on or off, and from which body size (the tests run every body through both)."""
    global _on, _min_bytes
    if on and simdjson is None:
        raise RuntimeError("pysimdjson is not installed")
    _on, _min_bytes = on, min_bytes


def read(raw: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """The request as wirejson.loads would give it, with each float tensor's "data" as a float64 array;
    None when this route does not apply or might read the body differently (the module docstring)."""
    if not _on or len(raw) < _min_bytes:
        return None
    data = raw if isinstance(raw, bytes) else bytes(raw)
    try:
        parser = _parsers.pop()                   # atomic under the GIL; another thread may have emptied it
    except IndexError:
        parser = simdjson.Parser()
    try:
        doc = _convert(parser, data)
    finally:
        if len(_parsers) < POOL:
            _parsers.append(parser)
    return doc


def _convert(parser: Any, data: bytes) -> dict[str, Any] | None:
    """Parse and convert; every proxy of the document is gone when this returns (the parser is reusable)."""
    try:
        root = parser.parse(data)
    except (ValueError, RuntimeError, TypeError):   # not JSON simdjson reads (the old route says why)
        return None
    if not isinstance(root, simdjson.Object):
        return None
    counted = _Counted()
    try:
        doc = {key: _inputs(root[key], counted) if key == "inputs" else counted.python(root[key])
               for key in _keys(root)}
    except (ValueError, RuntimeError, TypeError, MemoryError, _Duplicate):
        return None
    if counted.fast and data.count(b"[") != counted.arrays + counted.fast:
        return None                               # some fast "data" held an inner array: numpy's rules decide
    return doc


class _Counted:
    """Converts proxies into Python values, counting the arrays it made (the "[" check) and fast tensors."""

    def __init__(self) -> None:
        self.arrays = 0
        self.fast = 0

    def python(self, value: Any) -> Any:
        if isinstance(value, simdjson.Object):
            value = value.as_dict()
        elif isinstance(value, simdjson.Array):
            value = value.as_list()
        else:
            return value
        self.arrays += _arrays_in(value)
        return value

    def tensor(self, item: Any) -> dict[str, Any]:
        """One input object; its "data" as doubles when it is a float tensor's and numeric only."""
        entry = {key: None if key == "data" else self.python(item[key]) for key in _keys(item)}
        if "data" in entry:
            entry["data"] = self._data(item["data"], entry.get("datatype"))
        return entry

    def _data(self, values: Any, datatype: Any) -> Any:
        if datatype in FLOATS and isinstance(values, simdjson.Array):
            try:
                flat = np.frombuffer(values.as_buffer(of_type="d"), dtype=np.float64)
            except (TypeError, ValueError):       # true/false, null, strings, objects among the values
                return self.python(values)
            self.fast += 1
            return flat
        return self.python(values)


def _inputs(value: Any, counted: _Counted) -> Any:
    if not isinstance(value, simdjson.Array):
        return counted.python(value)
    counted.arrays += 1
    return [counted.tensor(item) if isinstance(item, simdjson.Object) else counted.python(item) for item in value]


class _Duplicate(Exception):
    """An object names a key twice: json.loads keeps the last, simdjson's lookup finds the first."""


def _keys(obj: Any) -> list[str]:
    """An object's keys, each once; values are then looked up one by one (`items()` would convert them all,
    tensor data included, into Python objects)."""
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise _Duplicate
    return keys


def _arrays_in(value: Any) -> int:
    """How many JSON arrays a converted value holds (itself included), walked without recursion."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            count += 1
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return count
