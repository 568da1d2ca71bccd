"""Signing keys: ngcx's own ECDSA P-256 key, a PEM key the user names, or an AWS KMS key; all behind `Signer`.

Why P-256 and DER signatures over SHA-256: that is the one scheme cosign's specification requires every
implementation to support (sigstore/cosign specs/SIGNATURE_SPEC.md, "Signature Schemes": ECDSA-P256, the hash the
registry uses, sha256), and what `cosign verify --key cosign.pub` checks; AWS KMS's ECC_NIST_P256 key with
ECDSA_SHA_256 makes the same ASN.1 DER signature. Why a key made on first use: issue 48 wants signing by
default with no extra step; the private key is a 0600 PKCS#8 PEM file in ngcx's state folder
(core/paths.py state_dir()/signing/), its public key `cosign.pub` beside it, for users to hand to cosign,
Kyverno or a deploy host. The private key's bytes are never put in a message, a log line or a state row:
errors name the file, never its content.

Key specs as users type them (--key): a path (a PEM private key to sign; a PEM public key, or a private key, to
verify), or `awskms:///alias/NAME`, `awskms:///KEY-ID`, `awskms:///arn:aws:kms:...`, `awskms://ENDPOINT/ID`
(cosign's own KMS URI form), or `aliyunkms://REGION/KEY-ID` / `aliyunkms://REGION/alias/NAME` (Alibaba Cloud
KMS; cosign has no provider for it, so its users verify with the exported public key).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path
from typing import Protocol

from ..core.errors import UserError

KEY_FILE, PUB_FILE = "cosign.key", "cosign.pub"
AWS_PREFIX = "awskms://"
KEY_HINT = "pass --key PATH (a PEM EC P-256 key), awskms:///alias/NAME or aliyunkms://REGION/alias/NAME"


class Signer(Protocol):
    """What sign.py and attest.py need from a key: an ECDSA P-256 signature over SHA-256(data), and the public key."""

    label: str  # where the key is, for messages (a path or a KMS URI; never key material)

    def sign(self, data: bytes) -> bytes:
        """ASN.1 DER ECDSA signature over SHA-256(data)."""
        ...

    def public_pem(self) -> bytes:
        """The public key as PEM SubjectPublicKeyInfo (what `cosign verify --key` reads)."""
        ...


def fingerprint(public_pem: bytes) -> str:
    """sha256:HEX of the DER SubjectPublicKeyInfo: names a key in reports without importing cryptography."""
    body = b"".join(line for line in public_pem.strip().splitlines() if not line.startswith(b"-----"))
    return "sha256:" + hashlib.sha256(base64.b64decode(body)).hexdigest()


def pem_from_der(der: bytes) -> bytes:
    """PEM PUBLIC KEY text for a DER SubjectPublicKeyInfo (what KMS GetPublicKey returns)."""
    text = base64.b64encode(der).decode()
    lines = [text[i:i + 64] for i in range(0, len(text), 64)]
    return ("-----BEGIN PUBLIC KEY-----\n" + "\n".join(lines) + "\n-----END PUBLIC KEY-----\n").encode()


# ------------------------------------------------------------------------------------------------ local keys


def default_key_path() -> Path:
    """ngcx's own private key: STATE/signing/cosign.key (STATE: core/paths.py state_dir())."""
    from ..core.paths import state_dir

    return state_dir() / "signing" / KEY_FILE


class FileSigner:
    """A PEM EC P-256 private key on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = str(path)
        self._key = _load_private(path)

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def public_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def ensure_default_key() -> Path:
    """Make ngcx's key pair on first use (0600 private key, public key beside it); returns the private key's path.

    O_EXCL: two first pushes at once make one key, the other reads it.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = default_key_path()
    if path.is_file():
        return path
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path
        with os.fdopen(fd, "wb") as handle:
            handle.write(private)
        pub = path.with_name(PUB_FILE)
        pub.write_bytes(public)
        pub.chmod(0o644)
    except OSError as exc:
        raise UserError(f"cannot write the signing key in {path.parent}: {exc.strerror}",
                        hint="set NGCX_STATE_DIR to a writable folder, or pass --key PATH") from None
    return path


