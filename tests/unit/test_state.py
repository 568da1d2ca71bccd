"""The state store keeps what was built and pushed, newest first, across processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from ngcx import state


@pytest.fixture(autouse=True)
def _own_state(isolated_state):
    """Every test gets an empty state dir (never the user's)."""


def _build(**over):
    row = dict(image="pytorch", release="24.05", variant="runtime", tag="ngcx/pytorch:24.05-runtime",
               image_id="sha256:aaa", size_bytes=123, duration_s=4.5, base="debian:bookworm-slim",
               dockerfile_sha="f00")
    row.update(over)
    return row


def test_db_lives_in_state_dir_with_wal_and_schema_version(isolated_state):
    state.record_build(**_build())
    path = isolated_state["state"] / "state.db"
    assert path.is_file()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == state.SCHEMA_VERSION >= 1
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"builds", "pushes", "deployments"} <= tables


def test_latest_build_picks_newest_of_the_right_variant():
    state.record_build(**_build(image_id="sha256:old"), built_at=100.0)
    state.record_build(**_build(image_id="sha256:new"), built_at=200.0)
    state.record_build(**_build(variant="devel", image_id="sha256:devel"), built_at=300.0)
    state.record_build(**_build(release="24.04", image_id="sha256:other"), built_at=400.0)
    latest = state.latest_build("pytorch", "24.05", "runtime")
    assert latest is not None and latest.image_id == "sha256:new"
    assert latest.size_bytes == 123 and latest.base == "debian:bookworm-slim"
    assert state.latest_build("pytorch", "99.99", "runtime") is None
    assert [b.image_id for b in state.list_builds()] == [
        "sha256:other", "sha256:devel", "sha256:new", "sha256:old"]
    assert len(state.list_builds("nope")) == 0


def test_pushes_recorded_newest_first():
    state.record_push(tag="ngcx/base:bookworm", remote_ref="h:5000/base:bookworm", digest="sha256:1",
                      pushed_at=1.0)
    state.record_push(tag="ngcx/base:bookworm", remote_ref="h:5000/t/base:bookworm", digest="sha256:2",
                      pushed_at=2.0)
    pushes = state.list_pushes("ngcx/base:bookworm")
    assert [p.digest for p in pushes] == ["sha256:2", "sha256:1"]
    assert pushes[0].remote_ref == "h:5000/t/base:bookworm"


def test_records_survive_across_processes(isolated_state):
    """A build recorded by one ngcx process is seen by the next (no in-memory state)."""
    code = ("from ngcx import state; state.record_build(image='x', release='1', variant='devel',"
            " tag='ngcx/x:1-devel', image_id='sha256:zz')")
    subprocess.run([sys.executable, "-c", code], check=True)
    latest = state.latest_build("x", "1", "devel")
    assert latest is not None and latest.image_id == "sha256:zz"


def test_failed_transaction_leaves_no_row():
    with pytest.raises(RuntimeError), state.connect() as conn:
        conn.execute("INSERT INTO pushes (tag, remote_ref, digest, pushed_at) VALUES ('a','b','c',1)")
        raise RuntimeError("interrupted")
    assert state.list_pushes() == []


def test_newer_schema_is_refused_with_one_line(isolated_state):
    from ngcx.errors import UserError

    state.list_builds()
    conn = sqlite3.connect(isolated_state["state"] / "state.db")
    conn.execute(f"PRAGMA user_version = {state.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UserError, match="schema version"):
        state.list_builds()


def test_concurrent_writers_lose_nothing(isolated_state):
    """Two ngcx processes recording at once (a build and a push): every row lands, no 'locked'."""
    code = ("import sys; from ngcx import state\n"
            "for i in range(40): state.record_push(tag=sys.argv[1], remote_ref=f'r/{i}', digest=f'sha256:{i}')")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{n}"], stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert {tag: len(state.list_pushes(tag)) for tag in ("w0", "w1", "w2")} == {"w0": 40, "w1": 40, "w2": 40}
