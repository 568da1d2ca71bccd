"""Shared helpers for talking to the Docker Engine, the docker CLI and OCI registries.

Why one module: base, build, push, login and doctor all need the same three things — an engine
client that fails with one clear line when dockerd is down, the user's docker credentials (read
exactly the way `docker login` stores them, credential helpers included), and plain HTTP calls to
a registry's /v2/ API (reachability, manifest digests) with the Basic/Bearer auth dance.
Heavy imports (docker SDK, requests) stay inside functions so `ngcx --help` stays fast.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ngcx.errors import UserError

ENGINE_HINT = "start it with scripts/setup.sh, or: nohup dockerd >/var/log/ngcx-dockerd.log 2>&1 &"

# What we accept when asking a registry for a manifest: the formats `docker push` produces.
MANIFEST_ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
))

DOCKER_HUB = "docker.io"


def engine_client(timeout: int = 600) -> Any:
    """A docker SDK client that has answered a ping; UserError (one line) when the engine is down."""
    import docker
    from docker.errors import DockerException

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as exc:
        reason = _short_reason(str(exc))
        raise UserError(f"Docker Engine not reachable at {host}: {reason}", hint=ENGINE_HINT) from None
    return client


def _short_reason(text: str) -> str:
    """The most telling fragment of a docker/requests error, kept to one line."""
    for pattern in (r"Connection refused", r"No such file or directory", r"Permission denied",
                    r"timed out", r"Name or service not known"):
        if re.search(pattern, text, re.IGNORECASE):
            return pattern.lower()
    return text.splitlines()[0][:160] if text else "unknown error"


def image_or_none(client: Any, ref: str) -> Any:
    """The local image `ref`, or None when it does not exist locally."""
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


def docker_cli() -> str | None:
    """Path of a docker CLI able to run `DOCKER_BUILDKIT=1 docker build` without buildx.

    Why not just `docker` from PATH: a newer CLI (>= 23) refuses DOCKER_BUILDKIT=1 without the
    buildx plugin, while the Debian docker.io CLI (20.10) drives BuildKit itself. We take the
    first CLI on PATH that has buildx or is a 20.10-era client. $NGCX_DOCKER_CLI overrides.
    """
    override = os.environ.get("NGCX_DOCKER_CLI")
    if override:
        return override
    seen: set[str] = set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / "docker"
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            continue
        real = str(candidate.resolve())
        if real in seen:
            continue
        seen.add(real)
        if _cli_drives_buildkit(str(candidate)):
            return str(candidate)
    return shutil.which("docker")


def _cli_drives_buildkit(cli: str) -> bool:
    """True when `cli` can run BuildKit builds: buildx present, or a client older than 23."""
    try:
        buildx = subprocess.run([cli, "buildx", "version"], capture_output=True, timeout=10)
        if buildx.returncode == 0:
            return True
        out = subprocess.run([cli, "version", "--format", "{{.Client.Version}}"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return False
    match = re.match(r"(\d+)\.", out)
    return bool(match) and int(match.group(1)) < 23


# ---------------------------------------------------------------- credentials (docker config)

def docker_config_path() -> Path:
    """Where `docker login` keeps credentials: $DOCKER_CONFIG/config.json or ~/.docker/config.json."""
    folder = os.environ.get("DOCKER_CONFIG")
    return (Path(folder) if folder else Path.home() / ".docker") / "config.json"


def read_docker_config() -> dict[str, Any]:
    path = docker_config_path()
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text() or "{}")
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON (line {exc.lineno})",
                        hint="fix or remove the file, then log in again") from None


def write_docker_config(config: dict[str, Any]) -> Path:
    """Write the docker config atomically with mode 0600 (it may hold base64 passwords)."""
    path = docker_config_path()
    tmp = path.with_name(path.name + ".ngcx-tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle, indent="\t")
            handle.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as exc:  # full or read-only disk: the old file stays whole, no half-written copy
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UserError(f"cannot write the docker credentials file {path}: {exc.strerror}",
                        hint="free space or fix permissions there, or set DOCKER_CONFIG to a writable "
                             "folder; nothing was stored") from None
    return path


def credential_helper(config: dict[str, Any], registry: str) -> str | None:
    """The credential helper configured for `registry` (credHelpers wins over credsStore)."""
    helpers = config.get("credHelpers") or {}
    return helpers.get(registry) or config.get("credsStore") or None


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def stored_credentials(registry: str) -> Credentials | None:
    """Credentials `docker login` (or `ngcx login`) stored for `registry`, through helpers too."""
    import docker.auth
    from docker.errors import DockerException

    try:
        auth = docker.auth.load_config(config_path=str(docker_config_path()))
        entry = auth.resolve_authconfig(registry)
    except DockerException as exc:
        raise UserError(f"cannot read credentials for {registry}: {_short_reason(str(exc))}",
                        hint=f"run: ngcx login {registry}") from None
    if not entry:
        return None
    user = entry.get("Username") or entry.get("username")
    secret = entry.get("Password") or entry.get("password")
    if not user or secret is None:
        return None
    return Credentials(user, secret)


def auth_field(creds: Credentials) -> str:
    return base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


# ---------------------------------------------------------------- registry HTTP API

# Docker's reference grammar (distribution/reference): a registry host[:port], then lowercase path
# components, then a tag. Checked here so a typo is one line now, not an HTTP error later.
REGISTRY_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                           r"|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


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
                 timeout: float = 10.0) -> Any:
    """One request to a registry's /v2 API, answering a Basic or Bearer challenge with `creds`.

    Returns the requests.Response (status codes are the caller's business); raises UserError
    when the registry cannot be reached at all.
    """
    import requests

    url = registry_base_url(host) + path
    try:
        resp = requests.request(method, url, headers=headers or {}, timeout=timeout)
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("basic") and creds:
            return requests.request(method, url, headers=headers or {}, timeout=timeout,
                                    auth=(creds.username, creds.password))
        if challenge.lower().startswith("bearer"):
            token = _bearer_token(challenge, creds, scope, timeout)
            if token:
                merged = dict(headers or {}, Authorization=f"Bearer {token}")
                return requests.request(method, url, headers=merged, timeout=timeout)
        return resp
    except requests.RequestException as exc:
        raise UserError(f"registry {host} is not reachable at {registry_base_url(host)}: "
                        f"{_short_reason(str(exc))}",
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


def human_size(num: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num) < 1000 or unit == "TB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1000
    return f"{num:.1f} TB"
