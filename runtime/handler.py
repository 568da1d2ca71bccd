"""User handlers (`handler: module:Class` in ngcx.yaml) wrapped as an Engine.

Why an Engine: the server, the dynamic batcher and bench already speak the Engine contract
(engine.py); a handler that looks like one more engine gets KServe v2, BYTES tensors, batching
and draining for free, and the routes (routes.py) need no handler-specific paths.

The contract a handler class follows:
  inputs / outputs   class attributes, lists of {"name", "datatype", "shape"} (KServe v2
                     datatypes, -1 for dynamic dims; dim 0 is the batch when every tensor's dim 0
                     is -1). Optional when the handler only pre/post-processes a model with the
                     same signature: then the model engine's signature is used.
  load(context)      once, before the server turns ready; context.engine is the optimized ngcx
                     engine of the project's model (or None), context.model_path, context.app_dir.
  predict(inputs)    dict[str, np.ndarray] -> dict[str, np.ndarray]; BYTES tensors are numpy object
                     arrays of `bytes` (a returned str is sent as UTF-8).
  warmup_inputs      optional: a dict of arrays (or a method returning one) for the warm-up
                     inference; without it, handlers with BYTES inputs are not warmed up.
  InvalidInput       `from ngcx_runtime.handler import InvalidInput`: raise it from predict() for a
                     bad request (400 to that client only); any other exception is a 500.

A handler that fails to import, to construct or to load() is a RuntimeUserError that names the
handler's file:line and the exception in one line (exit 2), never a traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .engine import BYTES, KSERVE_TO_NUMPY, Engine, TensorSpec
from .errors import InvalidInput, RuntimeUserError

__all__ = ["Context", "HandlerEngine", "InvalidInput", "load_handler"]

DEFAULT_APP_DIR = Path("/opt/ngcx/app")
DATATYPES = (*KSERVE_TO_NUMPY, BYTES)


@dataclass(frozen=True)
class Context:
    """What load() gets: the project's model as an optimized engine (or None) and where things are."""

    engine: Engine | None
    model_path: Path | None
    app_dir: Path


def default_app_dir() -> Path:
    """/opt/ngcx/app inside a project image, else the current directory (a checkout)."""
    return DEFAULT_APP_DIR if DEFAULT_APP_DIR.is_dir() else Path.cwd()


def parse_spec(spec: str) -> tuple[str, str]:
    """'pkg.module:Class' -> (module, class); anything else is one line naming the expected form."""
    module, sep, cls = spec.partition(":")
    ok = sep and all(p.isidentifier() for p in module.split(".")) and cls.isidentifier()
    if not ok:
        raise RuntimeUserError(f"--handler {spec!r}: expected module:Class, e.g. handler:Classifier")
    return module, cls


