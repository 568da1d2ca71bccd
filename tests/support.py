"""Shared test helpers: the real Docker Engine, the loopback registry, secret canaries (fixtures: conftest.py).

Why not in conftest.py: tests import these by name, and `conftest` is the module name of every conftest.py
(tests/runtime/ has its own), so `from support import X` found whichever was collected last.

Skip rule: a test that needs Docker or a registry is skipped WITH the reason when none is there
(a laptop without dockerd), but FAILS when CI=true or NGCX_REQUIRE_DOCKER=1, so CI can never go
green by silently skipping the integration tests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

LOOPBACK_REGISTRY = "127.0.0.1:5000"
BASE_IMAGE = "ngcx/base:bookworm"


PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


def aliyun_sdk_on(monkeypatch: pytest.MonkeyPatch, endpoint: str, access_key: str, secret: str) -> None:
    """ngcx's Aliyun clients (ngcx.clouds.aliyun.Api) go to the ECS emulator at `endpoint` with this key pair;
    no proxy is left set (the SDK sends even 127.0.0.1 through HTTP(S)_PROXY: it ignores NO_PROXY)."""
    for name, value in {"ALIBABA_CLOUD_ACCESS_KEY_ID": access_key, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": secret,
                        "NGCX_ALIYUN_ECS_ENDPOINT": endpoint}.items():
        monkeypatch.setenv(name, value)
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


@contextlib.contextmanager
def quick_ecs(hosts: Any, access_key: str, secret: str) -> Iterator[Any]:
    """The ECS emulator on `hosts` (a HostBackend) accepting one key pair, its instances Running 0.05 s after a
    create or start, its metadata service on loopback: what the deploy tests that drive the SDK need."""
    from emulators.aliyun_ecs import EcsEmulator

    with EcsEmulator(hosts, access_keys={access_key: secret}, boot_seconds=0.05, start_seconds=0.05,
                     metadata_host="127.0.0.1") as emulator:
        yield emulator


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


def ctrl_c_able() -> None:
    """preexec_fn for a child that a test interrupts with SIGINT: SIGINT back to its default action.
    A suite started in the background by a script (nohup, or `&` without job control) hands SIGINT down
    ignored, and a Python started so never turns SIGINT into KeyboardInterrupt: the child would sleep
    through the test's Ctrl-C. A terminal's Ctrl-C always finds the default action, as here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _v2_status(host: str) -> int | None:
    import requests

    try:
        return requests.get(f"http://{host}/v2/", timeout=3).status_code
    except requests.RequestException:
        return None


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


# ----------------------------------------------------------------------------- secrets (issue 8)

