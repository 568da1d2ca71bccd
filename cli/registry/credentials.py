"""The user's registry credentials, read and written exactly the way `docker login` keeps them.

Why one module: `ngcx login` writes them, push and doctor read them, and a deploy hands them to
the machine that pulls the image; all must agree with the docker CLI on the file
($DOCKER_CONFIG/config.json), its 0600 mode, and credential helpers (credHelpers / credsStore).
The docker SDK is imported inside functions so `ngcx --help` stays fast.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.engine import short_reason
from ..core.errors import UserError


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
        raise UserError(f"cannot read credentials for {registry}: {short_reason(str(exc))}",
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
