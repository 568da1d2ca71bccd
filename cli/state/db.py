"""SQLite state store: which images were built, pushed and deployed, and when.

Why SQLite: one file at paths.state_dir()/state.db, transactional (an interrupted deploy never
leaves a half-written record), readable with the sqlite3 CLI, no server. Every function opens
its own connection (no module-level state) in WAL mode so a long `ngcx build` and a concurrent
`ngcx images` do not block each other. The schema carries a version in PRAGMA user_version;
migrations are appended to MIGRATIONS and run in order on open.

Faults are handled here, once, for every command (issue 8): a corrupt file (garbage, truncated) is
moved aside to state.db.corrupt-<ts> with one warning line and a fresh store is started (nothing is
deleted); a store locked by another ngcx for longer than $NGCX_STATE_LOCK_TIMEOUT seconds (30), a
full disk or an unwritable folder become one UserError line. A store written by a NEWER ngcx is
refused, never moved aside: its deployments table may track billed instances this ngcx cannot read.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ..core import paths
from ..core.errors import UserError

_READER: ContextVar[bool] = ContextVar("ngcx_state_reader", default=False)   # reader() below
READER_LOCK_TIMEOUT_S = 2.0   # a page waits this long for a store another process holds, then says so

# Index i holds the SQL that brings the schema from version i to i+1. Append only.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE builds (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        image TEXT NOT NULL,
        release TEXT NOT NULL,
        variant TEXT NOT NULL,
        tag TEXT NOT NULL,
        image_id TEXT NOT NULL,
        digest TEXT,
        size_bytes INTEGER,
        duration_s REAL,
        built_at REAL NOT NULL,
        base TEXT,
        dockerfile_sha TEXT
    );
    CREATE INDEX builds_by_release ON builds (image, release, variant, built_at);
    CREATE TABLE pushes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tag TEXT NOT NULL,
        remote_ref TEXT NOT NULL,
        digest TEXT NOT NULL,
        pushed_at REAL NOT NULL
    );
    CREATE TABLE deployments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        target TEXT NOT NULL,
        image_ref TEXT NOT NULL,
        instance_id TEXT,
        region TEXT,
        status TEXT NOT NULL,
        endpoint TEXT,
        detail TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # 2: deployments carry what a deploy needs to be resumed, reused or cleaned up by the next ngcx
    # (issue 10): the spec that makes hosts interchangeable, the cloud's idempotency token, the host
    # address, per-phase seconds, and the pid of the ngcx that owns an in-flight deploy.
    """
    ALTER TABLE deployments ADD COLUMN zone TEXT;
    ALTER TABLE deployments ADD COLUMN instance_type TEXT;
    ALTER TABLE deployments ADD COLUMN client_token TEXT;
    ALTER TABLE deployments ADD COLUMN host TEXT;
    ALTER TABLE deployments ADD COLUMN container TEXT;
    ALTER TABLE deployments ADD COLUMN model TEXT;
    ALTER TABLE deployments ADD COLUMN spec TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE deployments ADD COLUMN phases TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE deployments ADD COLUMN pid INTEGER;
    ALTER TABLE deployments ADD COLUMN path TEXT;
    CREATE INDEX deployments_by_target ON deployments (target, status);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 3: services (issue 21): replicas behind a load balancer. A service row is written before its balancer
    # or any replica exists; each replica is a deployments row that names its service.
    """
    CREATE TABLE services (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        target TEXT NOT NULL,
        region TEXT,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        replicas INTEGER NOT NULL,
        endpoint TEXT,
        balancer TEXT NOT NULL DEFAULT '{}',
        config TEXT NOT NULL DEFAULT '{}',
        previous TEXT NOT NULL DEFAULT '{}',
        detail TEXT,
        pid INTEGER,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    ALTER TABLE deployments ADD COLUMN service_id INTEGER;
    CREATE INDEX deployments_by_service ON deployments (service_id, status);
    """,
    # 4: `ngcx test` results (the dashboard's image page): one row per run, each check in `results` (JSON),
    # keyed by the image id tested, since a tag moves to the next build and its old results must not follow it.
    """
    CREATE TABLE tests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        tag TEXT NOT NULL,
        image_id TEXT NOT NULL,
        passed INTEGER NOT NULL,
        failed INTEGER NOT NULL,
        skipped INTEGER NOT NULL,
        results TEXT NOT NULL DEFAULT '[]',
        duration_s REAL,
        tested_at REAL NOT NULL
    );
    CREATE INDEX tests_by_image ON tests (image_id, tested_at);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def db_path() -> Path:
    return paths.state_dir() / "state.db"


# Primary SQLite result codes (sqlite3.Error.sqlite_errorcode & 0xff) we turn into one clear line.
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN = (
    5, 6, 8, 10, 11, 13, 14)
SQLITE_NOTADB = 26
LOW_DISK_BYTES = 1 << 20  # an I/O error with less than this free is a full disk (the -shm mmap fails so)
CORRUPT_CODES = (SQLITE_CORRUPT, SQLITE_NOTADB)


def lock_timeout() -> float:
    """Seconds to wait for another ngcx holding the store ($NGCX_STATE_LOCK_TIMEOUT, default 30)."""
    try:
        return max(0.0, float(os.environ.get("NGCX_STATE_LOCK_TIMEOUT", "30")))
    except ValueError:
        raise UserError(f"NGCX_STATE_LOCK_TIMEOUT={os.environ['NGCX_STATE_LOCK_TIMEOUT']!r} is not a number",
                        hint="set it to seconds, e.g. 30") from None


@contextmanager
def connect() -> Iterator[sqlite3.Connection]:
    """A migrated connection in WAL mode; commits on success, rolls back on error, always closes.

    Every sqlite3 error, whether raised while opening or inside the caller's block, leaves as one
    UserError line (see _as_user_error); a corrupt store is moved aside once and reopened fresh.
    """
    path = db_path()
    if _READER.get():
        conn = _open_reader(path)
        try:
            yield conn
        except sqlite3.Error as exc:
            raise (_corrupt(path, str(exc)) if _code(exc) in CORRUPT_CODES
                   else _as_user_error(exc, path, READER_LOCK_TIMEOUT_S)) from None
        finally:
            conn.close()
        return
    try:
        conn = _open(path)
    except sqlite3.DatabaseError as exc:
        if _code(exc) not in CORRUPT_CODES:
            raise _as_user_error(exc, path) from None
        _move_corrupt_aside(path, exc)
        try:
            conn = _open(path)
        except sqlite3.Error as again:
            raise _as_user_error(again, path) from None
    try:
        conn.execute("BEGIN")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:  # SQLite already rolled back after e.g. SQLITE_FULL
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise _as_user_error(exc, path) from None
    finally:
        conn.close()


@contextmanager
def reader() -> Iterator[None]:
    """Within this block (and the tasks and to_thread calls it starts), connect() opens the store read-only.

    Why (issue 23): `ngcx dashboard` reads the store for hours while commands write it. A reader connection in
    WAL mode never blocks a writer, and it never repairs: a corrupt store is one line saying so (the next
    command moves it aside, as always), not a store moved aside under a running deploy by a page view.
    """
    token = _READER.set(True)
    try:
        yield
    finally:
        _READER.reset(token)


def _open_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection to a store of this ngcx's schema, or one UserError line."""
    if not path.exists():
        raise UserError(f"state database {path} is gone", hint="any ngcx command starts a fresh one")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=READER_LOCK_TIMEOUT_S,
                               isolation_level=None)
    except sqlite3.Error as exc:
        raise _as_user_error(exc, path) from None
    conn.row_factory = sqlite3.Row
    try:
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        conn.close()
        if _code(exc) in CORRUPT_CODES:
            raise _corrupt(path, str(exc)) from None
        raise _as_user_error(exc, path, READER_LOCK_TIMEOUT_S) from None
    if verdict != "ok" or version != SCHEMA_VERSION:
        conn.close()
        raise _corrupt(path, f"quick_check: {verdict}") if verdict != "ok" else UserError(
            f"state database {path} has schema {version}, this ngcx reads {SCHEMA_VERSION}",
            hint="run any ngcx command of this version (it migrates the store), then reload")
    return conn


