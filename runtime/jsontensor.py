"""JSON tensors both ways at image size: a request's `data` list into numpy in one conversion, an answer's
array into JSON text without a list of Python numbers (issue 50 item 5).

Measured first, on a 3x224x224 FP32 request as Python's json and tritonclient write it (3.1 MB, 150,528
values of 17 digits), on this repo's 2-core machine with nothing else running (orjson 3.13, numpy 2.4,
best of 10-20 calls):
- parse_header + parse_infer_request took 26-27 ms: orjson.loads 10 ms, np.asarray(data, float32) 3.3 ms,
  a second, untyped np.asarray(data) 4.3 ms that only checked the values' types, and freeing the 150,528
  Python floats; json.loads alone (no orjson) is 45 ms;
- numpy's own text routes are slower than orjson plus one conversion, so "text straight into numpy" loses:
  np.fromstring(sep=",") 80 ms, np.loadtxt 65 ms, np.array(text.split(b","), float32) 53 ms, a regex
  check of the number grammar alone 132 ms (these four on a busy machine, where orjson.loads took 16 ms).
  orjson's number parser is the fastest route here; what it costs is mostly the text (10 ms for these
  17-digit numbers, 5 ms for as many short ints), not the Python objects.
So a numeric tensor is read by ONE untyped np.asarray over orjson's list: it is at once the type check
(numbers and true/false give a number dtype; null, strings and objects do not) and the conversion, then a
cast into the tensor's dtype (0.2 ms). Parse + build: 26-27 -> 21-22 ms per image, in an A/B of the two
trees in one session. The rest is orjson's (one core: it holds the GIL), which bounds a JSON image point
of `python -m bench serve-peers` at about 45 requests/s on one core.

The standard library's meaning is kept (wirejson.py reads NaN / Infinity / -Infinity as json does):
- a float tensor gets float(token) cast to its dtype, as np.asarray(data, dtype) gave: Python ints are
  first made float64 (as numpy does for an int in a float list), an int past 64 bits takes the old path;
- an integer tensor refuses a value out of its range (a 400, as numpy's OverflowError was), and a float in
  it takes the old path (numpy truncates it; NaN is refused), so every rare case answers as before;
- BOOL takes any number (non-zero is true) and true/false, as numpy did.

Answers: a finite numeric array goes to orjson as the array itself (OPT_SERIALIZE_NUMPY: no tolist(), no
Python floats). orjson writes FP32/FP16 values in their own type's shortest form (0.1, not the float64
widening 0.10000000149011612): the same FP32 value to any reader that reads FP32, and a shorter text. An
array with NaN or an infinity keeps the standard library's text (orjson would write null), through tolist.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import wirejson

_NUMBERS = "fbiu"                     # numpy kinds an untyped asarray gives for numbers and true/false
_NOT_NUMBERS = "'data' must hold numbers (or true/false), not strings or null"


class BadTensor(ValueError):
    """A JSON 'data' list that cannot be the tensor: the message completes "input 'x': ..."."""


def from_json(data: list, dtype: np.dtype) -> np.ndarray:
    """`data` (a JSON list, flat or nested, of numbers or true/false) as an array of `dtype` (its shape is
    the nesting's; the caller checks the element count against the request's shape). An array is what
    jsonbody.py read from a float tensor's flat list of numbers: only the cast is left."""
    if isinstance(data, np.ndarray):
        return _cast(data, dtype)
    try:
        probe = np.asarray(data)                   # the one pass over the list: values' types and the numbers
    except OverflowError:                          # an int past int64 next to a negative one (UINT64's top half)
        _only_numbers(data)
        return _typed(data, None, dtype)
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadTensor(_not_rectangular(dtype, exc)) from None
    if probe.dtype.kind in "USV":
        raise BadTensor(_NOT_NUMBERS)
    if probe.dtype.kind not in _NUMBERS or (probe.dtype.kind == "f" and dtype.kind in "iu"):
        return _typed(data, probe, dtype)          # objects, or floats for an integer tensor: numpy's rules
    return _cast(probe, dtype)


def _cast(probe: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A number array into the tensor's dtype with np.asarray(data, dtype)'s meaning, or the typed path."""
    if dtype.kind == "f":
        if probe.dtype.kind in "iu":
            probe = probe.astype(np.float64)       # numpy reads an int in a float list as float64 first
        return probe.astype(dtype, copy=False)
    if dtype.kind == "b":
        return probe.astype(dtype, copy=False)     # non-zero is true, as np.asarray(data, bool) reads it
    if probe.size:                                 # ints (or true/false) for an integer tensor: in its range?
        info = np.iinfo(dtype)
        low, high = int(probe.min()), int(probe.max())
        if low < info.min or high > info.max:
            raise BadTensor(f"'data' holds {low if low < info.min else high}, out of {dtype.name}'s range "
                            f"{info.min}..{info.max}")
    return probe.astype(dtype, copy=False)


def _only_numbers(data: list) -> None:
    """Every leaf of a nested list is a number or true/false (a walk in Python: only for the rare lists that
    an untyped asarray cannot take)."""
    stack = [data]
    while stack:                                   # iterative: a deeply nested list is no RecursionError
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif item is None or isinstance(item, str | dict):
            raise BadTensor(_NOT_NUMBERS)


def _typed(data: list, probe: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """The old, slower path for what an untyped asarray cannot decide: object arrays (ints past 64 bits, or
    null / strings / lists among numbers) and floats for an integer tensor."""
    if probe is not None and probe.dtype.kind == "O" and any(
            v is None or isinstance(v, str | list | dict) for v in probe.reshape(-1)):
        raise BadTensor(_NOT_NUMBERS)
    try:
        return np.asarray(data, dtype=dtype)
    except OverflowError as exc:
        raise BadTensor(f"'data' holds an integer out of {dtype.name}'s range ({exc})") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadTensor(_not_rectangular(dtype, exc)) from None


def _not_rectangular(dtype: np.dtype, exc: BaseException) -> str:
    why = " ".join(str(exc).split())              # numpy quotes the bad value whole: cut it
    return f"'data' is not a rectangular list of {dtype.name} values ({why[:120]})"


def to_json(arr: np.ndarray) -> tuple[Any, bool]:
    """A numeric output's "data", and whether it is finite (wirejson.dumps may then use orjson): the flat
    array itself when orjson will write it with the standard library's meaning (finite, native byte order),
    else the list json.dumps writes (NaN / Infinity / -Infinity as the standard library spells them)."""
    flat = arr.reshape(-1)
    finite = flat.dtype.kind != "f" or bool(np.isfinite(flat).all())
    if wirejson.FAST and finite and flat.dtype.isnative:
        return np.ascontiguousarray(flat), True
    return flat.tolist(), finite
