"""Alibaba Cloud KMS (2016-01-20) for the signing tests: the asymmetric-key actions ngcx calls, behind the same RPC
gateway as the other Alibaba Cloud emulators (tests/emulators/aliyun_rpc.py: signature v1, error bodies).

Actions, as Alibaba Cloud's KMS API reference describes them: CreateKey (KeySpec EC_P256 | RSA_2048, KeyUsage
SIGN/VERIFY | ENCRYPT/DECRYPT), CreateAlias, DescribeKey (KeyMetadata with PrimaryKeyVersion), GetPublicKey (PEM),
AsymmetricSign (Digest = base64 of the message's digest, Algorithm ECDSA_SHA_256 for EC_P256; Value = base64 DER
signature). KeyId accepts a key id or `alias/NAME`. Keys are real (cryptography), so signatures verify anywhere.
"""

from __future__ import annotations

import base64
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from emulators.aliyun_rpc import ApiError, RpcService, decode_base64, invalid, required

VERSION = "2016-01-20"
KEY_SPECS = {"EC_P256": ("ECDSA_SHA_256",), "RSA_2048": ("RSA_PSS_SHA_256", "RSA_PKCS1_SHA_256")}
USAGES = ("SIGN/VERIFY", "ENCRYPT/DECRYPT")


@dataclass
class Key:
    id: str
    spec: str
    usage: str
    version: str
    private: Any


class KmsService(RpcService):
    products = {VERSION: ("Kms", "kms.aliyuncs.com")}

    def __init__(self, access_keys: dict[str, str], region: str) -> None:
        super().__init__(access_keys, region)
        self._keys: dict[str, Key] = {}
        self._aliases: dict[str, str] = {}
        self._key_lock = threading.Lock()
        self.actions[VERSION] = {"CreateKey": self._create_key, "CreateAlias": self._create_alias,
                                 "DescribeKey": self._describe_key, "GetPublicKey": self._get_public_key,
                                 "AsymmetricSign": self._asymmetric_sign}

    def _key(self, params: dict[str, str]) -> Key:
        ref = required(params, "KeyId")
        key_id = self._aliases.get(ref, ref)
        if key_id not in self._keys:
            raise ApiError(404, "Forbidden.KeyNotFound", f"The specified Key {ref} is not found.")
        return self._keys[key_id]

    def _versioned(self, params: dict[str, str]) -> Key:
        key = self._key(params)
        if required(params, "KeyVersionId") != key.version:
            raise ApiError(404, "Forbidden.ResourceNotFound", "The specified key version is not found.")
        if key.usage != "SIGN/VERIFY":
            raise ApiError(400, "Rejected.Unsupported", "The key usage is not SIGN/VERIFY.")
        return key

    def _create_key(self, params: dict[str, str]) -> dict[str, Any]:
        spec, usage = params.get("KeySpec") or "Aliyun_AES_256", params.get("KeyUsage") or "ENCRYPT/DECRYPT"
        if spec not in KEY_SPECS:
            raise invalid("KeySpec")
        if usage not in USAGES:
            raise invalid("KeyUsage")
        private = ec.generate_private_key(ec.SECP256R1()) if spec == "EC_P256" else rsa.generate_private_key(
            public_exponent=65537, key_size=2048)
        key = Key(str(uuid.uuid4()), spec, usage, str(uuid.uuid4()), private)
        self._keys[key.id] = key
        return {"KeyMetadata": self._metadata(key)}

    def _create_alias(self, params: dict[str, str]) -> dict[str, Any]:
        alias = required(params, "AliasName")
        if not alias.startswith("alias/"):
            raise invalid("AliasName", "It must start with alias/.")
        self._aliases[alias] = self._key(params).id
        return {}

    def _describe_key(self, params: dict[str, str]) -> dict[str, Any]:
        return {"KeyMetadata": self._metadata(self._key(params))}

    def _get_public_key(self, params: dict[str, str]) -> dict[str, Any]:
        key = self._versioned(params)
        pem = key.private.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
        return {"KeyId": key.id, "KeyVersionId": key.version, "PublicKey": pem.decode()}

    def _asymmetric_sign(self, params: dict[str, str]) -> dict[str, Any]:
        key = self._versioned(params)
        algorithm = required(params, "Algorithm")
        if algorithm not in KEY_SPECS[key.spec]:
            raise invalid("Algorithm", f"{algorithm} does not fit a {key.spec} key.")
        digest = decode_base64(required(params, "Digest"))
        if digest is None or len(digest) != 32:
            raise invalid("Digest", "It must be the base64 of a SHA-256 digest.")
        signature = key.private.sign(digest, ec.ECDSA(Prehashed(hashes.SHA256())))
        return {"KeyId": key.id, "KeyVersionId": key.version, "Value": base64.b64encode(signature).decode()}

    @staticmethod
    def _metadata(key: Key) -> dict[str, Any]:
        return {"KeyId": key.id, "KeySpec": key.spec, "KeyUsage": key.usage, "KeyState": "Enabled",
                "PrimaryKeyVersion": key.version, "Origin": "Aliyun_KMS"}
