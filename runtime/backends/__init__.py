"""Inference backends: real engines only (TensorRT, ONNX Runtime, PyTorch).

Each backend module exposes the same small set of functions so `optimize`, `plan.load`, `serve`
and `bench` never special-case an engine:

    NAME: str
    MODEL_SUFFIXES: tuple[str, ...]              # source model files it reads
    availability() -> tuple[bool, str]           # usable here? (reason when not)
    version() -> str                             # engine version, part of the plan cache key
    optimize(src, out_dir, opts) -> dict         # writes the artifact, returns manifest fields
    load(plan_dir, manifest, gpu) -> Engine      # a PLAN_DIR written by optimize
    load_model(src, gpu, name) -> Engine         # a raw model, no optimization step

The chooser below picks one automatically (TensorRT on a GPU when installed, else ONNX Runtime
for .onnx, PyTorch for .pt2); `--backend` overrides it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from ..errors import RuntimeUserError

BACKENDS = ("tensorrt", "onnxruntime", "pytorch")
_MODULES = {"tensorrt": "tensorrt", "onnxruntime": "onnxruntime", "pytorch": "pytorch"}


def get(name: str) -> ModuleType:
    """The backend module for a name; unknown names are a user error."""
    if name not in BACKENDS:
        raise RuntimeUserError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return importlib.import_module(f".{_MODULES[name]}", __package__)


def choose(model: Path, requested: str | None = None) -> ModuleType:
    """Pick the backend for a source model: the requested one, else the best usable one.

    Why this order: TensorRT is the fastest where it exists (GPU + module), ONNX Runtime runs
    .onnx everywhere (CUDA EP or CPU EP), PyTorch is the only engine for torch.export programs.
    """
    suffix = model.suffix.lower()
    if requested:
        mod = get(requested)
        if suffix not in mod.MODEL_SUFFIXES:
            raise RuntimeUserError(
                f"backend {requested} cannot read {model.name}: it takes {'/'.join(mod.MODEL_SUFFIXES)} "
                "files; pick another --backend or convert the model"
            )
        ok, reason = mod.availability()
        if not ok:
            raise RuntimeUserError(f"backend {requested} is not usable here: {reason}")
        return mod
    candidates = [n for n in BACKENDS if suffix in get(n).MODEL_SUFFIXES]
    if not candidates:
        raise RuntimeUserError(
            f"{model}: unsupported model type {suffix or '(no suffix)'}; ngcx-runtime reads .onnx "
            "(ONNX) and .pt2 (torch.export.save) files"
        )
    reasons = []
    for name in candidates:
        ok, reason = get(name).availability()
        if ok:
            return get(name)
        reasons.append(f"{name}: {reason}")
    raise RuntimeUserError(
        f"no backend can run {model.name} here ({'; '.join(reasons)}); install onnxruntime or torch"
    )


def availability_report() -> dict[str, dict]:
    """For `info`: each backend's usability, without raising."""
    out: dict[str, dict] = {}
    for name in BACKENDS:
        try:
            mod = get(name)
            ok, reason = mod.availability()
            entry: dict = {"usable": ok}
            entry.update(mod.describe() if ok and hasattr(mod, "describe") else {})
            if not ok:
                entry["reason"] = reason
        except Exception as exc:  # noqa: BLE001 - info must never crash on a broken engine
            entry = {"usable": False, "reason": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        out[name] = entry
    return out
