"""An empty registry per measurement, and the registry HTTP API calls the push suite needs.

Why a fresh `docker-registry` process per push: a registry deduplicates blobs across all its
repositories, so a second push of the same layers into a new repository of the same registry
uploads nothing ("Layer already exists", or a cross-repository mount). Only a registry with
empty storage makes every push upload every byte. Each one is Debian's docker-registry (what
scripts/setup.sh runs on 127.0.0.1:5000), on a free loopback port, with its own temporary storage
that is removed with it.

Uploads go through the Docker Registry HTTP API v2 the way dockerd pushes: POST a session, PATCH
the blob as one chunked stream (so compression and upload overlap), PUT with the digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGISTRY_BIN = "docker-registry"
CONFIG = """\
# Written by bench/suites/push_registry.py: a throwaway loopback registry with empty storage.
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {addr}
"""

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_GZIP_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_TAR_LAYER = "application/vnd.oci.image.layer.v1.tar"
ACCEPT = ", ".join((DOCKER_MANIFEST, OCI_MANIFEST))


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class FreshRegistry:
    """A docker-registry process on 127.0.0.1:<free port> with empty storage; stop() removes both."""

    parent: Path | None = None
    port: int = 0
    folder: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FreshRegistry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, wait: float = 30.0) -> None:
        binary = shutil.which(REGISTRY_BIN)
        if binary is None:
            raise RuntimeError(f"{REGISTRY_BIN} not found: run scripts/setup.sh (apt-get install docker-registry)")
        self.folder = Path(tempfile.mkdtemp(prefix="ngcx-bench-registry-", dir=self.parent))
        (self.folder / "storage").mkdir()
        self.port = free_port()
        config = self.folder / "config.yml"
        config.write_text(CONFIG.format(storage=self.folder / "storage", addr=self.address))
        log = (self.folder / "registry.log").open("wb")
        self.process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(OSError):
                if request(self.address, "GET", "/v2/")[0] == 200:
                    return
            time.sleep(0.1)
        tail = (self.folder / "registry.log").read_text(errors="replace")[-600:]
        self.stop()
        raise RuntimeError(f"{REGISTRY_BIN} on {self.address} did not answer /v2/ within {wait:.0f} s: {tail}")

    def stop(self) -> None:
        """End the process this object started (by its pid) and delete its storage (idempotent)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def stored_bytes(self) -> int:
        """Bytes of every blob the registry holds: what crossed the wire into it, headers aside."""
        blobs = (self.folder / "storage") if self.folder else None
        if blobs is None or not blobs.is_dir():
            return 0
        return sum(p.stat().st_size for p in blobs.rglob("data") if p.is_file())


# ----------------------------------------------------------------------------- HTTP API


def request(address: str, method: str, path: str, body: bytes | Iterable[bytes] | None = None,
            headers: dict[str, str] | None = None, timeout: float = 600.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request to the registry; (status, headers, body). An iterable body is sent chunked."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        chunked = body is not None and not isinstance(body, bytes)
        conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _expect(status: int, want: int, what: str, body: bytes) -> None:
    if status != want:
        raise RuntimeError(f"registry: {what} answered HTTP {status}: {body[:300].decode('utf-8', 'replace')}")


def _next(location: str) -> str:
    """A Location header as a path with query (the registry answers absolute URLs or paths)."""
    parts = urllib.parse.urlsplit(location)
    return parts.path + (f"?{parts.query}" if parts.query else "")


@dataclass
class Upload:
    """What one blob upload sent: its digest and bytes (the compressed size, what crossed the wire)."""

    digest: str = ""
    size: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)

    def counted(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if chunk:
                self.hasher.update(chunk)
                self.size += len(chunk)
                yield chunk
        self.digest = "sha256:" + self.hasher.hexdigest()


def push_blob(address: str, repository: str, chunks: Iterable[bytes]) -> Upload:
    """Upload one blob as a single streamed PATCH, then commit it under the digest seen while sending."""
    status, headers, body = request(address, "POST", f"/v2/{repository}/blobs/uploads/")
    _expect(status, 202, "starting an upload", body)
    upload = Upload()
    status, headers, body = request(address, "PATCH", _next(headers["location"]), body=upload.counted(chunks),
                                    headers={"Content-Type": "application/octet-stream"})
    _expect(status, 202, "the blob's PATCH", body)
    location = _next(headers["location"])
    joiner = "&" if "?" in location else "?"
    status, _, body = request(address, "PUT", f"{location}{joiner}digest={urllib.parse.quote(upload.digest)}",
                              body=b"", headers={"Content-Length": "0"})
    _expect(status, 201, f"committing blob {upload.digest}", body)
    return upload


def push_manifest(address: str, repository: str, tag: str, manifest: dict[str, Any]) -> str:
    """PUT the manifest under tag; its digest (sha256 of the exact bytes sent)."""
    data = json.dumps(manifest, separators=(",", ":")).encode()
    status, _, body = request(address, "PUT", f"/v2/{repository}/manifests/{tag}", body=data,
                              headers={"Content-Type": manifest["mediaType"]})
    _expect(status, 201, f"the manifest of {repository}:{tag}", body)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest(address: str, repository: str, tag: str) -> dict[str, Any]:
    """The manifest the registry serves for repository:tag (Docker v2 or OCI)."""
    status, _, body = request(address, "GET", f"/v2/{repository}/manifests/{tag}", headers={"Accept": ACCEPT})
    _expect(status, 200, f"GET manifest {repository}:{tag}", body)
    return json.loads(body)


def image_manifest(config: bytes, layers: list[tuple[str, int]], codec: str) -> dict[str, Any]:
    """A manifest for config + (digest, size) layers: Docker v2 with gzip layers (what dockerd pushes), or
    OCI with zstd or uncompressed ("none") layers (Docker v2 has no zstd type; OCI names the plain tar)."""
    oci = {"zstd": OCI_ZSTD_LAYER, "none": OCI_TAR_LAYER}
    kinds = (OCI_MANIFEST, OCI_CONFIG, oci[codec]) if codec in oci else (DOCKER_MANIFEST, DOCKER_CONFIG,
                                                                        DOCKER_GZIP_LAYER)
    return {"schemaVersion": 2, "mediaType": kinds[0],
            "config": {"mediaType": kinds[1], "size": len(config),
                       "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
            "layers": [{"mediaType": kinds[2], "size": size, "digest": digest} for digest, size in layers]}


def wire_bytes(served: dict[str, Any]) -> int:
    """Compressed bytes of an image as served: every layer plus the config (the manifest itself aside)."""
    return sum(int(layer["size"]) for layer in served["layers"]) + int(served["config"]["size"])
