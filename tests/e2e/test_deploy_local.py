"""`ngcx deploy --cloud local`, for real: an example project served on this host's engine, then its lifecycle.

What a user notices (issue 10): deploy prints a URL that answers KServe inferences, and where the
seconds went; deploying again swaps the container and keeps the URL; stop/start/logs/destroy act on
it; a container that dies before it is ready is one line with its last log lines and leaves nothing
running; a deploy killed with -9 is announced by the next command and cleaned up by gc.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from deploy_helpers import ngcx, one_inference

from ngcx.core.engine import containers
from support import ctrl_c_able

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def state(tmp_path, monkeypatch) -> dict[str, str]:
    """A state store of the test's own, so records and gc see only this test's deployments."""
    env = {"NGCX_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    return env


def records(cwd: Path, env: dict[str, str]) -> list[dict]:
    done = ngcx(cwd, "deployments", "ls", "--all", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_deploy_serves_the_project_then_redeploy_stop_start_logs_destroy(project, docker_client, state):
    first = ngcx(project, "deploy", "--cloud", "local", env=state)
    assert first.returncode == 0, first.stderr[-2000:]
    url = first.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:")
    assert "api 0.0 s · boot 0.0 s · pull 0.0 s · start" in first.stderr and "total" in first.stderr
    assert np.isfinite(one_inference(project, url, state)).all()
    [rec] = records(project, state)
    assert rec["status"] == "ready" and rec["path"] == "local" and rec["endpoint"] == url
    assert set(rec["phases"]) == {"api", "boot", "pull", "start", "ready"}

    again = ngcx(project, "deploy", "--cloud", "local", env=state)      # the warm path: swap the container
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines()[-1] == url                    # same URL for the user
    new, old = records(project, state)
    assert (new["status"], old["status"]) == ("ready", "replaced")
    assert not containers(docker_client, {"id": old["container"]})
    one_inference(project, url, state)

    assert ngcx(project, "deployments", "stop", str(new["id"]), env=state).returncode == 0
    assert docker_client.containers.get(new["container"]).status == "exited"
    with pytest.raises(OSError):
        one_inference(project, url, state)
    started = ngcx(project, "deployments", "start", str(new["id"]), env=state)
    assert started.returncode == 0 and started.stdout.strip() == url, started.stderr
    one_inference(project, url, state)

    logs = ngcx(project, "deployments", "logs", str(new["id"]), env=state)
    assert logs.returncode == 0 and "ready" in logs.stdout.lower(), logs.stdout[-1000:]
    show = json.loads(ngcx(project, "deployments", "show", str(new["id"]), "--json", env=state).stdout)
    assert show["id"] == new["id"] and show["status"] == "ready"

    gone = ngcx(project, "deployments", "destroy", str(new["id"]), "--yes", env=state)
    assert gone.returncode == 0, gone.stderr
    assert not containers(docker_client, {"id": new["container"]})
    assert records(project, state)[0]["status"] == "destroyed"


def test_a_container_that_dies_before_ready_is_one_line_and_is_removed(project, docker_client, state):
    done = ngcx(project, "deploy", "--cloud", "local", "--", "sh", "-c", "echo model-file-is-broken; exit 3",
                env=state)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert "exited with code 3" in line and "model-file-is-broken" in line
    [rec] = records(project, state)
    assert rec["status"] == "failed" and "exited with code 3" in rec["detail"]
    from ngcx.deploy import store
    from ngcx.deploy.common import LABEL_OWNER

    # this store's deployment only: ids restart at 1 in every state folder, so another run's leftover can share one
    mine = [f"ai.ngcx.deployment={rec['id']}", f"{LABEL_OWNER}={store.owner_id()}"]
    assert not containers(docker_client, {"label": mine})


def test_a_deploy_killed_with_sigkill_is_announced_and_gc_cleans_it(project, docker_client, state):
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--cloud", "local", "--ready-timeout", "300",
                             "--", "sleep", "300"], cwd=project, env={**os.environ, **state},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:          # wait until the container exists and the record says so
            recs = records(project, state) if (Path(state["NGCX_STATE_DIR"]) / "state.db").exists() else []
            if recs and recs[0]["container"]:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the deploy never recorded its container")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    container = recs[0]["container"]
    assert docker_client.containers.get(container).status == "running"     # left behind by the kill

    listed = ngcx(project, "deployments", "ls", env=state)
    assert f"deployment {recs[0]['id']} (local) was interrupted" in listed.stderr
    assert "ngcx deployments gc" in listed.stderr
    doctor = json.loads(ngcx(project, "doctor", "--json", env=state).stdout)
    [check] = [c for c in doctor["checks"] if c["name"] == "deployments"]
    assert check["status"] == "warn" and "1 interrupted" in check["detail"] and "gc" in check["hint"]
    gc = ngcx(project, "deployments", "gc", "--yes", env=state)
    assert gc.returncode == 0, gc.stderr
    assert container[:12] in gc.stdout
    assert not containers(docker_client, {"id": container})
    assert records(project, state)[0]["status"] == "failed"
    assert "no orphaned" in ngcx(project, "deployments", "gc", "--yes", env=state).stderr


@pytest.mark.parametrize("args, expect", [
    (("deploy", "onnxruntime:25.08", "--cloud", "local"), "catalog image without a model to serve"),
    (("deploy", "--cloud", "mars"), "'mars' is not one of"),
    (("deploy", "--cloud", "aliyun", "--allow-from", "everyone"), "--allow-from 'everyone' is not a CIDR"),
    (("deployments", "show", "banana"), "'banana' is not a deployment id"),
    (("deployments", "stop", "999"), "no deployment 999"),
    (("deploy", "--cloud", "aliyun", "--no-auth"), "--no-auth with --allow-from 0.0.0.0/0 would let anyone"),
    (("deployments", "rotate-key", "999"), "no deployment 999"),
])
def test_deploy_bad_input_is_one_line_exit_2(project, state, args, expect):
    done = ngcx(project, *args, env=state)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert expect in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_during_a_deploy_removes_its_container_and_says_so(project, docker_client, state):
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--cloud", "local", "--", "sleep", "300"],
                            cwd=project, env={**os.environ, **state}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ctrl_c_able)
    deadline = time.monotonic() + 60
    while not containers(docker_client, {"label": "ai.ngcx.deployment"}) or not (
            Path(state["NGCX_STATE_DIR"]) / "state.db").exists() or not records(project, state)[0]["container"]:
        assert time.monotonic() < deadline, "the deploy never started its container"
        time.sleep(0.2)
    container = records(project, state)[0]["container"]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert not containers(docker_client, {"id": container})
    rec = records(project, state)[0]
    assert rec["status"] == "failed" and rec["detail"].startswith("interrupted (Ctrl-C)")
