"""A deployed model answers only to its owner (issue 20), tried as an attacker on the same network would.

The deployment is a real `ngcx deploy --cloud local` of the example project (with --grpc-port added to
its command, so both protocols are tried); the attacker is a container on the engine's bridge, so the
server sees a peer that is not loopback. What a user notices: every category but health needs the key;
a wrong key is no better than none; unload is refused even with the key (model control is off) and
the model stays ready; shared memory stays loopback-only; the key and its hash are in no output,
state row, log or `docker inspect`; `rotate-key` under load fails no request and the old key is then
refused.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from deploy_helpers import MODEL, ngcx

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ATTACKER = Path(__file__).with_name("attacker.py")
IMAGE = "ngcx-app/onnx-zero-code:latest"

HTTP_EXPECT = {   # (no key, wrong key, right key)
    "health": (200, 200, 200), "metadata": (401, 401, 200), "inference": (401, 401, 200),
    "shared-memory": (401, 401, 403), "statistics": (401, 401, 200), "unknown": (401, 401, 404),
}
GRPC_EXPECT = {
    "health": ("OK", "OK", "OK"), "metadata": ("UNAUTHENTICATED",) * 2 + ("OK",),
    "shared-memory": ("UNAUTHENTICATED",) * 2 + ("PERMISSION_DENIED",),
    "statistics": ("UNAUTHENTICATED",) * 2 + ("OK",),
}


@pytest.fixture(scope="module")
def deployed(project, docker_client, tmp_path_factory):
    """(state env, record, key): the project deployed locally with gRPC on 8001 as well."""
    state = {"NGCX_STATE_DIR": str(tmp_path_factory.mktemp("security") / "state")}
    cmd = docker_client.images.get(IMAGE).attrs["Config"]["Cmd"]
    done = ngcx(project, "deploy", "--cloud", "local", "--", *cmd, "--grpc-port", "8001", env=state)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = json.loads(ngcx(project, "deployments", "ls", "--json", env=state).stdout)
    key = (Path(state["NGCX_STATE_DIR"]) / "keys" / f"{record['id']}.key").read_text().strip()
    assert key not in done.stdout + done.stderr               # not a terminal: the key is not printed
    assert f"Bearer $(ngcx deployments key {record['id']})" in done.stderr
    yield state, record, key, done
    ngcx(project, "deployments", "destroy", str(record["id"]), "--yes", env=state)


def attack(docker_client, record: dict, key: str) -> dict:
    container = docker_client.containers.get(record["container"])
    address = container.attrs["NetworkSettings"]["IPAddress"]
    assert address and not address.startswith("127."), "the served container must be on the bridge"
    done = subprocess.run(["/usr/bin/docker", "run", "-i", "--rm", "--network", "bridge", "--entrypoint", "python3",
                           "-v", f"{ATTACKER}:/attacker.py:ro", IMAGE, "/attacker.py"],
                          input=json.dumps({"host": address, "key": key, "model": MODEL}), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_category_from_a_peer_on_the_network(deployed, docker_client):
    _state, record, key, _done = deployed
    seen = attack(docker_client, record, key)
    print(json.dumps(seen, indent=1))                         # the table of the closing note
    for name, got in seen["http"].items():
        category = name.split(":")[0]
        want = HTTP_EXPECT.get(category) or {"model-repository": (401, 401, 403 if "unload" in name else 200)}[category]
        assert (got["none"], got["wrong"], got["right"]) == want, (name, got)
    for name, got in seen["grpc"].items():
        category = name.split(":")[0]
        row = (got["none"], got["wrong"], got["right"])
        if category == "inference":      # the key gets it past the door; the empty request then fails as it should
            assert row[:2] == ("UNAUTHENTICATED",) * 2 and row[2] not in ("UNAUTHENTICATED", "PERMISSION_DENIED", "OK")
        elif category == "model-repository":
            assert row == ("UNAUTHENTICATED",) * 2 + ("PERMISSION_DENIED" if "Unload" in name else "OK",), (name, row)
        else:
            assert row == GRPC_EXPECT[category], (name, row)
    assert seen["still ready"] == 200                          # the unload attempts took nothing down


def test_the_key_and_its_hash_are_in_no_output_state_log_or_inspect(deployed, project, docker_client):
    state, record, key, done = deployed
    digest = hashlib.sha256(key.encode()).hexdigest()
    texts = [done.stdout, done.stderr]
    for args in (("deployments", "ls", "--json"), ("deployments", "show", str(record["id"])),
                 ("deployments", "show", str(record["id"]), "--json"), ("deployments", "logs", str(record["id"]))):
        out = ngcx(project, *args, env=state)
        assert out.returncode == 0, out.stderr
        texts += [out.stdout, out.stderr]
    container = docker_client.containers.get(record["container"])
    texts += [json.dumps(container.attrs), container.logs().decode(errors="replace")]
    blob = b"".join(p.read_bytes() for p in Path(state["NGCX_STATE_DIR"]).glob("state.db*"))
    for needle in (key, digest):
        assert not [t for t in texts if needle in t]
        assert needle.encode() not in blob
    env = container.attrs["Config"]["Env"]
    assert "NGCX_RUNTIME_AUTH_KEYS=/run/ngcx/auth/keys" in env   # a path, not a secret
    keyfile = Path(state["NGCX_STATE_DIR"]) / "keys" / f"{record['id']}.key"
    assert keyfile.stat().st_mode & 0o077 == 0


def test_rotate_key_under_load_fails_no_request_and_then_refuses_the_old_key(deployed, project):
    from ngcx.project.client import Client

    state, record, old, _done = deployed
    current = {"key": old}
    failures: list[int] = []
    count = {"n": 0}
    stop = threading.Event()

    def load() -> None:                      # bounded: at most 20000 requests or 90 s
        client = Client(record["endpoint"], timeout=10)
        deadline = time.monotonic() + 90
        while not stop.is_set() and count["n"] < 20000 and time.monotonic() < deadline:
            client.key = current["key"]
            status = client.status("GET", f"/v2/models/{MODEL}")
            count["n"] += 1
            if status != 200:
                failures.append(status)
        client.close()

    def follow() -> None:                    # a client that picks up the new key as a user would
        deadline = time.monotonic() + 90
        while not stop.is_set() and time.monotonic() < deadline:
            got = ngcx(project, "deployments", "key", str(record["id"]), env=state)
            if got.returncode == 0 and got.stdout.strip():
                current["key"] = got.stdout.strip()
            time.sleep(0.2)

    threads = [threading.Thread(target=load), threading.Thread(target=follow)]
    for thread in threads:
        thread.start()
    try:
        rotated = ngcx(project, "deployments", "rotate-key", str(record["id"]), "--grace", "3", env=state)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert rotated.returncode == 0, rotated.stderr[-2000:]
    new = ngcx(project, "deployments", "key", str(record["id"]), env=state).stdout.strip()
    assert new and new != old and count["n"] > 50 and not failures, (count, failures[:5])
    assert Client(record["endpoint"], key=old).status("GET", "/v2") == 401
    assert Client(record["endpoint"], key=new).status("GET", "/v2") == 200
    assert old not in rotated.stdout + rotated.stderr and new not in rotated.stdout + rotated.stderr
