"""JSON on the inference path: orjson where it is installed, with the standard library's meaning.

Why not the standard library alone: a small conv net's request (768 FP32 values, 16 KB of JSON) took
379 us in json.loads and 47 us in orjson.loads; an answer of 1000 floats took 1,049 us in json.dumps
and 73 us in orjson.dumps (this repo's 2-core CI machine, orjson 3.13; issue 24, where ngcx lost
JSON points of `python -m bench serve-peers` to KServe). Every image installs orjson (recipes/runtime.j2);
ngcx-runtime outside an image may lack it, and then the standard library does all of it.

The standard library's meaning is kept, because clients rely on it: Python's json and tritonclient
write NaN / Infinity / -Infinity (an attention mask of -inf is a real input), and a -inf logit must
come back as -Infinity, not as orjson's `null`. So:
- loads: orjson first; a body orjson refuses (those literals, nesting past its depth limit, or bad
  JSON) is parsed again by the standard library, which either reads it or raises the error the
  client gets. Only refused bodies pay twice.
- dumps: orjson only when every float in the document is finite (the caller knows: `finite`); numpy
  arrays in the document (jsontensor.to_json, only with orjson and only finite ones) are written as
  arrays, without a list of Python floats (issue 50).
One difference is left: an integer past 64 bits reads as a float in orjson and as an int in the standard
library; either way numpy refuses it for an integer tensor (a 400), and a float tensor gets the same value.
"""

from __future__ import annotations

import json
from typing import Any

try:                                        # an optional speed-up: every image has it, a plain checkout may not
    import orjson
except ImportError:                          # pragma: no cover - the fallback is tested with use(False)
    orjson = None  # type: ignore[assignment]


class NestedTooDeeply(ValueError):
    """The document nests deeper than the standard library's parser can go."""


def _stdlib_loads(raw: bytes | bytearray | memoryview | str) -> Any:
    try:
        return json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
    except RecursionError:
        raise NestedTooDeeply("nested too deeply") from None


def _orjson_loads(raw: bytes | bytearray | memoryview | str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _stdlib_loads(raw)


def _as_list(value: Any) -> Any:
    """json.dumps's hook for what it cannot write: a numpy array (jsontensor.to_json's) as its list."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _stdlib_dumps(doc: Any, finite: bool = True) -> bytes:
    return json.dumps(doc, separators=(",", ":"), default=_as_list).encode()


def _orjson_dumps(doc: Any, finite: bool = True) -> bytes:
    """numpy arrays in `doc` are written as they are (jsontensor.to_json hands out only finite ones)."""
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) if finite else _stdlib_dumps(doc)


def use(fast: bool) -> None:
    """Pick the codec (the tests run both); fast needs orjson installed."""
    global loads, dumps, FAST
    if fast and orjson is None:
        raise RuntimeError("orjson is not installed")
    loads, dumps, FAST = (_orjson_loads, _orjson_dumps, True) if fast else (_stdlib_loads, _stdlib_dumps, False)


loads = _stdlib_loads
dumps = _stdlib_dumps
FAST = False
use(orjson is not None)
