"""Sign a pushed image's digest the way cosign does, so `cosign verify --key cosign.pub` accepts it.

The format (sigstore/cosign specs/SIGNATURE_SPEC.md):
- Payload: "Simple Signing" JSON (containers/image docs/containers-signature.5.md) with
  critical.identity.docker-reference, critical.image.docker-manifest-digest and critical.type =
  "cosign container image signature"; optional claims in `optional`. The signature covers these exact bytes, so
  they are uploaded as they were signed, never re-serialised.
- Signature: ECDSA P-256 over SHA-256 of the payload, ASN.1 DER, base64 in the layer annotation
  `dev.cosignproject.cosign/signature` (keys.py).
- Storage: an OCI image manifest at the tag `sha256-HEX.sig` in the image's repository; one layer per signature
  (mediaType application/vnd.dev.cosign.simplesigning.v1+json), the payload as the layer's blob. "Multiple
  signatures can be embedded in one image manifest": a new signature is appended, an identical one is not added
  twice. The local registry (distribution 2.8) has no OCI 1.1 referrers API, so the tag schema is the one used.
Note: cosign 2.x also wants a transparency-log entry unless told `--insecure-ignore-tlog=true`; ngcx signs
offline (no Rekor is reachable from here), as `cosign sign --tlog-upload=false` does.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from .keys import Signer, fingerprint
from .ociref import Repo, artifact_manifest, layer, sig_tag

SIMPLESIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
COSIGN_TYPE = "cosign container image signature"


@dataclass(frozen=True)
class Signed:
    digest: str             # the image's manifest digest that was signed
    tag: str                # where the signature lives: sha256-HEX.sig
    signature_manifest: str  # that manifest's digest
    key: str                # fingerprint of the public key (keys.fingerprint)


def payload(docker_reference: str, digest: str, optional: dict[str, Any] | None = None) -> bytes:
    """The simple-signing payload bytes for `digest` (compact JSON, as cosign writes it)."""
    body = {"critical": {"identity": {"docker-reference": docker_reference},
                         "image": {"docker-manifest-digest": digest},
                         "type": COSIGN_TYPE},
            "optional": optional or None}
    return json.dumps(body, separators=(",", ":")).encode()


def sign_image(repo: Repo, digest: str, signer: Signer, optional: dict[str, Any] | None = None) -> Signed:
    """Sign `digest` in `repo` and store the signature at its .sig tag (appended to any signatures already there)."""
    data = payload(f"{repo.host}/{repo.repository}", digest, optional)
    signature = base64.b64encode(signer.sign(data)).decode()
    new = layer(repo, data, SIMPLESIGNING, {SIGNATURE_ANNOTATION: signature})
    layers = [old for old in _existing_layers(repo, sig_tag(digest))
              if old.get("mediaType") == SIMPLESIGNING
              and (old.get("digest"), old.get("annotations")) != (new["digest"], new["annotations"])]
    body = artifact_manifest(repo, [*layers, new])
    stored = repo.put_manifest(sig_tag(digest), body)
    return Signed(digest, sig_tag(digest), stored, fingerprint(signer.public_pem()))


def _existing_layers(repo: Repo, tag: str) -> list[dict[str, Any]]:
    """The layers of the manifest at `tag` now (none when there is none)."""
    manifest = repo.manifest_json(tag)
    return list((manifest or {}).get("layers") or [])
