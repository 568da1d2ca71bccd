"""A model's OpenSSF Model Signing (OMS) signature, checked before `serve` loads it (issue 48, item 5).

What is checked: the key-based form the PyPI `model-signing` library writes (`model_signing.signing.Config()
.use_elliptic_key_signer(...)`, what `ngcx build` signs a project's model with: cli/project/modelsign.py): a
Sigstore bundle v0.3 JSON whose DSSE envelope carries an in-toto Statement v1 with predicate type
https://model_signing/signature/v1.0, listing every file of the model with its sha256 ("." for a one-file
model), signed by ECDSA P-256 over SHA-256 of the DSSE pre-authentication encoding (PAE). The bundle's
verificationMaterial.publicKey.hint is the sha256 of the key's PEM, as the library checks it.

Why pure Python and not `cryptography` or `model-signing`: the runtime runs inside every image and its
dependencies are pinned and hashed there (recipes/runtime.j2, registry.lock.yaml: grpcio, numpy, orjson,
protobuf); neither is among them. ECDSA verification on P-256 is a few dozen lines of integer arithmetic
(SEC 1 v2 §4.1.4; the curve's constants are FIPS 186-4 D.1.2.3's), and tests/runtime/test_model_signature.py
checks this verifier against the `model-signing` library's own, on signed and tampered models alike.

Where the files are: MODEL.sig beside the model (a file or a folder) and MODEL.pub, its public key, beside it;
`ngcx build` puts both there in their own layer. --model-key PEM (a key from outside the image) makes the
signature mandatory and is the key it must verify with.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import RuntimeUserError

SIG_SUFFIX, KEY_SUFFIX = ".sig", ".pub"
BUNDLE_MEDIA_TYPES = ("application/vnd.dev.sigstore.bundle.v0.3+json", "application/vnd.dev.sigstore.bundle+json;"
                      "version=0.3")
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
HOW = "rebuild the image with `ngcx build` (it signs the model), or restore the signed model"

# NIST P-256 (FIPS 186-4 D.1.2.3)
P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
A = P - 3
B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
G = (0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
     0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5)
# DER SubjectPublicKeyInfo of an uncompressed P-256 key, up to the point: SEQUENCE { SEQUENCE { id-ecPublicKey,
# prime256v1 }, BIT STRING 00 04 X Y } (RFC 5480 §2); what `cryptography` writes for PEM SubjectPublicKeyInfo
SPKI_P256 = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")


@dataclass(frozen=True)
class Verified:
    """What a valid signature said: the files it covers and the key that signed (sha256 of its PEM)."""

    files: dict[str, str]        # name ("." for a one-file model) -> sha256 hex
    ignored: tuple[str, ...]     # paths under a folder model the signer left out (serialization.ignore_paths)
    key_sha256: str


# ------------------------------------------------------------------------------------------------ paths


def signature_path(model: Path) -> Path:
    """MODEL.sig beside the model file or folder (outside a folder, so it is not one of its files)."""
    return model.parent / (model.name + SIG_SUFFIX)


def key_path(model: Path) -> Path:
    return model.parent / (model.name + KEY_SUFFIX)


def check_model(model: Path, key: Path | None = None, signature: Path | None = None) -> Verified | None:
    """Verify MODEL against its signature before anything loads it; None when there is nothing to check (no
    signature and no --model-key). Any failure is one RuntimeUserError line naming the file and the fix."""
    sig = signature or signature_path(model)
    if not sig.is_file():
        if key is not None or signature is not None:
            raise RuntimeUserError(f"model {model} has no signature at {sig}, and --model-key {key} requires one; "
                                   f"{HOW}")
        return None
    if key is not None and not key.is_file():
        raise RuntimeUserError(f"--model-key {key}: no such file; give the signer's PEM public key "
                               "(ngcx's: STATE/signing/cosign.pub)")
    key = key or key_path(model)
    if not key.is_file():
        raise RuntimeUserError(f"model {model} is signed ({sig}) but its public key {key} is missing; pass "
                               "--model-key PEM (ngcx's: STATE/signing/cosign.pub)")
    verified = verify_bundle(_read(sig, "signature"), _read(key, "public key"), str(sig))
    _check_files(model, verified, sig)
    return verified


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RuntimeUserError(f"cannot read the model's {what} {path}: {exc.strerror}") from None


# ------------------------------------------------------------------------------------------------ the bundle


def verify_bundle(bundle_bytes: bytes, public_pem: bytes, where: str = "the signature") -> Verified:
    """The bundle's signature checked with the key; returns the files and digests it vouches for."""
    try:
        bundle = json.loads(bundle_bytes)
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        sig = base64.b64decode(envelope["signatures"][0]["sig"], validate=True)
        payload_type = envelope["payloadType"]
        media = bundle.get("mediaType")
        hint = ((bundle.get("verificationMaterial") or {}).get("publicKey") or {}).get("hint")
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error):
        raise RuntimeUserError(f"{where} is not an OpenSSF Model Signing bundle (Sigstore bundle JSON with a DSSE "
                               f"envelope); {HOW}") from None
    if media not in BUNDLE_MEDIA_TYPES or payload_type != PAYLOAD_TYPE:
        raise RuntimeUserError(f"{where}: bundle {media!r} with payload {payload_type!r}, not a Sigstore bundle v0.3 "
                               f"over {PAYLOAD_TYPE}; {HOW}")
    point = public_point(public_pem)
    key_sha = hashlib.sha256(canonical_pem(public_pem)).hexdigest()
    if hint and hint != key_sha:
        raise RuntimeUserError(f"{where} was made by another key (sha256 {hint[:16]}…), not this public key "
                               f"(sha256 {key_sha[:16]}…); pass the signer's key with --model-key, or {HOW}")
    if not ecdsa_verify(point, pae(payload_type, payload), sig):
        raise RuntimeUserError(f"{where}: the ECDSA signature does not verify with public key sha256 "
                               f"{key_sha[:16]}…: the signature or its statement was changed; {HOW}")
    files, ignored = _statement_files(payload, where)
    return Verified(files, ignored, key_sha)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (secure-systems-lab/dsse protocol.md): what is signed."""
    return b"DSSEv1 %d %s %d " % (len(payload_type), payload_type.encode(), len(payload)) + payload


def _statement_files(payload: bytes, where: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """name -> sha256 from the statement's resources; the subject's digest must be their chain, as the library's
    verifier requires (sha256 over the resource digests, in order)."""
    try:
        statement: Any = json.loads(payload)
        ok_types = statement["_type"] == STATEMENT_TYPE and statement["predicateType"] == PREDICATE_TYPE
        serialization = statement["predicate"]["serialization"]
        resources = statement["predicate"]["resources"]
        [subject] = statement["subject"]
        root = subject["digest"]["sha256"]
        files = {str(r["name"]): str(r["digest"]) for r in resources if r["algorithm"] == "sha256"}
        chain = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
        ignored = tuple(str(p) for p in serialization.get("ignore_paths") or ())
    except (ValueError, KeyError, TypeError):
        raise RuntimeUserError(f"{where}: its in-toto statement is not a model_signing v1.0 manifest; {HOW}") from None
    if not ok_types:
        raise RuntimeUserError(f"{where}: statement {statement.get('predicateType')!r} is not {PREDICATE_TYPE}; {HOW}")
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256" \
            or len(files) != len(resources):
        raise RuntimeUserError(f"{where}: serialization {serialization.get('method')}/{serialization.get('hash_type')}"
                               f" is not files/sha256, the one ngcx-runtime checks; {HOW}")
    if chain != root:
        raise RuntimeUserError(f"{where}: its resources hash to {chain}, not the subject's {root}; {HOW}")
    return files, ignored


# ------------------------------------------------------------------------------------------------ the model's bytes


def _check_files(model: Path, verified: Verified, sig: Path) -> None:
    """Every file the signature lists has its bytes, and no file was added (model_signing's own rule)."""
    files = verified.files
    actual = _model_files(model, [Path(p) for p in verified.ignored])
    for name in sorted(set(files) | set(actual)):
        shown = model if name == "." else model / name
        if name not in actual:
            raise RuntimeUserError(f"model file {shown} is missing: its signature {sig} lists it; {HOW}")
        if name not in files:
            raise RuntimeUserError(f"model file {shown} is not in its signature {sig} (added after signing); {HOW}")
        digest = _sha256(actual[name])
        if digest != files[name]:
            raise RuntimeUserError(f"model file {shown} changed after signing: sha256 {digest}, its signature {sig} "
                                   f"expects {files[name]}; {HOW}")


def _model_files(model: Path, ignore: list[Path]) -> dict[str, Path]:
    """name -> path as model_signing names them: "." for a one-file model, else POSIX paths under the folder."""
    if model.is_symlink() or not model.exists():
        raise RuntimeUserError(f"model {model} is a symbolic link or missing; a signed model must be real files")
    if model.is_file():
        return {".": model}
    out: dict[str, Path] = {}
    for path in sorted(model.rglob("*")):
        rel = path.relative_to(model)
        if any(rel == i or i in rel.parents for i in ignore):
            continue
        if path.is_symlink():
            raise RuntimeUserError(f"model file {path} is a symbolic link; a signed model must be real files")
        if path.is_file():
            out[rel.as_posix()] = path
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ ECDSA P-256


def canonical_pem(public_pem: bytes) -> bytes:
    """The PEM as `cryptography` writes it (64-column base64): the form whose sha256 is the bundle's key hint."""
    der = _pem_der(public_pem)
    text = base64.b64encode(der).decode()
    body = "\n".join(text[i:i + 64] for i in range(0, len(text), 64))
    return f"-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n".encode()


def _pem_der(public_pem: bytes) -> bytes:
    lines = public_pem.strip().splitlines()
    if len(lines) < 3 or (lines[0].strip(), lines[-1].strip()) != (b"-----BEGIN PUBLIC KEY-----",
                                                                   b"-----END PUBLIC KEY-----"):
        raise RuntimeUserError("the model's public key is not a PEM PUBLIC KEY (ngcx's: STATE/signing/cosign.pub)")
    try:
        return base64.b64decode(b"".join(line.strip() for line in lines[1:-1]), validate=True)
    except binascii.Error:
        raise RuntimeUserError("the model's public key is not valid PEM base64") from None


def public_point(public_pem: bytes) -> tuple[int, int]:
    """(x, y) of an uncompressed EC P-256 SubjectPublicKeyInfo, checked to lie on the curve."""
    der = _pem_der(public_pem)
    if len(der) != len(SPKI_P256) + 65 or not der.startswith(SPKI_P256) or der[len(SPKI_P256)] != 4:
        raise RuntimeUserError("the model's public key is not an EC P-256 key (model-signing's key-based signatures "
                               "here are ECDSA P-256, ngcx's signing key)")
    x = int.from_bytes(der[-64:-32], "big")
    y = int.from_bytes(der[-32:], "big")
    if not (x < P and y < P and (y * y - x * x * x - A * x - B) % P == 0):
        raise RuntimeUserError("the model's public key is not a point of P-256")
    return x, y


def _der_signature(sig: bytes) -> tuple[int, int] | None:
    """(r, s) from a DER ECDSA-Sig-Value (SEQUENCE of two INTEGERs); None when malformed."""
    if len(sig) < 8 or sig[0] != 0x30 or sig[1] != len(sig) - 2:
        return None
    values, at = [], 2
    for _ in range(2):
        if at + 2 > len(sig) or sig[at] != 0x02:
            return None
        size = sig[at + 1]
        if size == 0 or at + 2 + size > len(sig):
            return None
        values.append(int.from_bytes(sig[at + 2:at + 2 + size], "big"))
        at += 2 + size
    return (values[0], values[1]) if at == len(sig) else None


def _add(p: tuple[int, int, int], q: tuple[int, int, int]) -> tuple[int, int, int]:
    """Jacobian point addition on P-256 (Z=0: the point at infinity); doubling when p == q."""
    x1, y1, z1 = p
    x2, y2, z2 = q
    if z1 == 0:
        return q
    if z2 == 0:
        return p
    z1z1, z2z2 = z1 * z1 % P, z2 * z2 % P
    u1, u2 = x1 * z2z2 % P, x2 * z1z1 % P
    s1, s2 = y1 * z2 * z2z2 % P, y2 * z1 * z1z1 % P
    if u1 == u2:
        return _double(p) if s1 == s2 else (1, 1, 0)
    h, r = (u2 - u1) % P, (s2 - s1) % P
    hh = h * h % P
    hhh = h * hh % P
    v = u1 * hh % P
    x3 = (r * r - hhh - 2 * v) % P
    y3 = (r * (v - x3) - s1 * hhh) % P
    return x3, y3, z1 * z2 * h % P


def _double(p: tuple[int, int, int]) -> tuple[int, int, int]:
    x, y, z = p
    if z == 0 or y == 0:
        return (1, 1, 0)
    yy = y * y % P
    s = 4 * x * yy % P
    zz = z * z % P
    m = 3 * (x - zz) * (x + zz) % P          # a = -3
    x3 = (m * m - 2 * s) % P
    return x3, (m * (s - x3) - 8 * yy * yy) % P, 2 * y * z % P


def _mul2(u1: int, u2: int, q: tuple[int, int]) -> int | None:
    """x of u1*G + u2*Q (Shamir's trick), affine; None at infinity."""
    g, qq = (*G, 1), (*q, 1)
    both = _add(g, qq)
    acc = (1, 1, 0)
    for bit in range(max(u1.bit_length(), u2.bit_length()) - 1, -1, -1):
        acc = _double(acc)
        pick = ((u1 >> bit) & 1, (u2 >> bit) & 1)
        if pick == (1, 1):
            acc = _add(acc, both)
        elif pick == (1, 0):
            acc = _add(acc, g)
        elif pick == (0, 1):
            acc = _add(acc, qq)
    x, _y, z = acc
    if z == 0:
        return None
    return x * pow(z * z % P, -1, P) % P


def ecdsa_verify(point: tuple[int, int], message: bytes, der_sig: bytes) -> bool:
    """ECDSA P-256 with SHA-256 (SEC 1 v2 §4.1.4) over message; der_sig as ASN.1 DER."""
    rs = _der_signature(der_sig)
    if rs is None:
        return False
    r, s = rs
    if not (0 < r < N and 0 < s < N):
        return False
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    w = pow(s, -1, N)
    x = _mul2(e * w % N, r * w % N, point)
    return x is not None and x % N == r
