"""Shared fixtures: the real Docker Engine, the loopback registry, a password-protected registry.

Skip rule: a test that needs Docker or a registry is skipped WITH the reason when none is there
(a laptop without dockerd), but FAILS when CI=true or NGCX_REQUIRE_DOCKER=1, so CI can never go
green by silently skipping the integration tests.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

LOOPBACK_REGISTRY = "127.0.0.1:5000"
BASE_IMAGE = "ngcx/base:bookworm"


def require_docker() -> bool:
    """True when missing Docker/registry/base must fail the test instead of skipping it."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("NGCX_REQUIRE_DOCKER") == "1"


def missing(reason: str) -> None:
    """Skip with `reason`, or fail with it where Docker is required (CI)."""
    if require_docker():
        pytest.fail(f"{reason} (required because CI=true or NGCX_REQUIRE_DOCKER=1; run scripts/setup.sh)")
    pytest.skip(reason)


def run_ngcx(*args: str, input: str | None = None, env: dict[str, str] | None = None,
             timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run the real `ngcx` command as a user would: exit code, stdout and stderr as seen."""
    return subprocess.run([sys.executable, "-m", "ngcx", *args], input=input, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client on the real engine (skip/fail with the reason when there is none)."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except DockerException as exc:
        missing(f"no Docker Engine reachable: {str(exc).splitlines()[0][:120]}")
    yield client
    client.close()


def _v2_status(host: str) -> int | None:
    import requests

    try:
        return requests.get(f"http://{host}/v2/", timeout=3).status_code
    except requests.RequestException:
        return None


@pytest.fixture(scope="session")
def registry(docker_client) -> str:
    """The unauthenticated loopback registry scripts/setup.sh starts on 127.0.0.1:5000."""
    if _v2_status(LOOPBACK_REGISTRY) != 200:
        missing(f"no registry answering http://{LOOPBACK_REGISTRY}/v2/ (scripts/setup.sh starts it)")
    return LOOPBACK_REGISTRY


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    """The offline base image (`ngcx base bootstrap`, run by scripts/setup.sh)."""
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(BASE_IMAGE)
    except ImageNotFound:
        missing(f"{BASE_IMAGE} not present (make it with: ngcx base bootstrap)")
    return BASE_IMAGE


@dataclass(frozen=True)
class AuthRegistry:
    host: str
    user: str
    password: str

    def __iter__(self):
        return iter((self.host, self.user, self.password))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_registry(folder: Path, extra_config: str = "", ready_status: int = 200,
                   storage_extra: str = "") -> Iterator[str]:
    """Run a real docker-registry on a free loopback port with its own storage; yields host:port."""
    binary = shutil.which("docker-registry")
    if not binary:
        missing("docker-registry (apt: docker-registry) not installed")
    host = f"127.0.0.1:{_free_port()}"
    config = folder / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n  delete:\n    enabled: true\n"
        + storage_extra + f"http:\n  addr: {host}\n" + extra_config)
    log_path = folder / "registry.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 20
            while _v2_status(host) != ready_status:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"registry did not start: {log_path.read_text()[-500:]}")
                time.sleep(0.1)
            yield host
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def auth_registry(docker_client, tmp_path: Path) -> Iterator[AuthRegistry]:
    """A real docker-registry with htpasswd (bcrypt) auth on a free loopback port, random password."""
    htpasswd = shutil.which("htpasswd")
    if not htpasswd:
        missing("htpasswd (apt: apache2-utils) not installed")
    user, password = "ngcx-test", secrets.token_urlsafe(18)
    line = subprocess.run([htpasswd, "-Bbn", user, password], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / "htpasswd").write_text(line + "\n")
    auth = f"auth:\n  htpasswd:\n    realm: ngcx-test\n    path: {tmp_path / 'htpasswd'}\n"
    with serve_registry(tmp_path, auth, ready_status=401) as host:
        yield AuthRegistry(host, user, password)


@pytest.fixture
def readonly_registry(docker_client, tmp_path: Path) -> Iterator[str]:
    """A real docker-registry in read-only maintenance mode: /v2/ answers, every push is refused."""
    readonly = "  maintenance:\n    readonly:\n      enabled: true\n"
    with serve_registry(tmp_path, storage_extra=readonly) as host:
        yield host


@pytest.fixture
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """State, config and docker credentials in temp dirs, so tests never touch the user's."""
    dirs = {name: tmp_path / f"isolated-{name}" for name in ("state", "config", "docker_config")}
    for folder in dirs.values():
        folder.mkdir(mode=0o700)
    monkeypatch.setenv("NGCX_STATE_DIR", str(dirs["state"]))
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(dirs["config"]))
    monkeypatch.setenv("DOCKER_CONFIG", str(dirs["docker_config"]))
    return dirs
