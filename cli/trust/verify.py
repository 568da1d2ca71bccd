"""Is the image a tag serves now the one that was signed? Signature and attestations checked against its digest.

The checks are cosign's (`cosign verify --key`, `cosign verify-attestation --key`; sigstore/cosign
specs/SIGNATURE_SPEC.md), done here so that every deploy can make them (issue 48, item 4):
1. the tag is resolved to a digest at the registry (what a pull would get now);
2. the signature manifest at `sha256-HEX.sig`: some simple-signing layer whose payload bytes hash to the layer's
   digest, whose base64 ECDSA P-256 signature verifies with the key over SHA-256(payload), and whose
   critical.image.docker-manifest-digest is that digest;
3. the attestations at `sha256-HEX.att`: every DSSE envelope's signature verifies over PAE (attest.py), and each
   statement's subject digest is that digest; the required predicate types (SLSA provenance) are present.
Every failure is one line naming what failed. Fast on purpose (a deploy runs it before anything starts; target
0.3 s on loopback): requests and cryptography's ECDSA are the only heavy imports, credentials are read only when
the registry asks for them (ociref.Repo).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import UserError
from ..registry.credentials import Credentials
from .attest import CYCLONEDX, DSSE_LAYER, INTOTO_PAYLOAD, SLSA_PROVENANCE, pae
from .keys import fingerprint, public_key_for
from .ociref import ImageRef, Repo, att_tag, parse_ref, sig_tag
from .sign import COSIGN_TYPE, SIGNATURE_ANNOTATION, SIMPLESIGNING

SHORT_NAMES = {SLSA_PROVENANCE: "SLSA provenance", CYCLONEDX: "CycloneDX SBOM"}


@dataclass(frozen=True)
class Verdict:
    """What `verify` found. ok: signature and required attestations verified for `digest` with `key`."""

    ref: str
    ok: bool
    digest: str | None = None                 # what the tag resolves to at the registry now
    key: str = ""                             # fingerprint (sha256:HEX of the public key) checked against
    failure: str | None = None                # one line naming what failed
    attestations: tuple[str, ...] = ()        # predicate types whose envelopes verified
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        if self.ok:
            kinds = ", ".join(SHORT_NAMES.get(a, a) for a in self.attestations)
            return (f"{self.ref}@{self.digest}: signed by key {self.key[:19]}…"
                    + (f"; attestations: {kinds}" if kinds else ""))
        return f"{self.ref}: {self.failure}"

    def as_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "ok": self.ok, "digest": self.digest, "key": self.key, "failure": self.failure,
                "attestations": list(self.attestations), "seconds": round(self.seconds, 4)}


class Refused(UserError):
    """An image that failed verification: one line, exit 1 from `ngcx verify`, refused by a deploy."""

    exit_code = 1


def verify(ref: str, key: str | None = None, *, require: tuple[str, ...] = (SLSA_PROVENANCE,),
           public_pem: bytes | None = None, creds: Credentials | None = None) -> Verdict:
    """Check `ref` (HOST/REPO[:TAG|@DIGEST]) against `key` (a PEM path or awskms://; None: ngcx's own public key,
    or `public_pem` given directly). `creds`: registry credentials when the caller has them (an ECR/ACR token);
    else stored ones are read if the registry asks. `require`: predicate types that must be attested (every
    attestation present is checked either way). A malformed ref or an unreadable key is a UserError; a failed
    check is a Verdict with ok=False."""
    started = time.perf_counter()
    parsed = parse_ref(ref)
    pem = public_pem if public_pem is not None else public_key_for(key)
    public = _load_public(pem)
    repo = Repo.of(parsed, creds)
    verdict = _check(parsed, repo, public, fingerprint(pem), require)
    return replace(verdict, seconds=time.perf_counter() - started)


def require_verified(ref: str, key: str | None = None, **kwargs: Any) -> Verdict:
    """verify(), raising Refused (one line) unless it passed: what a deploy calls before starting anything."""
    verdict = verify(ref, key, **kwargs)
    if not verdict.ok:
        raise Refused(f"image refused: {verdict.line()}",
                      hint="sign it (ngcx push signs by default), pass the signer's --key, or --allow-unsigned")
    return verdict


def _check(ref: ImageRef, repo: Repo, public: Any, key: str, require: tuple[str, ...]) -> Verdict:
    shown = str(ref)
    digest = repo.resolve(ref)
    if digest is None:
        return Verdict(shown, False, key=key, failure=f"not found in the registry ({ref.name} has no "
                                                      f"{ref.digest or ref.tag})")
    failure = _check_signature(repo, digest, public, key)
    if failure:
        return Verdict(shown, False, digest, key, failure)
    kinds, failure = _check_attestations(repo, digest, public, key, require)
    if failure:
        return Verdict(shown, False, digest, key, failure, kinds)
    return Verdict(shown, True, digest, key, None, kinds)


def _check_signature(repo: Repo, digest: str, public: Any, key: str) -> str | None:
    """None when some signature layer verifies with `public` and names `digest`; else the failure line."""
    manifest = repo.manifest_json(sig_tag(digest))
    layers = [d for d in (manifest or {}).get("layers") or [] if d.get("mediaType") == SIMPLESIGNING]
    if not layers:
        return (f"no signature for {digest} (nothing at tag {sig_tag(digest)}: unsigned, or another image was "
                "pushed under this tag after signing)")
    signed_other: str | None = None
    edited = False
    for descriptor in layers:
        payload = repo.blob(descriptor.get("digest", ""))
        sig = _b64((descriptor.get("annotations") or {}).get(SIGNATURE_ANNOTATION, ""))
        if payload is None:
            edited = True
            continue
        if sig is None or not _ecdsa_ok(public, sig, payload):
            continue
        claimed = _signed_digest(payload)
        if claimed == digest:
            return None
        signed_other = claimed or "an unreadable payload"
    if signed_other:
        return f"signed digest differs: the signature is for {signed_other}, the registry serves {digest}"
    if edited:
        return f"signature payload edited or missing at {sig_tag(digest)} (its bytes do not match their digest)"
    return f"signature does not match key {key[:19]}… (signed by another key, or the signature was replaced)"


def _check_attestations(repo: Repo, digest: str, public: Any, key: str,
                        require: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """(predicate types verified, None) or (…, the failure line).

    Every envelope of a type ngcx attests (SLSA provenance, CycloneDX) must verify with the key and name `digest`:
    an edited or added one is a failure, not skipped. Envelopes of other types that another party signed with its
    own key (a scanner's) are left alone, as `cosign verify-attestation` leaves what it cannot verify."""
    manifest = repo.manifest_json(att_tag(digest))
    layers = [d for d in (manifest or {}).get("layers") or [] if d.get("mediaType") == DSSE_LAYER]
    verified: list[str] = []
    for descriptor in layers:
        kind = (descriptor.get("annotations") or {}).get("predicateType", "?")
        raw = repo.blob(descriptor.get("digest", ""))
        stmt = _open_envelope(raw, public) if raw is not None else None
        if stmt is None and kind not in SHORT_NAMES and kind not in require:
            continue
        if raw is None:
            return tuple(verified), f"attestation edited: {kind} (its bytes do not match their digest)"
        if stmt is None:
            return tuple(verified), (f"attestation edited: {kind} does not verify with key {key[:19]}… "
                                     "(changed after signing, or signed by another key)")
        subjects = [s.get("digest", {}).get("sha256") for s in stmt.get("subject") or []]
        if digest.removeprefix("sha256:") not in subjects:
            return tuple(verified), f"attestation {kind} is about another image, not {digest}"
        if stmt.get("predicateType") != kind:
            return tuple(verified), f"attestation edited: annotated {kind}, signed as {stmt.get('predicateType')}"
        verified.append(kind)
    missing = [kind for kind in require if kind not in verified]
    if missing:
        return tuple(verified), (f"no {', '.join(missing)} attestation for {digest} (nothing at tag "
                                 f"{att_tag(digest)}, or none of that type)")
    return tuple(verified), None


def _open_envelope(raw: bytes, public: Any) -> dict[str, Any] | None:
    """The statement inside a DSSE envelope when one of its signatures verifies over PAE; else None."""
    try:
        env = json.loads(raw)
        body = base64.b64decode(env["payload"], validate=True)
        if env.get("payloadType") != INTOTO_PAYLOAD:
            return None
        signed = pae(env["payloadType"], body)
        if not any(_ecdsa_ok(public, _b64(s.get("sig", "")) or b"", signed) for s in env.get("signatures") or []):
            return None
        stmt = json.loads(body)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None
    return stmt if isinstance(stmt, dict) else None


def _signed_digest(payload: bytes) -> str | None:
    """critical.image.docker-manifest-digest of a cosign simple-signing payload (None when not one)."""
    try:
        critical = json.loads(payload)["critical"]
        if critical.get("type") != COSIGN_TYPE:
            return None
        return critical["image"]["docker-manifest-digest"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True) or None
    except (binascii.Error, ValueError, TypeError):
        return None


def _ecdsa_ok(public: Any, sig: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        public.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


def _load_public(pem: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        public = load_pem_public_key(pem)
    except ValueError:
        raise UserError("the verification key is not a PEM public key", hint="pass --key cosign.pub") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise UserError("the verification key is not ECDSA P-256 (cosign's scheme)", hint="pass --key cosign.pub")
    return public
