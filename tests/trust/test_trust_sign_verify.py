"""`ngcx push` signs what it pushed and `ngcx verify` accepts exactly that image, refusing every tampering in one line.

Real engine, real loopback registry (127.0.0.1:5000), real `ngcx` processes; the tampering is done as an attacker
with push access would, through the registry's own HTTP API (trust_images.py).
"""

from __future__ import annotations

import base64
import json
import secrets
import stat

import pytest
from trust_images import get_blob, get_manifest, push, put_blob, put_manifest, remove_images, split, tiny_image

from support import run_ngcx

pytestmark = pytest.mark.docker

SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"


@pytest.fixture
def namespace(registry) -> str:
    return f"{registry}/ngcx-trust-{secrets.token_hex(4)}"


@pytest.fixture
def images(docker_client):
    made: list[str] = []

    def make(repository: str | None = None, tag: str = "v1") -> str:
        ref = tiny_image(docker_client, repository or f"ngcx-trust/tiny{secrets.token_hex(3)}", tag)
        made.append(docker_client.images.get(ref).id)  # by id: a later image may take over the local tag
        return ref

    yield make
    remove_images(docker_client, *made)


def _refused(proc, *words: str) -> str:
    """The one stderr line of a refused verify (exit 1), which must name what failed."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_push_signs_by_default_and_verify_accepts(images, namespace, isolated_state):
    remote, digest = push(images(), namespace)
    key = isolated_state["state"] / "signing" / "cosign.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (key.parent / "cosign.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")

    proc = run_ngcx("verify", remote)
    assert proc.returncode == 0, proc.stderr
    assert digest in proc.stdout and "signed by key" in proc.stdout and "SLSA provenance" in proc.stdout

    as_json = run_ngcx("verify", remote, "--key", str(key.parent / "cosign.pub"), "--json")
    assert as_json.returncode == 0, as_json.stderr
    verdict = json.loads(as_json.stdout)
    assert verdict["ok"] is True and verdict["digest"] == digest and SLSA in verdict["attestations"]
    by_digest = run_ngcx("verify", f"{remote.rsplit(':', 1)[0]}@{digest}")
    assert by_digest.returncode == 0, by_digest.stderr


def test_private_key_never_leaves_its_file(images, namespace, isolated_state):
    local = images()
    proc = run_ngcx("push", local, "--registry", namespace)
    assert proc.returncode == 0, proc.stderr
    remote, _, digest = proc.stdout.strip().splitlines()[-1].partition("@")
    private = (isolated_state["state"] / "signing" / "cosign.key").read_text()
    secret_body = "".join(line for line in private.splitlines() if not line.startswith("-----"))
    host, repo, _tag = split(remote)
    stored = b""
    for tag in (digest.replace(":", "-") + ".sig", digest.replace(":", "-") + ".att"):
        manifest = get_manifest(host, repo, tag)
        stored += json.dumps(manifest).encode()
        for descriptor in [manifest["config"], *manifest["layers"]]:
            stored += get_blob(host, repo, descriptor["digest"])
    for text in (proc.stdout, proc.stderr, stored.decode(errors="replace")):
        assert secret_body[:40] not in text and "PRIVATE KEY" not in text


def test_another_image_pushed_under_the_signed_tag_is_refused(images, namespace, isolated_state):
    local = images()
    remote, _ = push(local, namespace)
    repository, tag = local.rsplit(":", 1)
    again = images(repository, tag)  # another image under the same local name, pushed without signing
    assert again == local
    replaced, other_digest = push(again, namespace, "--no-sign")
    assert replaced == remote

    _refused(run_ngcx("verify", remote), "no signature", other_digest)


def test_signature_replaced_by_another_key_is_refused(images, namespace, isolated_state):
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    remote, digest = push(images(), namespace)
    host, repo, _ = split(remote)
    sig_tag = digest.replace(":", "-") + ".sig"
    manifest = get_manifest(host, repo, sig_tag)
    layer = manifest["layers"][0]
    payload = get_blob(host, repo, layer["digest"])
    forged = ec.generate_private_key(ec.SECP256R1()).sign(payload, ec.ECDSA(hashes.SHA256()))
    layer["annotations"]["dev.cosignproject.cosign/signature"] = base64.b64encode(forged).decode()
    put_manifest(host, repo, sig_tag, manifest)

    _refused(run_ngcx("verify", remote), "signature does not match key")


def test_signature_of_another_digest_is_refused(images, namespace, isolated_state):
    signed, signed_digest = push(images(), namespace)
    unsigned, unsigned_digest = push(images(), namespace, "--no-sign")
    host, signed_repo, _ = split(signed)
    _, repo, _ = split(unsigned)
    manifest = get_manifest(host, signed_repo, signed_digest.replace(":", "-") + ".sig")
    for descriptor in [manifest["config"], *manifest["layers"]]:
        put_blob(host, repo, get_blob(host, signed_repo, descriptor["digest"]))
    put_manifest(host, repo, unsigned_digest.replace(":", "-") + ".sig", manifest)

    _refused(run_ngcx("verify", unsigned), "signed digest differs", signed_digest, unsigned_digest)


def _edit_attestation(remote: str, digest: str, kind: str, edit) -> None:
    """Replace the `kind` envelope's statement by edit(statement), keeping its signature (an attacker's edit)."""
    host, repo, _ = split(remote)
    att_tag = digest.replace(":", "-") + ".att"
    manifest = get_manifest(host, repo, att_tag)
    layer = next(d for d in manifest["layers"] if d["annotations"]["predicateType"] == kind)
    envelope = json.loads(get_blob(host, repo, layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    edit(statement)
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    edited = json.dumps(envelope).encode()
    layer["digest"], layer["size"] = put_blob(host, repo, edited), len(edited)
    put_manifest(host, repo, att_tag, manifest)


def _other_builder(statement: dict) -> None:
    statement["predicate"]["runDetails"]["builder"]["id"] = "https://evil.example/builder"


def _hidden_component(statement: dict) -> None:
    statement["predicate"].setdefault("components", []).append({"type": "library", "name": "backdoor",
                                                                "version": "1.0"})


@pytest.mark.parametrize(("kind", "edit"), [(SLSA, _other_builder), (CYCLONEDX, _hidden_component)],
                         ids=["provenance", "sbom"])
def test_edited_attestation_is_refused(images, namespace, isolated_state, kind, edit):
    remote, digest = push(images(), namespace)
    _edit_attestation(remote, digest, kind, edit)
    _refused(run_ngcx("verify", remote), "attestation edited", kind)


def test_attestation_added_with_another_key(images, namespace, isolated_state):
    """Another party's attestation of its own type is left alone; a provenance signed by another key is refused."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    remote, digest = push(images(), namespace)
    host, repo, _ = split(remote)
    att_tag = digest.replace(":", "-") + ".att"
    other_key = ec.generate_private_key(ec.SECP256R1())

    def add(kind: str) -> None:
        statement = {"_type": "https://in-toto.io/Statement/v1", "predicateType": kind, "predicate": {},
                     "subject": [{"name": f"{host}/{repo}", "digest": {"sha256": digest.removeprefix("sha256:")}}]}
        body = json.dumps(statement).encode()
        pae = b"DSSEv1 %d application/vnd.in-toto+json %d %s" % (len("application/vnd.in-toto+json"), len(body), body)
        envelope = {"payloadType": "application/vnd.in-toto+json", "payload": base64.b64encode(body).decode(),
                    "signatures": [{"keyid": "", "sig": base64.b64encode(
                        other_key.sign(pae, ec.ECDSA(hashes.SHA256()))).decode()}]}
        data = json.dumps(envelope).encode()
        manifest = get_manifest(host, repo, att_tag)
        manifest["layers"].append({"mediaType": "application/vnd.dsse.envelope.v1+json", "size": len(data),
                                   "digest": put_blob(host, repo, data), "annotations": {"predicateType": kind}})
        put_manifest(host, repo, att_tag, manifest)

    add("https://example.com/scan/v1")
    accepted = run_ngcx("verify", remote)
    assert accepted.returncode == 0, accepted.stderr
    add(SLSA)
    _refused(run_ngcx("verify", remote), "attestation edited", SLSA)


