"""examples.yaml: a project's requests and the outputs it must answer (`ngcx test` sends them all).

Why its own loader with the model's signature: an example is only useful when it reaches the
model. A wrong input name, datatype, rank or fixed dimension would otherwise come back from the
server as a 400 in the middle of `ngcx test`; here it is one problem naming the example, the
tensor and the fix, with file:line, before anything is built or started (issue 9, bad input).
Same discipline as ngcx.yaml (spec.py): the one limited YAML loader, a strict pydantic schema,
then rules. Comparison (`compare`) says how far off an output is, not just that it is: the max
absolute and relative error and the first index outside the tolerance.

File shape:
    examples:
      - name: cat
        inputs:
          image: {datatype: BYTES, shape: [1], file: samples/cat.png}    # one BYTES element: the raw bytes
          x: {datatype: FP32, shape: [1, 4], data: [0.1, 0.2, 0.3, 0.4]}  # or npy: samples/x.npy
        outputs:
          labels: {data: ["tabby", "..."]}                                 # exact for BYTES / integers
          y: {data: [...], rtol: 1.0e-3, atol: 1.0e-4}                     # or npy: samples/y.npy
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..core.problems import Problem, ProblemsFound, schema_problems

if TYPE_CHECKING:
    import numpy as np

# KServe v2 datatypes (runtime/engine.py's table plus BYTES), kept here so the CLI needs no runtime import.
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES")
FLOAT_TYPES = ("FP16", "FP32", "FP64")
# Float outputs without rtol/atol: the same model on another ORT/CPU may differ in the last bits.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
MAX_FILE_BYTES = 64 << 20          # one `file:` input: an image or a document, not a dataset


# ----------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputTensor(_Strict):
    """One request tensor: its datatype, shape and exactly one source of values."""

    datatype: str = Field(description="KServe v2 datatype: FP32, INT64, BYTES, ...")
    shape: list[int] = Field(description="full shape, batch included, e.g. [1, 3, 224, 224]")
    data: list[Any] | None = Field(None, description="values, flat or nested (row-major)")
    npy: str | None = Field(None, description=".npy file relative to examples.yaml")
    file: str | None = Field(None, description="BYTES only: a file sent as one element (its raw bytes)")

    @model_validator(mode="after")
    def _one_source(self) -> InputTensor:
        given = [k for k in ("data", "npy", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of data, npy, file (got {', '.join(given) or 'none'})")
        return self


class OutputTensor(_Strict):
    """One expected output: values and, for floats, how close is close enough."""

    data: list[Any] | None = Field(None, description="expected values, flat or nested")
    npy: str | None = Field(None, description=".npy file relative to examples.yaml")
    shape: list[int] | None = Field(None, description="expected shape (default: a nested list's or .npy's own "
                                    "shape; a flat list compares values only)")
    rtol: float | None = Field(None, ge=0, description=f"relative tolerance for floats (default {DEFAULT_RTOL})")
    atol: float | None = Field(None, ge=0, description=f"absolute tolerance for floats (default {DEFAULT_ATOL})")

    @model_validator(mode="after")
    def _one_source(self) -> OutputTensor:
        if (self.data is None) == (self.npy is None):
            raise ValueError("give exactly one of data, npy")
        return self


class ExampleSpec(_Strict):
    name: str = Field(min_length=1)
    inputs: dict[str, InputTensor] = Field(min_length=1)
    outputs: dict[str, OutputTensor] = Field(default_factory=dict, description="empty: only check that it answers")


class ExamplesFile(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, title="examples.yaml")

    examples: list[ExampleSpec] = Field(min_length=1)


# ----------------------------------------------------------------------------- completed examples


@dataclass(frozen=True)
class Expected:
    """One expected output, ready to compare: exact (BYTES, integers, bools) or within rtol/atol."""

    array: np.ndarray
    shape: tuple[int, ...] | None
    rtol: float
    atol: float

    @property
    def exact(self) -> bool:
        return self.array.dtype.kind not in "fc"


@dataclass(frozen=True)
class Example:
    """One request and its expected answer. inputs: numpy arrays (BYTES = object arrays of bytes)."""

    name: str
    where: str                                   # examples.yaml:line, for reports
    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]                    # input name -> KServe datatype
    outputs: dict[str, Expected] = field(default_factory=dict)

    def kserve_inputs(self) -> list[dict[str, Any]]:
        """The request's `inputs` as KServe v2 JSON (BYTES as UTF-8 text where it decodes)."""
        out = []
        for name, arr in self.inputs.items():
            flat = arr.reshape(-1).tolist()
            if self.datatypes[name] == "BYTES":
                flat = [b.decode("utf-8", "surrogateescape") if isinstance(b, bytes) else b for b in flat]
            out.append({"name": name, "datatype": self.datatypes[name], "shape": list(arr.shape), "data": flat})
        return out


