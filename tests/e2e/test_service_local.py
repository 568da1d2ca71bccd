"""`ngcx deploy --cloud local --replicas N`, for real: a service of the example project behind haproxy, then
its life under constant load — a rolling update, a crashing version rolled back, scale in and out, a killed
replica replaced by `reconcile`, `rollback`, destroy — with zero failed requests wherever the issue asks.

What a user notices (issue 21): one URL (the balancer's) that answers inferences whichever replica takes
them; every replica takes some; a new version replaces the old without one failed request; a version that
crashes is rolled back in one line while the old replicas keep answering; a replica whose container dies is
replaced by `ngcx deployments reconcile`; destroy leaves no container, network or key behind.

The load: LOAD_CLIENTS threads, each on its own keep-alive connection to the balancer, sending the example's
inference with the service's key back to back, bounded by LOAD_MAX_S and LOAD_MAX_REQUESTS. A failed request
is any answer but 200 or a connection error.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deploy_helpers import LOAD_CLIENTS, Load, ngcx

from ngcx.core.engine import containers

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAST = ("--drain", "5", "--health-interval", "1")


@pytest.fixture
def state(tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    """A state store of the test's own; whatever services a failed test left are destroyed afterwards."""
    env = {"NGCX_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    yield env
    from ngcx.deploy import service, store

    for svc in store.services():
        service.destroy(svc)


@pytest.fixture(scope="session")
def fp16(project) -> Path:
    """The same project's FP16 build (ngcx.fp16.yaml): the "new version" a rolling update ships."""
    done = ngcx(project, "build", "-f", "ngcx.fp16.yaml", "--progress", "plain")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return project


def body(project: Path) -> bytes:
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    array = example.inputs["image"]
    return json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.reshape(-1).tolist()}]}).encode()


