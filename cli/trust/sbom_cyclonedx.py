"""CycloneDX 1.6 JSON from an Inventory, through cyclonedx-python-lib, validated before anyone sees it.

Why the library and its validator: the document must validate against the official CycloneDX 1.6 JSON schema
(issue 48), and cyclonedx-python-lib ships that schema (cyclonedx/schema/_res/bom-1.6.SNAPSHOT.schema.json) and
validates with it; a writer of our own would be checked only by our own reading of the spec.

Components and their purls (purl-spec's types): every Debian package `pkg:deb/<os id>/NAME@VER?arch=&distro=`,
every Python distribution `pkg:pypi/NAME@VER` (with the wheel's sha256 where the image or the catalog's lock
says which file it was: sbom_lock.py), every
CUDA library file the probe saw loaded `pkg:generic/nvidia/COMPONENT@VER`, a project's model files (type
machine-learning-model, sha256), and the base image (`pkg:oci/...@DIGEST`). metadata.component is the image
itself: a container component whose version and SHA-256 hash are its digest.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from .sbom_collect import BaseRef, CudaLib, Deb, ImageRef, Inventory, ModelFile, PyDist

NS = "ngcx:"   # property names of our own (CycloneDX property taxonomy: a namespace prefix of the tool's)


def cyclonedx(inv: Inventory) -> dict[str, Any]:
    """The CycloneDX 1.6 document for `inv`, as a dict; raises if it does not validate against the 1.6 schema
    (a bug of ours, never shipped as an SBOM)."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.output.json import JsonV1Dot6

    bom = Bom()
    image = _image(inv)
    bom.metadata.component = image
    bom.metadata.tools.components.add(_tool())
    parts = ([_deb(d, inv.os) for d in inv.debs] + [_dist(d) for d in inv.dists] + [_cuda(c) for c in inv.cuda]
             + [_model(m) for m in inv.models] + ([_base(inv.base)] if inv.base and inv.base.digest else []))
    for part in parts:
        bom.components.add(part)
    bom.register_dependency(image, parts)
    text = JsonV1Dot6(bom).output_as_string(indent=None)
    validate(text)
    return json.loads(text)