# ----------------------------------------------------------------------------- load


def load_examples(file: Path, inputs: list | None = None, outputs: list | None = None) -> list[Example]:
    """Parse, validate and build examples.yaml; with a signature (lists of {name, datatype, shape}
    dicts or TensorSpec-like objects) also check every example against it. Problems -> ProblemsFound."""

    from ..core.yamlio import read_text

    source = str(file)
    text = read_text(file, "check `examples:` in ngcx.yaml, or run `ngcx init` for a stub")
    data, lines = _parse(text, source)
    try:
        spec = ExamplesFile.model_validate(data)
    except ValidationError as exc:
        raise ProblemsFound(file.name, _schema_problems(exc, source, lines)) from None
    problems: list[Problem] = []
    names: dict[str, int] = {}
    for i, ex in enumerate(spec.examples):
        if ex.name in names:
            problems.append(Problem(_where(source, lines, ("examples", i, "name")), f"examples.{i}.name",
                                    "examples.duplicate-name", f"example name {ex.name!r} is used twice",
                                    "give each example its own name (reports name them)"))
        names[ex.name] = i
    if inputs is not None or outputs is not None:
        problems += check_signature(spec, _signature(inputs or []), _signature(outputs or []), source, lines)
    built = []
    for i, ex in enumerate(spec.examples):
        example, found = _build(ex, i, file.parent, source, lines)
        problems += found
        built.append(example)
    if problems:
        raise ProblemsFound(file.name, problems)
    return built


def load_project_examples(project: Any, signature: Any = None) -> list[Example]:
    """A project's examples.yaml ([] when it has none), checked against `signature` (a sniff.Signature,
    e.g. from the running server's /v2/models/NAME metadata) or else the one known before building
    (sniff.project_signature: the handler's declared tensors or the ONNX model's)."""
    from .sniff import project_signature

    if project.examples is None:
        return []
    sig = signature or project_signature(project)
    return load_examples(project.examples, sig.inputs if sig else None, sig.outputs if sig else None)


def _parse(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """YAML text -> (data, {path: line}) through the one limited loader."""
    from ..core.yamlio import load_mapping_with_lines

    return load_mapping_with_lines(text, source, "a mapping with an `examples:` list")


def _where(source: str, lines: dict[tuple, int], loc: tuple) -> str:
    from ..core.problems import where

    return where(source, lines, loc)


def _schema_problems(exc: ValidationError, source: str, lines: dict[tuple, int]) -> list[Problem]:
    return schema_problems(exc, source, lines, "inputs take datatype, shape and one of data/npy/file; "
                                               "outputs take data or npy, shape, rtol, atol")


# ----------------------------------------------------------------------------- signature rules


@dataclass(frozen=True)
class _Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]


def _signature(specs: list) -> list[_Tensor]:
    """dicts {name, datatype, shape} or objects with those attributes (runtime TensorSpec) -> _Tensor."""
    out = []
    for s in specs:
        get = s.get if isinstance(s, dict) else lambda k, s=s: getattr(s, k)
        out.append(_Tensor(str(get("name")), str(get("datatype")), tuple(int(d) for d in get("shape"))))
    return out


