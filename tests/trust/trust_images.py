"""Helpers for the signing tests: tiny real images in the real engine, pushed to the real loopback registry.

Why imported tiny images: a signature covers a manifest digest, whatever the image holds; a one-file image made
with the engine's own import (no pull, no base needed) pushes in well under a second, and random content makes
every image a new digest, so tests never see each other's signatures.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import tarfile

import requests

from support import run_ngcx

ACCEPT = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"


def tiny_image(client, repository: str, tag: str) -> str:
    """A one-file image `repository:tag` made by the engine from a tar; returns the reference."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"ngcx trust test {secrets.token_hex(16)}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag)
    return f"{repository}:{tag}"


def push(local_ref: str, registry_ns: str, *args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """`ngcx push LOCAL --registry REGISTRY_NS ARGS...` (must succeed) -> (remote ref, digest)."""
    proc = run_ngcx("push", local_ref, "--registry", registry_ns, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    ref, _, digest = proc.stdout.strip().splitlines()[-1].partition("@")
    assert digest.startswith("sha256:"), proc.stdout
    return ref, digest


def split(remote_ref: str) -> tuple[str, str, str]:
    """'127.0.0.1:5000/ns/x:tag' -> ('127.0.0.1:5000', 'ns/x', 'tag')."""
    host, _, rest = remote_ref.partition("/")
    repo, _, tag = rest.rpartition(":")
    return host, repo, tag


def get_manifest(host: str, repo: str, reference: str) -> dict:
    resp = requests.get(f"http://{host}/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT}, timeout=10)
    assert resp.status_code == 200, (reference, resp.status_code)
    return resp.json()


def get_blob(host: str, repo: str, digest: str) -> bytes:
    resp = requests.get(f"http://{host}/v2/{repo}/blobs/{digest}", timeout=10)
    assert resp.status_code == 200, (digest, resp.status_code)
    return resp.content


def put_blob(host: str, repo: str, data: bytes) -> str:
    """Upload a blob with the distribution API itself (what an attacker with push access can do)."""
    import hashlib

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = requests.post(f"http://{host}/v2/{repo}/blobs/uploads/", timeout=10)
    assert start.status_code == 202, start.status_code
    location = start.headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    done = requests.put(f"{location}{'&' if '?' in location else '?'}digest={digest}", data=data, timeout=10,
                        headers={"Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.status_code
    return digest


def put_manifest(host: str, repo: str, tag: str, manifest: dict) -> None:
    body = json.dumps(manifest).encode()
    media_type = manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json")
    resp = requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=body, timeout=10,
                        headers={"Content-Type": media_type})
    assert resp.status_code == 201, (resp.status_code, resp.text[:200])


def remove_images(client, *refs: str) -> None:
    """Remove each tiny image with every tag it got (the registry tags `ngcx push` added): each is unique."""
    for ref in refs:
        with contextlib.suppress(Exception):
            image = client.images.get(ref)
            for tag in image.tags:
                client.images.remove(tag, noprune=True)
            client.images.remove(image.id, noprune=True)  # left with only a repo digest once its tag moved on


def get_manifest_raw(host: str, repo: str, reference: str) -> tuple[bytes, str]:
    """(the manifest's exact bytes, its media type): what put_manifest_raw needs to restore a tag to the very
    digest it had (a re-serialized JSON would be another digest)."""
    resp = requests.get(f"http://{host}/v2/{repo}/manifests/{reference}", headers={"Accept": ACCEPT}, timeout=10)
    assert resp.status_code == 200, (reference, resp.status_code)
    return resp.content, resp.headers["Content-Type"]


def put_manifest_raw(host: str, repo: str, tag: str, body: bytes, media_type: str) -> None:
    resp = requests.put(f"http://{host}/v2/{repo}/manifests/{tag}", data=body, timeout=10,
                        headers={"Content-Type": media_type})
    assert resp.status_code == 201, (resp.status_code, resp.text[:200])


def push_other_image(host: str, repo: str, tag: str) -> str:
    """Another image (one random file) pushed under `repo:tag` through the distribution API, unsigned, as
    anyone with push access to the repository could; returns its manifest digest."""
    import hashlib

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"not the image that was signed {secrets.token_hex(16)}\n".encode()
        info = tarfile.TarInfo("evil.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = buf.getvalue()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                           "digest": put_blob(host, repo, config.encode())},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(layer),
                            "digest": put_blob(host, repo, layer)}]}
    body = json.dumps(manifest).encode()
    put_manifest_raw(host, repo, tag, body, manifest["mediaType"])
    return "sha256:" + hashlib.sha256(body).hexdigest()


def replace_signature(host: str, repo: str, digest: str) -> None:
    """The digest's .sig replaced by the same payload signed with a fresh key (not the one a deploy trusts)."""
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    sig_tag = digest.replace(":", "-") + ".sig"
    manifest = get_manifest(host, repo, sig_tag)
    layer = manifest["layers"][0]
    payload = get_blob(host, repo, layer["digest"])
    forged = ec.generate_private_key(ec.SECP256R1()).sign(payload, ec.ECDSA(hashes.SHA256()))
    layer["annotations"]["dev.cosignproject.cosign/signature"] = base64.b64encode(forged).decode()
    put_manifest(host, repo, sig_tag, manifest)


def edit_attestation(host: str, repo: str, digest: str, kind: str) -> None:
    """The `kind` attestation's statement edited (a field added to its predicate), its signature kept: an
    attacker's edit of the SBOM or the provenance. Fails when the digest carries no such attestation."""
    import base64

    att_tag = digest.replace(":", "-") + ".att"
    manifest = get_manifest(host, repo, att_tag)
    kinds = [d["annotations"].get("predicateType") for d in manifest["layers"]]
    assert kind in kinds, (kind, kinds)
    layer = next(d for d in manifest["layers"] if d["annotations"].get("predicateType") == kind)
    envelope = json.loads(get_blob(host, repo, layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["tampered"] = "https://evil.example/"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    edited = json.dumps(envelope).encode()
    layer["digest"], layer["size"] = put_blob(host, repo, edited), len(edited)
    put_manifest(host, repo, att_tag, manifest)
