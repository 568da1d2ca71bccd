"""What a project build sends to BuildKit, and which layer a change invalidated.

Why a context folder of ngcx's own (state dir/projects/NAME/context) and not the project folder:
BuildKit keys its cache on content, so the context holds only what the Dockerfile copies, each file
written only when its content changed (the model hard-linked where the disk allows it). A code
edit then re-sends a few KB and re-runs two COPY steps; the model layer and the wheels stay cached.

Why the layer report: users cannot see why a rebuild is slow (BentoML, Truss). Each layer's inputs
(system packages, requirements or ngcx.lock, model sha256, code files, ngcx.yaml) are hashed and
kept in build.json next to the context; the next build names the first layer whose inputs changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ngcx_runtime.manifest import sha256_file  # one copy: the runtime keys plans by it too

if TYPE_CHECKING:
    from .base import BaseImage
    from .spec import Project

SKIP_PARTS = ("__pycache__", ".git", ".ipynb_checkpoints")
SKIP_SUFFIXES = (".pyc", ".pyo")


def sha256_tree(path: Path) -> str:
    """A file's sha256, or a folder's (SavedModel): relative names and contents, in order."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def tree_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stat_key(path: Path) -> list[int]:
    """What says "the model did not change" without reading it: size, mtime, inode (folder: its files)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    key = [len(files)]
    for f in files:
        st = f.stat()
        key += [st.st_size, st.st_mtime_ns, st.st_ino]
    return key


def model_sha(path: Path, previous: dict[str, Any]) -> str:
    """sha256 of the model, reused from the last build when its stat is unchanged (a multi-GB model
    is not re-read on every code edit)."""
    key = stat_key(path)
    cached = previous.get("model_stat") or {}
    if cached.get("path") == str(path) and cached.get("key") == key and cached.get("sha256"):
        return cached["sha256"]
    return sha256_tree(path)


def _skipped(rel: Path) -> bool:
    return any(p in SKIP_PARTS for p in rel.parts) or rel.suffix in SKIP_SUFFIXES


def code_files(project: Project) -> dict[str, Path]:
    """Context path under app/ -> source: spec.files (files or folders) and the handler's module."""
    root = project.root
    sources: list[Path] = [(root / f).resolve() for f in project.spec.files]
    if project.spec.handler:
        top = project.spec.handler.split(":")[0].split(".")[0]
        sources.append(root / f"{top}.py" if (root / f"{top}.py").is_file() else root / top)
    out: dict[str, Path] = {}
    for src in sources:
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root)
            if not _skipped(rel):
                out[rel.as_posix()] = f
    return dict(sorted(out.items()))


def requirements_text(project: Project) -> tuple[str, bool]:
    """(what the wheels layer installs, locked?): ngcx.lock when present and valid, else the list."""
    from . import lock

    lock_file = project.root / lock.LOCK_FILE
    if not lock_file.is_file():
        return ("\n".join(project.requirements) + "\n" if project.requirements else "", False)
    return lock_file.read_text(encoding="utf-8"), True


def layer_inputs(project: Project, base: BaseImage, reqs: str, model: str | None, code: dict[str, str]) -> dict:
    """Each layer's inputs as hashes, in layer order: compared with the previous build's."""
    calib = project.spec.model.calibration if project.spec.model else None
    return {
        "base": {"layers": base.chain},
        "system packages": {"packages": list(project.spec.system_packages)},
        "wheels": {"requirements": hashlib.sha256(reqs.encode()).hexdigest()},
        "model": {"model": model, "calibration": sha256_file(project.root / calib) if calib else None},
        "code": code,
        "config": {"ngcx.yaml": sha256_file(project.file)},
    }


