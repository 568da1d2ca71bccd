"""Each deployment's endpoint key: made here, shown once, kept only in a 0600 file of the state folder.

Why files and not the state database: a state row is read by every `ngcx deployments` command, shown
by `--json` and copied into bug reports; a key there would leak. The host gets only the key's SHA-256
(recipes/deploy/host.sh.j2 writes it into the file ngcx-runtime's --auth-keys-file reads), which
cannot be replayed as the key. 256 random bits, URL-safe base64 (RFC 6750's b64token alphabet, so
it travels in `Authorization: Bearer` unquoted), with an `ngcx_` prefix that secret scanners and
people recognise.

Files, under STATE/keys/ (0700): ID.key (the key), ID.next (a rotation's new key until the host has
it: an interrupted rotate-key is resumed, not lost), ID.pem (the host's TLS certificate, public),
ID.auth/keys (a local deploy's hashes file, mounted read-only into its container). A service's key is
s<ID>.key (cli/deploy/service.py): every replica of the service accepts it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

PREFIX = "ngcx_"


def folder() -> Path:
    from ..core import paths

    path = paths.state_dir() / "keys"
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    """The SHA-256 hex of a key: all that a host ever holds."""
    return hashlib.sha256(key.encode()).hexdigest()


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic, and never readable by others for a moment (created 0600, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def create(deployment: int | str) -> str:
    """A fresh key for a new deployment, saved before any host hears of its hash."""
    key = new_key()
    _write(folder() / f"{deployment}.key", key + "\n")
    return key


def get(deployment: int | str) -> str | None:
    return _read(folder() / f"{deployment}.key")


def pending(deployment: int | str) -> str | None:
    """The new key of a rotation that has not finished (None when none is in progress)."""
    return _read(folder() / f"{deployment}.next")


def begin_rotation(deployment: int | str) -> str:
    """The new key of a rotation (an unfinished rotation's, when there is one), saved as ID.next."""
    key = pending(deployment) or new_key()
    _write(folder() / f"{deployment}.next", key + "\n")
    return key


def finish_rotation(deployment: int | str) -> None:
    """ID.next becomes ID.key: from now on the old key is forgotten here."""
    os.replace(folder() / f"{deployment}.next", folder() / f"{deployment}.key")


def save_certificate(deployment: int | str, pem: str) -> Path:
    path = folder() / f"{deployment}.pem"
    _write(path, pem.strip() + "\n", 0o644)
    return path


def certificate_path(deployment: int | str) -> Path | None:
    path = folder() / f"{deployment}.pem"
    return path if path.is_file() else None


def forget(deployment: int | str) -> None:
    """Delete a deployment's key files (it is destroyed or replaced: the key opens nothing any more)."""
    import shutil

    for suffix in ("key", "next", "pem"):
        (folder() / f"{deployment}.{suffix}").unlink(missing_ok=True)
    shutil.rmtree(folder() / f"{deployment}.auth", ignore_errors=True)   # local/verbs.py's mounted hashes


def kept() -> set[int]:
    """The deployments that have files here."""
    return {int(p.name.split(".")[0]) for p in folder().iterdir() if p.name.split(".")[0].isdigit()}


def hashes_text(deployment: int | str, keys: list[str]) -> str:
    """The --auth-keys-file content for a host: one SHA-256 per accepted key."""
    return digests_text(deployment, [digest(k) for k in keys])


def digests_text(deployment: int | str, digests: list[str] | tuple[str, ...]) -> str:
    return f"# ngcx deployment {deployment}: SHA-256 of each accepted key\n" + "".join(d + "\n" for d in digests)


def write_local_hashes(deployment: int | str, text: str) -> Path:
    """STATE/keys/ID.auth/keys, a local deploy's hashes file (its folder is mounted into the container, so
    a rewrite by rename is seen there; a mounted file would keep the old inode)."""
    folder_ = folder() / f"{deployment}.auth"
    folder_.mkdir(mode=0o700, exist_ok=True)
    _write(folder_ / "keys", text)
    return folder_
