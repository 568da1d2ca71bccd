"""Behind `ngcx base`: bootstrap an offline base image from a Debian mirror (debootstrap -> docker import).

Why: behind a firewall (or in mainland China) Docker Hub is often unreachable, yet a Debian
mirror almost always is. `ngcx base bootstrap` builds the equivalent of debian:<suite>-slim from
a mirror only, so `ngcx build --base ngcx/base:bookworm` works with no registry at all. The
image carries OCI labels saying which suite and mirror it came from (never mirror credentials).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import deque
from pathlib import Path

from ..core.errors import UserError

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_REPO = "ngcx/base"
VARIANTS = ("minbase", "buildd", "default")
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")
LABEL_SUITE = "ai.ngcx.base.suite"
LABEL_MIRROR = "ai.ngcx.base.mirror"
LABEL_VARIANT = "ai.ngcx.base.variant"
ROOT_PREFIX = "ngcx-base-"  # temp root filesystems under --workdir: ngcx-base-<suite>-<random>
OWNER_FILE = "ngcx-owner.pid"  # in each: the pid of the ngcx that made it (stale once that is gone)

# Same trimming as the official debian:*-slim images (debuerreotype's slimify): docs, man pages and
# translations are excluded now and for every package installed later in the image.
DPKG_SLIM = """\
# ngcx base: keep images small, like debian:*-slim
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
APT_CLEAN = """\
# ngcx base: no .deb files or package lists left in image layers
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""
# NAME:TAG where NAME may carry a registry host:port; the tag is after the last colon, no '/' in it.
TAG_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def check_inputs(suite: str, mirror: str, tag: str, variant: str) -> None:
    """Everything we can reject in milliseconds, before the 30 s debootstrap starts."""
    if os.geteuid() != 0:
        raise UserError("ngcx base bootstrap must run as root (debootstrap creates device nodes "
                        "and chowns files)", hint="run it with sudo, or as root")
    if not shutil.which("debootstrap"):
        raise UserError("debootstrap is not installed", hint="apt-get install debootstrap")
    if variant not in VARIANTS:
        raise UserError(f"unknown --variant {variant!r}", hint=f"use one of: {', '.join(VARIANTS)}")
    if not re.fullmatch(r"[a-z][a-z0-9-]*", suite) or not (DEBOOTSTRAP_SCRIPTS / suite).exists():
        known = sorted(p.name for p in DEBOOTSTRAP_SCRIPTS.glob("*") if p.name in (
            "bullseye", "bookworm", "trixie", "sid", "stable", "testing", "unstable"))
        raise UserError(f"unknown Debian suite {suite!r} (debootstrap has no script for it)",
                        hint=f"use one of: {', '.join(known) or 'bookworm'}")
    try:
        scheme = urllib.parse.urlsplit(mirror).scheme
    except ValueError:  # e.g. an unclosed '[' of an IPv6 address
        scheme = ""
    if scheme not in ("http", "https", "file"):
        raise UserError(f"--mirror {public_url(mirror)!r} is not an http(s):// or file:// URL",
                        hint=f"e.g. --mirror {DEFAULT_MIRROR}")
    if not TAG_RE.fullmatch(tag):  # not match(): '$' would accept a trailing newline
        raise UserError(f"--tag {tag!r} is not a valid image reference NAME:TAG",
                        hint=f"e.g. --tag {BASE_REPO}:{suite}")


def public_url(url: str) -> str:
    """The URL without user:password, safe for labels, logs and error messages.

    Textual, never raising: urlsplit() refuses some URLs a user can type (a bad port, an unclosed
    IPv6 '['), and this runs while reporting exactly such a mistake. The user-info is everything up
    to the last '@' of the authority (as urlsplit reads it), with or without a scheme.
    """
    return _USERINFO.sub(lambda m: m["prefix"] or "", url, count=1)


_USERINFO = re.compile(r"^(?P<prefix>[A-Za-z][A-Za-z0-9+.-]*://|//)?[^/?#]*@")


def check_mirror(mirror: str, suite: str) -> None:
    """Fetch dists/SUITE/Release so a dead mirror or a missing suite fails in seconds, not minutes."""
    import urllib.error
    import urllib.request

    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    request = urllib.request.Request(url, method="GET")
    parts = urllib.parse.urlsplit(mirror)
    if parts.username:
        import base64

        token = base64.b64encode(f"{urllib.parse.unquote(parts.username)}:"
                                 f"{urllib.parse.unquote(parts.password or '')}".encode()).decode()
        request = urllib.request.Request(public_url(url), headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            resp.read(64)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise UserError(f"suite {suite!r} not found on mirror {public_url(mirror)} "
                            f"(no dists/{suite}/Release)", hint="check --suite and --mirror") from None
        raise UserError(f"mirror {public_url(mirror)} answered HTTP {exc.code} for dists/{suite}/Release",
                        hint="check --mirror (and http_proxy/https_proxy)") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"mirror {public_url(mirror)} is unreachable: {reason}",
                        hint="check --mirror and your proxy settings (http_proxy/https_proxy)") from None


def bootstrap(client, *, suite: str, mirror: str, tag: str, variant: str, slim: bool, workdir: Path):
    """Build the root filesystem and import it; the temp dir is removed whatever happens."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        reclaim_stale_roots(workdir)
        root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{suite}-", dir=workdir))
    except OSError as exc:
        raise UserError(f"cannot use --workdir {workdir}: {exc.strerror}",
                        hint="pass --workdir a writable folder with ~400 MB free") from None
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        (root / OWNER_FILE).write_text(f"{os.getpid()}\n")
        run_debootstrap(root / "rootfs", suite=suite, mirror=mirror, variant=variant, tag=tag)
        finish_rootfs(root / "rootfs", slim=slim, mirror=mirror)
        image = import_rootfs(client, root / "rootfs", tag=tag, labels=image_labels(suite, mirror, variant))
        record_pin(tag, image.id)
        return image
    finally:
        signal.signal(signal.SIGTERM, previous)
        remove_tree(root)


