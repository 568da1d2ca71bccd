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


def render_plan(manifest: dict[str, Any]) -> str:
    """A plan's manifest for a reader: what it is, what it is tied to, and the optimizer's choices with every
    candidate's time and error (a plan from `optimize --tune`)."""
    from .choose import render

    lines = [f"plan {manifest.get('name', '?')}: {manifest['backend']} {manifest['backend_version']} "
             f"{manifest['precision']} on {manifest['target'].get('name')} "
             f"(sm {manifest['target'].get('compute_capability') or '-'}), batch profile "
             f"{manifest.get('batch_profile')}"]
    lines += [f"  note: {n}" for n in manifest.get("notes") or [] if isinstance(n, str)]
    section = manifest.get("optimizer")
    if isinstance(section, dict):
        lines += render(section)
    else:
        lines.append("optimizer: not tuned (build it with optimize --tune to time the candidates on this GPU)")
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("info", help="report loaded CUDA libraries, frameworks, driver, GPUs, backends")
    p.add_argument("plan", nargs="?", type=Path,
                   help="a plan directory (optimize -o): show what the plan is and what its optimizer chose instead")
    p.add_argument("--json", action="store_true", help="machine-readable output (stable shape)")
    p.add_argument("--lib-path", action="append", default=[], type=Path,
                   help="extra directory to search for CUDA libraries first (repeatable; also "
                        "$NGCX_PROBE_LIB_PATH)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.plan is not None:
        from .errors import RuntimeUserError
        from .plan import read_manifest

        if not args.plan.is_dir():
            raise RuntimeUserError(f"{args.plan}: not a plan directory; give the -o folder of ngcx-runtime optimize")
        manifest = read_manifest(args.plan)
        print(json.dumps(manifest, indent=2) if args.json else render_plan(manifest))
        return 0
    from .probe import probe

    report = probe(args.lib_path)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_table(report))
    return 0
