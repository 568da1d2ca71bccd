"""SQLite state store: which images were built, pushed and deployed, and when.

Why SQLite: one file at paths.state_dir()/state.db, transactional (an interrupted deploy never
leaves a half-written record), readable with the sqlite3 CLI, no server. Every function opens
its own connection (no module-level state) in WAL mode so a long `ngcx build` and a concurrent
`ngcx images` do not block each other. The schema carries a version in PRAGMA user_version;
migrations are appended to MIGRATIONS and run in order on open.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ngcx import paths

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
)
SCHEMA_VERSION = len(MIGRATIONS)


def db_path() -> Path:
    return paths.state_dir() / "state.db"


@contextmanager
def connect() -> Iterator[sqlite3.Connection]:
    """A migrated connection in WAL mode; commits on success, rolls back on error, always closes."""
    conn = sqlite3.connect(db_path(), timeout=30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        _migrate(conn)
        conn.execute("BEGIN")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to SCHEMA_VERSION under one write lock (two ngcx processes may race)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current > SCHEMA_VERSION:
            from ngcx.errors import UserError

            raise UserError(f"{db_path()} has schema version {current}, this ngcx knows {SCHEMA_VERSION}",
                            hint="upgrade ngcx, or point NGCX_STATE_DIR elsewhere")
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


def list_builds(image: str | None = None) -> list[Build]:
    """All builds, newest first (optionally of one image)."""
    sql = "SELECT * FROM builds"
    args: tuple[str, ...] = ()
    if image is not None:
        sql += " WHERE image = ?"
        args = (image,)
    with connect() as conn:
        rows = conn.execute(sql + " ORDER BY built_at DESC, id DESC", args).fetchall()
    return [Build(**dict(row)) for row in rows]


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
