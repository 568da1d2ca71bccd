"""The catalog: registry.yaml read, validated and completed (images -> releases -> pins, rules as data).

yamlio (core/) reads with line numbers, schema.py checks shapes, rules.py the compatibility rules,
complete.py computes each release's full data, cache.py keeps a validated catalog so a warm command
needs no pydantic. This module stays light (the standard library only), so the CLI starts fast:
commands/catalog.py prints what load_catalog() returns.
"""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Catalog, Release


def load_catalog(path: str | Path | None = None) -> "Catalog":
    """Load, validate and complete a catalog (default: the shipped registry.yaml); cached by its sha256."""
    from .cache import load_catalog as _load

    return _load(path)


def release_summary(rel: "Release") -> dict:
    """What `catalog show` reports for one release (also used by --json)."""
    return {
        "image": rel.image,
        "release": rel.tag,
        "ref": rel.ref,
        "base": {"profile": rel.spec.base, "image": rel.base.image, "offline": rel.base.offline},
        "python": rel.spec.python,
        "cuda": rel.cuda,
        "pins": {p.component: {"wheel": p.wheel, "version": p.version} for p in rel.pins},
        "framework": {"wheel": rel.framework.wheel, "version": rel.framework.version} if rel.framework else None,
        "extras": list(rel.extras),
        "min_driver": rel.min_driver,
        "min_driver_by_gpu": rel.arch_min_driver,
        "full_feature_driver": rel.full_driver,
        "compute_capabilities": list(rel.compute_capabilities),
        "nvidia_require_cuda": rel.require_cuda,
    }
