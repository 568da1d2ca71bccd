"""`ngcx deploy --cloud aws` through real boto3 against the AWS test double (moto's server behind
tests/emulators/aws_ec2.py), whose instances are real machines (containers with their own dockerd,
disk and address) and whose SSM Run Command runs on them.

What a user notices (issue 11, "Done when"): push to ECR (ecr://, the repository created) -> bake a
host image (hosts bake --cloud aws: the one cold pull) -> deploy -> a correct KServe inference
through the printed URL -> logs through SSM -> stop (EBS kept) -> deploy again from the stopped
host -> the running host reused -> a restart without capacity falls back to a new host -> destroy,
and the instances are gone. A wrong secret is one line; no secret (the secret key, the ECR token)
is in any output, state row or host file.

The `aws` fixture is built like the session clouds of e2e/clouds.py (same Cloud object), so it can
move there and join the shared fault suite; moto keeps one state per process, so only one AWS
emulator may run at a time in a session.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from deploy_helpers import one_inference
from e2e.clouds import NO_PROXY_ENV, Cloud, phase_line, state_of

pytestmark = [pytest.mark.docker, pytest.mark.slow]

KEY, SECRET = "AKIANGCXE2ETEST00001", "aws-secret-never-printed-4b9e"
REGION = "us-east-1"
G5 = "g5.xlarge"


@pytest.fixture(scope="module")
def aws(docker_client, registry, relay, project, tmp_path_factory) -> Iterator[Cloud]:
    """AWS: the EC2/SSM/ECR double, the image pushed to "ECR" and a host image baked."""
    from emulators.aws_ec2 import Ec2Emulator
    from emulators.docker_hosts import DockerHosts

    home = tmp_path_factory.mktemp("aws-home")
    hosts = DockerHosts(docker_client, insecure_registries=[relay.address])
    # boot/start seconds: the API-side delay on top of the machine's own real boot (its dockerd start)
    with Ec2Emulator(hosts, access_keys={KEY: SECRET}, boot_seconds=1.0, start_seconds=1.0) as emulator:
        env = {"AWS_ENDPOINT_URL": emulator.endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
               "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
               "NGCX_ECR_ENDPOINT": registry, "NGCX_ECR_VPC_ENDPOINT": relay.address,
               "NGCX_STATE_DIR": str(home / "state"), "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker"),
               **NO_PROXY_ENV}
        cloud = Cloud("aws", emulator, hosts, project, env, "A10G", G5, ("InsufficientInstanceCapacity", 500),
                      ("RequestLimitExceeded", 503), ("InternalError", 500), "AWS_SECRET_ACCESS_KEY", SECRET,
                      emulator.set_capacity)
        pushed = cloud.ngcx("push", "ngcx-app/onnx-zero-code:latest", "--registry", f"ecr://{REGION}/e2e")
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        created = [c for name, c in emulator.calls if name == "CreateRepository"]
        assert [c["repositoryName"] for c in created] == ["e2e/onnx-zero-code"]
        assert [name for name, _ in emulator.calls].count("GetAuthorizationToken") >= 1, "push logs in with a token"
        t0 = time.monotonic()
        baked = cloud.ngcx("hosts", "bake", "--cloud", "aws", "--region", REGION)
        assert baked.returncode == 0, baked.stderr[-3000:]
        cloud.baked = baked.stdout.strip()
        print(f"aws bake: {time.monotonic() - t0:.1f} s")
        assert [m["state"] for m in emulator.images() if m["id"] == cloud.baked] == ["available"]
        assert not [i for i in emulator.instances() if i["tags"].get("ngcx:role") == "bake"
                    and state_of(i) not in ("terminated", "shutting-down")], "the builder is left"
        yield cloud


def ecr_password(emulator) -> str:
    ecr = boto3.client("ecr", endpoint_url=emulator.endpoint, region_name=REGION, aws_access_key_id=KEY,
                       aws_secret_access_key=SECRET)
    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    return base64.b64decode(token).decode().split(":", 1)[1]


def instance(cloud: Cloud, instance_id: str) -> dict:
    [found] = [i for i in cloud.emulator.instances() if i["id"] == instance_id]
    return found


def test_push_bake_deploy_infer_stop_redeploy_running_restart_failure_destroy(aws):
    cloud = aws
    first = cloud.deploy()
    assert first.returncode == 0, first.stderr[-3000:]
    one_inference(cloud.project, first.stdout.strip())
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
    one_inference(cloud.project, again.stdout.strip())
    second = cloud.records()[0]
    assert second["path"] == "stopped-host" and second["instance_id"] == rec["instance_id"]
    assert second["phases"]["pull"] < 5, second["phases"]                # nothing crossed the network
    print("stopped host:", phase_line(again))

    logs = cloud.ngcx("deployments", "logs", str(second["id"]), "--tail", "20")
    assert logs.returncode == 0 and "ready" in logs.stdout.lower(), logs.stdout[-1500:]   # via SSM Run Command

    running = cloud.deploy()                                    # the running host: swap the container only
    assert running.returncode == 0, running.stderr[-3000:]
    third = cloud.records()[0]
    assert third["path"] == "running-host" and third["instance_id"] == rec["instance_id"]
    one_inference(cloud.project, running.stdout.strip())
    print("running host:", phase_line(running))

    assert cloud.ngcx("deployments", "stop", str(third["id"])).returncode == 0
    cloud.emulator.fail_restart(rec["instance_id"])             # the stop released the GPU; none left in the zone
    fallback = cloud.deploy()
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "cannot start again (InsufficientInstanceCapacity" in fallback.stderr
    fourth = cloud.records()[0]
    assert fourth["path"] == "fresh-host" and fourth["instance_id"] != rec["instance_id"]
    one_inference(cloud.project, fallback.stdout.strip())

    for record in (fourth, third):
        assert cloud.ngcx("deployments", "destroy", str(record["id"]), "--yes").returncode == 0
    gone = {i["id"]: state_of(i) for i in cloud.emulator.instances()}
    assert gone[rec["instance_id"]] in ("terminated", "shutting-down")
    assert gone[fourth["instance_id"]] in ("terminated", "shutting-down")


def test_a_wrong_secret_is_one_line_without_the_secret(aws):
    wrong = "this-is-the-wrong-secret-9d1e"
    done = aws.ngcx("deploy", "--cloud", "aws", "--gpu", "A10G", env={"AWS_SECRET_ACCESS_KEY": wrong})
    assert done.returncode == 2
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "AWS rejected the credentials (AuthFailure)" in line and wrong not in done.stderr


def test_no_secret_in_outputs_state_or_on_the_hosts(aws):
    done = aws.deploy()                                         # a host that got a token through its user-data
    assert done.returncode == 0, done.stderr[-3000:]
    rec = aws.records()[0]
    needles = [SECRET, ecr_password(aws.emulator)]
    for text in aws.outputs:
        assert not [n for n in needles if n in text]
    db = Path(aws.env["NGCX_STATE_DIR"]) / "state.db"
    blob = b"".join(p.read_bytes() for p in db.parent.glob("state.db*"))
    assert not [n for n in needles if n.encode() in blob]
    config = Path(aws.env["DOCKER_CONFIG"]) / "config.json"
    assert not config.exists() or not [n for n in needles if n in config.read_text()]
    checked = 0
    for inst in aws.emulator.instances():
        if state_of(inst) != "running":
            continue
        console = aws.hosts.console_output(inst["id"])
        files = aws.hosts.run_command(inst["id"], "cat /var/lib/cloud/* /root/.docker/config.json "
                                      "/var/lib/ngcx/* /var/log/cloud-init-output.log 2>/dev/null; true", 30)
        assert not [n for n in needles if n in console or n in files.output], inst["id"]
        checked += 1
    assert checked
    assert aws.ngcx("deployments", "destroy", str(rec["id"]), "--yes").returncode == 0
