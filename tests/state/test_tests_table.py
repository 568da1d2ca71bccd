"""`ngcx test` runs are kept per image id (migration 4), and the dashboard's queries over builds hold."""

from __future__ import annotations

import sqlite3
import time
from types import SimpleNamespace

import pytest

from ngcx.state import db as state


@pytest.fixture(autouse=True)
def _own_state(isolated_state):
    """Every test gets an empty state dir (never the user's)."""


def _results(*statuses: str) -> list[dict]:
    return [{"name": f"check {n}", "status": s, "expected": "1.0", "found": "1.0", "note": "ünïcode ✓"}
            for n, s in enumerate(statuses)]


def test_a_v3_store_upgrades_to_the_tests_table_keeping_its_rows(isolated_state):
    """A store written by the previous ngcx (schema 3, one build) gains `tests` and keeps the build."""
    path = isolated_state["state"] / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for script in state.MIGRATIONS[:3]:
        conn.executescript(script)
    conn.execute("INSERT INTO builds (image, release, variant, tag, image_id, built_at)"
                 " VALUES ('cuda', '24.05', 'runtime', 'ngcx/cuda:24.05-runtime', 'sha256:old', 1.0)")
    conn.execute("PRAGMA user_version = 3")
    conn.close()

    assert state.latest_tests("sha256:old") is None
    run_id = state.record_test(tag="ngcx/cuda:24.05-runtime", image_id="sha256:old", results=_results("passed"))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == state.SCHEMA_VERSION >= 4
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='tests'")}
    assert "tests_by_image" in indexes
    conn.close()
    assert [b.image_id for b in state.list_builds()] == ["sha256:old"]
    latest = state.latest_tests("sha256:old")
    assert latest is not None and latest.id == run_id


def test_record_and_read_back_the_newest_run_of_one_image():
    tag = "ngcx/pytorch:24.11-runtime"
    state.record_test(tag=tag, image_id="sha256:a", results=_results("passed", "failed"), duration_s=3.0,
                      tested_at=100.0)
    results = _results("passed", "passed", "skipped", "failed")
    state.record_test(tag=tag, image_id="sha256:a", results=results, duration_s=12.5, tested_at=200.0)
    state.record_test(tag=tag, image_id="sha256:b", results=_results("failed"), tested_at=300.0)  # the next build

    run = state.latest_tests("sha256:a")
    assert run is not None
    assert (run.tag, run.image_id, run.passed, run.failed, run.skipped) == (tag, "sha256:a", 2, 1, 1)
    assert run.results == results and run.duration_s == 12.5 and run.tested_at == 200.0
    newer = state.latest_tests("sha256:b")
    assert newer is not None and (newer.passed, newer.failed, newer.skipped) == (0, 1, 0)
    assert state.latest_tests("sha256:never") is None


def test_tested_at_defaults_to_now():
    before = time.time()
    state.record_test(tag="t", image_id="sha256:c", results=[])
    run = state.latest_tests("sha256:c")
    assert run is not None and before <= run.tested_at <= time.time() and run.results == []


def _build(tag: str, built_at: float, image_id: str) -> None:
    image, _, rest = tag.removeprefix("ngcx/").partition(":")
    release, _, variant = rest.partition("-")
    state.record_build(image=image, release=release, variant=variant, tag=tag, image_id=image_id,
                       built_at=built_at, size_bytes=10, duration_s=1.0)


def test_latest_builds_is_one_row_per_tag_newest_first_and_build_of_finds_tag_or_id():
    _build("ngcx/cuda:24.05-runtime", 1.0, "sha256:" + "1" * 64)
    _build("ngcx/cuda:24.05-devel", 2.0, "sha256:" + "2" * 64)
    _build("ngcx/cuda:24.05-runtime", 3.0, "sha256:" + "3" * 64)
    latest = state.latest_builds()
    assert [(b.tag, b.built_at) for b in latest] == [("ngcx/cuda:24.05-runtime", 3.0), ("ngcx/cuda:24.05-devel", 2.0)]
    assert [b.tag for b in state.latest_builds(limit=1)] == ["ngcx/cuda:24.05-runtime"]
    assert [b.built_at for b in state.list_builds(limit=2)] == [3.0, 2.0]

    by_tag = state.build_of("ngcx/cuda:24.05-runtime")
    assert by_tag is not None and by_tag.image_id == "sha256:" + "3" * 64
    for ref in ("sha256:" + "2" * 64, "2" * 64, "2" * 12):
        found = state.build_of(ref)
        assert found is not None and found.tag == "ngcx/cuda:24.05-devel", ref
    assert state.build_of("2" * 5) is None and state.build_of("ngcx/none:1") is None


def test_ngcx_test_records_what_the_table_shows_with_credentials_hidden(monkeypatch):
    from ngcx.commands import test as test_cmd
    from ngcx.core import engine
    from ngcx.test.image import FAIL, PASS, SKIP, Check

    fake = SimpleNamespace(images=SimpleNamespace(get=lambda tag: SimpleNamespace(id="sha256:img")))
    monkeypatch.setattr(engine, "engine_client", lambda timeout=600: fake)
    checks = [Check("cudnn", "9.1.0.70", "9.1.0", PASS), Check("GPU driver", ">= 525", "-", SKIP, "no GPU"),
              Check("index", "reachable", "https://user:s3cret@pypi.example/simple", FAIL)]
    test_cmd.record_run("ngcx/cuda:24.05-runtime", checks, 4.25)
    run = state.latest_tests("sha256:img")
    assert run is not None and (run.passed, run.failed, run.skipped, run.duration_s) == (1, 1, 1, 4.25)
    assert [r["status"] for r in run.results] == ["passed", "skipped", "failed"]
    assert run.results[1] == {"name": "GPU driver", "status": "skipped", "expected": ">= 525", "found": "-",
                              "note": "no GPU"}
    assert "s3cret" not in str(run.results) and "https://***@pypi.example/simple" in run.results[2]["found"]


def test_a_record_that_cannot_be_made_is_one_warning_not_an_error(monkeypatch, capfd):
    """The engine is gone by the time the run is recorded: the test result stands, stderr says why."""
    from ngcx.commands import test as test_cmd
    from ngcx.test.image import PASS, Check

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    test_cmd.record_run("ngcx/cuda:24.05-runtime", [Check("cudnn", "9", "9", PASS)], 1.0)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ngcx: warning: the test results of ngcx/cuda:24.05-runtime")
    assert "Docker Engine not reachable" in err[0]
