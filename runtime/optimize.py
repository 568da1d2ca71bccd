"""`ngcx-runtime optimize MODEL -o PLAN_DIR`: model -> optimized artifact + manifest, cached.

Why a cache: building is the slow phase (TensorRT builds take minutes; torch.compile and
calibration take seconds to minutes), and a plan is fully determined by (model hash, backend,
backend version, precision, batch profile, GPU arch, calibration data hash). The same inputs give
the cached plan back at once. The plan is built in a temp dir and renamed into place, so a failed
build leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RuntimeUserError
from .manifest import (
    MANIFEST,
    PLAN_FORMAT,
    PRECISIONS,
    OptimizeOptions,
    host_target,
    runtime_version,
    sha256_file,
)


@dataclass
class OptimizeResult:
    plan_dir: Path
    manifest: dict[str, Any]
    cache_hit: bool
    seconds: float


def cache_root() -> Path:
    return Path(os.environ.get("NGCX_RUNTIME_CACHE") or Path.home() / ".cache" / "ngcx-runtime")


def parse_batches(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise RuntimeUserError(f"--batch {text!r}: give positive batch sizes separated by commas, e.g. 1,8,64")
    return sizes


MAX_CALIBRATION_BYTES = 4 << 30  # arrays as loaded; 500 ImageNet samples in fp32 are ~300 MB
NPZ_FIX = "save it with numpy.savez(path, input_name=array, ...)"
# Reading a zip or .npy header can fail in all of these ways (zlib.error: corrupt deflate data,
# NotImplementedError: unknown compression, RuntimeError: encrypted member, EOFError: truncated).
_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


def load_calibration(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """Read calibration data: an .npz whose arrays are keyed by model input name.

    Why not plain np.load: it trusts the file. Each .npy header is checked against the size the
    zip records for it, and the total against MAX_CALIBRATION_BYTES, before anything is
    allocated, so a zip bomb or a header claiming terabytes is one line, not an OOM kill.
    Pickles (object arrays) are refused, never loaded (allow_pickle stays False).
    """
    path = Path(path)
    if not path.is_file():
        raise RuntimeUserError(f"{path}: no such calibration file; {NPZ_FIX}")
    try:
        data = _read_npz(path)
    except _NPZ_ERRORS as exc:
        reason = (str(exc).splitlines() or [exc.__class__.__name__])[0][:200]
        raise RuntimeUserError(f"{path}: not a readable .npz ({reason}); {NPZ_FIX}") from None
    if not data:
        raise RuntimeUserError(f"{path}: holds no arrays; save one per model input, keyed by input name")
    return data, sha256_file(path)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise RuntimeUserError(f"{path}: not an .npz (zip) archive; {NPZ_FIX}")
    with zipfile.ZipFile(path) as zf:
        members = zf.infolist()
        total = sum(m.file_size for m in members)
        if total > MAX_CALIBRATION_BYTES:
            raise RuntimeUserError(
                f"{path}: its arrays would take {total / 2**30:.1f} GiB in memory, over the "
                f"{MAX_CALIBRATION_BYTES / 2**30:g} GiB limit for calibration data; use fewer samples")
        return {m.filename.removesuffix(".npy"): _read_member(zf, m, path) for m in members}


def _read_member(zf: zipfile.ZipFile, member: zipfile.ZipInfo, path: Path) -> np.ndarray:
    """One .npy member, its header checked before the array is allocated."""
    where = f"{path}: member {member.filename!r}"
    if not member.filename.endswith(".npy"):
        raise RuntimeUserError(f"{where} is not a .npy array; {NPZ_FIX}")
    with zf.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise RuntimeUserError(f"{where}: .npy format {version} is not supported; {NPZ_FIX}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
    if dtype.hasobject or dtype.kind not in "biuf":
        raise RuntimeUserError(f"{where} holds {dtype} values, not numbers (object arrays are pickles and are "
                               f"never loaded); {NPZ_FIX}")
    if any(d < 0 for d in shape):            # their product could pass the size check below, or be negative
        raise RuntimeUserError(f"{where} is corrupt: its header gives a negative dimension; save it again")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > member.file_size:
        raise RuntimeUserError(f"{where} is truncated or corrupt: its header promises {nbytes} bytes, the archive "
                               f"holds {member.file_size}; save it again")
    if not shape or math.prod(shape) == 0:
        raise RuntimeUserError(f"{where} is empty or a scalar: give an array of samples, first axis = sample")
    with zf.open(member) as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def cache_key(model_sha: str, backend: str, backend_version: str, opts: OptimizeOptions, target: dict[str, Any]) -> str:
    parts = {
        "model": model_sha,
        "backend": backend,
        "backend_version": backend_version,
        "precision": opts.precision,
        "batch_profile": opts.batch_profile,
        "target": [target["name"], target["compute_capability"]],
        "calibration": [opts.calibration_sha256, opts.calibration_method] if opts.precision == "int8" else None,
        "plan_format": PLAN_FORMAT,
    }
    if opts.tune:                       # absent otherwise: untuned plans keep the keys they always had
        parts["tuning"] = opts.tuning_key()
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def options_from_manifest(manifest: dict[str, Any]) -> OptimizeOptions:
    """Options to rebuild a plan from its manifest (used when a plan meets another GPU).

    The manifest is a file on disk that anyone may have edited: a field of the wrong type is a
    RuntimeUserError naming it, never a KeyError or TypeError from deep in optimize.
    """
    calib = _field(manifest, "calibration", dict, {}) or {}
    batches = _field(manifest, "batch_profile", list, [1]) or [1]
    if not all(type(b) is int and b >= 1 for b in batches):
        raise RuntimeUserError(f"plan manifest: batch_profile {str(batches)[:80]} is not a list of positive "
                               "integers; rebuild the plan with ngcx-runtime optimize")
    data = sha = None
    calib_path = _field(calib, "path", str, None, "calibration.path")
    if calib_path and Path(calib_path).is_file():
        data, sha = load_calibration(Path(calib_path))
    return OptimizeOptions(
        precision=_field(manifest, "precision", str, None, required=True),
        batch_profile=batches,
        calibration=data,
        calibration_sha256=sha,
        calibration_method=_field(calib, "method", str, "entropy", "calibration.method"),
        name=_field(manifest, "name", str, "model"),
        **_tuning_from(manifest),
    )


def _tuning_from(manifest: dict[str, Any]) -> dict[str, Any]:
    """A tuned plan is rebuilt tuned, with the candidates it tried and the tolerance it recorded (on seeded examples:
    the user's are not kept in the plan)."""
    section = _field(manifest, "optimizer", dict, None)
    if not section:
        return {}
    tol = _field(section, "tolerance", dict, {}, "optimizer.tolerance")
    from .candidates import ALL

    tried = sorted({t.get("candidate") for t in section.get("trials") or [] if isinstance(t, dict)} & set(ALL))
    return {"tune": True, "min_top1": _number(tol, "min_top1", 0.9),
            "max_rel_error": _number(tol, "max_rel_error", 0.15), "candidates": tried or None,
            "allow_sparsity": any(ALL[n].sparse for n in tried)}


def _number(tol: dict[str, Any], key: str, default: float) -> float:
    value = tol.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuntimeUserError(f"plan manifest: optimizer.tolerance.{key} is {str(value)[:60]!r}, not a number; "
                               "rebuild the plan with ngcx-runtime optimize")
    return float(value)


def _field(doc: dict[str, Any], key: str, kind: type, default: Any, where: str | None = None,
           required: bool = False) -> Any:
    """doc[key] if it has type `kind`; None/absent -> default, unless the field is required."""
    value = doc.get(key)
    if value is None and not required:
        return default
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise RuntimeUserError(f"plan manifest: {where or key} is {str(value)[:60]!r}, not a {kind.__name__}; "
                               "rebuild the plan with ngcx-runtime optimize")
    return value


def optimize(
    model: Path,
    out_dir: Path | None,
    opts: OptimizeOptions,
    backend: str | None = None,
    calibration_path: Path | None = None,
) -> OptimizeResult:
    """Build (or fetch from the cache) the plan for `model`, copy it to out_dir if given."""
    from . import backends

    start = time.perf_counter()
    model = Path(model).resolve()
    if not model.is_file():
        raise RuntimeUserError(f"{model}: no such model file")
    if opts.precision not in PRECISIONS:
        raise RuntimeUserError(f"--precision {opts.precision}: choose one of {', '.join(PRECISIONS)}")
    mod = backends.choose(model, backend)
    if opts.tune and mod.NAME != "pytorch":
        raise RuntimeUserError(f"--tune: the measured optimizer runs on the PyTorch backend (a .pt2 model), not "
                               f"{mod.NAME}; export the model with torch.export.save, or drop --tune")
    target = host_target()
    opts.gpu = target["kind"] == "gpu"
    model_sha = sha256_file(model)
    key = cache_key(model_sha, mod.NAME, mod.version(), opts, target)
    entry = cache_root() / key
    hit = (entry / MANIFEST).is_file()
    if not hit:
        _build(mod, model, model_sha, entry, opts, target, key, calibration_path)
    manifest = json.loads((entry / MANIFEST).read_text())
    plan_dir = entry
    if out_dir is not None:
        plan_dir = Path(out_dir)
        _place(entry, plan_dir)
        if manifest.get("name") != opts.name:  # the name is not part of the artifact, only of the copy
            manifest["name"] = opts.name
            (plan_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return OptimizeResult(plan_dir, manifest, hit, time.perf_counter() - start)


def _build(
    mod,
    model: Path,
    model_sha: str,
    entry: Path,
    opts: OptimizeOptions,
    target: dict[str, Any],
    key: str,
    calibration_path: Path | None,
) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=entry.parent))
    try:
        fields = mod.optimize(model, tmp, opts)
        if fields.get("device") == "cpu":  # e.g. ORT without a GPU EP: tied to the CPU, not the GPU
            from .manifest import cpu_target

            target = cpu_target()
        manifest = {
            "plan_format": PLAN_FORMAT,
            "name": opts.name,
            "backend": mod.NAME,
            "backend_version": mod.version(),
            "precision": opts.precision,
            "batch_profile": opts.batch_profile,
            "target": target,
            "gpu": target["name"] if target["kind"] == "gpu" else "cpu",
            "compute_capability": target["compute_capability"],
            "source": {"path": str(model), "sha256": model_sha, "size": model.stat().st_size},
            "calibration": (
                {
                    "path": str(calibration_path) if calibration_path else None,
                    "sha256": opts.calibration_sha256,
                    "method": opts.calibration_method,
                }
                if opts.precision == "int8"
                else None
            ),
            "ngcx_runtime_version": runtime_version(),
            "cache_key": key,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **fields,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            tmp.rename(entry)
        except OSError:  # another process built the same key meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _place(entry: Path, plan_dir: Path) -> None:
    """Copy the cached plan to the user's PLAN_DIR (replacing an older plan there)."""
    if plan_dir.exists() and not (plan_dir / MANIFEST).is_file() and any(plan_dir.iterdir()):
        raise RuntimeUserError(f"-o {plan_dir}: exists and is not a plan directory; choose an empty or new path")
    tmp = plan_dir.with_name(f".{plan_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(entry, tmp)
    if plan_dir.exists():
        shutil.rmtree(plan_dir)
    tmp.rename(plan_dir)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("optimize", help="optimize a model into a plan directory (cached)")
    p.add_argument("model", type=Path, help="source model: .onnx or .pt2 (torch.export.save)")
    p.add_argument("-o", "--output", type=Path, required=True, help="plan directory to write")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--calibration-data", type=Path, help=".npz keyed by input name (int8)")
    p.add_argument("--calibration-method", default="entropy", choices=("entropy", "percentile", "minmax"))
    p.add_argument("--batch", default="1,8,64", help="batch profile min..max, e.g. 1,8,64")
    p.add_argument("--backend", choices=("tensorrt", "onnxruntime", "pytorch"))
    p.add_argument("--name", help="model name used when serving (default: file stem)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    t = p.add_argument_group("measured optimizer (PyTorch backend on a GPU, --precision fp16)")
    t.add_argument("--tune", action="store_true",
                   help="time every candidate that can pay off on this GPU (torch.compile modes, channels-last, "
                        "FP8 linear layers, ...) per batch size and keep the fastest within the tolerance")
    t.add_argument("--examples", type=Path, help=".npz keyed by input name: the samples the error is measured on "
                                                 "(default: 32 seeded random samples)")
    t.add_argument("--min-top1", type=float, default=0.9, help="top-1 agreement with FP32 at least (default 0.9)")
    t.add_argument("--max-rel-error", type=float, default=0.15,
                   help="max |error| / max |FP32 output| at most (default 0.15)")
    t.add_argument("--allow-sparsity", action="store_true",
                   help="also try 2:4 structured sparsity (zeroes half of each linear layer's weights)")
    t.add_argument("--candidates", help="comma-separated candidate names to try (default: all that apply)")
    p.set_defaults(func=run)


def _tuning(args: argparse.Namespace) -> dict[str, Any]:
    """OptimizeOptions' tuning fields from the flags, each checked here: a bad one is one line, nothing built."""
    tuning_flags = [f for f, on in (("--examples", args.examples), ("--allow-sparsity", args.allow_sparsity),
                                    ("--candidates", args.candidates)) if on]
    if not args.tune:
        if tuning_flags:
            raise RuntimeUserError(f"{', '.join(tuning_flags)} only apply with --tune; add --tune")
        return {}
    from .candidates import ALL
    from .choose import Tolerance

    try:
        Tolerance(args.min_top1, args.max_rel_error)
    except ValueError as exc:
        raise RuntimeUserError(f"--min-top1/--max-rel-error: {exc}") from None
    only = [c.strip() for c in args.candidates.split(",") if c.strip()] if args.candidates else None
    unknown = [c for c in only or [] if c not in ALL]
    if unknown:
        raise RuntimeUserError(f"--candidates: unknown {', '.join(map(repr, unknown))}; choose from "
                               f"{', '.join(ALL)}")
    examples = sha = None
    if args.examples is not None:
        examples, sha = load_calibration(args.examples)
    return {"tune": True, "examples": examples, "examples_sha256": sha, "allow_sparsity": args.allow_sparsity,
            "min_top1": args.min_top1, "max_rel_error": args.max_rel_error, "candidates": only}


def run(args: argparse.Namespace) -> int:
    calib = sha = None
    if args.calibration_data is not None:
        calib, sha = load_calibration(args.calibration_data)
    from .manifest import model_name

    opts = OptimizeOptions(
        precision=args.precision,
        batch_profile=parse_batches(args.batch),
        calibration=calib,
        calibration_sha256=sha,
        calibration_method=args.calibration_method,
        name=args.name or model_name(args.model),
        **_tuning(args),
    )
    res = optimize(
        args.model,
        args.output,
        opts,
        backend=args.backend,
        calibration_path=args.calibration_data.resolve() if args.calibration_data else None,
    )
    m = res.manifest
    if args.json:
        print(
            json.dumps(
                {
                    "plan_dir": str(res.plan_dir),
                    "cache_hit": res.cache_hit,
                    "seconds": round(res.seconds, 3),
                    "manifest": m,
                },
                indent=2,
            )
        )
    else:
        how = "cache hit" if res.cache_hit else "built"
        print(
            f"{res.plan_dir}: {m['backend']} {m['backend_version']} {m['precision']} on {m['gpu']} "
            f"({how} in {res.seconds:.2f}s, cache key {m['cache_key']})"
        )
        if isinstance(m.get("optimizer"), dict):
            from .choose import render

            print("\n".join(render(m["optimizer"])))
    return 0
