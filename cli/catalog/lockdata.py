"""The catalog's wheel hashes (registry.lock.yaml): what every pip install of a release may accept, to the byte.

Why a file of its own beside registry.yaml: the catalog says which versions a release pins; this file says which
bytes those versions are (the sha256 of every file the package index publishes for them) and which exact set each
pip layer installs, transitive dependencies included, because `pip install --require-hashes` refuses any
requirement without a hash (recipes/macros.j2 hashed_lines). It is generated (`ngcx catalog lock`, refresh.py),
never hand-edited, so it stays out of the validated catalog and its cache: a refresh changes no pin.

Looked up by content, not by file: the lock beside the catalog file first, then the shipped one, and an entry is
used only when it holds every pin the release names, so a copied catalog with the same pins builds and a changed
pin is "no hashes" (run the refresh), never the old bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    from .model import Release

REFRESH = "ngcx catalog lock"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def lock_path(catalog_source: str | Path) -> Path:
    """registry.yaml -> registry.lock.yaml (any catalog file: NAME.yaml -> NAME.lock.yaml)."""
    path = Path(catalog_source)
    return path.with_name(f"{path.stem}.lock.yaml")


def canonical(name: str) -> str:
    """PEP 503's normalized project name: the lock's keys spell every package this way."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin_key(requirement: str) -> str:
    """'Torch[x]==2.5.1' -> 'torch==2.5.1': the key of `hashes` (extras do not change the file)."""
    name, _, version = requirement.partition("==")
    return f"{canonical(name.split('[')[0].strip())}=={version.strip()}"


@dataclass(frozen=True)
class ReleaseLock:
    """One release's hashed layers: requirement -> the sha256 hexes pip may accept, in install order."""

    stack: tuple[tuple[str, tuple[str, ...]], ...]
    framework: tuple[tuple[str, tuple[str, ...]], ...]
    runtime: tuple[tuple[str, tuple[str, ...]], ...]

    def stack_hashes(self, requirement: str) -> tuple[str, ...]:
        return dict(self.stack)[requirement]


def _read(path: Path) -> dict | None:
    """The lock file's data, or None when there is none; malformed -> one line.

    `ngcx catalog lock` writes it as JSON under its comment header (JSON is YAML), so a render reads it with the
    json module: the warm and the seeded render import no YAML parser (tests/catalog/test_catalog_cache.py). A
    file edited into block YAML still reads, through the catalog's limited loader."""
    import json

    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                        hint=f"regenerate it with `{REFRESH}`") from None
    try:
        data = json.loads("".join(line for line in text.splitlines(True) if not line.startswith("#")))
    except ValueError:
        from ..core.yamlio import load_yaml

        data = load_yaml(text, str(path))
    if not isinstance(data, dict) or not isinstance(data.get("hashes"), dict) \
            or not isinstance(data.get("releases"), dict):
        raise UserError(f"{path}: not a catalog lock (no hashes/releases mappings)",
                        hint=f"regenerate it with `{REFRESH}`")
    return data


def _hashes(data: dict, requirement: str) -> tuple[str, ...] | None:
    found = data["hashes"].get(pin_key(requirement))
    if not isinstance(found, list) or not found or not all(isinstance(h, str) and SHA256.match(h) for h in found):
        return None
    return tuple(found)


def _hashed(data: dict, requirements: list) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    out = []
    for req in requirements:
        hashes = _hashes(data, req) if isinstance(req, str) else None
        if hashes is None:
            return None
        out.append((req, hashes))
    return tuple(out)


def _entry(data: dict, release: Release) -> ReleaseLock | None:
    """The release's lock from one file's data, or None when it is missing or no longer matches the pins."""
    entry = data["releases"].get(release.ref)
    if not isinstance(entry, dict):
        return None
    stack = _hashed(data, [p.requirement for p in release.pins])
    as_named = {pin_key(r): r for r in release.install if "==" in r}  # 'tensorflow[and-cuda]==2.16.2' keeps its extra
    framework = _hashed(data, [as_named.get(pin_key(r), r) if isinstance(r, str) else r
                               for r in entry.get("framework") or []])
    runtime = _hashed(data, list(entry.get("runtime") or []))
    if stack is None or framework is None or runtime is None or not runtime:
        return None
    installed = {pin_key(r) for r, _ in framework}
    if release.install and not all(pin_key(r) in installed for r in release.install if "==" in r):
        return None  # a framework or extra pin changed since the refresh
    return ReleaseLock(stack=stack, framework=framework, runtime=runtime)


def release_lock(release: Release, catalog_source: str | None) -> ReleaseLock:
    """The hashes a release builds with: the lock beside its catalog, else the shipped one; none -> exit 2."""
    from ..core import paths

    candidates = [lock_path(catalog_source)] if catalog_source else []
    shipped = lock_path(paths.registry_file())
    if shipped not in candidates:
        candidates.append(shipped)
    for path in candidates:
        data = _read(path)
        found = _entry(data, release) if data else None
        if found is not None:
            return found
    raise UserError(f"{release.ref} has no wheel hashes in {candidates[0].name} (every pip install runs with "
                    "--require-hashes)", hint=f"run `{REFRESH}` to fetch them from the package index")


def is_locked(release: Release, catalog_source: str | None) -> bool:
    """Whether the release has its wheel hashes (it renders and builds)."""
    try:
        release_lock(release, catalog_source)
    except UserError:
        return False
    return True