def _corrupt(path: Path, why: str) -> UserError:
    return UserError(f"state database {path} cannot be read: it is corrupt ({why})",
                     hint="any ngcx command moves it aside and starts a fresh one (e.g. `ngcx deployments ls`)")


def check() -> None:
    """Open (and if needed repair or migrate) the store now: a long command calls this BEFORE its
    slow work, so a locked, full or unwritable store fails in a second, not after a 10-minute build."""
    with connect():
        pass


def _open(path: Path) -> sqlite3.Connection:
    """Connect, switch to WAL, verify the file's pages (quick_check: cheap on a store this size), migrate."""
    conn = sqlite3.connect(path, timeout=lock_timeout(), isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            exc = sqlite3.DatabaseError(f"quick_check: {verdict}")
            exc.sqlite_errorcode = SQLITE_CORRUPT  # type: ignore[attr-defined]
            raise exc
        _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _code(exc: sqlite3.Error) -> int:
    return (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF


def _as_user_error(exc: sqlite3.Error, path: Path, waited: float | None = None) -> UserError:
    """One line naming the store, what happened and the fix; never the SQL or a traceback."""
    code = _code(exc)
    if code in (SQLITE_BUSY, SQLITE_LOCKED) or "locked" in str(exc):
        waited = lock_timeout() if waited is None else waited
        return UserError(f"state database {path} is locked by another ngcx process "
                         f"(waited {waited:.0f} s)", hint="wait for it to finish, then run the command again")
    if code == SQLITE_FULL or "disk is full" in str(exc) or (code == SQLITE_IOERR and _low_disk(path)):
        return UserError(f"no space left on the device holding the state database {path}",
                         hint="free some space there (df -h), or set NGCX_STATE_DIR to a folder on another disk")
    if code in (SQLITE_READONLY, SQLITE_CANTOPEN):
        return UserError(f"state database {path} cannot be written ({exc})",
                         hint="make that folder writable, or set NGCX_STATE_DIR to a writable folder")
    if code in CORRUPT_CODES:
        return UserError(f"state database {path} is still unreadable after moving it aside ({exc})",
                         hint="check the disk, or set NGCX_STATE_DIR to another folder")
    return UserError(f"state database {path}: {exc}", hint="run the command again; if it persists, "
                     "move that file aside (ngcx starts a new one)")


def _low_disk(path: Path) -> bool:
    import shutil

    try:
        return shutil.disk_usage(path.parent).free < LOW_DISK_BYTES
    except OSError:
        return False


def _move_corrupt_aside(path: Path, exc: sqlite3.Error) -> None:
    """Rename a corrupt store (and its WAL) to state.db.corrupt-<ts> and say so in one warning line.

    Under an flock so that two ngcx processes meeting the same corrupt file move it once: the
    second one re-checks after taking the lock and finds the fresh store the first one made.
    """
    import fcntl

    lock_path = path.with_name(path.name + ".lock")
    try:
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _still_corrupt(path):
                stamp = time.strftime("%Y%m%dT%H%M%S")
                moved = path.with_name(f"{path.name}.corrupt-{stamp}")
                n = 1
                while moved.exists():
                    moved, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
                # WAL and shm first: once state.db is gone another ngcx may create fresh ones.
                for suffix in ("-wal", "-shm"):
                    side = path.with_name(path.name + suffix)
                    if side.exists():
                        os.replace(side, moved.with_name(moved.name + suffix))
                os.replace(path, moved)
                print(f"ngcx: warning: state database {path} was unreadable ({exc}); moved it to {moved} "
                      "and started a new one", file=sys.stderr)
    except OSError as err:
        raise UserError(f"state database {path} is unreadable ({exc}) and could not be moved aside: "
                        f"{err.strerror}", hint="move or delete that file, or set NGCX_STATE_DIR elsewhere") from None


def _still_corrupt(path: Path) -> bool:
    """True while `path` still fails to open (another process may have moved it aside already)."""
    if not path.exists():
        return False
    try:
        _open(path).close()
    except sqlite3.DatabaseError as exc:
        return _code(exc) in CORRUPT_CODES
    return False


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to SCHEMA_VERSION under one write lock (two ngcx processes may race)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > SCHEMA_VERSION:
            raise UserError(f"state database {db_path()} has schema version {current}, written by a newer ngcx; "
                            f"this ngcx knows version {SCHEMA_VERSION} and leaves it untouched",
                            hint="upgrade ngcx, or set NGCX_STATE_DIR to another folder")
        for version in range(current, SCHEMA_VERSION):
            for statement in MIGRATIONS[version].split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@dataclass(frozen=True)
class Build:
    id: int
    image: str
    release: str
    variant: str
    tag: str
    image_id: str
    digest: str | None
    size_bytes: int | None
    duration_s: float | None
    built_at: float
    base: str | None
    dockerfile_sha: str | None


@dataclass(frozen=True)
class Push:
    id: int
    tag: str
    remote_ref: str
    digest: str
    pushed_at: float


def record_build(*, image: str, release: str, variant: str, tag: str, image_id: str,
                 digest: str | None = None, size_bytes: int | None = None,
                 duration_s: float | None = None, base: str | None = None,
                 dockerfile_sha: str | None = None, built_at: float | None = None) -> int:
    """Store one finished build; returns its id."""
    with connect() as conn:
        cur = conn.execute(
            "INSERT INTO builds (image, release, variant, tag, image_id, digest, size_bytes, duration_s,"
            " built_at, base, dockerfile_sha) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (image, release, variant, tag, image_id, digest, size_bytes, duration_s,
             time.time() if built_at is None else built_at, base, dockerfile_sha))
        return int(cur.lastrowid)


def list_builds(image: str | None = None, limit: int | None = None) -> list[Build]:
    """All builds, newest first (optionally of one image; at most `limit`)."""
    sql = "SELECT * FROM builds"
    args: tuple[str | int, ...] = ()
    if image is not None:
        sql += " WHERE image = ?"
        args = (image,)
    sql += " ORDER BY built_at DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args += (max(0, limit),)
    with connect() as conn:
        rows = conn.execute(sql, args).fetchall()
    return [Build(**dict(row)) for row in rows]


def latest_builds(limit: int | None = None) -> list[Build]:
    """The newest build of each tag, newest first: one query (a window), however many builds the store holds."""
    sql = ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY tag ORDER BY built_at DESC, id DESC) AS nth"
           " FROM builds) WHERE nth = 1 ORDER BY built_at DESC, id DESC")
    args: tuple[int, ...] = ()
    if limit is not None:
        sql += " LIMIT ?"
        args = (max(0, limit),)
    with connect() as conn:
        rows = conn.execute(sql, args).fetchall()
    return [Build(**{k: v for k, v in dict(row).items() if k != "nth"}) for row in rows]


