"""Print a wheel's Requires-Dist from PyPI's simple index (PEP 691 JSON + PEP 658 metadata).

Why: registry.yaml's framework pins must equal the framework wheel's own Requires-Dist, so pip
changes nothing when the framework installs on top of the pinned CUDA wheels. This reads the
metadata file PyPI publishes beside each wheel (no multi-GB download) to regenerate or audit them.
Usage: python scripts/pypi_requires.py torch==2.5.1 [tensorflow==2.18.1 ...]
"""
from __future__ import annotations

import json
import sys
import urllib.request

SIMPLE = "https://pypi.org/simple/{name}/"
ACCEPT = "application/vnd.pypi.simple.v1+json"


def wheel_files(name: str, version: str) -> list[dict]:
    """Return the linux x86_64 (or pure) wheel entries of one release, best first."""
    req = urllib.request.Request(SIMPLE.format(name=name), headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    norm = name.replace("-", "_").lower()
    picked = [
        f for f in files
        if f["filename"].lower().startswith(f"{norm}-{version}-") and f["filename"].endswith(".whl")
        and ("manylinux" in f["filename"] and "x86_64" in f["filename"] or "none-any" in f["filename"])
    ]
    picked.sort(key=lambda f: ("cp311" not in f["filename"], f["filename"]))
    return picked


def requires(name: str, version: str) -> tuple[str, list[str]]:
    """Requires-Python and Requires-Dist lines of the first matching wheel's METADATA."""
    files = wheel_files(name, version)
    if not files:
        raise SystemExit(f"{name}=={version}: no linux x86_64 wheel on PyPI")
    with urllib.request.urlopen(files[0]["url"] + ".metadata", timeout=60) as resp:
        meta = resp.read().decode()
    lines = meta.split("\n\n", 1)[0].splitlines()
    py = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Python:")), "")
    return py, [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Requires-Dist:")]


def main(argv: list[str]) -> None:
    for spec in argv:
        name, version = spec.split("==")
        py, reqs = requires(name, version)
        print(f"## {name}=={version}  Requires-Python: {py}")
        for r in reqs:
            print(f"   {r}")


if __name__ == "__main__":
    main(sys.argv[1:])