def record_pin(tag: str, image_id: str) -> None:
    """Record which image `tag` is now (render/basepin.py): builds FROM it refuse another image under that tag."""
    from ..render import basepin

    try:
        basepin.record(tag, image_id)
    except OSError as exc:
        raise UserError(f"made {tag} ({image_id[:19]}), but cannot record its pin in the state folder: "
                        f"{exc.strerror}", hint="set NGCX_STATE_DIR to a writable folder and bootstrap again") from None


def reclaim_stale_roots(workdir: Path) -> None:
    """Remove root filesystems left by a bootstrap that was killed (SIGKILL, OOM, power loss).

    Why: SIGINT/SIGTERM clean up in bootstrap()'s finally, but a killed ngcx leaves its temp root
    (~300 MB, maybe with /proc mounted in it) and an orphaned debootstrap still writing into it. A
    root is stale when the ngcx named in its owner file is gone; its processes are killed, its
    mounts released, then it is deleted, so the next run recovers with no manual cleanup.
    """
    for root in sorted(workdir.glob(f"{ROOT_PREFIX}*")):
        if not root.is_dir() or _owner_alive(root):
            continue
        _kill_processes_in(root)
        remove_tree(root)
        print(f"ngcx: removed {root}, left by an interrupted bootstrap", file=sys.stderr)