def test_unsigned_image_and_wrong_key_are_refused(images, namespace, isolated_state, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    unsigned, digest = push(images(), namespace, "--no-sign")
    run_ngcx("push", images(), "--registry", namespace)  # makes this machine's key
    _refused(run_ngcx("verify", unsigned), "no signature", digest)

    signed, _ = push(images(), namespace)
    other = tmp_path / "other.pub"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    _refused(run_ngcx("verify", signed, "--key", str(other)), "signature does not match key")


def test_bad_input_is_one_line_exit_2(isolated_state, tmp_path, registry):
    not_a_key = tmp_path / "key.pem"
    not_a_key.write_text("hello\n")
    cases = [("verify", "ngcx/local-only:tag"), ("verify", f"{registry}/x@sha256:1234"),
             ("verify", f"{registry}/x:tag", "--key", str(not_a_key)),
             ("verify", f"{registry}/x:tag", "--key", str(tmp_path / "absent.pub")),
             ("verify", f"{registry}/x:tag")]  # no --key and no key made on this machine yet
    for args in cases:
        proc = run_ngcx(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_push_with_a_bad_key_uploads_nothing(images, namespace, isolated_state, tmp_path):
    bad = tmp_path / "rsa.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot really\n-----END PRIVATE KEY-----\n")
    local = images()
    proc = run_ngcx("push", local, "--registry", namespace, "--key", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(bad) in proc.stderr and "not really" not in proc.stderr
    name, tag = local.split("/", 1)[1].split(":")
    host, _, ns = namespace.partition("/")
    import requests

    assert requests.head(f"http://{host}/v2/{ns}/{name}/manifests/{tag}", timeout=10).status_code == 404


def test_sign_and_verify_on_a_registry_that_needs_a_login(images, auth_registry, isolated_state):
    """The signature and attestations go up, and are read back, with the credentials `ngcx login` stored."""
    host, user, password = auth_registry
    login = run_ngcx("login", host, "--username", user, "--password-stdin", input=password + "\n")
    assert login.returncode == 0, login.stderr
    remote, digest = push(images(), host)
    verified = run_ngcx("verify", remote)
    assert verified.returncode == 0 and digest in verified.stdout, verified.stderr
    assert run_ngcx("logout", host).returncode == 0
    anonymous = run_ngcx("verify", remote)
    assert anonymous.returncode == 2 and len(anonymous.stderr.strip().splitlines()) == 1, anonymous.stderr
    assert f"ngcx login {host}" in anonymous.stderr
    for proc in (login, verified, anonymous):
        assert password not in proc.stdout + proc.stderr


def test_the_private_key_is_in_no_output_artifact_label_or_state_row(images, namespace, isolated_state, docker_client):
    """What a push signs with never leaves its 0600 file: not in push's or verify's output, not in the signature or
    attestation manifests and blobs in the registry, not in the image's labels, not in the state database."""
    from cryptography.hazmat.primitives import serialization

    local = images()
    proc = run_ngcx("push", local, "--registry", namespace)
    assert proc.returncode == 0, proc.stderr
    remote, _, digest = proc.stdout.strip().splitlines()[-1].partition("@")
    key_file = isolated_state["state"] / "signing" / "cosign.key"
    private = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    scalar = private.private_numbers().private_value.to_bytes(32, "big")
    der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    forms = [scalar.hex().encode(), base64.b64encode(scalar), base64.b64encode(der)[:40], b"PRIVATE KEY"]

    host, repo, _tag = split(remote)
    seen = [proc.stdout.encode(), proc.stderr.encode(), run_ngcx("verify", remote).stderr.encode(),
            json.dumps(docker_client.images.get(local).labels or {}).encode()]
    for suffix in (".sig", ".att"):
        manifest = get_manifest(host, repo, digest.replace(":", "-") + suffix)
        seen.append(json.dumps(manifest).encode())
        seen += [get_blob(host, repo, layer["digest"]) for layer in manifest["layers"]]
    seen += [p.read_bytes() for p in isolated_state["state"].rglob("*") if p.is_file() and p != key_file]
    assert len(seen) > 6
    leaked = [form for form in forms for blob in seen if form in blob]
    assert leaked == []
