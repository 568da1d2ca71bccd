"""The state store keeps what was built and pushed, newest first, across processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from ngcx.state import db as state


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
    code = ("from ngcx.state import db as state; state.record_build(image='x', release='1', variant='devel',"
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
    from ngcx.core.errors import UserError

    state.list_builds()
    conn = sqlite3.connect(isolated_state["state"] / "state.db")
    conn.execute(f"PRAGMA user_version = {state.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UserError, match="schema version"):
        state.list_builds()


def test_concurrent_writers_lose_nothing(isolated_state):
    """Two ngcx processes recording at once (a build and a push): every row lands, no 'locked'."""
    code = ("import sys; from ngcx.state import db as state\n"
            "for i in range(40): state.record_push(tag=sys.argv[1], remote_ref=f'r/{i}', digest=f'sha256:{i}')")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{n}"], stderr=subprocess.PIPE, text=True)
             for n in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert {tag: len(state.list_pushes(tag)) for tag in ("w0", "w1", "w2")} == {"w0": 40, "w1": 40, "w2": 40}


# ----------------------------------------------------------------------------- faults (issue 8)


def _lock_holder(db: str, seconds: float) -> subprocess.Popen:
    """Another process that holds the store exclusively (locking_mode=EXCLUSIVE + a write txn)."""
    code = ("import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA locking_mode=EXCLUSIVE'); c.execute('BEGIN EXCLUSIVE')\n"
            "c.execute(\"INSERT INTO pushes (tag, remote_ref, digest, pushed_at) VALUES ('x','y','z',0)\")\n"
            "print('held', flush=True); time.sleep(float(sys.argv[2]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, db, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_store_is_moved_aside_with_one_warning_and_a_fresh_one_starts(isolated_state, capfd, damage):
    for n in range(300):
        state.record_push(tag=f"t{n}", remote_ref="r", digest="sha256:" + "ab" * 32)
    path = isolated_state["state"] / "state.db"
    if damage == "garbage":
        path.write_bytes(b"\x8f not sqlite " * 300)
    else:
        with path.open("r+b") as handle:
            handle.truncate(path.stat().st_size // 2)
    damaged = path.read_bytes()

    assert state.list_pushes() == []  # a fresh store, no exception
    warning = capfd.readouterr().err.strip().splitlines()
    moved = sorted(isolated_state["state"].glob("state.db.corrupt-*"))
    assert len(warning) == 1 and warning[0].startswith("ngcx: warning: ") and str(moved[0]) in warning[0]
    assert [m.name for m in moved if not m.name.endswith(("-wal", "-shm"))] == [moved[0].name]
    assert moved[0].read_bytes() == damaged  # nothing lost: the damaged file is kept as it was
    state.record_push(tag="after", remote_ref="r", digest="sha256:1")  # the next run just works
    assert [p.tag for p in state.list_pushes()] == ["after"]
    assert capfd.readouterr().err == ""  # warned once, not on every later run


def test_two_processes_meeting_one_corrupt_store_move_it_once(isolated_state):
    state.list_builds()
    (isolated_state["state"] / "state.db").write_bytes(b"garbage" * 1000)
    code = "from ngcx.state import db as state; state.record_push(tag='p', remote_ref='r', digest='d')"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errs = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], errs
    assert sum("moved it to" in err for err in errs) == 1, errs
    assert len([p for p in isolated_state["state"].glob("state.db.corrupt-*") if "-wal" not in p.name]) == 1
    assert len(state.list_pushes("p")) == 3  # no process wrote into a store that was then moved away


def test_store_locked_longer_than_the_timeout_is_one_line_then_works(isolated_state, monkeypatch):
    from ngcx.core.errors import UserError

    state.list_builds()
    monkeypatch.setenv("NGCX_STATE_LOCK_TIMEOUT", "1")
    holder = _lock_holder(str(isolated_state["state"] / "state.db"), 30)
    try:
        for call in (state.list_builds, lambda: state.record_push(tag="a", remote_ref="b", digest="c")):
            with pytest.raises(UserError, match="is locked by another ngcx process") as info:
                call()
            assert "\n" not in info.value.line() and "run the command again" in info.value.line()
    finally:
        holder.kill()
        holder.wait()
    state.record_push(tag="a", remote_ref="b", digest="c")
    assert [p.tag for p in state.list_pushes()] == ["a"]  # the holder's uncommitted row is gone


def test_unwritable_state_folder_is_one_line(tmp_path, monkeypatch):
    """Root ignores permission bits, so the folder is made impossible: a path under a regular file."""
    from ngcx.core.errors import UserError

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "a-file" / "state"))
    with pytest.raises(UserError, match=r"cannot create the ngcx state folder .*a-file/state: Not a directory"):
        state.list_builds()
