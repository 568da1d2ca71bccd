"""Plain HTTP calls to a registry's /v2/ API, and Docker's grammar for registry names.

Why one module: login proves credentials against /v2/, push reads the manifest digest back to
verify what it uploaded, doctor checks reachability, and deploy checks that a machine will be able
to pull; all of them need the same Basic/Bearer auth dance, the same HTTP-for-loopback rule, and
the same check that a typed registry name is valid before anything goes over the wire.
requests is imported inside functions so `ngcx --help` stays fast.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..core.engine import short_reason
from ..core.errors import UserError
from ..core.naming import PATH_COMPONENT as PATH_COMPONENT  # re-exported: the reference grammar
from ..core.naming import REGISTRY_HOST as REGISTRY_HOST
from ..core.naming import TAG as TAG
from .credentials import Credentials

# What we accept when asking a registry for a manifest: the formats `docker push` produces.
MANIFEST_ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
))

DOCKER_HUB = "docker.io"



def split_registry(target: str) -> tuple[str, str]:
    """'host:5000/team/x' -> ('host:5000', 'team/x'); the namespace part may be empty.

    Anything that is not HOST[:PORT][/NAMESPACE] in Docker's grammar is a UserError naming the bad part.
    """
    typed = target
    target = target.strip()
    for prefix in ("https://", "http://"):
        if target.startswith(prefix):
            target = target[len(prefix):]
    target = target.strip("/")
    while target.endswith("/v2") or target == "v2":  # all of them: 'h/v2/v2' -> 'h', as 'h/v2' -> 'h'
        target = target[:-2].rstrip("/")
    host, _, namespace = target.partition("/")
    hint = "pass e.g. --registry 127.0.0.1:5000/team"
    if not host or host == "v2":  # 'v2' alone is the API path of a registry typed without its host
        raise UserError("empty registry name", hint=hint)
    match = REGISTRY_HOST.fullmatch(host)
    if not match or int(match["port"] or 0) > 65535:
        raise UserError(f"registry {typed!r}: {host!r} is not a HOST[:PORT] (letters, digits, '.', '-', port "
                        "up to 65535)", hint=hint)
    bad = next((c for c in namespace.split("/") if not PATH_COMPONENT.fullmatch(c)), None) if namespace else None
    if bad is not None:
        raise UserError(f"registry {typed!r}: namespace part {bad!r} is not lowercase letters and digits "
                        "joined by '.', '_' or '-'", hint=hint)
    return host, namespace


def registry_base_url(host: str) -> str:
    """HTTP for loopback registries (Docker treats 127.0.0.0/8 as insecure), HTTPS elsewhere.

    $NGCX_INSECURE_REGISTRIES (comma-separated hosts) adds plain-HTTP registries, mirroring the
    daemon's insecure-registries setting.
    """
    bare = host.split(":")[0] if not host.startswith("[") else host.split("]")[0] + "]"
    insecure = {h.strip() for h in os.environ.get("NGCX_INSECURE_REGISTRIES", "").split(",") if h.strip()}
    if bare in ("localhost", "[::1]") or bare.startswith("127.") or host in insecure:
        return f"http://{host}"
    if host == DOCKER_HUB:
        return "https://registry-1.docker.io"
    return f"https://{host}"


def registry_get(host: str, path: str, *, creds: Credentials | None = None, method: str = "GET",
                 headers: dict[str, str] | None = None, scope: str | None = None,
                 timeout: float = 10.0, data: bytes | None = None) -> Any:
    """One request to a registry's /v2 API, answering a Basic or Bearer challenge with `creds`.

    `path` may also be a whole URL (an upload's Location header). `data` is the request body
    (blob and manifest uploads; sent again when a challenge is answered).
    Returns the requests.Response (status codes are the caller's business); raises UserError
    when the registry cannot be reached at all.
    """
    import requests

    url = path if path.startswith(("http://", "https://")) else registry_base_url(host) + path
    try:
        resp = requests.request(method, url, headers=headers or {}, timeout=timeout, data=data)
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("basic") and creds:
            return requests.request(method, url, headers=headers or {}, timeout=timeout, data=data,
                                    auth=(creds.username, creds.password))
        if challenge.lower().startswith("bearer"):
            token = _bearer_token(challenge, creds, scope, timeout)
            if token:
                merged = dict(headers or {}, Authorization=f"Bearer {token}")
                return requests.request(method, url, headers=merged, timeout=timeout, data=data)
        return resp
    except requests.RequestException as exc:
        raise UserError(f"registry {host} is not reachable at {registry_base_url(host)}: "
                        f"{short_reason(str(exc))}",
                        hint="check the address, or start the registry (scripts/setup.sh starts "
                             "127.0.0.1:5000)") from None


def _bearer_token(challenge: str, creds: Credentials | None, scope: str | None,
                  timeout: float) -> str | None:
    """Fetch a token from the realm named in a Bearer challenge (Docker Hub, Harbor, ACR...)."""
    import requests

    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    if scope:
        params["scope"] = scope
    auth = (creds.username, creds.password) if creds else None
    resp = requests.get(realm, params=params, auth=auth, timeout=timeout)
    if resp.status_code != 200:
        return None
    body = resp.json()
    return body.get("token") or body.get("access_token")


def registry_status(host: str, creds: Credentials | None = None, timeout: float = 5.0) -> int:
    """HTTP status of GET /v2/ (200 ok, 401 needs credentials); UserError when unreachable."""
    return registry_get(host, "/v2/", creds=creds, timeout=timeout).status_code


def manifest_digest(host: str, repository: str, tag: str, creds: Credentials | None) -> str | None:
    """The registry's Docker-Content-Digest for repository:tag (None when the tag is unknown)."""
    scope = f"repository:{repository}:pull"
    path = f"/v2/{repository}/manifests/{tag}"
    headers = {"Accept": MANIFEST_ACCEPT}
    resp = registry_get(host, path, creds=creds, method="HEAD", headers=headers, scope=scope)
    if resp.status_code == 200 and resp.headers.get("Docker-Content-Digest"):
        return resp.headers["Docker-Content-Digest"]
    resp = registry_get(host, path, creds=creds, headers=headers, scope=scope)
    if resp.status_code != 200:
        return None
    digest = resp.headers.get("Docker-Content-Digest")
    if digest:
        return digest
    import hashlib

    return "sha256:" + hashlib.sha256(resp.content).hexdigest()


# --- the few calls signing needs (trust/): read a manifest or blob, upload a blob, put a manifest --------------
# Why here and not in trust/: the auth dance and the HTTP-for-loopback rule above are the same for every /v2 call,
# and the OCI distribution spec's monolithic upload (POST, then PUT ?digest=) is plain registry API.


def get_manifest(host: str, repository: str, reference: str, creds: Credentials | None) -> tuple[bytes, str] | None:
    """(raw manifest bytes, its digest) for repository:reference (a tag or a digest); None when absent (404)."""
    import hashlib

    resp = registry_get(host, f"/v2/{repository}/manifests/{reference}", creds=creds,
                        headers={"Accept": MANIFEST_ACCEPT}, scope=f"repository:{repository}:pull")
    if resp.status_code == 404:
        return None
    _expect(resp, 200, f"GET manifest {repository}:{reference}", host)
    return resp.content, "sha256:" + hashlib.sha256(resp.content).hexdigest()


def get_blob(host: str, repository: str, digest: str, creds: Credentials | None) -> bytes | None:
    """The blob's bytes (None when absent); the caller checks them against `digest`."""
    resp = registry_get(host, f"/v2/{repository}/blobs/{digest}", creds=creds, scope=f"repository:{repository}:pull")
    if resp.status_code == 404:
        return None
    _expect(resp, 200, f"GET blob {digest[:19]} in {repository}", host)
    return resp.content


def put_blob(host: str, repository: str, data: bytes, creds: Credentials | None) -> str:
    """Upload `data` as one blob (skipped when the registry has it); returns its digest."""
    import hashlib

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    scope = f"repository:{repository}:pull,push"
    if registry_get(host, f"/v2/{repository}/blobs/{digest}", creds=creds, method="HEAD",
                    scope=scope).status_code == 200:
        return digest
    start = registry_get(host, f"/v2/{repository}/blobs/uploads/", creds=creds, method="POST", scope=scope,
                         data=b"")
    _expect(start, 202, f"start a blob upload to {repository}", host)
    location = start.headers.get("Location", "")
    if location.startswith("/"):
        location = registry_base_url(host) + location
    sep = "&" if "?" in location else "?"
    done = registry_get(host, f"{location}{sep}digest={digest}", creds=creds, method="PUT", scope=scope, data=data,
                        headers={"Content-Type": "application/octet-stream"})
    _expect(done, 201, f"upload a blob to {repository}", host)
    return digest


def put_manifest(host: str, repository: str, tag: str, body: bytes, media_type: str,
                 creds: Credentials | None) -> str:
    """PUT a manifest under `tag`; returns the digest the registry stored it as."""
    import hashlib

    resp = registry_get(host, f"/v2/{repository}/manifests/{tag}", creds=creds, method="PUT", data=body,
                        headers={"Content-Type": media_type}, scope=f"repository:{repository}:pull,push")
    _expect(resp, 201, f"PUT manifest {repository}:{tag}", host)
    return resp.headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()


def _expect(resp: Any, status: int, what: str, host: str) -> None:
    """One line naming the call and the registry's own error code when the answer is not `status`."""
    if resp.status_code == status:
        return
    detail = ""
    try:
        errors = resp.json().get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:200]
    except ValueError:
        detail = " ".join(resp.text.split())[:120]
    hint = f"run: ngcx login {host}" if resp.status_code in (401, 403) else "see the registry's logs"
    raise UserError(f"registry {host}: {what} answered HTTP {resp.status_code}" + (f" ({detail})" if detail else ""),
                    hint=hint)
