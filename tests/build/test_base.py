"""`ngcx base bootstrap`: an offline base image from a Debian mirror, and clear refusals."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import ctrl_c_able, missing, run_ngcx

pytestmark = pytest.mark.docker

MIRROR = os.environ.get("NGCX_BASE_MIRROR", "http://deb.debian.org/debian")


def _needs_root_and_debootstrap() -> None:
    if os.geteuid() != 0:
        missing("ngcx base bootstrap needs root (debootstrap)")
    if not Path("/usr/sbin/debootstrap").exists():
        missing("debootstrap not installed (apt-get install debootstrap)")


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ngcx: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_bootstrap_builds_a_bookworm_image_with_labels(docker_client, isolated_state, tmp_path):
    _needs_root_and_debootstrap()
    tag = f"ngcx/base:test-{secrets.token_hex(4)}"
    workdir = tmp_path / "work"
    try:
        proc = run_ngcx("base", "bootstrap", "--tag", tag, "--mirror", MIRROR, "--workdir", str(workdir))
        assert proc.returncode == 0, proc.stderr[-2000:]
        image = docker_client.images.get(tag)
        assert image.id in proc.stdout and tag in proc.stdout and "MB" in proc.stdout
        os_release = docker_client.containers.run(tag, ["cat", "/etc/os-release"], remove=True).decode()
        assert "VERSION_CODENAME=bookworm" in os_release
        labels = image.labels
        assert labels["ai.ngcx.base.suite"] == "bookworm"
        assert labels["ai.ngcx.base.mirror"] == MIRROR
        assert labels["org.opencontainers.image.created"].endswith("Z")
        assert image.attrs["Config"]["Cmd"] == ["bash"]
        # slim like debian:bookworm-slim: no man pages, no package lists, no .debs in the layer
        script = "ls /usr/share/man /var/lib/apt/lists /var/cache/apt/archives | grep -c . || true"
        listing = docker_client.containers.run(tag, ["bash", "-c", script], remove=True).decode()
        assert int(listing.strip().splitlines()[-1]) <= 6, listing
        assert image.attrs["Size"] < 150e6
        assert list(workdir.iterdir()) == [], "temporary root filesystem left behind"
    finally:
        with contextlib.suppress(Exception):  # nothing to clean when the build failed
            docker_client.images.remove(tag, force=True)


def test_interrupted_bootstrap_leaves_nothing_behind(docker_client, isolated_state, tmp_path):
    """Ctrl-C in the middle of debootstrap: temp dir, mounts, processes and image all gone."""
    _needs_root_and_debootstrap()
    tag = f"ngcx/base:test-int-{secrets.token_hex(4)}"
    workdir = tmp_path / "work"
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "base", "bootstrap", "--tag", tag,
                             "--mirror", MIRROR, "--workdir", str(workdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_able)
    deadline = time.monotonic() + 60
    while not list(workdir.glob("*/rootfs/var/cache/apt/archives/*.deb")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "debootstrap never started downloading"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, "an interrupted bootstrap must not report success"
    assert "Traceback" not in err
    assert list(workdir.iterdir()) == []
    assert str(workdir) not in Path("/proc/mounts").read_text()
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if str(workdir) in line and not line.startswith("Z")]
    assert not docker_client.images.list(name=tag)


def test_unknown_suite_is_one_line(isolated_state):
    _needs_root_and_debootstrap()
    proc = run_ngcx("base", "bootstrap", "--suite", "bookwrom")
    _assert_one_line_error(proc, "bookwrom", "bookworm")


def test_unreachable_mirror_is_one_line_and_hides_credentials(docker_client, isolated_state, tmp_path):
    _needs_root_and_debootstrap()
    port = _dead_port()
    proc = run_ngcx("base", "bootstrap", "--mirror", f"http://mirroruser:s3cr3t-pw@127.0.0.1:{port}/debian",
                    "--tag", "ngcx/base:test-never", "--workdir", str(tmp_path / "w"))
    _assert_one_line_error(proc, "unreachable", f"127.0.0.1:{port}")
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    assert not docker_client.images.list(name="ngcx/base:test-never")
    assert not (tmp_path / "w").exists() or list((tmp_path / "w").iterdir()) == []


def test_suite_missing_on_mirror_is_one_line(docker_client, isolated_state):
    """A suite debootstrap knows but the mirror does not carry (e.g. an archived release)."""
    _needs_root_and_debootstrap()
    proc = run_ngcx("base", "bootstrap", "--suite", "bookworm", "--mirror", MIRROR.rstrip("/") + "-nothere")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_engine_down_is_one_line(isolated_state, tmp_path):
    _needs_root_and_debootstrap()
    proc = run_ngcx("base", "bootstrap", env={"DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    _assert_one_line_error(proc, "Docker Engine not reachable")


def test_bad_tag_and_variant_are_refused_before_any_work(isolated_state):
    _needs_root_and_debootstrap()
    _assert_one_line_error(run_ngcx("base", "bootstrap", "--tag", "Not A Tag"), "--tag")
    _assert_one_line_error(run_ngcx("base", "bootstrap", "--variant", "tiny"), "--variant")


def test_base_ls_lists_the_offline_base(base_image):
    proc = run_ngcx("base", "ls")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if base_image in line)
    assert "bookworm" in line.split()[3:]


def test_offline_base_labels_are_json_safe(docker_client, base_image):
    """Labels are plain strings a registry UI can show; no credentials, no newlines."""
    labels = docker_client.images.get(base_image).labels
    assert labels["ai.ngcx.base.suite"] == "bookworm"
    assert "@" not in labels["ai.ngcx.base.mirror"]
    json.dumps(labels)
    assert all("\n" not in v for v in labels.values())
