"""The Docker Engine and the docker CLI: one place that knows how to reach them.

Why one module: base, build, test, run, push, images, doctor and the project commands all need an
engine client that fails with one clear line when dockerd is down (not a 40-line traceback), and
build, run and doctor need the one docker CLI on PATH that drives BuildKit without buildx.
Heavy imports (docker SDK) stay inside functions so `ngcx --help` stays fast.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .errors import UserError

ENGINE_HINT = "start it with scripts/setup.sh, or: nohup dockerd >/var/log/ngcx-dockerd.log 2>&1 &"


def engine_client(timeout: int = 600) -> Any:
    """A docker SDK client that has answered a ping; UserError (one line) when the engine is down."""
    import docker
    from docker.errors import DockerException

    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except DockerException as exc:
        reason = short_reason(str(exc))
        raise UserError(f"Docker Engine not reachable at {host}: {reason}", hint=ENGINE_HINT) from None
    return client


def image_labels(ref: str) -> dict[str, str] | None:
    """The labels of the local image `ref` (a tag or an id), or None when the engine has no such image.

    Why not the docker SDK here: a redeploy onto a running host reads one image's labels, and the SDK's import
    (requests, its API mixins) and ping cost ~0.23 s of that redeploy's ~3 s on this project's 2-core machine
    (cProfile of `python -m bench.suites.deploy_phases --running-only`); one GET /images/REF/json on the
    engine's unix socket costs milliseconds. An engine reached another way (DOCKER_HOST=tcp://, ssh://, TLS)
    goes through the SDK, which knows those transports."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://") or os.environ.get("DOCKER_TLS_VERIFY"):
        image = image_or_none(engine_client(), ref)
        return None if image is None else dict(image.labels or {})
    status, body = _unix_get(host[len("unix://"):], f"/images/{quote(ref, safe='/:')}/json", host)
    if status == 404:
        return None
    if status != 200:
        raise UserError(f"Docker Engine at {host} answered {status} for image {ref}: {short_reason(body)}",
                        hint=ENGINE_HINT)
    return dict((json.loads(body).get("Config") or {}).get("Labels") or {})


def _unix_get(path: str, url: str, host: str, timeout: float = 30.0) -> tuple[int, str]:
    """(status, body) of one GET to the engine's API on the unix socket at `path`."""
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)

    conn = UnixConnection("localhost", timeout=timeout)
    try:
        conn.request("GET", url)
        reply = conn.getresponse()
        return reply.status, reply.read().decode("utf-8", "replace")
    except OSError as exc:
        raise UserError(f"Docker Engine not reachable at {host}: {short_reason(str(exc))}",
                        hint=ENGINE_HINT) from None
    finally:
        conn.close()


def short_reason(text: str) -> str:
    """The most telling fragment of a docker/requests error, kept to one line.

    Public because the engine, the credentials store and the registry API all turn their SDK's
    multi-line errors into the same one-line reasons."""
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


def containers(client: Any, filters: dict[str, Any]) -> list[Any]:
    """Every container matching `filters`, stopped ones too, leaving out those removed while listing.

    docker-py's `containers.list` inspects each listed container in turn and raises NotFound when one is removed
    between the list and its inspect (another deploy's cleanup, a rolling update's old replica); that race failed
    CI once (tests/e2e/test_deploy_local.py). A container gone by then is simply not there any more.
    """
    from docker.errors import NotFound

    found = []
    for row in client.api.containers(all=True, filters=filters):
        try:
            found.append(client.containers.get(row["Id"]))
        except NotFound:
            continue
    return found


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