CLOUD_SECRET_VARS = ("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "AWS_SECRET_ACCESS_KEY")
CLOUD_TOKEN_VARS = ("ALIBABA_CLOUD_SECURITY_TOKEN", "AWS_SESSION_TOKEN")


def host_ca_bundle() -> Path:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return Path(os.environ[var])
    return Path("/etc/ssl/certs/ca-certificates.crt")


def marker_ca_bundle(folder: Path) -> tuple[Path, list[str]]:
    """The host's CA bundle plus one freshly made CA; returns (bundle, 4 base64 body lines unique to it)."""
    key, crt = folder / "marker.key", folder / "marker.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN=ngcx-leak-test-{secrets.token_hex(4)}", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    body = [ln for ln in crt.read_text().splitlines() if ln and not ln.startswith("-----")]
    bundle = folder / "bundle.pem"
    bundle.write_text(host_ca_bundle().read_text() + "\n" + crt.read_text())
    key.unlink()
    return bundle, body[2:6]  # past the fixed header bytes: random key material and serial


@dataclass(frozen=True)
class SecretCanaries:
    """Unique secrets a test hands to ngcx; none may ever come back out of anything ngcx writes.

    Each is minted per test, so a hit can only be a leak by the code under test. Reusable by any
    command's test (deploy will take the cloud ones from the same environment variables).
    """

    ca_bundle: Path
    ca_lines: tuple[str, ...]
    registry_user: str
    registry_password: str
    pip_password: str
    cloud_secret: str
    cloud_token: str

    def pip_index_url(self, host: str = "pypi.org") -> str:
        return f"https://ngcxuser:{self.pip_password}@{host}/simple"

    def cloud_env(self) -> dict[str, str]:
        """The cloud credentials as the official SDKs read them (key ids are not secret, the rest is)."""
        env = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI5tNGCXCANARYKEYID", "AWS_ACCESS_KEY_ID": "AKIANGCXCANARYKEYID0"}
        env.update({var: self.cloud_secret for var in CLOUD_SECRET_VARS})
        env.update({var: self.cloud_token for var in CLOUD_TOKEN_VARS})
        return env

    def registry_auth_b64(self) -> str:
        """How docker stores the registry login in config.json `auths` (base64 of user:password)."""
        return base64.b64encode(f"{self.registry_user}:{self.registry_password}".encode()).decode()

    def needles(self) -> dict[str, str]:
        """label -> string to search for: every secret plainly, plus its Basic-auth base64 form."""
        found = {f"CA body line {i}": line for i, line in enumerate(self.ca_lines[:2], 1)}
        found.update({
            "registry password": self.registry_password,
            "registry user:password (base64)": self.registry_auth_b64(),
            "pip index password": self.pip_password,
            "pip user:password (base64)": base64.b64encode(f"ngcxuser:{self.pip_password}".encode()).decode(),
            "cloud AccessKey secret": self.cloud_secret,
            "cloud security token": self.cloud_token,
        })
        return found


class SecretScan:
    """Searches everything it is shown for the canaries; counts the places it looked.

    A "place" is one stream, file, table, image layer file or image document. Hits name the place
    and the canary's label, never the secret itself (so a failing assert does not leak it either).
    """

    def __init__(self, needles: dict[str, str]) -> None:
        self.needles = {label: value.encode() for label, value in needles.items()}
        self.places = 0
        self.bytes_scanned = 0
        self.layers_skipped = 0
        self.hits: list[str] = []

    def data(self, where: str, blob: bytes | str, skip: tuple[str, ...] = ()) -> None:
        raw = blob.encode() if isinstance(blob, str) else blob
        self.places += 1
        self.bytes_scanned += len(raw)
        self.hits += [f"{where}: {label}" for label, needle in self.needles.items()
                      if label not in skip and needle in raw]

    def file(self, path: Path, skip: tuple[str, ...] = ()) -> None:
        self.data(str(path), path.read_bytes(), skip)

    def tree(self, folder: Path) -> None:
        """Every regular file under `folder` (links are not followed)."""
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.is_symlink():
                self.file(path)

    def sqlite(self, db: Path) -> list[str]:
        """Every row of every table, as values; returns the table names (the raw file is tree()'s)."""
        import sqlite3

        with contextlib.closing(sqlite3.connect(db)) as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for table in tables:
                rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
                self.data(f"{db.name} table {table} ({len(rows)} rows)", repr(rows))
        return tables

    def process(self, name: str, proc: subprocess.CompletedProcess[str]) -> None:
        self.data(f"{name} stdout", proc.stdout)
        self.data(f"{name} stderr", proc.stderr)

    def image(self, docker_client, ref: str, workdir: Path, older_layers: frozenset[str] = frozenset()) -> None:
        """Every file of every layer, the config, the manifest, `docker history` and the inspect JSON.

        older_layers: diff IDs that existed before the canaries were minted (see local_layers()); they
        cannot hold a canary, so they are counted as skipped instead of being read (a cached 2 GB CUDA
        layer). The saved image is streamed to disk, never held in memory.
        """
        import tarfile

        attrs = docker_client.api.inspect_image(ref)
        diff_ids = attrs["RootFS"]["Layers"]
        self.layers_skipped += sum(1 for d in diff_ids if d in older_layers)
        self.data(f"docker inspect {ref}", json.dumps(attrs))
        history = subprocess.run(["docker", "history", "--no-trunc", ref], capture_output=True, text=True)
        self.data(f"docker history {ref}", history.stdout + history.stderr)
        if all(d in older_layers for d in diff_ids):
            return
        saved = workdir / "image.tar"
        with saved.open("wb") as out:
            for chunk in docker_client.images.get(ref).save(named=True):
                out.write(chunk)
        try:
            with tarfile.open(saved) as outer:
                manifest = json.load(outer.extractfile("manifest.json"))
                skip = {path for item in manifest for path, diff in zip(item["Layers"], diff_ids, strict=True)
                        if diff in older_layers}
                for member in outer.getmembers():
                    if not member.isfile() or member.name in skip:
                        continue
                    handle = outer.extractfile(member)
                    if member.name.endswith("layer.tar"):
                        with tarfile.open(fileobj=handle) as layer:
                            for item in layer.getmembers():
                                if item.isfile():
                                    self.data(f"{ref} {member.name}:{item.name}", layer.extractfile(item).read())
                    else:
                        self.data(f"{ref} {member.name}", handle.read())
        finally:
            saved.unlink()

    def summary(self) -> str:
        skipped = f", {self.layers_skipped} image layers older than the canaries skipped" if self.layers_skipped else ""
        return (f"{self.places} places scanned ({self.bytes_scanned / 1e6:.1f} MB{skipped}) for "
                f"{len(self.needles)} canaries: found {len(self.hits)} times")


def local_layers(docker_client) -> frozenset[str]:
    """Diff IDs of every layer of every local image now: layers that cannot hold canaries minted later."""
    return frozenset(d for image in docker_client.images.list(all=True)
                     for d in image.attrs.get("RootFS", {}).get("Layers", []))