def build_of(ref: str) -> Build | None:
    """The newest build whose tag is `ref`, or whose image id is `ref` (sha256:..., or its first 12+ hex digits)."""
    hex_id = ref.removeprefix("sha256:")
    id_pattern = f"sha256:{hex_id}%" if len(hex_id) >= 12 and all(c in "0123456789abcdef" for c in hex_id) else None
    with connect() as conn:
        row = conn.execute(
            "SELECT * FROM builds WHERE tag = ? OR image_id = ? OR image_id LIKE ?"
            " ORDER BY tag = ? DESC, built_at DESC, id DESC LIMIT 1", (ref, ref, id_pattern, ref)).fetchone()
    return Build(**dict(row)) if row else None


def latest_build(image: str, release: str, variant: str) -> Build | None:
    """The newest build of one image release variant, or None."""
    with connect() as conn:
        row = conn.execute(
            "SELECT * FROM builds WHERE image = ? AND release = ? AND variant = ?"
            " ORDER BY built_at DESC, id DESC LIMIT 1", (image, release, variant)).fetchone()
    return Build(**dict(row)) if row else None


def record_push(*, tag: str, remote_ref: str, digest: str, pushed_at: float | None = None) -> int:
    """Store one verified push (local tag -> remote ref@digest); returns its id."""
    with connect() as conn:
        cur = conn.execute(
            "INSERT INTO pushes (tag, remote_ref, digest, pushed_at) VALUES (?,?,?,?)",
            (tag, remote_ref, digest, time.time() if pushed_at is None else pushed_at))
        return int(cur.lastrowid)


