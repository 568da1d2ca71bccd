"""An image reference in the registry, and the registry calls signing and verifying make on its repository.

Why its own module: sign, attest and verify all start from the same three facts (registry host, repository,
digest) and the same credentials; verify runs before every deploy (issue 48: <= 0.3 s on loopback), so
credentials are read only when the registry asks for them (a 401): the docker SDK that reads them costs
more than the whole check against an open registry. cosign's tag schema (specs/SIGNATURE_SPEC.md,
"Tag-based Discovery"): the digest `sha256:HEX` is found at the tag `sha256-HEX.sig` (signatures) and
`sha256-HEX.att` (attestations) in the image's own repository.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UserError
from ..registry import api
from ..registry.credentials import Credentials

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
REF_HINT = "give HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST], e.g. 127.0.0.1:5000/team/pytorch:25.08-runtime"


def sig_tag(digest: str) -> str:
    """cosign's signature tag for a digest: sha256:abc -> sha256-abc.sig."""
    return digest.replace(":", "-") + ".sig"


def att_tag(digest: str) -> str:
    """cosign's attestation tag for a digest: sha256:abc -> sha256-abc.att."""
    return digest.replace(":", "-") + ".att"


@dataclass(frozen=True)
class ImageRef:
    host: str
    repository: str          # the path under the host: team/pytorch
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """HOST/REPOSITORY, what cosign writes as the payload's docker-reference."""
        return f"{self.host}/{self.repository}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse_ref(ref: str) -> ImageRef:
    """'127.0.0.1:5000/team/x:tag' or '...@sha256:...' -> ImageRef; anything else one UserError line.

    The first component must be a registry (has '.' or ':' or is localhost): a signature lives in a registry,
    so a local-only name like ngcx/pytorch:25.08 cannot be verified.
    """
    typed = ref
    ref = ref.strip()
    name, _, digest = ref.partition("@")
    if digest and not DIGEST.fullmatch(digest):
        raise UserError(f"image {typed!r}: {digest!r} is not a sha256:<64 hex> digest", hint=REF_HINT)
    host, _, path = name.partition("/")
    if not path or not ("." in host or ":" in host or host == "localhost"):
        raise UserError(f"image {typed!r} names no registry", hint=REF_HINT)
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not api.TAG.fullmatch(tag):
            raise UserError(f"image {typed!r}: {tag!r} is not a valid tag", hint=REF_HINT)
    api.split_registry(f"{host}/{path}")  # Docker's grammar for the host and each path component
    if not tag and not digest:
        tag = "latest"
    return ImageRef(host, path, tag, digest or None)


@dataclass
class Repo:
    """One repository on one registry; credentials fetched on the first 401 (or given, as push has them)."""

    host: str
    repository: str
    creds: Credentials | None = None
    _asked: bool = field(default=False, repr=False)

    @classmethod
    def of(cls, ref: ImageRef, creds: Credentials | None = None) -> Repo:
        return cls(ref.host, ref.repository, creds, creds is not None)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self.host, self.repository, *args, self.creds)
        except UserError as exc:
            if self._asked or "HTTP 401" not in exc.message:
                raise
        self._login()
        return fn(self.host, self.repository, *args, self.creds)

    def _login(self) -> None:
        from ..registry.credentials import stored_credentials

        self._asked = True
        self.creds = stored_credentials(self.host)

    def resolve(self, ref: ImageRef) -> str | None:
        """The digest a tag points at now (or the digest given, if the registry has it)."""
        reference = ref.digest or ref.tag or "latest"
        found = self.manifest(reference)
        if found is None and not self._asked and self.creds is None:
            # a private registry may answer 404 (not 401) to an anonymous pull: ask once with stored credentials
            self._login()
            if self.creds is not None:
                found = self.manifest(reference)
        return found[1] if found else None

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        return self._call(api.get_manifest, reference)

    def manifest_json(self, reference: str) -> dict[str, Any] | None:
        found = self.manifest(reference)
        return json.loads(found[0]) if found else None

    def blob(self, digest: str) -> bytes | None:
        """The blob, or None when absent or when its bytes do not hash to `digest` (an edited blob)."""
        data = self._call(api.get_blob, digest)
        if data is None or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            return None
        return data

    def put_blob(self, data: bytes) -> str:
        return self._call(api.put_blob, data)

    def put_manifest(self, tag: str, body: bytes, media_type: str = OCI_MANIFEST) -> str:
        return self._call(api.put_manifest, tag, body, media_type)


def artifact_manifest(repo: Repo, layers: list[dict[str, Any]]) -> bytes:
    """An OCI image manifest holding `layers` (descriptors of blobs already uploaded), as cosign writes one.

    cosign builds its .sig/.att images on go-containerregistry's empty image: an OCI manifest whose config is
    an image config listing each layer's digest as its diff_id (the layers are stored uncompressed), os and
    architecture empty. The config is uploaded here.
    """
    config = {"architecture": "", "created": "0001-01-01T00:00:00Z", "history": [{"created": "0001-01-01T00:00:00Z"}],
              "os": "", "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
              "config": {}}
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    config_digest = repo.put_blob(config_bytes)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "size": len(config_bytes), "digest": config_digest},
                "layers": layers}
    return json.dumps(manifest, separators=(",", ":")).encode()


def layer(repo: Repo, data: bytes, media_type: str, annotations: dict[str, str]) -> dict[str, Any]:
    """Upload `data` and return its layer descriptor (mediaType, size, digest, annotations)."""
    digest = repo.put_blob(data)
    return {"mediaType": media_type, "size": len(data), "digest": digest, "annotations": annotations}