def show(cwd: Path, ref: str, env: dict[str, str]) -> dict:
    done = ngcx(cwd, "deployments", "show", ref, "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def served_by(cwd: Path, member: dict, key: str) -> int:
    """How many inferences the replica itself counted (its /metrics, with the service's key)."""
    parts = urlsplit(member["endpoint"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("nv_inference_request_success{")))


def infer_status(url: str, key: str, payload: bytes) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", "/v2/models/convnet/infer", payload, {"Authorization": f"Bearer {key}"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_local_service_rolls_scales_heals_and_rolls_back_without_a_failed_request(fp16, docker_client, state):
    project = fp16
    made = ngcx(project, "deploy", "--cloud", "local", "--replicas", "3", *FAST, env=state)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:") and "service s1 ready: 3 replica(s)" in made.stderr
    key = ngcx(project, "deployments", "key", "s1", env=state).stdout.strip()
    assert key.startswith("ngcx_") and key not in made.stderr + made.stdout      # not a terminal: not shown
    svc = show(project, "s1", state)
    assert svc["status"] == "ready" and svc["endpoint"] == url and len(svc["members"]) == 3
    v1 = svc["version"]
    assert {m["status"] for m in svc["members"]} == {"ready"} and all(m["service_id"] == 1 for m in svc["members"])
    listed = ngcx(project, "deployments", "ls", env=state).stdout
    assert "s1" in listed and "3 replica(s)" in listed

    payload = body(project)
    with Load(url, key, payload) as load:            # every replica takes a share of the balancer's traffic
        load.settle(60)
    assert not load.errors, load.errors[:5]
    assert all(served_by(project, m, key) > 0 for m in svc["members"]), "a replica got no request"
    assert infer_status(url, "ngcx_wrong", payload) == 401         # the key still guards every replica

    # rolling update to the FP16 build under constant load: zero failed requests
    with Load(url, key, payload) as load:
        load.settle()
        rolled = ngcx(project, "deploy", "-f", "ngcx.fp16.yaml", "--service", "s1", env=state)
        load.settle()
    assert rolled.returncode == 0, rolled.stderr[-3000:]
    assert not load.errors and load.total() > 100, (load.seen, load.errors[:5])
    print(f"rolling update of 3 replicas under {LOAD_CLIENTS} clients: {load.total()} requests, 0 failed")
    svc = show(project, "s1", state)
    v2 = svc["version"]
    assert v2 != v1 and svc["image"].startswith("ngcx-app/onnx-zero-code-fp16")
    assert len(svc["members"]) == 3 and {m["spec"]["version"] for m in svc["members"]} == {v2}
    old = [c for c in containers(docker_client, {"label": "ai.ngcx.deployment"})
           if c.image.id == v1]
    assert not old, "an old-version replica outlived the update"

    # a version that crashes is rolled back in one line; the FP16 replicas kept answering
    with Load(url, key, payload) as load:
        load.settle()
        crash = ngcx(project, "deploy", "-f", "ngcx.fp16.yaml", "--service", "s1", "--",
                     "ngcx-runtime", "serve", "/no/such/model", env=state)
        load.settle()
    assert crash.returncode != 0 and "rolled back" in crash.stderr, crash.stderr[-2000:]
    assert len([ln for ln in crash.stderr.splitlines() if ln.startswith("ngcx: error")]) == 1, crash.stderr
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    svc = show(project, "s1", state)
    assert svc["status"] == "ready" and svc["version"] == v2 and len(svc["members"]) == 3
    assert "rolled back" in svc["detail"]

    # scale in to 1 under load: the two leaving replicas drain, nothing fails
    with Load(url, key, payload) as load:
        load.settle()
        scaled = ngcx(project, "deployments", "scale", "s1", "1", env=state)
        load.settle()
    assert scaled.returncode == 0, scaled.stderr[-2000:]
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    assert len(show(project, "s1", state)["members"]) == 1

    # scale out to 2, kill one replica's container: reconcile replaces it, the balancer stops sending to it
    assert ngcx(project, "deployments", "scale", "s1", "2", env=state).returncode == 0
    members = show(project, "s1", state)["members"]
    victim = members[0]
    docker_client.containers.get(victim["container"]).kill()
    fixed = ngcx(project, "deployments", "reconcile", "s1", env=state)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert f"replica {victim['id']}'s host is stopped; replacing it" in fixed.stderr
    svc = show(project, "s1", state)
    assert len(svc["members"]) == 2 and victim["id"] not in {m["id"] for m in svc["members"]}
    with Load(url, key, payload) as load:
        load.settle(40)
    assert not load.errors, load.errors[:5]
    again = ngcx(project, "deployments", "reconcile", "s1", env=state)      # nothing left to do
    assert again.returncode == 0 and "replacing" not in again.stderr, again.stderr

    # rollback: back to the INT8 version, under load, nothing fails
    with Load(url, key, payload) as load:
        load.settle()
        back = ngcx(project, "deployments", "rollback", "s1", env=state)
        load.settle()
    assert back.returncode == 0, back.stderr[-2000:]
    assert not load.errors, (load.seen, load.errors[:5])
    assert show(project, "s1", state)["version"] == v1

    # the service's key rotates on every replica; stop empties the balancer, start fills it again
    assert ngcx(project, "deployments", "rotate-key", "s1", "--grace", "0", env=state).returncode == 0
    new_key = ngcx(project, "deployments", "key", "s1", env=state).stdout.strip()
    assert new_key.startswith("ngcx_") and new_key != key
    assert [infer_status(url, k, payload) for k in (key, new_key)] == [401, 200]
    assert ngcx(project, "deployments", "stop", "s1", env=state).returncode == 0
    assert show(project, "s1", state)["status"] == "stopped"
    assert infer_status(url, new_key, payload) == 503                 # the balancer stays, with no replica
    started = ngcx(project, "deployments", "start", "s1", env=state)
    assert started.returncode == 0 and started.stdout.strip() == url, started.stderr[-2000:]
    assert infer_status(url, new_key, payload) == 200

    # a replica is changed through its service only
    member = show(project, "s1", state)["members"][0]
    refused = ngcx(project, "deployments", "destroy", str(member["id"]), "--yes", env=state)
    assert refused.returncode == 2 and "replica of service s1" in refused.stderr

    gone = ngcx(project, "deployments", "destroy", "s1", "--yes", env=state)
    assert gone.returncode == 0, gone.stderr
    last = show(project, "s1", state)
    assert not containers(docker_client, {"name": f"{last['name']}-lb"})    # the balancer
    assert last["status"] == "destroyed" and not last["members"]
    assert not any(containers(docker_client, {"id": m["container"]}) for m in svc["members"])
    assert not docker_client.networks.list(names=[last["name"]])
    assert ngcx(project, "deployments", "key", "s1", env=state).returncode == 2


def test_a_service_killed_while_it_is_made_is_finished_by_reconcile_and_gc(project, docker_client, state):
    """kill -9 after the balancer exists and a replica is on its way: the records say what was made; reconcile
    finishes the service (the count, the balancer, no half-made replica left); a killed create whose row has
    no balancer yet leaves a balancer that gc deletes."""
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--cloud", "local", "--replicas", "2", *FAST],
                            cwd=project, env={**_env(), **state}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "balancer" not in _peek_rows(state):
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=30)
    assert proc.returncode == -9                                   # killed mid-way, not finished
    assert show(project, "s1", state)["status"] == "creating"
    done = ngcx(project, "deployments", "reconcile", "s1", env=state)
    assert done.returncode == 0, done.stderr[-2000:]
    svc = show(project, "s1", state)
    assert svc["status"] == "ready" and len(svc["members"]) == 2
    assert {m["status"] for m in svc["members"]} == {"ready"}
    gc = ngcx(project, "deployments", "gc", "--yes", env=state)
    assert gc.returncode == 0, gc.stderr
    assert ngcx(project, "deployments", "destroy", "s1", "--yes", env=state).returncode == 0
    assert not docker_client.networks.list(names=[svc["name"]])
    assert not [c.name for c in containers(docker_client, {}) if c.name.startswith(svc["name"])]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "NGCX_BASE": "offline"}


