"""`ngcx-runtime info [--json]`: what this image (or host) actually has loaded.

The JSON shape is a contract: `ngcx test` runs this inside a built image and compares the
versions with the image's pinned labels, so keys only get added, never renamed.
    {"probe_version": 1, "runtime_version": "0.1.0", "python": "3.11.2",
     "libraries": {"cudart"|"cublas"|"cudnn"|"nccl"|"tensorrt":
                   {"version", "raw", "path", "wheel": {"name", "version"} | null} | {"error"}},
     "frameworks": {"torch": {...}, "tensorflow": {...}, "onnxruntime": {...}, "tensorrt": {...}},
     "driver": {"version", "cuda"} | null,
     "gpus": [{"index", "name", "compute_capability", "memory_mib", "uuid"}],
     "backends": {"onnxruntime"|"pytorch"|"tensorrt": {"usable": bool, ...}}}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def render_table(report: dict[str, Any]) -> str:
    """A compact human view of the same report."""
    lines = [f"python {report['python']}", "", "libraries:"]
    for name, lib in report["libraries"].items():
        if "error" in lib:
            lines.append(f"  {name:<10} -        {lib['error']}")
        else:
            wheel = f"  [{lib['wheel']['name']} {lib['wheel']['version']}]" if lib.get("wheel") else ""
            lines.append(f"  {name:<10} {lib['version']:<8} {lib['path']}{wheel}")
    lines += ["", "frameworks:"]
    if not report["frameworks"]:
        lines.append("  (none importable)")
    for name, fw in report["frameworks"].items():
        if "error" in fw:
            lines.append(f"  {name:<12} error: {fw['error']}")
            continue
        extra = ", ".join(f"{k} {v}" for k, v in fw.items() if k not in ("version", "providers") and v)
        prov = f" providers: {', '.join(fw['providers'])}" if fw.get("providers") else ""
        lines.append(f"  {name:<12} {fw['version']}{' (' + extra + ')' if extra else ''}{prov}")
    lines.append("")
    drv = report["driver"]
    if drv:
        lines.append(f"driver: {drv['version'] or '?'} (CUDA {drv['cuda']})")
    else:
        lines.append(f"driver: {report.get('driver_note', 'no NVIDIA driver visible')}")
    for g in report["gpus"]:
        lines.append(f"  gpu {g['index']}: {g['name']}, sm {g['compute_capability']}, "
                     f"{g['memory_mib']} MiB, {g['uuid']}")
    lines += ["", "backends:"]
    for name, b in report["backends"].items():
        state = "usable" if b["usable"] else f"not usable: {b.get('reason', '')}"
        detail = b.get("device") or (", ".join(b["providers"]) if b.get("providers") else "")
        lines.append(f"  {name:<12} {state}{' (' + detail + ')' if b['usable'] and detail else ''}")
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("info", help="report loaded CUDA libraries, frameworks, driver, GPUs, backends")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable shape)")
    p.add_argument("--lib-path", action="append", default=[], type=Path,
                   help="extra directory to search for CUDA libraries first (repeatable; also "
                        "$NGCX_PROBE_LIB_PATH)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .probe import probe

    report = probe(args.lib_path)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_table(report))
    return 0