def check_signature(spec: ExamplesFile, inputs: list[_Tensor], outputs: list[_Tensor], source: str,
                    lines: dict[tuple, int]) -> list[Problem]:
    """Every example against the served signature: names, datatypes, ranks and fixed dims."""
    problems: list[Problem] = []
    by_in, by_out = {t.name: t for t in inputs}, {t.name: t for t in outputs}
    for i, ex in enumerate(spec.examples):
        def add(loc: tuple, rule: str, msg: str, hint: str, ex: ExampleSpec = ex, i: int = i) -> None:
            problems.append(Problem(_where(source, lines, ("examples", i, *loc)),
                                    ".".join(str(p) for p in ("examples", i, *loc)), rule,
                                    f"example {ex.name!r}: {msg}", hint))

        for name, t in ex.inputs.items():
            sig = by_in.get(name)
            if sig is None:
                add(("inputs", name), "examples.unknown-input", f"the model has no input {name!r}",
                    _closest(name, by_in, "inputs"))
                continue
            if t.datatype != sig.datatype:
                add(("inputs", name, "datatype"), "examples.datatype",
                    f"input {name!r} is {t.datatype} but the model takes {sig.datatype}", f"datatype: {sig.datatype}")
            shape_problem = _shape_mismatch(tuple(t.shape), sig.shape)
            if shape_problem:
                add(("inputs", name, "shape"), "examples.shape", f"input {name!r} shape {t.shape} {shape_problem}",
                    f"the model takes {_shape_text(sig.shape)} (-1 = any size)")
        for name in by_in:
            if name not in ex.inputs:
                add(("inputs",), "examples.missing-input", f"input {name!r} is missing",
                    f"add {name}: {{datatype: {by_in[name].datatype}, shape: {_example_shape(by_in[name].shape)}, "
                    "data: [...]}")
        for name in ex.outputs:
            if name not in by_out:
                add(("outputs", name), "examples.unknown-output", f"the model has no output {name!r}",
                    _closest(name, by_out, "outputs"))
    return problems


def _closest(name: str, known: dict[str, _Tensor], what: str) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    listed = ", ".join(known) or "none"
    return (f"did you mean {close[0]!r}? " if close else "") + f"its {what}: {listed}"


def _shape_mismatch(given: tuple[int, ...], model: tuple[int, ...]) -> str:
    """'' when `given` fits `model` (-1 dims match any size), else why not."""
    if any(d < 0 for d in given):
        return "has a negative dimension: an example's shape is concrete"
    if len(given) != len(model):
        return f"has rank {len(given)}, the model's has rank {len(model)}"
    for axis, (g, m) in enumerate(zip(given, model, strict=True)):
        if m >= 0 and g != m:
            return f"has {g} at dim {axis} where the model fixes {m}"
    return ""


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _example_shape(shape: tuple[int, ...]) -> str:
    """The model's shape with dynamic dims made concrete (batch 1, other dims 1)."""
    return "[" + ", ".join(str(d if d >= 0 else 1) for d in shape) + "]"


# ----------------------------------------------------------------------------- build arrays


def _build(ex: ExampleSpec, i: int, root: Path, source: str, lines: dict[tuple, int]) -> tuple[Example, list[Problem]]:
    """ExampleSpec -> Example with numpy arrays; unreadable files / wrong element counts -> problems."""
    problems: list[Problem] = []
    arrays: dict[str, Any] = {}
    datatypes: dict[str, str] = {}

    def add(loc: tuple, rule: str, msg: str, hint: str = "") -> None:
        problems.append(Problem(_where(source, lines, ("examples", i, *loc)),
                                ".".join(str(p) for p in ("examples", i, *loc)), rule,
                                f"example {ex.name!r}: {msg}", hint))

    for name, t in ex.inputs.items():
        datatypes[name] = t.datatype
        if t.datatype not in DATATYPES:
            add(("inputs", name, "datatype"), "examples.datatype-unknown", f"{t.datatype!r} is not a KServe datatype",
                f"use one of {', '.join(DATATYPES)}")
            continue
        try:
            arrays[name] = _input_array(t, root)
        except _BadValue as exc:
            add(("inputs", name, exc.key), exc.rule, f"input {name!r}: {exc}", exc.hint)
    outputs: dict[str, Expected] = {}
    for name, o in ex.outputs.items():
        try:
            outputs[name] = _expected(o, root)
        except _BadValue as exc:
            add(("outputs", name, exc.key), exc.rule, f"output {name!r}: {exc}", exc.hint)
    return Example(ex.name, _where(source, lines, ("examples", i)), arrays, datatypes, outputs), problems


