"""`ngcx dashboard` as a network peer sees it: the token on every request, CSRF on every change, loopback Host,
one line for a port in use, a banner (not a traceback) for a store that cannot be read.

Each test runs the real command (uvicorn on a free loopback port) over a state store of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .running import Dashboard, until


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A state store of the test's own, and no cloud credentials (the orphan search looks at the engine only)."""
    return {"NGCX_STATE_DIR": str(tmp_path / "state"), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
            "ALIBABA_CLOUD_ACCESS_KEY_ID": "", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ""}


def test_every_request_needs_the_token_and_the_first_visit_trades_it_for_a_cookie(env):
    with Dashboard(env) as dash:
        assert dash.base.startswith("http://127.0.0.1:")
        for path in ("/", "/static/dashboard.js", "/api/overview", "/events", "/catalog"):
            status, _, body = dash.call(path, auth=False)
            assert status == 401 and b"needs its token" in body, (path, status)
        status, _, _ = dash.call("/?token=wrong", auth=False)
        assert status == 401

        status, headers, _ = dash.call(f"/?token={dash.token}", auth=False)
        assert status == 303 and headers["location"] == "/"          # the token leaves the address bar
        cookie = headers["set-cookie"]
        assert f"ngcx_dashboard_{dash.port}={dash.token}" in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")

        status, _, body = dash.call("/", auth=False, headers={"Cookie": f"ngcx_dashboard_{dash.port}={dash.token}"})
        assert status == 200 and b"<h2>Deployments</h2>" in body
        assert dash.call("/api/overview")[0] == 200                   # scripts: Authorization: Bearer


def test_a_change_needs_the_pages_csrf_token_and_its_origin(env):
    with Dashboard(env) as dash:
        page = dash.call("/")[2].decode()
        csrf = re.search(r'name="ngcx-csrf" content="([0-9a-f]+)"', page).group(1)
        assert dash.call("/api/deployments/7/stop", method="POST")[0] == 403
        assert dash.call("/api/deployments/7/stop", method="POST",
                         headers={"X-NGCX-CSRF": csrf, "Origin": "http://evil.example"})[0] == 403
        status, _, body = dash.call("/api/deployments/7/reboot", method="POST", headers={"X-NGCX-CSRF": csrf})
        assert status == 409 and b"unknown action" in body
        status, _, body = dash.call("/api/deployments/--all/stop", method="POST", headers={"X-NGCX-CSRF": csrf})
        assert status == 409 and b"is not a deployment id" in body             # never an option of the command
        status, _, body = dash.call("/api/deployments/7/stop", method="POST",
                                    headers={"X-NGCX-CSRF": csrf, "Origin": dash.base})
        assert status == 202                                           # runs `ngcx deployments stop 7`
        job = json.loads(body)["id"]
        done = until(lambda: (j := json.loads(dash.call(f"/api/jobs/{job}")[2])) and j["rc"] is not None and j,
                     30, what="the stop job's end")
        assert done["rc"] == 2 and done["state"] == "failed"
        assert any("no deployment 7" in line for line in done["lines"])   # the command's own one line


def test_a_loopback_dashboard_refuses_a_foreign_host_header(env):
    with Dashboard(env) as dash:
        status, _, body = dash.call("/", headers={"Host": f"rebound.example:{dash.port}"})
        assert status == 403 and b"loopback only" in body


def test_a_second_dashboard_on_the_same_port_is_one_line(env):
    with Dashboard(env) as dash:
        second = subprocess.run([sys.executable, "-m", "ngcx", "dashboard", "--port", str(dash.port)],
                                capture_output=True, text=True, timeout=60, env=dash.env)
        assert second.returncode == 2
        assert f"port {dash.port} on 127.0.0.1 is in use" in second.stderr and "Traceback" not in second.stderr
        assert len(second.stderr.strip().splitlines()) <= 2                # the line and its hint
        assert dash.call("/")[0] == 200                                    # the first one keeps serving


