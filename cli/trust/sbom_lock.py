"""The wheel hashes a catalog image's pip installs accepted (registry.lock.yaml), for the SBOM's Python components.

Why from the lock and not the image: pip keeps no hash of a wheel installed from an index or a --find-links folder
(sbom_inside.py says what it does keep), while every catalog pip install runs with --require-hashes against the
release's lock (cli/catalog/lockdata.py, recipes/macros.j2): the installed wheel is one of the files the lock
lists for its name==version. Where the lock lists exactly one file, that is the wheel's sha256; where it lists
several (one per platform: x86_64 and aarch64), the SBOM gives them all as the set it is one of, never a guess.
A package the lock does not name (a project's own requirements), or an image of a release without a lock, gets
nothing from here.
"""

from __future__ import annotations

from ..core.errors import UserError


def accepted_hashes(labels: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """name==version (PEP 503 name) -> the sha256 hexes its release's lock accepts; {} for a non-catalog image."""
    from ..core import naming

    image, tag = labels.get(naming.LABEL_IMAGE), labels.get(naming.LABEL_RELEASE)
    if not image or not tag:
        return {}
    from ..catalog import load_catalog
    from ..catalog.lockdata import pin_key, release_lock

    try:
        release = load_catalog().resolve(f"{image}:{tag}")
        lock = release_lock(release, None)
    except UserError:       # a release the shipped catalog no longer has, or one without hashes
        return {}
    return {pin_key(req): hashes for req, hashes in (*lock.stack, *lock.framework, *lock.runtime)}


def key(name: str, version: str) -> str:
    from ..catalog.lockdata import pin_key

    return pin_key(f"{name}=={version}")
