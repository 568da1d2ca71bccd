"""Runs INSIDE the image (sbom_collect.py sends this file's text as `python3 -c`): what the image holds, as JSON.

Why from inside: labels say what a build asked for; only the image's own package databases say what it holds
(a `RUN pip install` in a user's layer, an apt package pulled in as a dependency). So this script asks the
image's own tools, in the image's own Python, and prints one JSON document on stdout:

- debs: dpkg's status database through `dpkg-query -W` (package, version, architecture, source package and
  version, status), the same database `dpkg-query -W` lists.
- dists: every Python distribution importlib.metadata finds on this interpreter's sys.path (what `pip list`
  reads), first one of a name wins as in pip. Wheel hash: PEP 610's direct_url.json keeps the sha256 of the
  archive a distribution was installed FROM a URL or file (`archive_info.hashes`, or the older `hash`); pip
  writes no such record for an install from an index or a --find-links folder (the catalog's wheel pool,
  recipes/macros.j2), and RECORD holds the installed files' hashes, not the wheel's. So `hashes` is empty for
  those, and the SBOM says so rather than guessing; the WHEEL file's tags are kept, which with the name and
  version name the wheel file that was installed (to look its hash up in a lock that maps files to hashes).
- cuda: ngcx_runtime.probe's own steps behind `ngcx test` (`libraries()` in a child interpreter, the framework
  imports, then `framework_copies()`), so the SBOM names the files the linker and the frameworks really load,
  each with its sha256.
- models: sha256 of each entry under the model folder given as argv[1] (a project image's /opt/ngcx/model),
  with the tree hash of cli/project/context.py sha256_tree for a folder, so it compares with the image's
  ai.ngcx.project.model-sha256 label.

Standard library only (plus ngcx_runtime when the image has it): it runs in every image, the base included,
and never imports ngcx (an image has no CLI).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

DPKG_FIELDS = ("name", "version", "arch", "source", "source_version", "status")
# dpkg-query expands \t and \n itself (dpkg-query(1), "Format"): the raw string goes to it as written.
DPKG_FORMAT = r"${Package}\t${Version}\t${Architecture}\t${source:Package}\t${source:Version}\t${db:Status-Abbrev}\n"


def debs() -> list[dict[str, str]] | dict[str, str]:
    """Every row of dpkg's status database, or {"error": why} in an image without dpkg."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", DPKG_FORMAT],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return {"error": str(exc).splitlines()[0]}
    rows = [[f.strip() for f in line.split("\t")] for line in out.splitlines() if line]
    return [dict(zip(DPKG_FIELDS, row, strict=False)) for row in rows]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _archive_hashes(dist: metadata.Distribution) -> dict[str, str]:
    """The installed archive's hashes from direct_url.json (PEP 610), {} when pip recorded none."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return {}
    archive = info.get("archive_info") or {}
    hashes = {k.lower(): v for k, v in (archive.get("hashes") or {}).items()}
    legacy = archive.get("hash") or ""
    if "=" in legacy:
        alg, value = legacy.split("=", 1)
        hashes.setdefault(alg.lower(), value)
    return hashes


def dists() -> list[dict[str, object]]:
    """Every distribution on sys.path, the first of each name (pip list shows that one)."""
    seen: set[str] = set()
    out: list[dict[str, object]] = []
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or _canonical(name) in seen:
            continue
        seen.add(_canonical(name))
        tags = [ln.split(":", 1)[1].strip() for ln in (dist.read_text("WHEEL") or "").splitlines()
                if ln.startswith("Tag:")]
        out.append({"name": name, "version": dist.version, "location": str(dist.locate_file("")),
                    "hashes": _archive_hashes(dist), "wheel_tags": tags})
    return out


def cuda() -> dict[str, object]:
    """The loaded CUDA libraries as ngcx-runtime's probe sees them, or {"error": why} without ngcx_runtime."""
    try:
        from ngcx_runtime import probe
    except ImportError as exc:
        return {"error": f"ngcx_runtime not importable: {exc}"}
    libs = probe.libraries()
    probe.frameworks()          # the imports that may map their own copies (torch's bundled cuDNN) ...
    probe.framework_copies(libs)  # ... noted as "framework_loaded", as in `ngcx-runtime info`
    for lib in libs.values():     # the bytes loaded: the file's sha256, the linker's copy and a framework's
        for entry in (lib, lib.get("framework_loaded") or {}):
            if entry.get("path") and Path(entry["path"]).is_file():
                entry["sha256"] = _sha256_file(Path(entry["path"]))
    return {"libraries": libs}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sha256_tree(path: Path) -> str:
    """cli/project/context.py sha256_tree, line for line: a file's sha256, or a folder's over names and contents."""
    if path.is_file():
        return _sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + _sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def models(folder: str) -> list[dict[str, object]]:
    root = Path(folder)
    if not folder or not root.is_dir():
        return []
    return [{"name": p.name, "path": str(p), "folder": p.is_dir(), "sha256": _sha256_tree(p),
             "size": p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())}
            for p in sorted(root.iterdir()) if not _signature_file(p)]


def _signature_file(path: Path) -> bool:
    """MODEL.sig / MODEL.pub beside a model: its OpenSSF Model Signing signature and public key (ngcx build puts
    them there: cli/project/modelsign.py), not a model of their own."""
    return path.suffix in (".sig", ".pub") and path.with_suffix("").exists()


def os_release() -> dict[str, str]:
    """/etc/os-release's ID, VERSION_ID, VERSION_CODENAME, PRETTY_NAME (the deb purls' namespace and distro)."""
    out: dict[str, str] = {}
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME"):
            out[key] = value.strip().strip('"')
    return out


def main(argv: list[str]) -> None:
    report = {"python": ".".join(map(str, sys.version_info[:3])), "os": os_release(), "debs": debs(),
              "dists": dists(), "cuda": cuda(), "models": models(argv[1] if len(argv) > 1 else "")}
    sys.stdout.write("\n" + json.dumps(report) + "\n")


if __name__ == "__main__":
    main(sys.argv)
