"""`ngcx-runtime selftest [DIR]`: run an image's own tests (images/NAME/tests/) inside the image.

Why not pytest: runtime images stay slim and carry no test framework. Test files are plain
Python: every `test_*` function in `test_*.py` runs; a test that needs a GPU (or anything else
absent) calls `skip("reason")`, and is reported as skipped with that reason, never as passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

DEFAULT_DIR = "/opt/ngcx/tests"
CONSTRAINTS = Path("/etc/ngcx/constraints.txt")  # written by the image build: every pin of the release


class Skipped(Exception):
    """Raised by skip(): the test could not run here; the message says why."""


def skip(reason: str) -> None:
    raise Skipped(reason)


def gpu_count() -> int:
    """Visible NVIDIA GPUs through the driver API (0 when no driver/GPU), framework-free."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    if cuda.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    return count.value if cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


def require_gpu() -> int:
    """Skip unless a GPU is visible; returns how many."""
    n = gpu_count()
    if n == 0:
        skip("no GPU: no NVIDIA driver or device visible in this container")
    return n


def pins() -> dict[str, str]:
    """name -> version from the image's constraints file (what the build pinned)."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if "==" in line:
            name, version = line.strip().split("==", 1)
            out[name.split("[")[0].lower()] = version
    return out


def pin(prefix: str) -> str:
    """The version pinned for the first package whose name starts with prefix."""
    found = [v for k, v in pins().items() if k.startswith(prefix)]
    assert found, f"{CONSTRAINTS} pins no {prefix}* package"
    return found[0]


def same_version(found: str, pinned: str) -> bool:
    """Compare the components both report (cuDNN 9.1.0 vs wheel 9.1.0.70); local tags ignored."""
    a, b = found.split("+")[0].split("."), pinned.split("+")[0].split(".")
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"ngcx_selftest_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def run_dir(folder: Path) -> list[dict[str, Any]]:
    """Run every test; one result dict per test (name, status, reason/error, seconds)."""
    results: list[dict[str, Any]] = []
    for file in sorted(folder.glob("test_*.py")):
        try:
            module = _load(file)
        except Exception as exc:  # an import error fails every test of that file
            results.append({"name": file.stem, "status": "failed",
                            "error": f"{type(exc).__name__}: {exc}", "seconds": 0.0})
            continue
        for name in sorted(n for n in vars(module) if n.startswith("test_") and callable(getattr(module, n))):
            started = time.monotonic()
            entry: dict[str, Any] = {"name": f"{file.stem}::{name}"}
            try:
                getattr(module, name)()
                entry["status"] = "passed"
            except Skipped as exc:
                entry.update(status="skipped", reason=str(exc))
            except Exception as exc:
                entry.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                             traceback=traceback.format_exc(limit=4))
            entry["seconds"] = round(time.monotonic() - started, 3)
            results.append(entry)
    return results


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("selftest", help="run the image's own tests (default /opt/ngcx/tests)")
    p.add_argument("folder", nargs="?", default=DEFAULT_DIR)
    p.add_argument("--json", action="store_true", help="machine-readable results")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"ngcx-runtime: error: test folder {folder} does not exist", file=sys.stderr)
        return 2
    results = run_dir(folder)
    if args.json:
        print(json.dumps({"results": results}, indent=2))
    else:
        for r in results:
            extra = r.get("reason") or r.get("error") or ""
            print(f"{r['status']:<8} {r['name']}  {extra}")
    return 1 if any(r["status"] == "failed" for r in results) else 0


# Make `from ngcx_runtime.selftest import skip, require_gpu` the whole API a test file needs.
__all__ = ["skip", "require_gpu", "gpu_count", "Skipped", "run_dir", "pins", "pin", "same_version", "CONSTRAINTS"]