class _BadValue(Exception):
    def __init__(self, message: str, key: str, rule: str, hint: str = "") -> None:
        super().__init__(message)
        self.key, self.rule, self.hint = key, rule, hint


def _input_array(t: InputTensor, root: Path) -> np.ndarray:
    import numpy as np

    shape = tuple(t.shape)
    count = math.prod(shape)
    if t.file is not None:
        if t.datatype != "BYTES":
            raise _BadValue(f"`file:` sends raw bytes, so datatype must be BYTES, not {t.datatype}", "file",
                            "examples.file-not-bytes", "use npy: or data: for numbers")
        if count != 1:
            raise _BadValue(f"`file:` is one element but shape {t.shape} holds {count}", "shape",
                            "examples.count", "use shape: [1]")
        raw = _read(root, t.file, "file")
        arr = np.empty(1, dtype=object)
        arr[0] = raw
        return arr.reshape(shape)
    arr = _load_npy(root, t.npy) if t.npy is not None else _from_data(t.data, t.datatype, "data")
    if arr.size != count:
        raise _BadValue(f"{arr.size} values do not fill shape {t.shape} ({count} elements)",
                        "npy" if t.npy else "data", "examples.count", "fix the shape or the values")
    if t.datatype == "BYTES":
        return _as_bytes(arr).reshape(shape)
    from .sniff import numpy_dtype

    try:
        return arr.astype(numpy_dtype(t.datatype)).reshape(shape)
    except (ValueError, TypeError):
        raise _BadValue(f"values are not {t.datatype} numbers", "npy" if t.npy else "data", "examples.values",
                        "write numbers, or datatype: BYTES for text") from None


def _expected(o: OutputTensor, root: Path) -> Expected:
    import numpy as np

    arr = _load_npy(root, o.npy) if o.npy is not None else _from_data(o.data, None, "data")
    if arr.dtype.kind in "US":
        arr = _as_bytes(arr)
    elif arr.dtype == object:
        raise _BadValue("values mix text and numbers", "data", "examples.values", "use one kind per output")
    # An explicit shape, or the nesting of `data:` / the .npy's own shape when it has more than one axis.
    shape = tuple(o.shape) if o.shape is not None else (tuple(arr.shape) if arr.ndim > 1 else None)
    if o.shape is not None:
        if math.prod(shape) != arr.size:
            raise _BadValue(f"{arr.size} values do not fill shape {o.shape}", "shape", "examples.count",
                            "fix the shape or the values")
        arr = arr.reshape(shape)
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    return Expected(arr, shape, o.rtol if o.rtol is not None else DEFAULT_RTOL,
                    o.atol if o.atol is not None else DEFAULT_ATOL)


def _from_data(data: Any, datatype: str | None, key: str) -> np.ndarray:
    import numpy as np

    try:
        arr = np.array(data)
    except ValueError:
        raise _BadValue("nested lists of different lengths", key, "examples.ragged",
                        "write a flat list and give the shape") from None
    if arr.dtype == object:
        raise _BadValue("nested lists of different lengths or mixed values", key, "examples.ragged",
                        "write a flat list and give the shape")
    if datatype == "BYTES" and arr.size and arr.dtype.kind not in "US":
        raise _BadValue("BYTES values must be strings", key, "examples.values", 'quote them, e.g. ["text"]')
    if datatype not in (None, "BYTES") and arr.dtype.kind in "US":
        raise _BadValue(f"values are text but the datatype is {datatype}", key, "examples.values",
                        "write numbers, or datatype: BYTES")
    return arr


def _as_bytes(arr: np.ndarray) -> np.ndarray:
    import numpy as np

    out = np.empty(arr.shape, dtype=object)
    for idx, v in np.ndenumerate(arr):
        out[idx] = v if isinstance(v, bytes) else str(v).encode("utf-8")
    return out


