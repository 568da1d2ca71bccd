"""The base image a project builds FROM: its catalog release's local image, identified by content.

Apart from build.py because lock.py and context.py need it too (lock resolves inside the base, the
context records its layers), and none of them may import another in a circle.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..build.image import BuildOptions
    from ..catalog.model import Catalog
    from .spec import Project


@dataclass(frozen=True)
class BaseImage:
    """The catalog image a project builds FROM, identified by content."""

    ref: str                    # onnxruntime:25.08
    tag: str                    # ngcx/onnxruntime:25.08-runtime
    id: str                     # sha256:... image ID (changes when only its labels change)
    layers: tuple[str, ...]     # RootFS diff IDs: what the project's layers sit on

    @property
    def chain(self) -> str:
        """One digest of the base's layers: equal for two builds of the same content."""
        return "sha256:" + hashlib.sha256("\n".join(self.layers).encode()).hexdigest()


def _runtime_of(img: Any) -> str | None:
    """The ngcx-runtime version a catalog image was built with (its ai.ngcx.runtime label; None before 0.2.0)."""
    return (img.attrs.get("Config", {}).get("Labels") or {}).get("ai.ngcx.runtime")


def ensure_base(project: Project, opts: BuildOptions, client: Any, catalog: Catalog | None) -> BaseImage:
    """The base release's local image, built first with the catalog build path when it is missing or carries
    another ngcx-runtime than this ngcx's: a project must not ship a runtime older than the CLI that deploys
    it (0.2.0 added endpoint keys; an older runtime would serve an open endpoint, which deploy refuses)."""
    from dataclasses import replace

    from ngcx_runtime import __version__ as runtime_version

    from ..build import image as catalog_build
    from ..core import naming
    from ..core.engine import image_or_none

    release = project.release
    tag = naming.local_tag(release.image, release.tag, project.spec.variant)
    img = image_or_none(client, tag)
    stale = img is not None and _runtime_of(img) != runtime_version
    if img is None or stale:
        why = (f"carries ngcx-runtime {_runtime_of(img) or 'older than 0.2.0'}, this ngcx has {runtime_version}"
               if stale else "is not built here")
        print(f"base {tag} {why}: building {release.ref} ({project.spec.variant}) first")
        catalog_build.build(release, replace(opts, tag=None, variant=project.spec.variant), catalog)
        img = client.images.get(tag)
    layers = tuple(img.attrs.get("RootFS", {}).get("Layers") or ())
    return BaseImage(release.ref, tag, img.id, layers)