def _peek_rows(state: dict[str, str]) -> str:
    """The services row's balancer column, read as any SQLite reader would (no ngcx lock taken)."""
    import sqlite3

    path = Path(state["NGCX_STATE_DIR"]) / "state.db"
    if not path.exists():
        return ""
    try:
        with sqlite3.connect(path, timeout=1) as conn:
            rows = conn.execute("SELECT balancer FROM services").fetchall()
    except sqlite3.Error:
        return ""
    return "".join(r[0] for r in rows if r[0] != "{}" and "balancer_id" in r[0]) and "balancer"



def test_an_update_killed_half_way_is_finished_by_reconcile_without_a_failed_request(fp16, docker_client, state):
    """kill -9 while the new version's replicas come up: the row already names the new version, so reconcile
    finishes the update (half-made replicas removed, the old ones drained only once the new ones are in)."""
    project = fp16
    made = ngcx(project, "deploy", "--cloud", "local", "--replicas", "2", *FAST, env=state)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    key = ngcx(project, "deployments", "key", "s1", env=state).stdout.strip()
    old = {m["id"] for m in show(project, "s1", state)["members"]}
    with Load(url, key, body(project)) as load:
        load.settle()
        proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "-f", "ngcx.fp16.yaml", "--service", "s1"],
                                cwd=project, env={**_env(), **state}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and _replica_rows(state) <= len(old):
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        assert proc.returncode == -9
        listed = ngcx(project, "deployments", "ls", env=state)
        assert "service s1 (local) was interrupted while updating" in listed.stderr, listed.stderr
        fixed = ngcx(project, "deployments", "reconcile", "s1", env=state)
        load.settle()
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert not load.errors, (load.seen, load.errors[:5])
    svc = show(project, "s1", state)
    assert svc["status"] == "ready" and len(svc["members"]) == 2 and "fp16" in svc["image"]
    assert {m["spec"]["version"] for m in svc["members"]} == {svc["version"]}
    assert not old & {m["id"] for m in svc["members"]}
    gc = ngcx(project, "deployments", "gc", "--json", env=state)
    assert gc.returncode == 0 and json.loads(gc.stdout) == [], gc.stdout
    assert ngcx(project, "deployments", "destroy", "s1", "--yes", env=state).returncode == 0


def _replica_rows(state: dict[str, str]) -> int:
    """How many replica rows the services have (read as any SQLite reader would)."""
    import sqlite3

    try:
        with sqlite3.connect(Path(state["NGCX_STATE_DIR"]) / "state.db", timeout=1) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM deployments WHERE service_id IS NOT NULL").fetchone()[0])
    except sqlite3.Error:
        return 0