def _resolve(root: Path, rel: str, key: str) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise _BadValue(f"{rel} is outside the project folder", key, "path.outside",
                        "keep example files next to examples.yaml (the folder is the build context)")
    if not path.is_file():
        raise _BadValue(f"{rel} does not exist", key, "path.missing", f"check the path relative to {root}")
    return path


def _read(root: Path, rel: str, key: str) -> bytes:
    path = _resolve(root, rel, key)
    if path.stat().st_size > MAX_FILE_BYTES:
        raise _BadValue(f"{rel} is larger than {MAX_FILE_BYTES >> 20} MiB", key, "examples.too-large",
                        "send a smaller sample")
    return path.read_bytes()


def _load_npy(root: Path, rel: str) -> np.ndarray:
    import numpy as np

    path = _resolve(root, rel, "npy")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise _BadValue(f"{rel} is not a .npy array ({str(exc).splitlines()[0][:80]})", "npy", "examples.npy",
                        "write it with numpy.save (no pickled objects)") from None


# ----------------------------------------------------------------------------- compare


def compare(expected: dict[str, Expected], got: dict[str, Any]) -> list[str]:
    """Human diff lines, one per output that is missing or differs; [] when everything matches."""
    import numpy as np

    diffs = []
    for name, exp in expected.items():
        if name not in got:
            diffs.append(f"{name}: missing from the response (got {', '.join(got) or 'no outputs'})")
            continue
        arr = np.asarray(got[name])
        if exp.shape is not None and tuple(arr.shape) != exp.shape:
            diffs.append(f"{name}: shape {list(arr.shape)}, expected {list(exp.shape)}")
            continue
        if arr.size != exp.array.size:
            diffs.append(f"{name}: {arr.size} values, expected {exp.array.size} (shape {list(arr.shape)})")
            continue
        line = _compare_exact(exp, arr) if exp.exact or arr.dtype == object else _compare_close(exp, arr)
        if line:
            diffs.append(f"{name}: {line}")
    return diffs


def _compare_exact(exp: Expected, arr: np.ndarray) -> str:
    import numpy as np

    want, have = exp.array.reshape(-1), arr.reshape(-1)
    if want.dtype == object or have.dtype == object:       # BYTES: a str in a response counts as its UTF-8
        have, want = _as_bytes(have), _as_bytes(want)
        bad = [i for i, (w, h) in enumerate(zip(want, have, strict=True)) if w != h]
    else:
        bad = list(np.flatnonzero(want != have))
    if not bad:
        return ""
    i = int(bad[0])
    return (f"{len(bad)} of {want.size} values differ; first at {_index(i, arr.shape)}: "
            f"got {_short(have[i])}, expected {_short(want[i])}")


def _compare_close(exp: Expected, arr: np.ndarray) -> str:
    import numpy as np

    want = exp.array.reshape(-1).astype(np.float64)
    have = arr.reshape(-1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(have - want)
        ok = (err <= exp.atol + exp.rtol * np.abs(want)) | ((have == want) & np.isfinite(want))
        ok &= np.isnan(have) == np.isnan(want)
        ok |= np.isnan(have) & np.isnan(want)
        rel = np.where(want != 0, err / np.abs(want), np.where(err == 0, 0.0, np.inf))
    if ok.all():
        return ""
    i = int(np.flatnonzero(~ok)[0])
    finite = np.isfinite(err)
    max_abs = float(err[finite].max()) if finite.any() else math.inf
    max_rel = float(rel[np.isfinite(rel)].max()) if np.isfinite(rel).any() else math.inf
    return (f"{int((~ok).sum())} of {want.size} values outside rtol={exp.rtol:g} atol={exp.atol:g} "
            f"(max abs error {max_abs:.3g}, max rel error {max_rel:.3g}); first at {_index(i, arr.shape)}: "
            f"got {have[i]:.6g}, expected {want[i]:.6g}")


def _index(flat: int, shape: tuple[int, ...]) -> str:
    import numpy as np

    return "[" + ", ".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]" if shape else "[]"


def _short(value: Any) -> str:
    text = repr(value.item() if hasattr(value, "item") else value)     # 5, not np.int64(5)
    return text if len(text) <= 60 else text[:57] + "..."
