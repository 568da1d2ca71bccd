"""State and file faults (issue 8): each is one clear line, no traceback, nothing half-done, and the
NEXT run recovers without manual cleanup.

Real faults only: a state DB overwritten with garbage or cut in half, another process holding the DB
exclusively, folders on read-only or full tmpfs mounts (tests run as root, and root ignores
permission bits, so a mount is the honest way to make a folder unwritable), a registry whose
storage is a 1 MB tmpfs, and `ngcx base bootstrap` killed with SIGKILL mid-debootstrap.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import missing, run_ngcx, serve_registry

pytestmark = pytest.mark.docker

CUDA_REF = "cuda:24.05"  # the cheap, cached build that test_build.py makes too
MIRROR = os.environ.get("NGCX_BASE_MIRROR", "http://deb.debian.org/debian")


# ----------------------------------------------------------------------------- helpers


def one_error_line(proc: subprocess.CompletedProcess[str], *needles: str, code: int = 2,
                   after_progress: bool = False) -> str:
    """The run failed with `code`, no traceback, and stderr is one `ngcx: error:` line holding every needle
    (after_progress: push's per-layer progress bars may precede it; the error is still the last line)."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-800:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if after_progress:
        assert [ln for ln in lines if ln.startswith("ngcx:")] == lines[-1:], proc.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("ngcx: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    print(f"  {' '.join(proc.args[3:6])}: {lines[0]}")  # the figures in the report
    return lines[0]


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, *options: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted on `folder` (ENOSPC / EROFS for real); unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        missing(f"cannot mount a tmpfs here ({mounted.stderr.strip()[:120]}); these faults need root + mount")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def builds(state_dir: Path) -> list[tuple]:
    db = state_dir / "state.db"
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT tag, image_id FROM builds").fetchall()


def pushes(state_dir: Path) -> list[tuple]:
    db = state_dir / "state.db"
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT tag, remote_ref, digest FROM pushes").fetchall()


def image_absent(docker_client, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(ref)
    except ImageNotFound:
        return True
    return False


@pytest.fixture
def scratch_tag(docker_client) -> Iterator[str]:
    """A unique test tag, removed afterwards (only the tag: the cached layers stay)."""
    tag = f"ngcx-test/faults:{os.getpid()}-{time.monotonic_ns() % 10**6}"
    yield tag
    with contextlib.suppress(Exception):
        docker_client.images.remove(tag, noprune=True)


# ----------------------------------------------------------------------------- corrupt / future / locked DB


def _damage(db: Path, how: str) -> bytes:
    if how == "garbage":
        db.write_bytes(os.urandom(8192))
    else:  # truncated mid-file, as a full disk or a killed copy leaves it
        with db.open("r+b") as handle:
            handle.truncate(db.stat().st_size // 2)
    return db.read_bytes()


def _fill_store(state_dir: Path) -> None:
    """Enough rows that the store spans many pages, so cutting it in half really breaks it."""
    code = ("from ngcx.state import db as state\n"
            "for n in range(300): state.record_push(tag=f't{n}', remote_ref='r', digest='sha256:' + 'ab' * 32)")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "NGCX_STATE_DIR": str(state_dir)})


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_corrupt_state_db_is_moved_aside_with_one_warning_and_images_works(docker_client, isolated_state, how):
    _fill_store(isolated_state["state"])
    damaged = _damage(isolated_state["state"] / "state.db", how)

    first = run_ngcx("images", "--json")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert json.loads(first.stdout) == []  # stdout stays clean JSON
    warning = [ln for ln in first.stderr.splitlines() if ln.strip()]
    moved = [p for p in isolated_state["state"].glob("state.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(warning) == 1 and warning[0].startswith("ngcx: warning: ") and len(moved) == 1, first.stderr
    assert str(moved[0]) in warning[0] and moved[0].read_bytes() == damaged  # nothing lost silently
    print(f"  corrupt ({how}): {warning[0]}")

    again = run_ngcx("images", "--json")
    assert again.returncode == 0 and again.stderr == "" and json.loads(again.stdout) == []


def test_build_on_a_corrupt_state_db_warns_once_and_records_in_a_fresh_one(base_image, isolated_state, scratch_tag):
    _fill_store(isolated_state["state"])
    _damage(isolated_state["state"] / "state.db", "truncated")
    result = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", scratch_tag, "--progress", "quiet")
    assert result.returncode == 0, result.stderr[-2000:]
    assert sum(ln.startswith("ngcx: warning: state database") for ln in result.stderr.splitlines()) == 1
    assert [tag for tag, _ in builds(isolated_state["state"])] == [scratch_tag]


def test_state_db_from_a_newer_ngcx_is_refused_untouched_before_any_build(docker_client, isolated_state, scratch_tag):
    """Not moved aside: a newer ngcx's deployments table may track billed instances. The fix is an upgrade."""
    run_ngcx("images")
    db = isolated_state["state"] / "state.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
    before = db.read_bytes()
    one_error_line(run_ngcx("images"), str(db), "schema version 99", "upgrade ngcx")
    one_error_line(run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", scratch_tag), "schema version 99")
    assert db.read_bytes() == before and not list(db.parent.glob("state.db.corrupt-*"))
    assert image_absent(docker_client, scratch_tag)  # refused before the build, not after it


def test_locked_state_db_is_one_line_then_the_next_run_works(docker_client, isolated_state, scratch_tag):
    run_ngcx("images")
    db = isolated_state["state"] / "state.db"
    code = ("import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA locking_mode=EXCLUSIVE'); c.execute('BEGIN EXCLUSIVE')\n"
            "c.execute(\"INSERT INTO builds (image, release, variant, tag, image_id, built_at)"
            " VALUES ('x','1','runtime','x','sha256:x',0)\")\n"
            "print('held', flush=True); time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        env = {"NGCX_STATE_LOCK_TIMEOUT": "1"}
        started = time.monotonic()
        one_error_line(run_ngcx("images", env=env), str(db), "locked by another ngcx process", "run the command again")
        one_error_line(run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", scratch_tag, env=env),
                       "locked by another ngcx process")
        assert time.monotonic() - started < 20  # failed after the timeout, before any build
        assert image_absent(docker_client, scratch_tag)
    finally:
        holder.kill()
        holder.wait()
    after = run_ngcx("images", "--json")
    assert after.returncode == 0 and json.loads(after.stdout) == [] and after.stderr == ""


# ----------------------------------------------------------------------------- unwritable folders


def test_state_dir_under_a_regular_file_is_one_line(docker_client, tmp_path):
    (tmp_path / "a-file").write_text("")
    where = tmp_path / "a-file" / "state"
    one_error_line(run_ngcx("images", env={"NGCX_STATE_DIR": str(where)}), str(where), "Not a directory",
                   "NGCX_STATE_DIR")


def test_read_only_state_dir_is_one_line_and_the_next_run_recovers(docker_client, tmp_path):
    state_dir = tmp_path / "ro-state"
    with tmpfs(state_dir, "1m", "ro"):
        one_error_line(run_ngcx("images", env={"NGCX_STATE_DIR": str(state_dir)}), str(state_dir),
                       "not writable", "NGCX_STATE_DIR")
    assert run_ngcx("images", env={"NGCX_STATE_DIR": str(state_dir)}).returncode == 0  # writable again


def test_config_dir_under_a_regular_file_is_one_line(tmp_path, isolated_state):
    (tmp_path / "a-file").write_text("")
    where = tmp_path / "a-file" / "config"
    one_error_line(run_ngcx("render", CUDA_REF, env={"NGCX_CONFIG_DIR": str(where)}), str(where),
                   "Not a directory", "NGCX_CONFIG_DIR")


def test_login_into_a_read_only_docker_config_is_one_line_without_the_password(auth_registry, tmp_path,
                                                                              isolated_state):
    host, user, password = auth_registry
    config_dir = tmp_path / "ro-docker-config"
    with tmpfs(config_dir, "1m", "ro"):
        proc = run_ngcx("login", host, "-u", user, "--password-stdin", input=password,
                        env={"DOCKER_CONFIG": str(config_dir)})
        one_error_line(proc, str(config_dir / "config.json"), "Read-only file system", "nothing was stored")
        assert password not in proc.stdout + proc.stderr
    ok = run_ngcx("login", host, "-u", user, "--password-stdin", input=password, env={"DOCKER_CONFIG": str(config_dir)})
    assert ok.returncode == 0, ok.stderr


# ----------------------------------------------------------------------------- full disks


def test_state_db_on_a_full_disk_is_one_line(docker_client, tmp_path):
    state_dir = tmp_path / "full-state"
    with tmpfs(state_dir, "8k"):
        one_error_line(run_ngcx("images", env={"NGCX_STATE_DIR": str(state_dir)}),
                       "no space left", str(state_dir / "state.db"), "NGCX_STATE_DIR")
        subprocess.run(["mount", "-o", "remount,size=1m", str(state_dir)], check=True)  # free space
        again = run_ngcx("images", "--json", env={"NGCX_STATE_DIR": str(state_dir)})
        assert again.returncode == 0 and json.loads(again.stdout) == [], again.stderr  # recovers by itself


def test_full_disk_for_the_build_context_is_one_line_then_a_retry_builds(docker_client, base_image, tmp_path,
                                                                       scratch_tag):
    state_dir = tmp_path / "small-state"
    env = {"NGCX_STATE_DIR": str(state_dir)}
    with tmpfs(state_dir, "128k"):
        # the first write a build makes there: the offline base's pin (render/basepin.py), else the context
        line = one_error_line(run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", scratch_tag, env=env),
                              "no space left on device", "KB free")
        assert (str(state_dir / "bases.json") in line) or (
            str(state_dir / "contexts" / "cuda-24.05-runtime") in line and "needs about" in line), line
        assert not (state_dir / "contexts").exists() or not any((state_dir / "contexts").iterdir())  # no partial
        assert builds(state_dir) == [] and image_absent(docker_client, scratch_tag)
        subprocess.run(["mount", "-o", "remount,size=2m", str(state_dir)], check=True)  # free space
        retry = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", scratch_tag, "--progress", "quiet", env=env)
        assert retry.returncode == 0, retry.stderr[-2000:]
        assert [tag for tag, _ in builds(state_dir)] == [scratch_tag]


def _small_image(docker_client, tag: str) -> None:
    """A one-layer image of 3 MB of random bytes (incompressible): bigger than the 1 MB registry disk."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        blob = os.urandom(3_000_000)
        info = tarfile.TarInfo("blob")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    repository, _, image_tag = tag.rpartition(":")
    docker_client.api.import_image_from_data(data.getvalue(), repository=repository, tag=image_tag)


def test_push_to_a_registry_with_a_full_disk_is_one_line_then_a_retry_pushes(docker_client, tmp_path,
                                                                             isolated_state, scratch_tag):
    """The engine retries a failing layer upload 5 times (about 50 s) before it gives up: that is dockerd's
    own policy (--max-upload-attempts), the same for `docker push`; ngcx then says it in one line."""
    _small_image(docker_client, scratch_tag)
    with tmpfs(tmp_path / "data", "1m"), serve_registry(tmp_path) as host:
        proc = run_ngcx("push", scratch_tag, "--registry", host, timeout=300)
        one_error_line(proc, f"push of {host}/faults:", "failed", "storage full", after_progress=True)
        assert pushes(isolated_state["state"]) == []
        assert not [t for t in docker_client.images.get(scratch_tag).tags if t.startswith(host)]  # no dangling tag
        subprocess.run(["mount", "-o", "remount,size=64m", str(tmp_path / "data")], check=True)  # free space
        retry = run_ngcx("push", scratch_tag, "--registry", host, timeout=300)
        assert retry.returncode == 0, retry.stderr[-2000:]
        [(tag, remote, digest)] = pushes(isolated_state["state"])
        assert tag == scratch_tag and remote.startswith(f"{host}/faults:") and retry.stdout.strip().endswith(digest)


# ----------------------------------------------------------------------------- interrupted bootstrap


def _wait_for(predicate, what: str, proc: subprocess.Popen, limit: float = 90) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert proc.poll() is None, f"bootstrap ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {limit} s"
        time.sleep(0.1)


def _processes_naming(text: str) -> list[str]:
    """Command lines (whole, from /proc: ps truncates) of live, non-zombie processes containing `text`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in args and ") Z " not in (proc / "stat").read_text():
                found.append(args)
    return found


def test_bootstrap_killed_mid_debootstrap_is_recovered_by_the_next_run(docker_client, isolated_state, tmp_path,
                                                                       request):
    """SIGKILL (no cleanup can run) leaves a half-made root and an orphaned debootstrap still writing
    into it. The next run must reclaim both by itself; SIGTERM during its `docker import` must then
    leave no root, no process and no half-made tag. (The re-run stops at the import, ~25 s, rather than
    finishing: test_base.py already proves a whole bootstrap.)"""
    if os.geteuid() != 0 or not Path("/usr/sbin/debootstrap").exists():
        missing("ngcx base bootstrap needs root and debootstrap")
    tag = f"ngcx/base:test-faults-{os.getpid()}"
    workdir = tmp_path / "work"
    cmd = [sys.executable, "-m", "ngcx", "base", "bootstrap", "--tag", tag, "--mirror", MIRROR,
           "--workdir", str(workdir)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: list(workdir.glob("*/rootfs/var/cache/apt/archives/*.deb")), "download", first)
    first.kill()
    first.communicate(timeout=30)
    [stale] = list(workdir.iterdir())  # what SIGKILL leaves: the precondition of this test

    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    request.addfinalizer(lambda: [docker_client.images.remove(image.id, force=True)
                                  for image in docker_client.images.list(name=tag)])
    try:
        _wait_for(lambda: _processes_naming(f"tar --numeric-owner --xattrs -C {workdir}/"), "docker import", second,
                  limit=240)
        assert not stale.exists() and not _processes_naming(str(stale))  # reclaimed by the next run
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    # 130 = interrupted (typer turns the KeyboardInterrupt into Exit(130) before main() could print a line)
    assert second.returncode == 130 and "Traceback" not in err, (second.returncode, err)
    assert f"removed {stale}, left by an interrupted bootstrap" in err, err
    assert list(workdir.iterdir()) == [] and str(workdir) not in Path("/proc/mounts").read_text()
    assert not _processes_naming(str(workdir) + "/")  # no orphan debootstrap / tar left
    assert not docker_client.images.list(name=tag)  # the interrupted import made no tag
