"""Plans: a PLAN_DIR (artifact + manifest.json) written by `optimize`, and loading one as an Engine.

Why a manifest: optimized artifacts are not portable (TensorRT plans and ORT's offline-optimized
graphs are tied to the GPU architecture and engine version, runtime.md §3), so every plan records
what it was built for and where its source model came from. `load()` compares that with this
host and refuses with a clear message, or rebuilds when the source model is still at hand
(through optimize.py). What a manifest holds and a plan is tied to is manifest.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .engine import Engine
from .errors import RuntimeUserError
from .manifest import (  # noqa: F401 - re-exported: ngcx_runtime.plan names them as ever
    MANIFEST,
    PLAN_FORMAT,
    PRECISIONS,
    OptimizeOptions,
    cpu_target,
    host_target,
    runtime_version,
    sha256_file,
)
from .manifest import model_name as _model_name

MAX_MANIFEST_BYTES = 1 << 20  # a manifest is ~1 KB
# Field -> the JSON types it may have; what _load_plan, mismatch and bench read without further checks.
MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "backend": (str,), "backend_version": (str,), "precision": (str,), "artifact": (str,), "target": (dict,)}
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {"source": (dict,), "calibration": (dict, type(None))}
TARGET_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,), "name": (str,), "compute_capability": (str, type(None)), "machine": (str, type(None))}


def read_manifest(plan_dir: Path) -> dict[str, Any]:
    """PLAN_DIR/manifest.json, its fields type-checked: a hand-edited or corrupt manifest is one line.

    Why so careful (issue 8): a plan dir is a file tree users copy between machines; deep nesting
    (RecursionError), a list instead of an object, or a number where a name belongs used to escape
    as tracebacks from the loader.
    """
    path = plan_dir / MANIFEST
    fix = "rebuild the plan with ngcx-runtime optimize MODEL -o PLAN_DIR"
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes, a manifest is about 1 KB")
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0][:200]
        raise RuntimeUserError(f"{path}: unreadable plan manifest ({reason}); {fix}") from None
    if not isinstance(manifest, dict):
        raise RuntimeUserError(f"{path}: the manifest is a JSON {type(manifest).__name__}, not an object; {fix}")
    for key in MANIFEST_FIELDS:
        if key not in manifest:
            raise RuntimeUserError(f"{path}: manifest lacks {key!r}; rebuild the plan with ngcx-runtime optimize")
    _check_types(manifest, {**MANIFEST_FIELDS, **OPTIONAL_FIELDS}, path, "", fix)
    _check_types(manifest["target"], TARGET_FIELDS, path, "target.", fix)
    source = manifest.get("source") or {}
    _check_types(source, {"path": (str,), "sha256": (str,)}, path, "source.", fix)
    if "optimizer" in manifest:
        from .choose import check_section

        why = check_section(manifest["optimizer"])
        if why:
            raise RuntimeUserError(f"{path}: manifest field optimizer {why}; {fix}")
    return manifest


def _check_types(doc: dict[str, Any], fields: dict[str, tuple[type, ...]], path: Path, prefix: str,
                 fix: str) -> None:
    """Each present field of `doc` named in `fields` has one of its allowed JSON types."""
    for key, kinds in fields.items():
        if key in doc and (not isinstance(doc[key], kinds) or isinstance(doc[key], bool)):
            wanted = " or ".join("null" if k is type(None) else {"str": "string", "dict": "object"}[k.__name__]
                                 for k in kinds)
            raise RuntimeUserError(f"{path}: manifest field {prefix}{key} is {json.dumps(doc[key])[:60]}, "
                                   f"not a {wanted}; {fix}")


def mismatch(manifest: dict[str, Any], target: dict[str, Any], backend_version: str) -> str | None:
    """Why this plan cannot run here, or None when it can."""
    built = manifest["target"]
    if manifest["backend_version"] != backend_version:
        return f"built with {manifest['backend']} {manifest['backend_version']}, this host has {backend_version}"
    if (built.get("name"), built.get("compute_capability"), built.get("machine")) != (
        target["name"],
        target["compute_capability"],
        target.get("machine"),
    ):
        cc = f" (sm {built.get('compute_capability')})" if built.get("compute_capability") else ""
        here = f" (sm {target['compute_capability']})" if target["compute_capability"] else ""
        return f"built for {built.get('name')}{cc}, this host has {target['name']}{here}"
    return None


def load(path: str | Path, backend: str | None = None, rebuild: bool = True,
         device: int | str | None = None) -> Engine:
    """Load a PLAN_DIR (written by optimize) or a raw model (.onnx / .pt2) as an Engine.

    A plan built for another GPU or engine version is rebuilt from its source model when that
    file is present with the recorded hash (rebuild=True), otherwise refused with the fix.
    device places one instance (serve --instances / --gpus): None = the backend's default, an int
    = that GPU, "cpu" = the CPU.
    """
    from . import backends

    path = Path(path)
    if not path.exists():
        raise RuntimeUserError(f"{path}: no such model or plan directory")
    if path.is_dir():
        return _load_plan(path, backend, rebuild, device)
    target = host_target()
    mod = backends.choose(path, backend)
    _check_device(device, target)
    return mod.load_model(path, gpu=target["kind"] == "gpu", name=_model_name(path), **_placed(device))


def _placed(device: int | str | None) -> dict[str, Any]:
    """The device keyword for a backend's load, only when an instance is placed (older call shape otherwise)."""
    return {} if device is None else {"device": device}


