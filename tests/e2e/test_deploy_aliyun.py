"""`ngcx deploy --cloud aliyun` through the real Alibaba Cloud SDK against the ECS emulator, whose
instances are real machines (containers with their own dockerd, disk and address: tests/emulators).

What a user notices (issue 10, "Done when"): push to ACR -> bake a host image -> deploy -> a correct
KServe inference through the printed URL -> logs -> stop/start -> stop -> deploy again from the stopped
host -> a running host reused -> a restart that fails for stock falls back to a new host -> destroy,
and the instances are gone in the cloud. The faults every cloud must survive are in
test_deploy_faults.py; the session's `aliyun` cloud (push + bake) is built in clouds.py.
"""

from __future__ import annotations

import pytest
from deploy_helpers import one_inference
from e2e.clouds import phase_line

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_push_deploy_infer_stop_redeploy_restart_failure_destroy(aliyun):
    cloud = aliyun
    first = cloud.deploy()
    assert first.returncode == 0, first.stderr[-3000:]
    url = first.stdout.strip()
    one_inference(cloud.project, url, cloud.env)
    rec = cloud.records()[0]
    assert rec["status"] == "ready" and rec["path"] == "fresh-host" and rec["instance_type"] == cloud.instance_type
    [inst] = cloud.mine(rec["id"])
    assert inst["image_id"] == cloud.baked and inst["status"] == "Running"
    assert inst["client_token"] == rec["client_token"]
    assert set(rec["phases"]) == {"api", "boot", "pull", "start", "ready"}
    print("fresh (baked):", phase_line(first))

    assert cloud.ngcx("deployments", "stop", str(rec["id"])).returncode == 0
    [inst] = [i for i in cloud.emulator.instances() if i["id"] == rec["instance_id"]]
    assert (inst["status"], inst["stopped_mode"]) == ("Stopped", "StopCharging")

    again = cloud.deploy()                                      # the stopped host, with its pulled layers
    assert again.returncode == 0, again.stderr[-3000:]
    one_inference(cloud.project, again.stdout.strip(), cloud.env)
    second = cloud.records()[0]
    assert second["path"] == "stopped-host" and second["instance_id"] == rec["instance_id"]
    assert second["phases"]["pull"] < 5, second["phases"]                # nothing crossed the network
    print("stopped host:", phase_line(again))

    logs = cloud.ngcx("deployments", "logs", str(second["id"]), "--tail", "20")
    assert logs.returncode == 0 and "ready" in logs.stdout.lower(), logs.stdout[-1500:]   # via Cloud Assistant
    assert cloud.ngcx("deployments", "stop", str(second["id"])).returncode == 0
    started = cloud.ngcx("deployments", "start", str(second["id"]))       # the container comes back with the host
    assert started.returncode == 0, started.stderr[-2000:]
    one_inference(cloud.project, started.stdout.strip(), cloud.env)

    sent, granted = len(cloud.emulator.commands_sent(rec["instance_id"])), len(cloud.emulator.token_grants)
    running = cloud.deploy()                                    # the running host: swap the container only
    assert running.returncode == 0, running.stderr[-3000:]
    # it holds the image's digest already: no registry login (no token asked with its role), no pull
    assert not [g for g in cloud.emulator.token_grants[granted:] if g["instance"] == rec["instance_id"]]
    # no round trip for the certificate: the host script's own output carries what the endpoint is pinned to
    host_script, *others = cloud.emulator.commands_sent(rec["instance_id"])[sent:]
    assert "docker run -d --name ngcx-serve" in host_script
    assert not any("tls.crt" in script for script in others), others
    third = cloud.records()[0]
    assert third["path"] == "running-host" and third["instance_id"] == rec["instance_id"]
    one_inference(cloud.project, running.stdout.strip(), cloud.env)
    print("running host:", phase_line(running))

    assert cloud.ngcx("deployments", "stop", str(third["id"])).returncode == 0
    cloud.emulator.fail_restart(rec["instance_id"])             # StopCharging released the GPU; none left
    fallback = cloud.deploy()
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "cannot start again (OperationDenied.NoStock" in fallback.stderr
    fourth = cloud.records()[0]
    assert fourth["path"] == "fresh-host" and fourth["instance_id"] != rec["instance_id"]
    one_inference(cloud.project, fallback.stdout.strip(), cloud.env)

    for record in (fourth, third):
        assert cloud.ngcx("deployments", "destroy", str(record["id"]), "--yes").returncode == 0
    left = {i["id"] for i in cloud.emulator.instances()}
    assert rec["instance_id"] not in left and fourth["instance_id"] not in left