def _load_private(path: Path):  # -> ec.EllipticCurvePrivateKey
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise UserError(f"key {path} is not an unencrypted PEM private key", hint=KEY_HINT) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UserError(f"key {path} is not an ECDSA P-256 key (cosign's scheme)", hint=KEY_HINT)
    return key


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read key {path}: {exc.strerror}", hint=KEY_HINT) from None


# ------------------------------------------------------------------------------------------------ AWS KMS

AWS_URI = re.compile(r"awskms://(?P<endpoint>[^/]*)/(?P<key>.+)")


KMS_RAW_LIMIT = 4096  # bytes: KMS Sign takes a RAW message up to this size (AWS KMS API reference, Sign)


class AwsKmsSigner:
    """An AWS KMS ECC_NIST_P256 key, signing with ECDSA_SHA_256; the private key never leaves KMS.

    Messages up to 4096 bytes (every simple-signing payload, a provenance statement) go as MessageType RAW and KMS
    hashes them; larger ones (an SBOM attestation's PAE) as their SHA-256 with MessageType DIGEST, which gives the
    same signature on AWS. moto (the tests' KMS) ignores MessageType and would hash a DIGEST again, so only the RAW
    path is checked against it.
    """

    def __init__(self, uri: str) -> None:
        match = AWS_URI.fullmatch(uri)
        if not match:
            raise UserError(f"key {uri!r} is not awskms:///KEY-ID, awskms:///alias/NAME or awskms:///ARN",
                            hint=KEY_HINT)
        self.label = uri
        self.key_id = match["key"]
        self._endpoint = match["endpoint"] or None
        self._api = None
        self._public: bytes | None = None

    def _call(self, operation: str, **params):
        from ..clouds.aws import Api, default_region

        if self._api is None:
            arn_region = self.key_id.split(":")[3] if self.key_id.startswith("arn:") else None
            region = arn_region or default_region()
            if not region:
                raise UserError(f"key {self.label}: no AWS region", hint="set AWS_REGION, or give the key's ARN")
            self._api = Api(region)
            if self._endpoint:  # cosign's awskms://ENDPOINT/ID: a KMS endpoint of the user's own
                self._api._clients["kms"] = self._api.session.client(
                    "kms", region_name=region, endpoint_url=f"https://{self._endpoint}")
        return self._api.call("kms", operation, **params)

    def sign(self, data: bytes) -> bytes:
        raw = len(data) <= KMS_RAW_LIMIT
        answer = self._call("sign", KeyId=self.key_id, Message=data if raw else hashlib.sha256(data).digest(),
                            MessageType="RAW" if raw else "DIGEST", SigningAlgorithm="ECDSA_SHA_256")
        return answer["Signature"]

    def public_pem(self) -> bytes:
        if self._public is None:
            answer = self._call("get_public_key", KeyId=self.key_id)
            spec = answer.get("KeySpec") or answer.get("CustomerMasterKeySpec")
            if spec != "ECC_NIST_P256" or not _is_p256(answer["PublicKey"]):
                raise UserError(f"key {self.label} is {spec}, not ECC_NIST_P256 (cosign's scheme)",
                                hint="create it with: aws kms create-key --key-spec ECC_NIST_P256 "
                                     "--key-usage SIGN_VERIFY")
            self._public = pem_from_der(answer["PublicKey"])
        return self._public


def _is_p256(der: bytes) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    try:
        key = load_der_public_key(der)
    except ValueError:
        return False
    return isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


# ------------------------------------------------------------------------------------------------ Alibaba Cloud KMS

ALIYUN_PREFIX = "aliyunkms://"
ALIYUN_URI = re.compile(r"aliyunkms://(?P<region>[a-z0-9-]+)/(?P<key>[A-Za-z0-9/_-]+)")
ALIYUN_KMS_VERSION = "2016-01-20"


