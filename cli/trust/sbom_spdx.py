"""SPDX 2.3 JSON from the same Inventory as the CycloneDX document (`ngcx sbom --format spdx`).

Why the standard library and not spdx-tools: spdx-tools pulls rdflib, ply, beartype and more into the CLI for
one json.dumps of plain fields; the fields are few and fixed by the SPDX 2.3 specification (clauses 6 and 7,
"Document creation information" and "Package information"; relationships, clause 11). What can be checked
here is checked before returning (`check`): unique, well-formed SPDX identifiers, every relationship naming
an element of the document, and the fields 2.3 makes mandatory on the document and each package. The tests
parse and validate the output with spdx-tools itself (tests/trust/test_sbom_image.py).
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sbom_collect import Inventory

SPDX_ID = re.compile(r"^SPDXRef-[A-Za-z0-9.-]+$")
DOC_FIELDS = ("spdxVersion", "dataLicense", "SPDXID", "name", "documentNamespace", "creationInfo")
PACKAGE_FIELDS = ("SPDXID", "name", "downloadLocation")


def spdx(inv: Inventory) -> dict[str, Any]:
    """The SPDX 2.3 document for `inv`: the image DESCRIBES-d, CONTAINS every package, DESCENDANT_OF its base."""
    from ngcx_runtime import __version__

    from .sbom_cyclonedx import cuda_purl, deb_purl, oci_purl, pypi_purl, wheel_sha256

    img = inv.image
    image_id = "SPDXRef-image"
    packages = [_package(image_id, img.name, img.digest, oci_purl(img.name, img.digest, img.tag).to_string(),
                         "CONTAINER", sha256=img.digest)]
    relationships = [_rel("SPDXRef-DOCUMENT", "DESCRIBES", image_id)]
    rows: list[tuple[str, str, str, str, str, str | None, str | None]] = []
    rows += [("deb", d.name, d.version, deb_purl(d, inv.os).to_string(), "LIBRARY", None,
              f"built package from: {d.source} {d.source_version}") for d in inv.debs]
    rows += [("pypi", d.name, d.version, pypi_purl(d).to_string(), "LIBRARY", wheel_sha256(d)[0], wheel_sha256(d)[1])
             for d in inv.dists]
    rows += [("cuda", c.path.rsplit("/", 1)[-1], c.version, cuda_purl(c).to_string(), "LIBRARY", c.sha256,
              f"{c.component} at {c.path}, loaded by the {c.loaded_by}") for c in inv.cuda]
    for i, (kind, name, version, purl, purpose, sha, info) in enumerate(rows):
        ref = f"SPDXRef-{kind}-{i}"
        packages.append(_package(ref, name, version, purl, purpose, sha256=sha, source_info=info))
        relationships.append(_rel(image_id, "CONTAINS", ref))
    for i, m in enumerate(inv.models):
        ref = f"SPDXRef-model-{i}"
        packages.append(_package(ref, m.name, None, None, "FILE", sha256=None if m.folder else m.sha256,
                                 source_info=f"{m.path}" + (f", tree sha256 {m.sha256}" if m.folder else "")))
        relationships.append(_rel(image_id, "CONTAINS", ref))
    if inv.base and inv.base.digest:
        from .sbom_collect import split_ref

        repo, tag = split_ref(inv.base.name or "base")
        packages.append(_package("SPDXRef-base", repo, inv.base.digest,
                                 oci_purl(repo, inv.base.digest, tag).to_string(), "CONTAINER",
                                 sha256=inv.base.digest, source_info=inv.base.how))
        relationships.append(_rel(image_id, "DESCENDANT_OF", "SPDXRef-base"))
    doc = {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{img.name}@{img.digest}",
        "documentNamespace": f"https://ngcx.invalid/spdx/{re.sub(r'[^A-Za-z0-9.-]+', '-', img.name)}-{uuid.uuid4()}",
        "creationInfo": {"created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "creators": [f"Tool: ngcx-{__version__}"],
                         "comment": f"made from inside the image in {inv.collect_s:.3f} s"},
        "packages": packages, "relationships": relationships,
    }
    check(doc)
    return doc


def _package(ref: str, name: str, version: str | None, purl: str | None, purpose: str, *, sha256: str | None = None,
             source_info: str | None = None) -> dict[str, Any]:
    package: dict[str, Any] = {"SPDXID": ref, "name": name, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                               "primaryPackagePurpose": purpose}
    if version:
        package["versionInfo"] = version
    hex_value = sha256.split(":", 1)[-1] if sha256 else ""
    if len(hex_value) == 64:
        package["checksums"] = [{"algorithm": "SHA256", "checksumValue": hex_value}]
    if purl:
        package["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                    "referenceLocator": purl}]
    if source_info:
        package["sourceInfo"] = source_info
    return package


def _rel(source: str, kind: str, target: str) -> dict[str, str]:
    return {"spdxElementId": source, "relationshipType": kind, "relatedSpdxElement": target}


def check(doc: dict[str, Any]) -> None:
    """What this module can check of SPDX 2.3 without its tools: a failure is a bug of ours (AssertionError's
    message names it), never a document handed out."""
    missing = [f for f in DOC_FIELDS if not doc.get(f)]
    ids = [p["SPDXID"] for p in doc["packages"]]
    bad = [i for i in ids if not SPDX_ID.match(i)] + [i for i in set(ids) if ids.count(i) > 1]
    for p in doc["packages"]:
        missing += [f"{p.get('SPDXID')}.{f}" for f in PACKAGE_FIELDS if not p.get(f)]
    known = set(ids) | {"SPDXRef-DOCUMENT"}
    dangling = [r for r in doc["relationships"] if {r["spdxElementId"], r["relatedSpdxElement"]} - known]
    if missing or bad or dangling or "#" in doc["documentNamespace"]:
        raise AssertionError(f"SPDX document not valid: missing {missing[:3]}, bad ids {bad[:3]}, "
                             f"dangling relationships {dangling[:2]}")