def validate(text: str) -> None:
    """Validate a CycloneDX JSON text against the library's bundled official 1.6 schema; UserError naming the
    first violation (the SBOM is not written)."""
    from cyclonedx.schema import SchemaVersion

    error = _json_validator()(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise UserError(f"the CycloneDX SBOM does not validate against the 1.6 schema: {str(error)[:300]}",
                        hint="this is a bug in ngcx: please report it with the image reference")


def _json_validator() -> Any:
    """cyclonedx-python-lib's strict JSON validator, its jsonschema imported without rfc3987_syntax.

    Why: jsonschema imports rfc3987_syntax (a Lark grammar built at import) for its `iri` / `iri-reference`
    format checks: 7 s of every `ngcx sbom` on this project's 2-core machine (`python -X importtime -c 'import
    jsonschema'`), 0.6 s without it, while the documents made here hold no iri field (no URLs: purls are plain
    strings in the 1.6 schema). Every structural rule of the schema is checked either way; the tests validate the
    same documents with the full jsonschema, iri checks included (tests/trust/test_sbom_image.py)."""
    import sys

    if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # an import of it raises ImportError
        try:
            import jsonschema  # noqa: F401
        finally:
            del sys.modules["rfc3987_syntax"]
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator


def _props(pairs: dict[str, str | None]) -> list[Any]:
    from cyclonedx.model import Property

    return [Property(name=NS + k, value=v) for k, v in pairs.items() if v]


def _sha256(hex_or_digest: str) -> list[Any]:
    from cyclonedx.model import HashAlgorithm, HashType

    value = hex_or_digest.split(":", 1)[1] if hex_or_digest.startswith("sha256:") else hex_or_digest
    return [HashType(alg=HashAlgorithm.SHA_256, content=value)] if len(value) == 64 else []


def oci_purl(name: str, digest: str, tag: str | None = None) -> Any:
    """purl-spec's oci type: the repository's last segment as name, the digest as version, the rest qualifiers."""
    from packageurl import PackageURL

    qualifiers = {"repository_url": name} | ({"tag": tag} if tag else {})
    return PackageURL(type="oci", name=name.rsplit("/", 1)[-1].lower(), version=digest, qualifiers=qualifiers)


def _image(inv: Inventory) -> Any:
    from cyclonedx.model.component import Component, ComponentType

    img: ImageRef = inv.image
    labels = {k: v for k, v in inv.labels.items() if k.startswith(("ai.ngcx.", "org.opencontainers."))}
    props = _props({"image-id": img.image_id, "platform": inv.platform, "created": inv.created,
                    "python": inv.python, "os": inv.os.get("PRETTY_NAME"),
                    "collect-seconds": f"{inv.collect_s:.3f}"})
    props += _props({f"repo-digest.{i}": d for i, d in enumerate(img.repo_digests)})
    props += _props({f"label.{k}": v for k, v in sorted(labels.items())})
    props += _props({f"note.{i}": n for i, n in enumerate(inv.notes)})
    return Component(type=ComponentType.CONTAINER, name=img.name, version=img.digest, bom_ref=f"image:{img.digest}",
                     hashes=_sha256(img.digest), purl=oci_purl(img.name, img.digest, img.tag), properties=props)


def _tool() -> Any:
    from cyclonedx.model.component import Component, ComponentType

    from ngcx_runtime import __version__

    return Component(type=ComponentType.APPLICATION, name="ngcx", version=__version__)


def deb_purl(deb: Deb, os_info: dict[str, str]) -> Any:
    from packageurl import PackageURL

    qualifiers = {"arch": deb.arch} | ({"distro": os_info["VERSION_CODENAME"]} if os_info.get("VERSION_CODENAME")
                                       else {})
    return PackageURL(type="deb", namespace=os_info.get("ID") or "debian", name=deb.name, version=deb.version,
                      qualifiers=qualifiers)


def _deb(deb: Deb, os_info: dict[str, str]) -> Any:
    from cyclonedx.model.component import Component

    purl = deb_purl(deb, os_info)
    source = f"{deb.source} {deb.source_version}" if (deb.source, deb.source_version) != (deb.name, deb.version) \
        else None
    return Component(name=deb.name, version=deb.version, purl=purl, bom_ref=purl.to_string(),
                     properties=_props({"package-type": "deb", "deb.source": source, "dpkg-status": deb.status}))


def pypi_purl(dist: PyDist) -> Any:
    """purl-spec's pypi type: the name lowercased with '_' as '-' (PEP 503 normalised)."""
    import re

    from packageurl import PackageURL

    return PackageURL(type="pypi", name=re.sub(r"[-_.]+", "-", dist.name).lower(), version=dist.version)


def _dist(dist: PyDist) -> Any:
    from cyclonedx.model.component import Component

    purl = pypi_purl(dist)
    known, source = wheel_sha256(dist)
    return Component(name=dist.name, version=dist.version, purl=purl, bom_ref=purl.to_string(),
                     hashes=_sha256(known) if known else [],
                     properties=_props({"package-type": "python", "python.location": dist.location,
                                        "python.wheel-tags": ", ".join(dist.wheel_tags) or None,
                                        "wheel-hash": source,
                                        "wheel-sha256-one-of": " ".join(dist.accepted) if not known and dist.accepted
                                        else None}))


def wheel_sha256(dist: PyDist) -> tuple[str | None, str]:
    """(the installed wheel's sha256 when it is known, where that answer comes from)."""
    if dist.hashes.get("sha256"):
        return dist.hashes["sha256"], "direct_url.json in the image"
    if len(dist.accepted) == 1:
        return dist.accepted[0], "registry.lock.yaml: the one file pip --require-hashes accepted"
    if dist.accepted:
        return None, "one of wheel-sha256-one-of (registry.lock.yaml: the files pip --require-hashes accepted)"
    return None, "not recorded in the image"


def cuda_purl(lib: CudaLib) -> Any:
    from packageurl import PackageURL

    return PackageURL(type="generic", namespace="nvidia", name=lib.component, version=lib.version,
                      qualifiers={"file_name": lib.path.rsplit("/", 1)[-1]})


def _cuda(lib: CudaLib) -> Any:
    from cyclonedx.model.component import Component

    return Component(name=lib.path.rsplit("/", 1)[-1], group="nvidia", version=lib.version, purl=cuda_purl(lib),
                     bom_ref=f"cuda:{lib.component}:{lib.path}", hashes=_sha256(lib.sha256 or ""),
                     description=f"{lib.component}, loaded by the "
                     f"{lib.loaded_by} (ngcx-runtime probe)",
                     properties=_props({"package-type": "cuda-library", "cuda.path": lib.path,
                                        "cuda.wheel": lib.wheel, "cuda.pin": lib.pin, "cuda.loaded-by": lib.loaded_by}))


def _model(model: ModelFile) -> Any:
    from cyclonedx.model.component import Component, ComponentType

    return Component(type=ComponentType.MACHINE_LEARNING_MODEL, name=model.name, bom_ref=f"model:{model.path}",
                     hashes=[] if model.folder else _sha256(model.sha256),
                     properties=_props({"model.path": model.path, "model.size": str(model.size),
                                        "model.sha256-tree": model.sha256 if model.folder else None}))


def _base(base: BaseRef) -> Any:
    from cyclonedx.model.component import Component, ComponentType

    from .sbom_collect import split_ref

    repo, tag = split_ref(base.name or "base")
    return Component(type=ComponentType.CONTAINER, name=repo, version=base.digest, bom_ref=f"base:{base.digest}",
                     hashes=_sha256(base.digest or ""), purl=oci_purl(repo, base.digest or "", tag),
                     properties=_props({"role": "base image", "base.verified": "true" if base.verified else "false",
                                        "base.how": base.how}))
