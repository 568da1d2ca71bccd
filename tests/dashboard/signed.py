"""Signed pushes for the dashboard's trust panel: one-blob images in the real loopback registry, signed and
attested by ngcx's own publish code with the key of the test's state folder, recorded as `ngcx push` records them.

Why no engine build and no `ngcx push`: a signature covers a manifest digest whatever the image holds, and
`ngcx push` of an image without Python attaches no SBOM (trust/publish.py _make_sbom); here the SBOM is given, so
the page has Debian, Python and CUDA components to count. The image page reads the build row (no local image is
needed: images.py image_detail) and the pushes of its tag. Random content makes every digest new.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass

SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"
BOM = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": [
    {"type": "library", "name": "libc6", "version": "2.36-9+deb12u7",
     "purl": "pkg:deb/debian/libc6@2.36-9%2Bdeb12u7?arch=amd64&distro=debian-12"},
    {"type": "library", "name": "zlib1g", "version": "1:1.2.13.dfsg-1",
     "purl": "pkg:deb/debian/zlib1g@1%3A1.2.13.dfsg-1?arch=amd64&distro=debian-12"},
    {"type": "library", "name": "numpy", "version": "2.1.3", "purl": "pkg:pypi/numpy@2.1.3"},
    {"type": "library", "name": "libcublas.so.12", "group": "nvidia", "version": "12.4.5.8",
     "purl": "pkg:generic/nvidia/cublas@12.4.5.8",
     "properties": [{"name": "ngcx:package-type", "value": "cuda-library"}]},
]}


@dataclass(frozen=True)
class Signed:
    tag: str            # the local tag the page is about
    remote_ref: str     # REGISTRY/REPO:TAG
    digest: str
    push_id: int


def signed_push(registry: str, name: str) -> Signed:
    """A fresh image pushed to `registry`, signed with the state folder's key (NGCX_STATE_DIR, made here), its
    provenance and BOM attested, and the build and push rows the page reads."""
    from ngcx.state import db as state
    from ngcx.trust.keys import ensure_default_key
    from ngcx.trust.ociref import OCI_MANIFEST, Repo, artifact_manifest, layer, parse_ref
    from ngcx.trust.publish import sign_and_attest

    ensure_default_key()
    suffix = secrets.token_hex(4)
    ref = parse_ref(f"{registry}/ngcx-dash-trust/{name}:v-{suffix}")
    repo = Repo.of(ref)
    blob = layer(repo, f"ngcx dashboard trust test {secrets.token_hex(16)}\n".encode(),
                 "application/vnd.oci.image.layer.v1.tar", {})
    digest = repo.put_manifest(ref.tag or "", artifact_manifest(repo, [blob]), OCI_MANIFEST)
    sign_and_attest(str(ref), digest, sbom=BOM, started=time.time() - 12.0, finished=time.time())
    tag = f"ngcx-dash-trust/{name}:v-{suffix}"
    state.record_build(image="cuda", release="24.05", variant="runtime", tag=tag, image_id="sha256:" + "0" * 64,
                       duration_s=12.0, base="nvidia/cuda:12.4.1-base-ubuntu22.04")
    push_id = state.record_push(tag=tag, remote_ref=str(ref), digest=digest)
    return Signed(tag, str(ref), digest, push_id)


def recorded_push(tag: str, remote_ref: str) -> Signed:
    """A push row (with its build row) for a registry the test controls, e.g. one that never answers."""
    from ngcx.state import db as state

    digest = "sha256:" + secrets.token_hex(32)
    state.record_build(image="cuda", release="24.05", variant="runtime", tag=tag, image_id="sha256:" + "1" * 64)
    return Signed(tag, remote_ref, digest, state.record_push(tag=tag, remote_ref=remote_ref, digest=digest))


def edit_attestation(signed: Signed, kind: str) -> None:
    """The `kind` statement edited (a field added to its predicate), its signature kept, written back through
    the registry's API as anyone with push access could."""
    from ngcx.trust.ociref import OCI_MANIFEST, Repo, att_tag, parse_ref

    repo = Repo.of(parse_ref(signed.remote_ref))
    manifest = repo.manifest_json(att_tag(signed.digest))
    assert manifest, "the push carries no attestations"
    descriptor = next(d for d in manifest["layers"] if d["annotations"].get("predicateType") == kind)
    envelope = json.loads(repo.blob(descriptor["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["tampered"] = "https://evil.example/"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    edited = json.dumps(envelope).encode()
    descriptor["digest"], descriptor["size"] = repo.put_blob(edited), len(edited)
    repo.put_manifest(att_tag(signed.digest), json.dumps(manifest).encode(), OCI_MANIFEST)
