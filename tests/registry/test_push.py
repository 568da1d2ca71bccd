"""`ngcx push`: the registry ends up serving exactly the digest the engine pushed."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import socket
import stat

import pytest
import requests

from ngcx.state import db as state
from support import run_ngcx

pytestmark = pytest.mark.docker

ACCEPT = ("application/vnd.docker.distribution.manifest.v2+json, "
          "application/vnd.oci.image.manifest.v1+json")


def _registry_digest(host: str, repo: str, tag: str, auth: tuple[str, str] | None = None) -> str:
    resp = requests.head(f"http://{host}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT},
                         auth=auth, timeout=10)
    assert resp.status_code == 200, resp.status_code
    return resp.headers["Docker-Content-Digest"]


def _pushed_ref(stdout: str) -> tuple[str, str]:
    """Last stdout line is REPO:TAG@DIGEST."""
    ref, _, digest = stdout.strip().splitlines()[-1].partition("@")
    assert digest.startswith("sha256:"), stdout
    return ref, digest


def _remove(client, ref: str) -> None:
    with contextlib.suppress(Exception):
        client.images.remove(ref, noprune=True)


def test_push_to_loopback_registry_then_pull_back(docker_client, registry, base_image, isolated_state):
    namespace = f"ngcx-test-{secrets.token_hex(4)}"
    remote = f"{registry}/{namespace}/base:bookworm"
    try:
        proc = run_ngcx("push", base_image, "--registry", f"{registry}/{namespace}")
        assert proc.returncode == 0, proc.stderr
        ref, digest = _pushed_ref(proc.stdout)
        assert ref == remote
        assert _registry_digest(registry, f"{namespace}/base", "bookworm") == digest
        local = docker_client.images.get(base_image)
        assert f"{registry}/{namespace}/base@{digest}" in local.attrs["RepoDigests"]
        pushes = state.list_pushes(base_image)
        assert [(p.remote_ref, p.digest) for p in pushes] == [(remote, digest)]
        # per-layer progress was shown
        assert any(word in proc.stderr for word in ("Pushed", "already exists", "Mounted from"))

        docker_client.images.remove(remote, noprune=True)
        pulled = docker_client.images.pull(f"{registry}/{namespace}/base", tag="bookworm")
        assert pulled.id == local.id
    finally:
        _remove(docker_client, remote)


def test_push_to_auth_registry_needs_login_and_hides_password(docker_client, auth_registry, base_image,
                                                               isolated_state):
    host, user, password = auth_registry
    remote = f"{host}/base:bookworm"
    try:
        before = run_ngcx("push", base_image, "--registry", host)
        assert before.returncode == 2
        assert before.stderr.strip().splitlines() == [before.stderr.strip()]
        assert "ngcx login" in before.stderr
        assert not docker_client.images.list(name=f"{host}/base")

        login = run_ngcx("login", host, "--username", user, "--password-stdin", input=password + "\n")
        assert login.returncode == 0, login.stderr
        config_path = isolated_state["docker_config"] / "config.json"
        assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
        entry = json.loads(config_path.read_text())["auths"][host]
        assert base64.b64decode(entry["auth"]).decode() == f"{user}:{password}"

        proc = run_ngcx("push", base_image, "--registry", host)
        assert proc.returncode == 0, proc.stderr
        ref, digest = _pushed_ref(proc.stdout)
        assert ref == remote
        assert _registry_digest(host, "base", "bookworm", auth=(user, password)) == digest
        for out in (before, login, proc):
            assert password not in out.stdout + out.stderr

        docker_client.images.remove(remote, noprune=True)
        pulled = docker_client.images.pull(f"{host}/base", tag="bookworm",
                                           auth_config={"username": user, "password": password})
        assert pulled.id == docker_client.images.get(base_image).id
    finally:
        _remove(docker_client, remote)


def test_push_with_registry_down_is_one_line(docker_client, base_image, isolated_state):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    host = f"127.0.0.1:{port}"
    proc = run_ngcx("push", base_image, "--registry", host)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and host in lines[0] and "not reachable" in lines[0]
    assert not docker_client.images.list(name=f"{host}/base"), "no half-done remote tag left"
    assert state.list_pushes() == []


def test_push_unknown_image_is_one_line(registry, isolated_state):
    for ref in ("ngcx/nothing:here", "no-such-image-in-catalog"):
        proc = run_ngcx("push", ref, "--registry", registry)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert ref.split(":")[0] in proc.stderr


def test_push_bad_variant_is_one_line(registry, base_image, isolated_state):
    proc = run_ngcx("push", base_image, "--registry", registry, "--variant", "slim")
    assert proc.returncode == 2
    assert "--variant" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_push_refused_mid_way_leaves_no_remote_tag(docker_client, readonly_registry, base_image,
                                                   isolated_state):
    """The registry is up but refuses the upload: one line, exit 2, no local remote tag, no record."""
    proc = run_ngcx("push", base_image, "--registry", readonly_registry)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = [ln for ln in proc.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert len(error) == 1 and "push of" in error[0] and readonly_registry in error[0]
    assert "refuses uploads" in error[0]
    assert "Traceback" not in proc.stderr
    assert not docker_client.images.list(name=f"{readonly_registry}/base")
    assert state.list_pushes() == []
