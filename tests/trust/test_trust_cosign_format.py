"""What `ngcx push` stores verifies by the formats' own rules, read from their specifications, not by ngcx's verifier.

- cosign, sigstore/cosign specs/SIGNATURE_SPEC.md: the signature of digest sha256:HEX is an OCI image manifest at
  the tag `sha256-HEX.sig`; a layer of mediaType application/vnd.dev.cosign.simplesigning.v1+json whose blob is
  the payload; the payload is Simple Signing JSON whose critical.image.docker-manifest-digest is the image's
  digest and critical.type "cosign container image signature"; the annotation dev.cosignproject.cosign/signature
  is a base64 ECDSA-P256 signature over the payload with SHA-256.
- Attestations (cosign's layout): the tag `sha256-HEX.att`, layers application/vnd.dsse.envelope.v1+json with a
  predicateType annotation; DSSE (secure-systems-lab/dsse protocol.md) signs PAE = "DSSEv1 LEN(type) type
  LEN(body) body"; the payload is an in-toto v1 Statement whose subject digest is the image's.
Only requests (the registry's HTTP API) and cryptography are used here: no ngcx module is imported.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets

import pytest
import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from trust_images import ACCEPT, push, remove_images, tiny_image

pytestmark = pytest.mark.docker


def _get(url: str, accept: str | None = None) -> requests.Response:
    resp = requests.get(url, headers={"Accept": accept} if accept else {}, timeout=10)
    assert resp.status_code == 200, (url, resp.status_code)
    return resp


def test_signature_and_attestation_verify_by_the_specifications(docker_client, registry, isolated_state):
    local = tiny_image(docker_client, f"ngcx-trust/fmt{secrets.token_hex(3)}", "v1")
    try:
        remote, digest = push(local, f"{registry}/ngcx-trust-{secrets.token_hex(4)}")
    finally:
        remove_images(docker_client, local)
    host, _, rest = remote.partition("/")
    repo = rest.rsplit(":", 1)[0]
    base = f"http://{host}/v2/{repo}"
    public = load_pem_public_key((isolated_state["state"] / "signing" / "cosign.pub").read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"

    # the tag resolves to the digest that was signed
    served = requests.head(f"{base}/manifests/{remote.rsplit(':', 1)[1]}", headers={"Accept": ACCEPT}, timeout=10)
    assert served.headers["Docker-Content-Digest"] == digest

    sig_tag = "sha256-" + digest.removeprefix("sha256:") + ".sig"
    manifest = _get(f"{base}/manifests/{sig_tag}", "application/vnd.oci.image.manifest.v1+json").json()
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    layers = [d for d in manifest["layers"] if d["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"]
    assert len(layers) == 1
    layer = layers[0]
    payload = _get(f"{base}/blobs/{layer['digest']}").content
    assert "sha256:" + hashlib.sha256(payload).hexdigest() == layer["digest"] and len(payload) == layer["size"]
    simple = json.loads(payload)
    assert simple["critical"]["type"] == "cosign container image signature"
    assert simple["critical"]["image"]["docker-manifest-digest"] == digest
    assert simple["critical"]["identity"]["docker-reference"] == f"{host}/{repo}"
    signature = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"], validate=True)
    public.verify(signature, payload, ec.ECDSA(hashes.SHA256()))  # raises InvalidSignature if it does not verify

    att_tag = "sha256-" + digest.removeprefix("sha256:") + ".att"
    att = _get(f"{base}/manifests/{att_tag}", "application/vnd.oci.image.manifest.v1+json").json()
    kinds = {}
    for descriptor in att["layers"]:
        assert descriptor["mediaType"] == "application/vnd.dsse.envelope.v1+json"
        envelope = json.loads(_get(f"{base}/blobs/{descriptor['digest']}").content)
        assert envelope["payloadType"] == "application/vnd.in-toto+json"
        body = base64.b64decode(envelope["payload"])
        pae = b"DSSEv1 %d %s %d %s" % (len(envelope["payloadType"]), envelope["payloadType"].encode(), len(body), body)
        public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), pae, ec.ECDSA(hashes.SHA256()))
        statement = json.loads(body)
        assert statement["_type"] == "https://in-toto.io/Statement/v1"
        assert statement["predicateType"] == descriptor["annotations"]["predicateType"]
        assert {"sha256": digest.removeprefix("sha256:")} in [s["digest"] for s in statement["subject"]]
        kinds[statement["predicateType"]] = statement["predicate"]
    provenance = kinds["https://slsa.dev/provenance/v1"]
    assert provenance["runDetails"]["builder"]["id"]
    assert provenance["buildDefinition"]["buildType"].startswith("https://")
