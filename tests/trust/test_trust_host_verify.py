"""The deploy host's own check (cli/trust/host_verify.py: standard library and openssl): it accepts what `ngcx push`
signed and refuses the same tampering as `ngcx verify`, run the way a host script runs it (`python3 - REF KEY`, the
program on standard input, by the machine's own python3, not ngcx's environment)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from trust_images import get_blob, get_manifest, push, put_blob, put_manifest, remove_images, split, tiny_image

import ngcx.trust.host_verify as host_verify

PROGRAM = Path(host_verify.__file__).read_text()
SLSA = "https://slsa.dev/provenance/v1"


def _host_check(ref: str, key: Path) -> subprocess.CompletedProcess[str]:
    python = shutil.which("python3") or sys.executable
    return subprocess.run([python, "-", ref, str(key)], input=PROGRAM, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), "DOCKER_CONFIG": os.environ["DOCKER_CONFIG"]})


def _refused(proc: subprocess.CompletedProcess[str], words: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ngcx: image refused:" in lines[0] and words in lines[0], proc.stderr


def test_the_hosts_openssl_ecdsa_check_agrees_with_cryptography():
    for _ in range(25):
        key = ec.generate_private_key(ec.SECP256R1())
        message = secrets.token_bytes(secrets.randbelow(300) + 1)
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        point = host_verify.public_point(pem)
        signature = key.sign(message, ec.ECDSA(hashes.SHA256()))
        assert host_verify.ecdsa_p256_verify(point, signature, message)
        assert not host_verify.ecdsa_p256_verify(point, signature, message + b".")
        other = ec.generate_private_key(ec.SECP256R1()).sign(message, ec.ECDSA(hashes.SHA256()))
        assert not host_verify.ecdsa_p256_verify(point, other, message)
        assert not host_verify.ecdsa_p256_verify(point, signature[:-1], message)


@pytest.mark.docker
def test_host_accepts_the_signed_digest_and_refuses_tampering(docker_client, registry, isolated_state):
    local = tiny_image(docker_client, f"ngcx-trust/host{secrets.token_hex(3)}", "v1")
    made = [docker_client.images.get(local).id]
    namespace = f"{registry}/ngcx-trust-{secrets.token_hex(4)}"
    try:
        remote, digest = push(local, namespace)
        key = isolated_state["state"] / "signing" / "cosign.pub"
        accepted = _host_check(remote, key)
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout.strip() == f"{remote.rsplit(':', 1)[0]}@{digest}"

        host, repo, tag = split(remote)
        att_tag = digest.replace(":", "-") + ".att"
        manifest = get_manifest(host, repo, att_tag)
        original = json.loads(json.dumps(manifest))
        layer = next(d for d in manifest["layers"] if d["annotations"]["predicateType"] == SLSA)
        envelope = json.loads(get_blob(host, repo, layer["digest"]))
        statement = json.loads(base64.b64decode(envelope["payload"]))
        statement["predicate"]["buildDefinition"]["externalParameters"]["image"] = "something-else"
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        edited = json.dumps(envelope).encode()
        layer["digest"], layer["size"] = put_blob(host, repo, edited), len(edited)
        put_manifest(host, repo, att_tag, manifest)
        _refused(_host_check(remote, key), "attestation edited")
        put_manifest(host, repo, att_tag, original)

        other = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        other_key = isolated_state["state"] / "other.pub"
        other_key.write_bytes(other)
        _refused(_host_check(remote, other_key), "signature does not match")

        again = tiny_image(docker_client, local.rsplit(":", 1)[0], "v1")
        made.append(docker_client.images.get(again).id)
        _ref, new_digest = push(again, namespace, "--no-sign")
        _refused(_host_check(remote, key), f"no signature for {new_digest}")
    finally:
        remove_images(docker_client, *made)