def _check_device(device: int | str | None, target: dict[str, Any]) -> None:
    if isinstance(device, int) and target["kind"] != "gpu":
        raise RuntimeUserError(f"an instance on GPU {device}: this host has no GPU; drop --gpus (or the "
                               "instance_group's gpus) to run the instances on the CPU")
    if device is not None and device != "cpu" and not isinstance(device, int):
        raise RuntimeUserError(f"instance device {device!r}: give a GPU index or 'cpu'")


def _load_plan(plan_dir: Path, backend: str | None, rebuild: bool, device: int | str | None = None) -> Engine:
    from . import backends

    manifest = read_manifest(plan_dir)
    if backend and backend != manifest["backend"]:
        raise RuntimeUserError(
            f"{plan_dir} is a {manifest['backend']} plan, not {backend}: "
            f"drop --backend or run optimize with --backend {backend}"
        )
    mod = backends.get(manifest["backend"])
    ok, reason = mod.availability()
    if not ok:
        raise RuntimeUserError(f"{plan_dir} needs the {manifest['backend']} backend: {reason}")
    on_cpu = manifest["target"].get("kind") == "cpu"  # a CPU plan runs on the CPU, GPU or not
    target = cpu_target() if on_cpu else host_target()
    why = mismatch(manifest, target, mod.version())
    if why is None:
        if not on_cpu:
            _check_device(device, target)
        return mod.load(plan_dir, manifest, gpu=not on_cpu, **_placed(None if on_cpu else device))
    source = manifest.get("source", {})
    src = Path(source.get("path", ""))
    if rebuild and src.is_file() and sha256_file(src) == source.get("sha256"):
        from .optimize import optimize, options_from_manifest

        print(f"ngcx-runtime: plan {plan_dir} {why}; rebuilding from {src}", file=sys.stderr)
        result = optimize(src, None, options_from_manifest(manifest), backend=manifest["backend"])
        return _load_plan(result.plan_dir, manifest["backend"], rebuild=False, device=device)
    raise RuntimeUserError(
        f"plan {plan_dir} cannot run here: {why}; plans are tied to GPU architecture and engine version, "
        f"rebuild it on this host with ngcx-runtime optimize {source.get('path', 'MODEL')} -o {plan_dir}"
    )
