"""The signed push the `--cloud kubernetes` tests deploy: a one-blob image in the real loopback registry, signed
and attested (SLSA provenance, an SBOM) by ngcx's own publish code with the key of a state folder of its own.

Why a real signed push: `deploy --cloud kubernetes` passes the trust gate before it writes a manifest
(deploy/gate.py through DeployConfig.pick_push: the digest's signature and provenance must verify with the key),
and the admission policy it writes carries that same key, so a test can check that the key in the policy is the
one that verifies what the registry holds. The image is made with the distribution API (ngcx's trust/ociref.py,
no engine or pull): a signature covers a manifest digest, whatever the image holds; random content makes every
session's digest new, so runs never see each other's signatures.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "ngcx-k8s-tests"
SIGNING = "signing"     # the key's folder in a state folder (trust/keys.py default_key_path)


@dataclass(frozen=True)
class SignedPush:
    repository: str     # REGISTRY/REPO
    digest: str
    state: Path         # the state folder whose signing/ holds the key that signed it

    def share_key(self, state: Path) -> None:
        """Give another state folder the same signing key (as one machine keeps one key across deploys)."""
        shutil.copytree(self.state / SIGNING, state / SIGNING, dirs_exist_ok=True)


def loopback_registry() -> str:
    """The loopback registry scripts/setup.sh starts, asked over HTTP (no engine needed: nothing here runs an image);
    skipped without it, failed under CI=true (support.missing)."""
    from support import LOOPBACK_REGISTRY, _v2_status, missing

    if _v2_status(LOOPBACK_REGISTRY) != 200:
        missing(f"no registry answering http://{LOOPBACK_REGISTRY}/v2/ (scripts/setup.sh starts it)")
    return LOOPBACK_REGISTRY


def signed_push(registry: str, state: Path) -> SignedPush:
    """Push a fresh one-blob image to `registry` and sign and attest it with `state`'s key (made here)."""
    from ngcx.trust.keys import ensure_default_key
    from ngcx.trust.ociref import OCI_MANIFEST, Repo, artifact_manifest, layer, parse_ref
    from ngcx.trust.publish import sign_and_attest

    old = os.environ.get("NGCX_STATE_DIR")
    os.environ["NGCX_STATE_DIR"] = str(state)
    try:
        ensure_default_key()
        ref = parse_ref(f"{registry}/{NAMESPACE}/resnet:k8s-{secrets.token_hex(4)}")
        repo = Repo.of(ref)
        blob = layer(repo, f"ngcx kubernetes test {secrets.token_hex(16)}\n".encode(),
                     "application/vnd.oci.image.layer.v1.tar", {})
        digest = repo.put_manifest(ref.tag or "", artifact_manifest(repo, [blob]), OCI_MANIFEST)
        bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}
        sign_and_attest(str(ref), digest, sbom=bom)
    finally:
        if old is None:
            os.environ.pop("NGCX_STATE_DIR", None)
        else:
            os.environ["NGCX_STATE_DIR"] = old
    return SignedPush(repository=ref.name, digest=digest, state=state)