def list_pushes(tag: str | None = None) -> list[Push]:
    """All pushes, newest first (optionally of one local tag)."""
    sql = "SELECT * FROM pushes"
    args: tuple[str, ...] = ()
    if tag is not None:
        sql += " WHERE tag = ?"
        args = (tag,)
    with connect() as conn:
        rows = conn.execute(sql + " ORDER BY pushed_at DESC, id DESC", args).fetchall()
    return [Push(**dict(row)) for row in rows]


@dataclass(frozen=True)
class TestRun:
    """One `ngcx test` run of one image: the counts, and each check as {name, status, expected, found, note}."""

    __test__ = False  # not a pytest test class, though its name starts with Test

    id: int
    tag: str
    image_id: str
    passed: int
    failed: int
    skipped: int
    results: list[dict]
    duration_s: float | None
    tested_at: float


TEST_STATUSES = ("passed", "failed", "skipped")


def record_test(*, tag: str, image_id: str, results: list[dict], duration_s: float | None = None,
                tested_at: float | None = None) -> int:
    """Store one finished `ngcx test` run; returns its id.

    `results` holds one dict per check whose "status" is passed, failed or skipped; the counts are taken
    from them, so they can never disagree. Callers pass only what the check table shows (never a secret).
    """
    counts = {status: sum(r.get("status") == status for r in results) for status in TEST_STATUSES}
    with connect() as conn:
        cur = conn.execute(
            "INSERT INTO tests (tag, image_id, passed, failed, skipped, results, duration_s, tested_at)"
            " VALUES (?,?,?,?,?,?,?,?)",
            (tag, image_id, counts["passed"], counts["failed"], counts["skipped"],
             json.dumps(results, ensure_ascii=False), duration_s, time.time() if tested_at is None else tested_at))
        return int(cur.lastrowid)


def latest_tests(image_id: str) -> TestRun | None:
    """The newest `ngcx test` run of this exact image (by id), or None when it was never tested."""
    with connect() as conn:
        row = conn.execute("SELECT * FROM tests WHERE image_id = ? ORDER BY tested_at DESC, id DESC LIMIT 1",
                           (image_id,)).fetchone()
    if row is None:
        return None
    return TestRun(**{**dict(row), "results": json.loads(row["results"])})