def _owner_alive(root: Path) -> bool:
    """True while the ngcx that made `root` still runs (no owner file yet: only if just made)."""
    try:
        pid = int((root / OWNER_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time() - root.stat().st_mtime < 60
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"ngcx" in cmdline


def _kill_processes_in(root: Path) -> None:
    """SIGKILL every process whose command line names `root` or whose root/cwd is inside it (an
    orphaned debootstrap and what it runs chrooted), until none is left (bounded)."""
    real = str(root.resolve())
    for _ in range(20):
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                args = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                links = [os.readlink(proc / name) for name in ("root", "cwd")]
            except OSError:
                continue
            if real in args or any(link == real or link.startswith(real + "/") for link in links):
                found.append(int(proc.name))
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _raise_interrupt(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def run_debootstrap(target: Path, *, suite: str, mirror: str, variant: str, tag: str) -> None:
    """Run debootstrap, showing its current step; on failure one line plus the full log on disk."""
    from rich.console import Console

    from ..core import paths

    log_path = paths.state_dir() / "logs" / f"base-{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
    except OSError as exc:
        raise UserError(f"cannot write the debootstrap log {log_path}: {exc.strerror}",
                        hint="free space there, or set NGCX_STATE_DIR to a writable folder") from None
    cmd = ["debootstrap"]
    if variant != "default":
        cmd.append(f"--variant={variant}")
    cmd += [suite, str(target), mirror]
    tail: deque[str] = deque(maxlen=30)
    console = Console(stderr=True)
    with log_path.open("w") as log, console.status(f"debootstrap {suite} ...") as status:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line.replace(mirror, public_url(mirror)))
                tail.append(line.strip())
                if line.startswith(("I:", "W:", "E:")):
                    status.update(f"debootstrap {suite}: {line[3:].strip()[:90]}")
            code = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if code != 0:
        errors = [t for t in tail if t.startswith("E:")] or [t for t in tail if t] or ["no output"]
        reason = errors[-1].replace(mirror, public_url(mirror))[:200]
        raise UserError(f"debootstrap {suite} failed (exit {code}): {reason}", hint=f"full log: {log_path}")


def finish_rootfs(rootfs: Path, *, slim: bool, mirror: str = "") -> None:
    """Drop caches and (with slim) docs/man/locales, and make later apt installs stay small.

    debootstrap writes the mirror URL as given into /etc/apt/sources.list; user:password in it
    would end up in the image layer, so the credentials are stripped here.
    """
    sources = rootfs / "etc/apt/sources.list"
    if mirror and sources.is_file() and public_url(mirror) != mirror:
        sources.write_text(sources.read_text().replace(mirror, public_url(mirror)))
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*",
                    "var/log/*.log", "var/log/apt/*"):
        for path in rootfs.glob(pattern):
            if path.is_file() and not path.is_symlink():
                path.unlink()
    (rootfs / "etc/apt/apt.conf.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)
    if not slim:
        return
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(DPKG_SLIM)
    for folder in ("usr/share/man", "usr/share/info", "usr/share/groff", "usr/share/lintian"):
        _empty_dir(rootfs / folder)
    locale = rootfs / "usr/share/locale"
    if locale.is_dir():
        for child in locale.iterdir():
            if child.name != "locale.alias":
                _remove(child)
    doc = rootfs / "usr/share/doc"
    if doc.is_dir():
        for path in sorted(doc.rglob("*"), reverse=True):
            if path.name == "copyright" or (path.is_dir() and not path.is_symlink()):
                if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                    path.rmdir()
                continue
            path.unlink()


def _empty_dir(folder: Path) -> None:
    if folder.is_dir():
        for child in folder.iterdir():
            _remove(child)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def image_labels(suite: str, mirror: str, variant: str) -> dict[str, str]:
    """OCI labels saying what this base is; the mirror without credentials."""
    return {
        "org.opencontainers.image.title": f"ngcx offline base (Debian {suite})",
        "org.opencontainers.image.description": f"debootstrap --variant={variant} {suite} from a mirror",
        "org.opencontainers.image.created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.version": suite,
        "org.opencontainers.image.vendor": "ngcx",
        "org.opencontainers.image.source": public_url(mirror),
        LABEL_SUITE: suite,
        LABEL_MIRROR: public_url(mirror),
        LABEL_VARIANT: variant,
    }


def import_rootfs(client, rootfs: Path, *, tag: str, labels: dict[str, str]):
    """Stream `tar -C rootfs -c .` into the engine's image import (no tarball on disk)."""
    import json

    changes = ['CMD ["bash"]', "ENV LANG=C.UTF-8"]
    changes += [f"LABEL {key}={json.dumps(value)}" for key, value in labels.items()]
    repository, _, image_tag = tag.rpartition(":")
    tar = subprocess.Popen(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-c", "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert tar.stdout is not None
        result = client.api.import_image(src=tar.stdout, repository=repository, tag=image_tag,
                                         changes=changes, stream_src=True)
    finally:
        if tar.poll() is None:
            tar.kill()
        _, err = tar.communicate()
    if tar.returncode != 0:
        raise UserError(f"tar of the root filesystem failed: {err.decode(errors='replace').strip()[:200]}")
    if '"error"' in str(result):
        raise UserError(f"docker import of {tag} failed: {str(result)[:200]}")
    return client.images.get(tag)


def remove_tree(root: Path) -> None:
    """Unmount anything debootstrap left mounted inside `root` (proc, sys), then delete it.

    Why: an interrupted debootstrap can leave /proc or /sys mounted in the target; deleting
    through such a mount would walk into the host's /proc or /sys.
    """
    real = str(root.resolve())
    mounts = []
    with open("/proc/mounts") as handle:
        for line in handle:
            point = line.split()[1].replace("\\040", " ")
            if point == real or point.startswith(real + "/"):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