class AliyunKmsSigner:
    """An Alibaba Cloud KMS EC_P256 key (KeyUsage SIGN/VERIFY): `aliyunkms://REGION/KEY-ID` or
    `aliyunkms://REGION/alias/NAME`. KMS 2016-01-20 AsymmetricSign takes the SHA-256 digest (base64) with
    Algorithm ECDSA_SHA_256 and answers the DER signature (base64 Value); GetPublicKey answers PEM. Both need
    a key version: the key's PrimaryKeyVersion (DescribeKey). Calls go through clouds/aliyun.py's client
    (credentials, NGCX_ALIYUN_ECS_ENDPOINT, retries); cosign has no Alibaba KMS provider, so a cosign user
    verifies such a signature with the exported public key (`--key cosign.pub`)."""

    def __init__(self, uri: str) -> None:
        match = ALIYUN_URI.fullmatch(uri)
        if not match:
            raise UserError(f"key {uri!r} is not aliyunkms://REGION/KEY-ID or aliyunkms://REGION/alias/NAME",
                            hint=KEY_HINT)
        self.label, self.region, self.key_id = uri, match["region"], match["key"]
        self._api = None
        self._version: str | None = None
        self._public: bytes | None = None

    def _call(self, action: str, **params: str) -> dict:
        from ..clouds.aliyun import Api, _rpc

        if self._api is None:
            self._api = Api(self.region)
        domain = f"kms.{self.region}.aliyuncs.com"
        return self._api._call(action, lambda: _rpc(domain, ALIYUN_KMS_VERSION, "Kms", action, params), retry=True,
                               service="kms")

    def _key_version(self) -> str:
        if self._version is None:
            meta = self._call("DescribeKey", KeyId=self.key_id).get("KeyMetadata") or {}
            if meta.get("KeySpec") != "EC_P256" or meta.get("KeyUsage") != "SIGN/VERIFY":
                raise UserError(f"key {self.label} is {meta.get('KeySpec')} for {meta.get('KeyUsage')}, not EC_P256 "
                                "for SIGN/VERIFY (cosign's scheme)",
                                hint="create it with: aliyun kms CreateKey --KeySpec EC_P256 --KeyUsage SIGN/VERIFY")
            self._version = str(meta.get("PrimaryKeyVersion") or "")
        return self._version

    def sign(self, data: bytes) -> bytes:
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        answer = self._call("AsymmetricSign", KeyId=self.key_id, KeyVersionId=self._key_version(),
                            Algorithm="ECDSA_SHA_256", Digest=digest)
        return base64.b64decode(answer["Value"])

    def public_pem(self) -> bytes:
        if self._public is None:
            answer = self._call("GetPublicKey", KeyId=self.key_id, KeyVersionId=self._key_version())
            pem = str(answer.get("PublicKey") or "").encode()
            body = b"".join(line for line in pem.strip().splitlines() if not line.startswith(b"-----"))
            try:
                der = base64.b64decode(body, validate=True)
            except ValueError:
                der = b""
            if not _is_p256(der):
                raise UserError(f"key {self.label}: KMS did not answer an EC P-256 public key", hint=KEY_HINT)
            self._public = pem_from_der(der)
        return self._public


# ------------------------------------------------------------------------------------------------ choosing


def signer_for(key: str | None) -> Signer:
    """The signer for --key: None -> ngcx's own key (made on first use), awskms://... -> KMS, else a PEM file."""
    if key and key.startswith(AWS_PREFIX):
        return AwsKmsSigner(key)
    if key and key.startswith(ALIYUN_PREFIX):
        return AliyunKmsSigner(key)
    if key and key.split("://", 1)[0] in ("gcpkms", "azurekms", "hashivault", "k8s"):
        raise UserError(f"key {key!r}: only PEM keys, awskms:// and aliyunkms:// are supported so far",
                        hint=KEY_HINT)
    return FileSigner(Path(key).expanduser() if key else ensure_default_key())


def public_key_for(key: str | None) -> bytes:
    """The PEM public key that verifies: --key's (a public or private PEM file, or awskms://), else ngcx's own."""
    if key and key.startswith((AWS_PREFIX, ALIYUN_PREFIX)):
        return signer_for(key).public_pem()
    if key is None:
        path = default_key_path().with_name(PUB_FILE)
        if not path.is_file():
            raise UserError(f"no signing key on this machine ({path} does not exist)",
                            hint="pass --key cosign.pub (the public key of whoever signed the image)")
    else:
        path = Path(key).expanduser()
    data = _read(path)
    if b"PUBLIC KEY-----" in data:
        return data
    if b"PRIVATE KEY-----" in data:
        return FileSigner(path).public_pem()
    raise UserError(f"key {path} is not a PEM public key", hint=KEY_HINT)
