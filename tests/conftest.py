"""Fixtures every test folder shares (helpers they import by name live in support.py).

Skip rule: a test that needs Docker or a registry is skipped WITH the reason when none is there
(a laptop without dockerd), but FAILS when CI=true or NGCX_REQUIRE_DOCKER=1, so CI can never go
green by silently skipping the integration tests.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import (
    BASE_IMAGE,
    LOOPBACK_REGISTRY,
    AuthRegistry,
    SecretCanaries,
    _v2_status,
    marker_ca_bundle,
    missing,
    serve_registry,
)

# The emulated clouds of the deploy tests (session fixtures shared by tests/e2e/*): see tests/e2e/clouds.py.
pytest_plugins = ["e2e.clouds"]

def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run tests/e2e last. Its session clouds hold this process's one moto server (moto keeps one state per
    process: tests/emulators/aws_ec2.py) until the session ends, so the AWS double's own tests
    (tests/emulators/) must have run (and closed theirs) before the first e2e test starts it."""
    e2e = Path(__file__).parent / "e2e"
    items.sort(key=lambda item: Path(str(item.fspath)).is_relative_to(e2e))

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

@pytest.fixture
def secret_canaries(tmp_path: Path) -> SecretCanaries:
    folder = tmp_path / "canaries"
    folder.mkdir()
    bundle, lines = marker_ca_bundle(folder)
    mint = secrets.token_hex
    return SecretCanaries(ca_bundle=bundle, ca_lines=tuple(lines), registry_user="ngcx-test",
                          registry_password=f"regpw-{mint(12)}", pip_password=f"pippw-{mint(12)}",
                          cloud_secret=f"aksecret{mint(15)}", cloud_token=f"sts-{mint(24)}")
