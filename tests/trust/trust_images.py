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
