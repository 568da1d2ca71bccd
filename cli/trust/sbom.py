"""Behind `ngcx sbom`: an SBOM of what an image really holds, made from inside it (issue 48, item 2).

`make_sbom(ref)` is the one call: the signing side (push, attest) attaches its result as the CycloneDX
attestation of the pushed digest. The steps: resolve the reference to a local image (a local tag, an image ID,
or a catalog IMAGE[:RELEASE] as `ngcx test` takes it), collect what the image holds from one container of it
(sbom_collect.py, which runs sbom_inside.py there), then write CycloneDX 1.6 (sbom_cyclonedx.py, validated
against the official schema) or SPDX 2.3 (sbom_spdx.py). `build_sbom` returns the same document with its
timings, for the benchmark and for `ngcx sbom`'s stderr line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

Format = Literal["cyclonedx", "spdx"]
FORMATS: tuple[str, ...] = ("cyclonedx", "spdx")


@dataclass(frozen=True)
class SbomResult:
    document: dict[str, Any]
    format: str
    image: str              # the local reference the SBOM was made from
    digest: str             # the image's digest as the SBOM names it (manifest digest once pushed, else its ID)
    components: int
    collect_s: float        # the container run and the engine's facts
    total_s: float          # collect + write + validate


def make_sbom(ref: str, fmt: Format = "cyclonedx", *, digest: str | None = None) -> dict[str, Any]:
    """The SBOM of image `ref` as a JSON-ready dict: CycloneDX 1.6 (validated against its schema) or SPDX 2.3.
    `digest`: the manifest digest the SBOM is about (push passes the digest it pushed and signs); by default
    the engine's repository digest for `ref`, else the image ID. UserError (one line, exit 2) when the engine
    is down or the image is not there."""
    return build_sbom(ref, fmt, digest=digest).document


def build_sbom(ref: str, fmt: Format = "cyclonedx", variant: str = "runtime", *,
               digest: str | None = None) -> SbomResult:
    """make_sbom with its timings: collect_s for the container run, total_s for everything."""
    from dataclasses import replace

    from .sbom_collect import collect

    if fmt not in FORMATS:
        from ..core.errors import UserError

        raise UserError(f"unknown SBOM format {fmt!r}", hint="use cyclonedx or spdx")
    started = time.monotonic()
    local = resolve(ref, variant)
    inv = collect(local)
    if digest:
        if not digest.startswith("sha256:") or len(digest) != 71:
            from ..core.errors import UserError

            raise UserError(f"not an image digest: {digest!r}", hint="give sha256: and 64 hex digits")
        inv = replace(inv, image=replace(inv.image, subject=digest))
    if fmt == "spdx":
        from .sbom_spdx import spdx

        doc = spdx(inv)
        count = len(doc["packages"]) - 1
    else:
        from .sbom_cyclonedx import cyclonedx

        doc = cyclonedx(inv)
        count = len(doc.get("components", []))
    return SbomResult(doc, fmt, local, inv.image.digest, count, inv.collect_s, round(time.monotonic() - started, 3))


def resolve(ref: str, variant: str = "runtime") -> str:
    """A local image as given (tag, name@digest, image ID), else a catalog IMAGE[:RELEASE] built locally."""
    from ..core.engine import engine_client, image_or_none
    from ..core.errors import UserError
    from ..workstation.host import resolve_image

    if image_or_none(engine_client(), ref) is not None:
        return ref
    if "/" in ref or "@" in ref or ref.startswith("sha256:"):   # catalog names have neither
        raise UserError(f"no local image {ref!r}", hint="build it with `ngcx build`, or check `docker images`")
    return resolve_image(ref, variant, None)
