"""`ngcx push --key awskms:///alias/NAME` signs with an AWS KMS ECC_NIST_P256 key; `ngcx verify` checks with it.

KMS is moto's server (as the other AWS tests run it: moto.server.ThreadedMotoServer on loopback, boto3 pointed at
it by AWS_ENDPOINT_URL); the image and the registry are real. The signature is also checked with `cryptography`
against the public key KMS hands out, so a verifier that accepted anything would not pass.
"""

from __future__ import annotations

import base64
import secrets

import boto3
import pytest
from moto.server import ThreadedMotoServer
from trust_images import get_blob, get_manifest, push, remove_images, split, tiny_image

from support import run_ngcx

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def kms_env():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        yield env
    finally:
        server.stop()


def _kms(env):
    return boto3.client("kms", region_name=env["AWS_REGION"], endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _kms_key(env, spec: str = "ECC_NIST_P256") -> tuple[str, bytes]:
    """A new KMS signing key under a new alias: (alias URI, its public key DER)."""
    kms = _kms(env)
    key_id = kms.create_key(KeySpec=spec, KeyUsage="SIGN_VERIFY")["KeyMetadata"]["KeyId"]
    alias = f"alias/ngcx-test-{secrets.token_hex(4)}"
    kms.create_alias(AliasName=alias, TargetKeyId=key_id)
    return f"awskms:///{alias}", kms.get_public_key(KeyId=key_id)["PublicKey"]


def test_kms_key_signs_and_verifies(docker_client, registry, isolated_state, kms_env, tmp_path):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    uri, public_der = _kms_key(kms_env)
    local = tiny_image(docker_client, f"ngcx-trust/kms{secrets.token_hex(3)}", "v1")
    try:
        remote, digest = push(local, f"{registry}/ngcx-trust-{secrets.token_hex(4)}", "--key", uri, env=kms_env)
        assert not (isolated_state["state"] / "signing" / "cosign.key").exists(), "no local key made for a KMS key"

        host, repo, _ = split(remote)
        layer = get_manifest(host, repo, digest.replace(":", "-") + ".sig")["layers"][-1]
        payload = get_blob(host, repo, layer["digest"])
        public = serialization.load_der_public_key(public_der)
        public.verify(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]), payload,
                      ec.ECDSA(hashes.SHA256()))

        by_kms = run_ngcx("verify", remote, "--key", uri, env=kms_env)
        assert by_kms.returncode == 0, by_kms.stderr
        pub = tmp_path / "kms.pub"
        pub.write_bytes(public.public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo))
        by_pem = run_ngcx("verify", remote, "--key", str(pub))
        assert by_pem.returncode == 0, by_pem.stderr

        other_uri, _ = _kms_key(kms_env)
        refused = run_ngcx("verify", remote, "--key", other_uri, env=kms_env)
        assert refused.returncode == 1 and "signature does not match key" in refused.stderr, refused.stderr
    finally:
        remove_images(docker_client, local)


def test_kms_key_of_the_wrong_kind_is_one_line_before_the_push(docker_client, registry, isolated_state, kms_env):
    uri, _ = _kms_key(kms_env, spec="RSA_2048")
    local = tiny_image(docker_client, f"ngcx-trust/kms{secrets.token_hex(3)}", "v1")
    try:
        proc = run_ngcx("push", local, "--registry", f"{registry}/ngcx-trust-{secrets.token_hex(4)}", "--key", uri,
                        env=kms_env)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "ECC_NIST_P256" in lines[0] and "Traceback" not in proc.stderr
        assert "Pushed" not in proc.stderr
    finally:
        remove_images(docker_client, local)


# --- Alibaba Cloud KMS: the real aliyun-python-sdk-core against the KMS emulator (aliyun_kms.py) ---------------

ALIYUN_AK, ALIYUN_SECRET, ALIYUN_REGION = "LTAI5tNgcxTrustTest", "trust-test-secret-value", "cn-hangzhou"


@pytest.fixture(scope="module")
def aliyun_kms():
    from aliyun_kms import KmsService

    with KmsService({ALIYUN_AK: ALIYUN_SECRET}, ALIYUN_REGION) as service:
        env = {"NGCX_ALIYUN_ECS_ENDPOINT": service.endpoint, "ALIBABA_CLOUD_ACCESS_KEY_ID": ALIYUN_AK,
               "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ALIYUN_SECRET}
        yield service, env


def _aliyun_key(service, spec: str = "EC_P256") -> str:
    key = service._create_key({"KeySpec": spec, "KeyUsage": "SIGN/VERIFY"})["KeyMetadata"]
    alias = f"alias/ngcx-test-{secrets.token_hex(4)}"
    service._create_alias({"AliasName": alias, "KeyId": key["KeyId"]})
    return f"aliyunkms://{ALIYUN_REGION}/{alias}"


def test_aliyun_kms_key_signs_and_verifies(docker_client, registry, isolated_state, aliyun_kms, tmp_path):
    service, env = aliyun_kms
    uri = _aliyun_key(service)
    local = tiny_image(docker_client, f"ngcx-trust/akms{secrets.token_hex(3)}", "v1")
    try:
        remote, _digest = push(local, f"{registry}/ngcx-trust-{secrets.token_hex(4)}", "--key", uri, env=env)
        assert not (isolated_state["state"] / "signing" / "cosign.key").exists()
        assert any(action == "AsymmetricSign" for action, _params in service.calls)

        by_kms = run_ngcx("verify", remote, "--key", uri, env=env)
        assert by_kms.returncode == 0, by_kms.stderr
        refused = run_ngcx("verify", remote, "--key", _aliyun_key(service), env=env)
        assert refused.returncode == 1 and "signature does not match key" in refused.stderr, refused.stderr
        for proc in (by_kms, refused):
            assert ALIYUN_SECRET not in proc.stdout + proc.stderr
    finally:
        remove_images(docker_client, local)


def test_aliyun_kms_rsa_key_is_refused_in_one_line(docker_client, registry, isolated_state, aliyun_kms):
    service, env = aliyun_kms
    local = tiny_image(docker_client, f"ngcx-trust/akms{secrets.token_hex(3)}", "v1")
    try:
        proc = run_ngcx("push", local, "--registry", f"{registry}/ngcx-trust-{secrets.token_hex(4)}", "--key",
                        _aliyun_key(service, "RSA_2048"), env=env)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "EC_P256" in proc.stderr and "Pushed" not in proc.stderr
    finally:
        remove_images(docker_client, local)
