"""Signed attestations about an image: in-toto v1 Statements in DSSE envelopes, stored where cosign keeps them.

Formats, each from its own specification:
- in-toto Statement v1 (in-toto/attestation spec/v1/statement.md): `_type` https://in-toto.io/Statement/v1,
  `subject` [{name, digest: {sha256: HEX}}], `predicateType`, `predicate`.
- DSSE (secure-systems-lab/dsse envelope.md, protocol.md): the envelope {payloadType, payload (base64),
  signatures [{keyid, sig (base64)}]}; the signature covers PAE(payloadType, payload) =
  "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body (lengths in ASCII decimal), never the JSON around it.
  payloadType application/vnd.in-toto+json.
- Where: cosign's attestation tag `sha256-HEX.att` in the image's repository (what `cosign verify-attestation`
  reads), an OCI image manifest with one layer per envelope, mediaType application/vnd.dsse.envelope.v1+json,
  annotated `predicateType` (and an empty `dev.cosignproject.cosign/signature`, as cosign writes it: the
  signature is inside the envelope). A new attestation replaces one of the same predicateType, as
  `cosign attest --replace` does, so re-signing does not pile up stale provenance.
- Predicates: SLSA Provenance v1 (https://slsa.dev/provenance/v1: buildDefinition {buildType,
  externalParameters, internalParameters, resolvedDependencies}, runDetails {builder {id, version}, metadata
  {invocationId, startedOn, finishedOn}}); CycloneDX (https://cyclonedx.org/bom: the BOM document itself).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .keys import Signer
from .ociref import Repo, artifact_manifest, att_tag, layer
from .sign import SIGNATURE_ANNOTATION

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
INTOTO_PAYLOAD = "application/vnd.in-toto+json"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"
BUILD_TYPE = "https://ngcx.dev/buildtypes/image/v1"
BUILDER_ID = "https://ngcx.dev/builder/ngcx"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's Pre-Authentication Encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def statement(subject_name: str, digest: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    """An in-toto v1 Statement about the image `subject_name`@`digest`."""
    algorithm, _, hex_digest = digest.partition(":")
    return {"_type": STATEMENT_TYPE, "subject": [{"name": subject_name, "digest": {algorithm: hex_digest}}],
            "predicateType": predicate_type, "predicate": predicate}


def envelope(stmt: dict[str, Any], signer: Signer) -> bytes:
    """The DSSE envelope (JSON bytes) carrying `stmt`, signed by `signer` over PAE."""
    body = json.dumps(stmt, separators=(",", ":"), sort_keys=True).encode()
    sig = signer.sign(pae(INTOTO_PAYLOAD, body))
    doc = {"payloadType": INTOTO_PAYLOAD, "payload": base64.b64encode(body).decode(),
           "signatures": [{"keyid": "", "sig": base64.b64encode(sig).decode()}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def provenance(inputs: dict[str, Any], dependencies: list[dict[str, Any]], *, started: str | None,
               finished: str | None, invocation: str, version: str) -> dict[str, Any]:
    """The SLSA Provenance v1 predicate: what was built from what, by which ngcx, when.

    inputs: the external parameters (image, release, variant, recipe and catalog sha256 ... as known);
    dependencies: ResourceDescriptors ({uri, digest: {sha256: HEX}, name?}) for the base and the wheels;
    started / finished: RFC 3339 UTC times of the build (None when unknown: the field is left out).
    """
    metadata: dict[str, Any] = {"invocationId": invocation}
    if started:
        metadata["startedOn"] = started
    if finished:
        metadata["finishedOn"] = finished
    return {"buildDefinition": {"buildType": BUILD_TYPE, "externalParameters": inputs, "internalParameters": {},
                                "resolvedDependencies": dependencies},
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"ngcx": version}}, "metadata": metadata}}


def attach(repo: Repo, digest: str, envelopes: list[tuple[bytes, str]]) -> str:
    """Store (envelope bytes, predicateType) pairs at `digest`'s .att tag; returns the manifest's digest.

    Layers of other predicate types already there stay; one of the same type is replaced.
    """
    replaced = {kind for _env, kind in envelopes}
    manifest = repo.manifest_json(att_tag(digest)) or {}
    kept = [old for old in manifest.get("layers") or []
            if old.get("mediaType") == DSSE_LAYER and (old.get("annotations") or {}).get("predicateType")
            not in replaced]
    new = [layer(repo, env, DSSE_LAYER, {SIGNATURE_ANNOTATION: "", "predicateType": kind}) for env, kind in envelopes]
    return repo.put_manifest(att_tag(digest), artifact_manifest(repo, [*kept, *new]))