def load_class(spec: str, app_dir: Path) -> type:
    """Import the handler's module from app_dir (put first on sys.path) and return its class."""
    module_name, cls_name = parse_spec(spec)
    app_dir = Path(app_dir).resolve()
    if not app_dir.is_dir():
        raise RuntimeUserError(f"--app-dir {app_dir}: no such directory; point it at the folder with the handler")
    if str(app_dir) not in sys.path:
        sys.path.insert(0, str(app_dir))
    _forget_foreign(module_name, app_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise RuntimeUserError(f"handler {spec}: no module {module_name!r} in {app_dir}; check `handler:` "
                                   "in ngcx.yaml (module:Class) and that the file is listed in `files:`") from None
        raise _user_error(spec, "import failed", exc, app_dir) from None
    except Exception as exc:  # noqa: BLE001 - any import-time failure of user code is one line
        raise _user_error(spec, "import failed", exc, app_dir) from None
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        where = getattr(module, "__file__", module_name)
        raise RuntimeUserError(f"handler {spec}: {where} defines no class {cls_name!r}; check `handler:` in "
                               "ngcx.yaml")
    if not callable(getattr(cls, "predict", None)):
        raise RuntimeUserError(f"handler {spec}: class {cls_name} ({_where_class(cls)}) has no predict(self, "
                               "inputs) method")
    return cls


def _forget_foreign(module_name: str, app_dir: Path) -> None:
    """A module of that name imported earlier from another folder (another app in the same process,
    e.g. tests) must not shadow this app's file."""
    cached = sys.modules.get(module_name)
    if cached is not None and not _under(getattr(cached, "__file__", None) or "", app_dir):
        for name in [m for m in sys.modules if m == module_name or m.startswith(module_name + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()


def _user_error(spec: str, what: str, exc: BaseException, app_dir: Path) -> RuntimeUserError:
    """One line: the handler, what failed, the innermost user-code file:line, the exception."""
    where = _user_frame(exc, app_dir)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, SyntaxError):
        text = exc.msg
    return RuntimeUserError(f"handler {spec}: {what} at {where}: {type(exc).__name__}: {text[:300]}")


def _user_frame(exc: BaseException, app_dir: Path) -> str:
    """file:line of the deepest traceback frame under app_dir (the user's code), else the deepest."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if _under(f.filename, app_dir)]
    frame = (mine or frames or [None])[-1]
    return f"{frame.filename}:{frame.lineno}" if frame else "?"


def _under(filename: str, root: Path) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(root)
    except (OSError, ValueError):
        return False


def _where_class(cls: type) -> str:
    module = sys.modules.get(cls.__module__)
    return getattr(module, "__file__", None) or cls.__module__


def tensor_specs(raw: Any, what: str, spec: str) -> list[TensorSpec]:
    """A handler's `inputs` / `outputs` attribute -> TensorSpecs, each mistake one line."""
    if not isinstance(raw, list | tuple) or not raw:
        raise RuntimeUserError(f"handler {spec}: `{what}` must be a non-empty list of "
                               '{"name", "datatype", "shape"} entries')
    specs = []
    for i, item in enumerate(raw):
        if isinstance(item, TensorSpec):
            specs.append(item)
            continue
        where = f"handler {spec}: {what}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise RuntimeUserError(f"{where} must be a dict with a non-empty 'name'")
        dt, shape = item.get("datatype"), item.get("shape")
        if dt not in DATATYPES:
            raise RuntimeUserError(f"{where} ({item['name']}): datatype {dt!r} is not one of {', '.join(DATATYPES)}")
        if not isinstance(shape, list | tuple) or not all(type(d) is int and d >= -1 for d in shape):
            raise RuntimeUserError(f"{where} ({item['name']}): shape {shape!r} must be a list of integers "
                                   "(-1 for a dynamic dimension)")
        specs.append(TensorSpec(item["name"], dt, tuple(shape)))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise RuntimeUserError(f"handler {spec}: `{what}` names a tensor twice: {names}")
    return specs


class HandlerEngine:
    """A loaded user handler behind the Engine contract: infer() is predict()."""

    backend = "python"
    # The handler contract makes dim 0 the batch (module docstring): layout.py trusts it instead of
    # probing, since predict() is user code that may count or log its calls.
    batch_axis_declared = True

    def __init__(self, handler: Any, spec: str, name: str, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 inner: Engine | None):
        self.handler = handler
        self.spec = spec
        self.name = name
        self.inputs = inputs
        self.outputs = outputs
        self.inner = inner
        self.device = inner.device if inner is not None else "cpu"
        self.precision = inner.precision if inner is not None else "fp32"
        # The wrapped model's bound applies when the handler passes batches straight through.
        self.max_batch = inner.max_batch if inner is not None else 0

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.handler.predict(feeds)
        if not isinstance(out, dict):
            raise TypeError(f"{type(self.handler).__name__}.predict returned {type(out).__name__}, expected a dict "
                            "of output name -> numpy array")
        return {k: _as_array(v) for k, v in out.items()}

    def warmup_inputs(self) -> dict[str, np.ndarray] | None:
        """The handler's own warm-up feeds, if it defines `warmup_inputs` (attribute or method)."""
        raw = getattr(self.handler, "warmup_inputs", None)
        if callable(raw):
            raw = raw()
        return None if raw is None else {k: _as_array(v) for k, v in dict(raw).items()}


def _as_array(value: Any) -> np.ndarray:
    """Lists of str/bytes become object arrays (BYTES); numpy arrays pass through untouched."""
    if isinstance(value, np.ndarray):
        return value
    arr = np.asarray(value)
    if arr.dtype.kind in "SU":
        arr = arr.astype(object)
    return arr


def load_handler(spec: str, app_dir: Path | None = None, engine: Engine | None = None,
                 model_path: Path | None = None, name: str | None = None) -> HandlerEngine:
    """Import, construct and load() the handler; wrap it as an Engine named `name`."""
    app_dir = Path(app_dir) if app_dir is not None else default_app_dir()
    cls = load_class(spec, app_dir)
    resolved = Path(app_dir).resolve()
    inputs = _signature(cls, "inputs", engine, spec)
    outputs = _signature(cls, "outputs", engine, spec)
    try:
        handler = cls()
    except Exception as exc:  # noqa: BLE001
        raise _user_error(spec, f"{cls.__name__}() failed", exc, resolved) from None
    load = getattr(handler, "load", None)
    if callable(load):
        try:
            load(Context(engine=engine, model_path=Path(model_path) if model_path else None, app_dir=resolved))
        except Exception as exc:  # noqa: BLE001
            raise _user_error(spec, "load() failed", exc, resolved) from None
    default = engine.name if engine is not None else spec.partition(":")[0].rsplit(".", 1)[-1]
    return HandlerEngine(handler, spec, name or default, inputs, outputs, engine)


def _signature(cls: type, what: str, engine: Engine | None, spec: str) -> list[TensorSpec]:
    raw = getattr(cls, what, None)
    if raw is not None:
        return tensor_specs(raw, what, spec)
    if engine is not None:
        return list(getattr(engine, what))
    raise RuntimeUserError(f"handler {spec}: the class declares no `{what}` and there is no model to take them "
                           f"from; add `{what} = [{{\"name\": ..., \"datatype\": ..., \"shape\": [...]}}]`")
