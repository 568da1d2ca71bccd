"""The faults every cloud must survive, written once and run for each emulated cloud (issue 11 item 4).

What a user notices: throttling and a 5xx whose answer was lost create no second billed instance; no
capacity in one zone lands in the next; kill -9 between the create call and the record update is found
by `ngcx deployments gc`; a container that never gets ready shows its last lines and its host is
deleted; a wrong secret is one line without the secret; and no secret (cloud key, registry token, the
host role's credentials, the endpoint's key before and after rotate-key, or its hash) is in any output,
state row, host file or log, nor in what the cloud keeps of a deploy (user-data, command text): the host
logs in to the registry with its own pull-only role.
A new cloud joins by adding its fixture name to CLOUDS.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from deploy_helpers import one_inference

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CLOUDS = ["aliyun", "aws"]


@pytest.fixture(params=CLOUDS)
def cloud(request):
    return request.getfixturevalue(request.param)


def test_throttling_and_a_lost_5xx_make_no_duplicate_and_no_capacity_moves_zones(cloud):
    emu = cloud.emulator
    before = emu.performed("RunInstances")
    emu.fail_next("RunInstances", *cloud.capacity)                               # the first zone: none left
    emu.fail_next("RunInstances", *cloud.throttle, times=2)
    emu.fail_next("RunInstances", *cloud.server_error, after_effect=True)       # created, the answer lost
    done = cloud.deploy()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{cloud.capacity[0]}; trying the next" in done.stderr
    rec = cloud.records()[0]
    [inst] = cloud.mine(rec["id"])                                              # one instance, not two
    assert emu.performed("RunInstances") - before == 1
    assert inst["id"] == rec["instance_id"] and inst["zone"] == rec["zone"]
    one_inference(cloud.project, done.stdout.strip(), cloud.env)
    assert cloud.ngcx("deployments", "destroy", str(rec["id"]), "--yes").returncode == 0


def test_kill_9_between_the_create_call_and_the_record_is_found_by_gc(cloud):
    emu = cloud.emulator
    release = threading.Event()
    emu.hold("RunInstances", release)
    before = emu.performed("RunInstances")
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--cloud", cloud.name, "--gpu", cloud.gpu,
                             "--gpu-mode", "auto"], cwd=cloud.project, env={**os.environ, **cloud.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while emu.performed("RunInstances") == before:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)                    # the cloud made it; ngcx never heard back
        proc.wait(timeout=30)
    finally:
        release.set()                                       # later calls answer at once again
    rec = cloud.records()[0]
    assert rec["status"] == "creating" and rec["instance_id"] is None and rec["client_token"]
    [orphan] = cloud.mine(rec["id"])

    listed = cloud.ngcx("deployments", "ls")
    assert f"deployment {rec['id']} ({cloud.name}) was interrupted while creating" in listed.stderr
    gc = cloud.ngcx("deployments", "gc", "--yes")
    assert gc.returncode == 0 and orphan["id"] in gc.stdout, gc.stderr[-2000:]
    deadline = time.monotonic() + 60
    while cloud.mine(rec["id"]):
        assert time.monotonic() < deadline, "gc did not delete the orphan"
        time.sleep(0.5)
    assert cloud.records()[0]["status"] == "failed"


def test_a_container_that_never_gets_ready_shows_its_last_lines_and_its_host_is_deleted(cloud):
    done = cloud.deploy("--", "sh", "-c", "echo weights-file-truncated >&2; exit 3")
    assert done.returncode == 2
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert "weights-file-truncated" in line and "exited" in line
    rec = cloud.records()[0]
    assert rec["status"] == "failed" and "weights-file-truncated" in rec["detail"] and "deleted" in rec["detail"]
    assert not cloud.mine(rec["id"])                                     # nothing billed is left


def test_a_wrong_secret_is_one_line_without_the_secret(cloud):
    wrong = "this-is-the-wrong-secret-9d1e"
    done = cloud.ngcx("deploy", "--cloud", cloud.name, "--gpu", cloud.gpu, env={cloud.secret_var: wrong})
    assert done.returncode == 2
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "rejected" in line and wrong not in done.stderr and cloud.secret not in done.stderr


def sent_to_the_cloud(emulator, since: int = 0, until: int | None = None) -> str:
    """Every request ngcx sent the emulated cloud (calls number `since` to `until`), with base64 user-data and
    command text decoded: what the cloud keeps (DescribeUserData, the command history). The hosts' own token
    requests are left out: they carry the role's session token to the API, as the protocol has them do."""
    calls = [(action, params) for action, params in emulator.calls[since:until] if action != "GetAuthorizationToken"]
    texts = [json.dumps(params, default=str) for _action, params in calls]
    for _action, params in calls:
        for name in ("UserData", "CommandContent"):
            value = params.get(name) if isinstance(params, dict) else None
            if value:
                with contextlib.suppress(ValueError):
                    texts.append(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
    return "\n".join(texts)


def test_the_bake_builder_pulled_with_its_role_and_no_registry_secret_reached_the_cloud(cloud):
    emu = cloud.emulator
    first_call, last_call, first_grant, last_grant = cloud.bake_window
    grants = emu.token_grants[first_grant:last_grant]
    assert grants, "the builder must have asked for its registry login itself"
    for grant in grants:                                  # its role may pull what it pre-pulls, nothing else
        assert grant["caller"].startswith("role:ngcx-pull-")
        assert len(grant["pull"]) == 1 and grant["pull"][0].endswith("e2e/onnx-zero-code")
    sent = sent_to_the_cloud(emu, since=first_call, until=last_call)
    assert "docker pull" in sent, "the bake script must be among what was read"
    assert not [n for n in [cloud.secret, *emu.issued_tokens, *emu.issued_secrets()] if n in sent]


def test_a_token_login_is_an_explicit_fallback_that_says_what_it_leaves(cloud):
    emu = cloud.emulator
    first_call, first_token, first_grant = len(emu.calls), len(emu.issued_tokens), len(emu.token_grants)
    done = cloud.deploy("--registry-login", "token")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--registry-login token:" in done.stderr and "keeps" in done.stderr       # what it leaves, said once
    rec = cloud.records()[0]
    tokens = emu.issued_tokens[first_token:]
    assert tokens and [t for t in tokens if t in sent_to_the_cloud(emu, since=first_call)], \
        "the token is in the host job: the fallback leaves it with the cloud"
    assert not [g for g in emu.token_grants[first_grant:] if g["instance"] == rec["instance_id"]]
    one_inference(cloud.project, done.stdout.strip(), cloud.env)
    assert cloud.ngcx("deployments", "destroy", str(rec["id"]), "--yes").returncode == 0


def test_no_secret_in_outputs_state_or_on_the_hosts(cloud):
    emu = cloud.emulator
    first_call, first_grant = len(emu.calls), len(emu.token_grants)
    done = cloud.deploy()                 # a host that logged in to the registry with its instance role
    assert done.returncode == 0, done.stderr[-3000:]
    rec = cloud.records()[0]
    grants = [g for g in emu.token_grants[first_grant:] if g["instance"] == rec["instance_id"]]
    assert grants, "the host must have asked for its registry login itself"
    for grant in grants:                                        # with its role, for that one repository only
        assert grant["caller"].startswith("role:ngcx-pull-")
        assert len(grant["pull"]) == 1 and grant["pull"][0].endswith("e2e/onnx-zero-code")
    keyfile = Path(cloud.env["NGCX_STATE_DIR"]) / "keys" / f"{rec['id']}.key"
    key = keyfile.read_text().strip()
    rotated = cloud.ngcx("deployments", "rotate-key", str(rec["id"]), "--grace", "0")   # through the command channel
    assert rotated.returncode == 0, rotated.stderr[-2000:]
    new_key = keyfile.read_text().strip()
    one_inference(cloud.project, done.stdout.strip(), cloud.env)                   # the new key, pinned TLS
    needles = [cloud.secret, *emu.issued_tokens, *emu.issued_secrets()]
    keys = [key, new_key]
    hashes = [hashlib.sha256(k.encode()).hexdigest() for k in keys]
    console = cloud.hosts.console_output(rec["instance_id"])
    files = cloud.hosts.run_command(rec["instance_id"], "cat /var/lib/cloud/* /root/.docker/config.json "
                                    "/var/lib/ngcx/* /var/log/cloud-init-output.log 2>/dev/null; "
                                    "docker inspect ngcx-serve; docker logs ngcx-serve 2>&1; true", 30)
    assert "ngcx-host: started deployment" in console + files.output      # we read the right machine
    assert not [n for n in needles + keys + hashes if n in console or n in files.output]
    # user-data and command text: no endpoint key, no cloud secret, no registry token, no role credential
    assert not [n for n in needles + keys if n in sent_to_the_cloud(emu, since=first_call)]
    assert cloud.ngcx("deployments", "destroy", str(rec["id"]), "--yes").returncode == 0
    assert not keyfile.exists()                                            # the key went with the deployment
    for text in cloud.outputs:
        assert not [n for n in needles + keys + hashes if n in text]
    db = Path(cloud.env["NGCX_STATE_DIR"]) / "state.db"
    blob = b"".join(p.read_bytes() for p in db.parent.glob("state.db*"))
    assert not [n for n in needles + keys + hashes if n.encode() in blob]
    config = Path(cloud.env["DOCKER_CONFIG"]) / "config.json"
    assert not config.exists() or not [n for n in needles if n in config.read_text()]