def changed_layer(old: dict | None, new: dict, locked: bool) -> tuple[str | None, str]:
    """(first layer whose inputs changed, why) — ("base", "first build") when there is no old build."""
    from .render import LAYERS

    if not old:
        return "base", "first build of this project"
    for layer in LAYERS:
        a, b = old.get(layer), new.get(layer)
        if a == b:
            continue
        if layer == "code":
            a, b = a or {}, b or {}
            names = sorted((set(a) ^ set(b)) | {k for k in b if k in a and a[k] != b[k]})
            shown = ", ".join(Path(n).name for n in names[:3]) + (" ..." if len(names) > 3 else "")
            return layer, f"{shown} changed" if names else "code changed"
        if layer == "model":
            which = [k for k in ("model", "calibration") if (a or {}).get(k) != (b or {}).get(k)]
            return layer, " and ".join("calibration data" if k == "calibration" else "the model" for k in which) \
                + " changed"
        why = {"base": "the base image changed", "system packages": "system_packages changed",
               "wheels": "ngcx.lock changed" if locked else "the requirements changed",
               "config": "ngcx.yaml changed"}[layer]
        return layer, why
    return None, "nothing changed since the last build"


def report_line(first: str | None, why: str, present: list[str]) -> str:
    """`rebuilding from layer 'code' (handler.py changed); wheels, model: cached`."""
    if first is None:
        return f"all layers cached ({why})"
    if first == "base":
        return f"building every layer ({why})"
    cached = [layer for layer in present[:present.index(first)] if layer != "base"] if first in present else []
    return f"rebuilding from layer '{first}' ({why})" + (f"; {', '.join(cached)}: cached" if cached else "")


def present_layers(project: Project, has_requirements: bool, has_code: bool) -> list[str]:
    out = ["base"]
    if project.spec.system_packages:
        out.append("system packages")
    if has_requirements:
        out.append("wheels")
    if project.model is not None:
        out.append("model")
    if has_code:
        out.append("code")
    return [*out, "config"]


# ----------------------------------------------------------------------------- disk


def can_link(src: Path, folder: Path) -> bool:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return src.stat().st_dev == probe.stat().st_dev
    except OSError:
        return False


# ----------------------------------------------------------------------------- context


def sync_context(ctx: Path, wanted: dict[str, Path | bytes], link: set[str]) -> None:
    """Make ctx hold exactly `wanted` (relative path -> source file or bytes), rewriting only what
    changed so unchanged files keep their inode and mtime (BuildKit re-sends nothing for them)."""
    ctx.mkdir(parents=True, exist_ok=True)
    for rel, src in wanted.items():
        target = ctx / rel
        if _same(target, src):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.ngcx-tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(src, bytes):
            tmp.write_bytes(src)
        elif rel in link:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
        else:
            shutil.copy2(src, tmp)
        os.replace(tmp, target)
    keep = {ctx / rel for rel in wanted}
    for path in sorted(ctx.rglob("*"), reverse=True):
        if path.is_file() or path.is_symlink():
            if path not in keep:
                path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _same(target: Path, src: Path | bytes) -> bool:
    import filecmp

    if not target.is_file():
        return False
    if isinstance(src, bytes):
        return target.stat().st_size == len(src) and target.read_bytes() == src
    with contextlib.suppress(OSError):
        if os.path.samefile(target, src):
            return True
    return target.stat().st_size == src.stat().st_size and filecmp.cmp(target, src, shallow=False)


def context_files(project: Project, reqs: str, code: dict[str, Path], dockerfile: str) -> dict[str, Path | bytes]:
    """What the Dockerfile copies, by context path."""
    wanted: dict[str, Path | bytes] = {"Dockerfile": dockerfile.encode(), "ngcx.yaml": project.file}
    if reqs:
        wanted["requirements.txt"] = reqs.encode()
    if project.model is not None:
        model = project.model
        if model.is_file():
            wanted[f"model/{model.name}"] = model
        else:
            for f in sorted(p for p in model.rglob("*") if p.is_file()):
                wanted[f"model/{model.name}/{f.relative_to(model).as_posix()}"] = f
    calib = project.spec.model.calibration if project.spec.model else None
    if calib:
        wanted[f"calibration/{Path(calib).as_posix()}"] = project.root / calib
    for rel, src in code.items():
        wanted[f"app/{rel}"] = src
    return wanted


def project_dir(name: str) -> Path:
    from ..core import paths

    return paths.state_dir() / "projects" / name


def load_previous(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "build.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_previous(folder: Path, data: dict[str, Any]) -> None:
    tmp = folder / "build.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, folder / "build.json")
