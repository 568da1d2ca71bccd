"""Bearer keys: the Authorization header's parser, the accepted key hashes, and the keys file's reload.

Why hashes: the server holds only SHA-256 hashes of the keys it accepts (--auth-key-sha256, a keys
file of hex lines), so a leaked process listing, config or file gives no key. A presented key is
hashed once and compared with hmac.compare_digest against EVERY accepted hash (no early exit),
so the time taken says nothing about which hash, or which prefix, came close. Keys are high
entropy tokens a deployer generates (`ngcx deploy` does); a plain hash is the right tool for
those, a password hash (bcrypt, scrypt) would cost milliseconds per request for nothing.

Why the parser is strict and small (bearer_token): it runs on every request from any peer before
anything else; it accepts `Bearer <token>` (scheme in any case, one or more spaces, RFC 6750's
b64token characters, at most MAX_TOKEN of them) and nothing else. Whatever else arrives, of any
length or bytes, is "no key" (the 401 path), never an exception.

Why a file that is re-read (KeyFile): key rotation without a restart, also in a container that
`ngcx deploy` configured through its environment. The deployer adds the new hash, waits until
the new key is accepted, then removes the old one; during the switch the file holds both, so no
request fails. The file is stat-ed at most every CHECK_INTERVAL_S, on the request that finds the
interval over (no thread; nothing when idle), and re-read when its (inode, mtime, size) changed.
A change younger than SETTLE_S is read on the next check instead (a writer rewriting the file in
place may not be done; replacing it by a rename is best), so a new key is accepted at most
CHECK_INTERVAL_S + SETTLE_S (0.5 s) after the file was written, plus the time to the next request.
At start a missing, unreadable or malformed file is one error line (exit 2); later, a malformed
or vanished file keeps the last good set and logs one line (no hash in it). An empty file
accepts no key: the server is locked, never open.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import RuntimeUserError

MAX_TOKEN = 512                  # characters of a bearer token; longer is "no key"
MAX_HEADER = 1024                # characters of an Authorization value looked at at all
CHECK_INTERVAL_S = 0.25          # the keys file is stat-ed at most this often
MAX_FILE_BYTES = 1 << 20         # a keys file larger than this (15,000 hashes) is a mistake
SETTLE_S = 0.25                  # a change younger than this is read on the next check
# RFC 6750 §2.1: credentials = "Bearer" 1*SP b64token; b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+"
# / "/" ) *"="; the scheme is case-insensitive (RFC 9110 §11.1)
_BEARER = re.compile(rf"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]{{1,{MAX_TOKEN}}}=*)")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def bearer_token(value: object) -> str | None:
    """The token of an `Authorization: Bearer <token>` value, or None for anything else (never raises)."""
    if not isinstance(value, str) or len(value) > MAX_HEADER:
        return None
    match = _BEARER.fullmatch(value.strip(" \t"))
    return match.group(1) if match else None


_SHA256 = hashlib.sha256()          # copied per key: cheaper than a new hash object (no algorithm look-up)


def digest(token: str) -> bytes:
    """The SHA-256 of a key as the server compares it (the key's ASCII bytes)."""
    h = _SHA256.copy()
    h.update(token.encode("ascii"))
    return h.digest()


def sha256_hex(key: str) -> str:
    """The hex SHA-256 a deployer writes into --auth-key-sha256 or a keys file for `key`."""
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def parse_hash(text: str, where: str) -> bytes:
    """One hex SHA-256 (64 hex digits, any case) as its 32 bytes; else one RuntimeUserError line naming
    `where` but never echoing the value (it may be a key pasted by mistake)."""
    text = text.strip()
    if not _HEX64.fullmatch(text):
        raise RuntimeUserError(f"{where} is not a SHA-256 in hex (64 hex digits, {len(text)} characters given); "
                               "give the hash of the key, e.g. `printf %s \"$KEY\" | sha256sum`, not the key")
    return bytes.fromhex(text)


def parse_hash_lines(text: str, where: str) -> frozenset[bytes]:
    """A keys file's content: one hex SHA-256 per line; blank lines and `#` comments (also after a hash) ignored."""
    out = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(parse_hash(line, f"{where} line {number}"))
    return frozenset(out)


def matches(presented: bytes, accepted: Iterable[bytes]) -> bool:
    """presented is one of accepted: compared with every one, in constant time, no early exit."""
    found = False
    for h in accepted:
        found |= hmac.compare_digest(presented, h)
    return found


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class KeyFile:
    """A keys file, re-read when it changed (see the module docstring); hashes() is the current set."""

    def __init__(self, path: str | Path, what: str, log: Callable[[str], None] | None = None):
        """Read the file now: a missing, unreadable or malformed one is a RuntimeUserError (exit 2).
        what: the flag that named it, for the lines (e.g. "--auth-keys-file")."""
        self.path = Path(path)
        self.what = what
        self.log = log or _stderr
        self._lock = threading.Lock()
        self._next_check = 0.0
        try:
            self._signature = self._stat()
            self._hashes = self._read()
        except OSError as exc:
            raise RuntimeUserError(f"{what} {self.path}: cannot read the keys file ({exc.strerror or exc}); "
                                   "write one hex SHA-256 of a key per line there, or drop the flag") from None
        self._pending: tuple[int, int, int] | None = None
        self._next_check = time.monotonic() + CHECK_INTERVAL_S

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read(self) -> frozenset[bytes]:
        """The file's hashes: a regular file of at most MAX_FILE_BYTES (not a device or a pipe that never ends)."""
        where = f"{self.what} {self.path}"
        if not stat.S_ISREG(os.stat(self.path).st_mode):          # checked before open: a pipe would block it
            raise RuntimeUserError(f"{where} is not a regular file; point it at a file of hex SHA-256 lines")
        with open(self.path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise RuntimeUserError(f"{where} is larger than {MAX_FILE_BYTES} bytes; it should hold one hex SHA-256 "
                                   "per line")
        return parse_hash_lines(data.decode("ascii", errors="replace"), where)

    def hashes(self) -> frozenset[bytes]:
        """The accepted hashes: stat-ed at most every CHECK_INTERVAL_S, re-read when changed."""
        if time.monotonic() >= self._next_check and self._lock.acquire(blocking=False):
            try:
                self._refresh()
            finally:
                self._next_check = time.monotonic() + CHECK_INTERVAL_S
                self._lock.release()
        return self._hashes

    def _refresh(self) -> None:
        try:
            signature = self._stat()
        except OSError as exc:
            if self._signature is not None:
                self.log(f"serve: {self.what} {self.path}: cannot read it ({exc.strerror or exc}); keeping the "
                         f"{len(self._hashes)} key(s) read before until it is back")
            self._signature = self._pending = None
            return
        if signature == self._signature:
            return
        young = time.time_ns() - signature[1] < SETTLE_S * 1e9
        if young and signature != self._pending:
            self._pending = signature           # possibly mid-write: read it on the next check
            return
        self._pending = None
        self._signature = signature
        try:
            hashes = self._read()
            if self._stat() != signature:       # changed while read: the next check reads it again
                self._signature = None
                return
        except (OSError, RuntimeUserError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            self.log(f"serve: {self.what}: the rewritten keys file is not valid ({why}); keeping the "
                     f"{len(self._hashes)} key(s) read before")
            return
        self._hashes = hashes
        self.log(f"serve: {self.what} {self.path} re-read: {len(hashes)} key(s) accepted"
                 + ("" if hashes else " (none: every guarded endpoint answers 401)"))


class KeySet:
    """The hashes given on the command line plus those of a keys file (None: no file)."""

    def __init__(self, hashes: Iterable[bytes] = (), file: KeyFile | None = None):
        self.fixed = frozenset(hashes)
        self.file = file

    @property
    def configured(self) -> bool:
        """Keys were asked for (hashes, or a file, even an empty one): the categories they guard are locked."""
        return bool(self.fixed) or self.file is not None

    def accepts(self, presented: bytes) -> bool:
        """presented (a key's SHA-256) is accepted: compared with every hash, constant time."""
        found = matches(presented, self.fixed)
        if self.file is not None:
            found |= matches(presented, self.file.hashes())
        return found
