"""`ngcx deploy --cloud aws` through real boto3 against the AWS test double (moto's server behind
tests/emulators/aws_ec2.py), whose instances are real machines (containers with their own dockerd,
disk and address) and whose SSM Run Command runs on them.

What a user notices (issue 11, "Done when"): push to ECR (ecr://, the repository created) -> bake a
host image (hosts bake --cloud aws: the one cold pull) -> deploy -> a correct KServe inference
through the printed URL -> logs through SSM -> stop (EBS kept) -> deploy again from the stopped
host -> the running host reused -> a restart without capacity falls back to a new host -> destroy,
and the instances are gone. A wrong secret is one line; no secret (the secret key, the ECR token)
is in any output, state row or host file.

The session's `aws` cloud (push + bake) is built in e2e/clouds.py; the faults every cloud must
survive (duplicates, capacity, kill -9, never ready, wrong secret, no secret anywhere) are in
test_deploy_faults.py.
"""

from __future__ import annotations

import pytest
from deploy_helpers import one_inference
from e2e.clouds import Cloud, phase_line, state_of

pytestmark = [pytest.mark.docker, pytest.mark.slow]

G5 = "g5.xlarge"


def instance(cloud: Cloud, instance_id: str) -> dict:
    [found] = [i for i in cloud.emulator.instances() if i["id"] == instance_id]
    return found


def test_push_bake_deploy_infer_stop_redeploy_running_restart_failure_destroy(aws):
    cloud = aws
    first = cloud.deploy()
    assert first.returncode == 0, first.stderr[-3000:]
    one_inference(cloud.project, first.stdout.strip(), cloud.env)
    rec = cloud.records()[0]
    assert rec["status"] == "ready" and rec["path"] == "fresh-host" and rec["instance_type"] == G5
    [inst] = cloud.mine(rec["id"])
    assert inst["image_id"] == cloud.baked and inst["state"] == "running"
    assert inst["client_token"] == rec["client_token"] and inst["tags"]["ngcx:owner"]
    assert inst["volume_ids"] and set(rec["phases"]) == {"api", "boot", "pull", "start", "ready"}
    print("fresh (baked):", phase_line(first))

    assert cloud.ngcx("deployments", "stop", str(rec["id"])).returncode == 0
    assert instance(cloud, rec["instance_id"])["state"] == "stopped"

    again = cloud.deploy()                                      # the stopped host, with its pulled layers
    assert again.returncode == 0, again.stderr[-3000:]
    one_inference(cloud.project, again.stdout.strip(), cloud.env)
    second = cloud.records()[0]
    assert second["path"] == "stopped-host" and second["instance_id"] == rec["instance_id"]
    assert second["phases"]["pull"] < 5, second["phases"]                # nothing crossed the network
    print("stopped host:", phase_line(again))

    logs = cloud.ngcx("deployments", "logs", str(second["id"]), "--tail", "20")
    assert logs.returncode == 0 and "ready" in logs.stdout.lower(), logs.stdout[-1500:]   # via SSM Run Command

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
    cloud.emulator.fail_restart(rec["instance_id"])             # the stop released the GPU; none left in the zone
    fallback = cloud.deploy()
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "cannot start again (InsufficientInstanceCapacity" in fallback.stderr
    fourth = cloud.records()[0]
    assert fourth["path"] == "fresh-host" and fourth["instance_id"] != rec["instance_id"]
    one_inference(cloud.project, fallback.stdout.strip(), cloud.env)

    for record in (fourth, third):
        assert cloud.ngcx("deployments", "destroy", str(record["id"]), "--yes").returncode == 0
    gone = {i["id"]: state_of(i) for i in cloud.emulator.instances()}
    assert gone[rec["instance_id"]] in ("terminated", "shutting-down")
    assert gone[fourth["instance_id"]] in ("terminated", "shutting-down")