def test_an_unreadable_store_is_a_banner_and_the_server_keeps_serving(env):
    with Dashboard(env) as dash:
        assert dash.call("/")[0] == 200
        db = Path(env["NGCX_STATE_DIR"]) / "state.db"
        original = db.read_bytes()
        db.write_bytes(b"this is not a database" * 200)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        status, _, body = until(lambda: (r := dash.call("/")) and b"cannot be read" in r[2] and r, 10,
                                what="the banner")
        assert status == 503 and b"Traceback" not in body
        assert db.read_bytes().startswith(b"this is not")                 # a reader never moves the store aside
        assert dash.call("/static/dashboard.css")[0] == 200
        db.write_bytes(original)
        until(lambda: dash.call("/")[0] == 200, 10, what="recovery once the store is readable again")


def test_unknown_pages_are_404_with_one_line(env):
    with Dashboard(env) as dash:
        status, _, body = dash.call("/deployments/99")
        assert status == 404 and b"no deployment 99" in body
        status, _, body = dash.call("/deployments/abc")
        assert status == 404 and b"ids are numbers" in body
        status, _, body = dash.call("/images/nosuch/image:tag")
        assert status == 404 and b"nosuch/image:tag" in body


def test_a_store_held_exclusively_is_a_locked_banner_until_it_is_released(env):
    import sqlite3

    with Dashboard(env) as dash:
        assert dash.call("/")[0] == 200
        holder = sqlite3.connect(Path(env["NGCX_STATE_DIR"]) / "state.db", isolation_level=None)
        try:
            holder.execute("PRAGMA locking_mode=EXCLUSIVE")
            holder.execute("BEGIN EXCLUSIVE")
            holder.execute("INSERT INTO meta (key, value) VALUES ('held', 'by the test')")
            status, _, body = until(lambda: (r := dash.call("/")) and b"is locked by another ngcx" in r[2] and r,
                                    15, what="the locked banner")
            assert status == 503 and b"Traceback" not in body
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        until(lambda: dash.call("/")[0] == 200, 15, what="the page once the store is released")


def test_a_busy_dashboard_never_makes_a_command_wait_for_the_store(env, monkeypatch):
    """Commands write while pages are read: allowed to wait at most 1 s for a lock (NGCX_STATE_LOCK_TIMEOUT=1, 30
    by default), every write still goes through, because the dashboard only ever holds short read transactions
    (state/db.py reader()). Not 0 s: SQLite's own opening of a WAL store can be busy for a moment."""
    import threading

    from ngcx.deploy import store
    from ngcx.deploy.common import DeployConfig

    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    with Dashboard(env) as dash:
        stop, reads = threading.Event(), []

        def read() -> None:
            while not stop.is_set() and len(reads) < 2000:
                reads.append(dash.call("/api/overview")[0])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        monkeypatch.setenv("NGCX_STATE_LOCK_TIMEOUT", "1")
        try:
            until(lambda: len(reads) >= 3, 20, what="the first reads")
            for n in range(40):
                record = store.create_intent(DeployConfig(cloud="local", image=f"w{n}:latest", pull_ref=None,
                                                          registry=None, labels={}, model=None))
                store.mark_destroyed(record.id, "written while the dashboard reads")
        finally:
            stop.set()
            reader.join(30)
        assert set(reads) == {200} and len(reads) >= 3


BAD = ["/api/deployments/abc/points", "/api/deployments/1/points?since=yesterday", "/api/deployments/abc/logs",
       "/events/deployments/abc", "/api/jobs/abc", "/api/jobs/99", "/deployments/s99", "/deployments/%00",
       "/images/..%2F..%2Fcontainers%2Fjson", "/images/sha256:zz", "/static/../guard.py", "/nosuchpage"]


def test_a_peers_bad_path_or_query_is_a_4xx_never_a_500(env):
    with Dashboard(env) as dash:
        for path in BAD:
            status, _, body = dash.call(path)
            assert 400 <= status < 500, (path, status, body[:300])
            assert b"Traceback" not in body
        assert dash.call("/")[0] == 200                                   # and the server keeps serving
