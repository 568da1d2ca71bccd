"""The AWS test double (tests/emulators/aws_ec2.py): moto's server behind a harness, driven through real
boto3 clients pointed at `.endpoint`, as the product's deploy code will drive it.

What a product developer relies on: a retry with the same ClientToken never makes a second instance
(and boto3's own token differs per call); capacity and throttling errors come in EC2's shape, also
after the cloud did the work; instances are `pending` until their machine is up; stop/start/terminate
and CreateImage reach the machine; user-data runs on it; the addresses reach it; tags land on the
instance and its volumes; the SSM AMI parameter and the ECR token look like AWS's.

Most tests run on PaperHosts (in memory, nothing runs); the `docker` ones use DockerHosts (containers
with their own dockerd), where user-data really runs and the addresses really answer.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from emulators.aws_ec2 import Ec2Emulator
from emulators.docker_hosts import NAME_PREFIX, DockerHosts, ensure_host_image
from emulators.hosts_api import PaperHosts
from ngcx.core.engine import containers
from support import missing

REGION = "us-east-1"
GPU_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended"
G5 = "g5.xlarge"
ZONE_A, ZONE_B, ZONE_C = "us-east-1a", "us-east-1b", "us-east-1c"
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


# --- helpers -----------------------------------------------------------------------------------------

def client(emulator: Ec2Emulator, service: str, attempts: int = 1):
    """A real boto3 client on the emulator; attempts=1 shows every error as the server sent it."""
    config = Config(retries={"mode": "standard", "total_max_attempts": attempts}, connect_timeout=5, read_timeout=60)
    return boto3.client(service, endpoint_url=emulator.endpoint, region_name=REGION, config=config,
                        aws_access_key_id="AKIAEMULATORTEST0000", aws_secret_access_key="emulator-secret")


def until(what: str, check: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(every)
    return value


def gpu_ami(emulator: Ec2Emulator) -> str:
    value = client(emulator, "ssm").get_parameter(Name=GPU_AMI_PARAMETER)["Parameter"]["Value"]
    return json.loads(value)["image_id"]


def launch(ec2, ami: str, **extra: Any) -> dict[str, Any]:
    [instance] = ec2.run_instances(ImageId=ami, InstanceType=extra.pop("InstanceType", G5), MinCount=1, MaxCount=1,
                                   **extra)["Instances"]
    return instance


def describe(ec2, instance_id: str) -> dict[str, Any]:
    [reservation] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservation["Instances"][0]


def state(ec2, instance_id: str) -> str:
    return describe(ec2, instance_id)["State"]["Name"]


def error_of(call: Callable[[], Any]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as caught:
        call()
    error = caught.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"], error["Error"]["Message"]


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3 (and requests) would send loopback and bridge calls through a configured proxy."""
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def paper() -> Iterator[tuple[Ec2Emulator, PaperHosts]]:
    hosts = PaperHosts(create_delay=0.2)
    with Ec2Emulator(hosts, boot_seconds=0.6, start_seconds=0.6) as emulator:
        yield emulator, hosts
        assert emulator.proxy_errors == [] and emulator.host_errors == []
    assert hosts.closed


# --- ClientToken, faults, capacity ---------------------------------------------------------------------

def test_the_same_client_token_replays_the_first_answer_and_makes_one_instance(paper):
    emulator, hosts = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    first = launch(ec2, ami, ClientToken="ngcx-deploy-7")
    again = launch(ec2, ami, ClientToken="ngcx-deploy-7")
    assert again["InstanceId"] == first["InstanceId"]
    assert [i["client_token"] for i in emulator.instances()] == ["ngcx-deploy-7"]
    assert emulator.performed("RunInstances") == 1

    code, status, _ = error_of(lambda: launch(ec2, ami, ClientToken="ngcx-deploy-7", InstanceType="g5.2xlarge"))
    assert (code, status) == ("IdempotentParameterMismatch", 400)

    # boto3 fills a fresh token into every call: without the product's own token, a retry is a second instance
    launch(ec2, ami)
    launch(ec2, ami)
    tokens = [i["client_token"] for i in emulator.instances()]
    assert len(tokens) == 3 and len(set(tokens)) == 3
    until("three machines created", lambda: len(hosts.named("create")) == 3)


def test_a_lost_answer_is_adopted_by_a_retry_with_the_same_token(paper):
    emulator, hosts = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    emulator.fail_next("RunInstances", "InternalError", 500, after_effect=True)
    code, status, _ = error_of(lambda: launch(ec2, ami, ClientToken="lost-1"))
    assert (code, status) == ("InternalError", 500)
    [made] = emulator.instances()
    assert made["client_token"] == "lost-1", "the cloud did the work although the client saw an error"
    assert launch(ec2, ami, ClientToken="lost-1")["InstanceId"] == made["id"]
    assert emulator.performed("RunInstances") == 1

    # boto3's own retries resend the token it made for the call, so they are safe too
    emulator.fail_next("RunInstances", "InternalError", 500, after_effect=True)
    retried = launch(client(emulator, "ec2", attempts=2), ami)
    assert len(emulator.instances()) == 2 and emulator.performed("RunInstances") == 2
    assert retried["InstanceId"] in {i["id"] for i in emulator.instances()}
    until("both machines created", lambda: len(hosts.named("create")) == 2)


def test_throttling_and_capacity_errors_have_ec2s_codes_and_statuses(paper):
    emulator, _ = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    emulator.fail_next("RunInstances", "RequestLimitExceeded", 503, times=2)
    for _ in range(2):
        assert error_of(lambda: launch(ec2, ami))[:2] == ("RequestLimitExceeded", 503)
    assert emulator.performed("RunInstances") == 0 and emulator.instances() == []

    emulator.fail_next("RunInstances", "InsufficientInstanceCapacity", 500, after_effect=True)
    assert error_of(lambda: launch(ec2, ami))[:2] == ("InsufficientInstanceCapacity", 500)
    assert len(emulator.instances()) == 1, "after_effect: created, and the answer lost"

    emulator.set_capacity(ZONE_A, G5, False)
    code, status, message = error_of(lambda: launch(ec2, ami, Placement={"AvailabilityZone": ZONE_A}))
    assert (code, status) == ("InsufficientInstanceCapacity", 500)
    assert ZONE_A in message and f"choosing {ZONE_B}, {ZONE_C}" in message
    assert error_of(lambda: launch(ec2, ami))[0] == "InsufficientInstanceCapacity", "no zone named: moto's us-east-1a"
    assert launch(ec2, ami, InstanceType="g5.2xlarge", Placement={"AvailabilityZone": ZONE_A})
    assert launch(ec2, ami, Placement={"AvailabilityZone": ZONE_B})["Placement"]["AvailabilityZone"] == ZONE_B
    assert emulator.performed("RunInstances") == 3
    assert [c[1].get("Placement.AvailabilityZone") for c in emulator.calls if c[0] == "RunInstances"][-2:] == [
        ZONE_A, ZONE_B]


def test_unknown_types_and_zones_and_bad_user_data_are_refused_before_anything_exists(paper):
    emulator, hosts = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    code, status, message = error_of(lambda: launch(ec2, ami, InstanceType="g9.bogus"))
    assert (code, status) == ("InvalidParameterValue", 400) and "g9.bogus" in message
    code, _, message = error_of(lambda: launch(ec2, ami, Placement={"AvailabilityZone": "us-east-1d"}))
    assert code == "InvalidParameterValue" and "us-east-1d" in message
    assert error_of(lambda: launch(ec2, ami, UserData="x" * (16 * 1024 + 1)))[0] == "InvalidParameterValue"
    assert emulator.instances() == [] and hosts.calls == [] and emulator.performed("RunInstances") == 0
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]]
    assert zones == [ZONE_A, ZONE_B, ZONE_C]
    assert ec2.describe_instance_types(InstanceTypes=["p4d.24xlarge"])["InstanceTypes"][0]["GpuInfo"]["Gpus"][0][
        "Name"] == "A100", "moto's answers that need no help pass unchanged"


def test_restart_failures_answer_insufficient_capacity_once(paper):
    emulator, _ = paper
    ec2 = client(emulator, "ec2")
    instance_id = launch(ec2, gpu_ami(emulator), Placement={"AvailabilityZone": ZONE_B})["InstanceId"]
    until("running", lambda: state(ec2, instance_id) == "running")
    ec2.stop_instances(InstanceIds=[instance_id])
    until("stopped", lambda: state(ec2, instance_id) == "stopped")
    emulator.fail_restart(instance_id)
    assert error_of(lambda: ec2.start_instances(InstanceIds=[instance_id]))[:2] == ("InsufficientInstanceCapacity",
                                                                                     500)
    emulator.set_capacity(ZONE_B, G5, False)
    assert error_of(lambda: ec2.start_instances(InstanceIds=[instance_id]))[0] == "InsufficientInstanceCapacity"
    assert state(ec2, instance_id) == "stopped"
    emulator.set_capacity(ZONE_B, G5, True)
    ec2.start_instances(InstanceIds=[instance_id])
    until("running again", lambda: state(ec2, instance_id) == "running")


def test_hold_answers_only_when_released_and_the_work_is_already_done(paper):
    emulator, _ = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    release = threading.Event()
    emulator.hold("RunInstances", release)
    answers: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: answers.append(launch(ec2, ami, ClientToken="held")))
    caller.start()
    until("the instance exists while the answer is held", lambda: emulator.instances())
    time.sleep(0.2)
    assert answers == [] and caller.is_alive()
    release.set()
    caller.join(10)
    assert [a["InstanceId"] for a in answers] == [i["id"] for i in emulator.instances()]


# --- states, machines, images, tags ---------------------------------------------------------------------

def test_instances_are_pending_until_the_machine_is_up_and_transitions_reach_it(paper):
    emulator, hosts = paper
    ec2 = client(emulator, "ec2")
    user_data = "#!/bin/sh\necho hello from user-data\n"
    launched = launch(ec2, gpu_ami(emulator), UserData=user_data)
    instance_id = launched["InstanceId"]
    assert launched["State"]["Name"] == "pending" and "PrivateIpAddress" not in launched
    early = describe(ec2, instance_id)
    assert early["State"] == {"Code": 0, "Name": "pending"}, "moto alone says running at once"
    assert "PrivateIpAddress" not in early and "PublicIpAddress" not in early
    assert error_of(lambda: ec2.stop_instances(InstanceIds=[instance_id]))[0] == "IncorrectInstanceState"

    ec2.get_waiter("instance_running").wait(InstanceIds=[instance_id], WaiterConfig={"Delay": 1, "MaxAttempts": 10})
    running = describe(ec2, instance_id)
    [(_, created_id, image_id, data)] = hosts.named("create")
    assert (created_id, image_id, data) == (instance_id, launched["ImageId"], user_data.encode())
    ip = running["PrivateIpAddress"]
    assert ip.startswith("10.99.0.") and running["PublicIpAddress"] == ip
    assert running["NetworkInterfaces"][0]["PrivateIpAddress"] == ip
    assert running["PrivateDnsName"] == f"ip-{ip.replace('.', '-')}.ec2.internal"

    ec2.stop_instances(InstanceIds=[instance_id])
    until("stopped", lambda: state(ec2, instance_id) == "stopped")
    assert hosts.machines[instance_id]["on"] is False
    ec2.start_instances(InstanceIds=[instance_id])
    assert state(ec2, instance_id) == "pending"
    until("running", lambda: state(ec2, instance_id) == "running")
    assert hosts.machines[instance_id]["on"] is True
    assert describe(ec2, instance_id)["PrivateIpAddress"] != ip, "the address the machine got on this start"

    ec2.terminate_instances(InstanceIds=[instance_id])
    until("terminated", lambda: state(ec2, instance_id) == "terminated")
    assert instance_id not in hosts.machines
    assert [c[0] for c in hosts.calls if c[1] == instance_id] == ["create", "stop", "start", "delete"]


def test_a_machine_that_cannot_be_created_leaves_a_terminated_instance(paper):
    emulator, hosts = paper
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    hosts.failing_creates.add(ami)
    instance_id = launch(ec2, ami)["InstanceId"]
    until("terminated", lambda: state(ec2, instance_id) == "terminated")
    assert [i for i, _ in emulator.host_errors] == [instance_id]
    emulator.host_errors.clear()


def test_tags_land_on_the_instance_and_its_volumes(paper):
    emulator, _ = paper
    ec2 = client(emulator, "ec2")
    tags = [{"Key": "ngcx:deployment", "Value": "42"}, {"Key": "ngcx:managed", "Value": "1"}]
    instance_id = launch(ec2, gpu_ami(emulator), TagSpecifications=[
        {"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}])["InstanceId"]
    [view] = emulator.instances()
    assert view["tags"] == {"ngcx:deployment": "42", "ngcx:managed": "1"}
    found = ec2.describe_instances(Filters=[{"Name": "tag:ngcx:deployment", "Values": ["42"]}])["Reservations"]
    assert [r["Instances"][0]["InstanceId"] for r in found] == [instance_id]
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
    assert [v["VolumeId"] for v in volumes] == view["volume_ids"]
    assert all({t["Key"]: t["Value"] for t in v["Tags"]} == view["tags"] for v in volumes)


def test_create_image_snapshots_the_machine_and_new_instances_boot_from_it(paper):
    emulator, hosts = paper
    hosts.snapshot_delay = 0.5
    ec2 = client(emulator, "ec2")
    source = launch(ec2, gpu_ami(emulator))["InstanceId"]
    until("running", lambda: state(ec2, source) == "running")
    ec2.stop_instances(InstanceIds=[source])
    until("stopped", lambda: state(ec2, source) == "stopped")
    image_id = ec2.create_image(InstanceId=source, Name="ngcx-host-test")["ImageId"]
    [image] = ec2.describe_images(ImageIds=[image_id])["Images"]
    assert image["State"] == "pending", "moto alone says available at once"
    ec2.get_waiter("image_available").wait(ImageIds=[image_id], WaiterConfig={"Delay": 1, "MaxAttempts": 10})
    assert hosts.named("snapshot") == [("snapshot", source, image_id)]

    copy = launch(ec2, image_id)["InstanceId"]
    until("the copy's machine", lambda: hosts.named("create")[-1:] and hosts.named("create")[-1][1] == copy)
    assert hosts.named("create")[-1][2] == image_id
    ec2.deregister_image(ImageId=image_id)
    until("the snapshot dropped", lambda: image_id not in hosts.images)


# --- SSM, ECR, the wire ------------------------------------------------------------------------------------

def test_the_gpu_ami_parameter_is_json_and_names_a_known_image(paper):
    emulator, _ = paper
    ssm, ec2 = client(emulator, "ssm"), client(emulator, "ec2")
    parameter = ssm.get_parameter(Name=GPU_AMI_PARAMETER)["Parameter"]
    value = json.loads(parameter["Value"])
    assert value["image_id"].startswith("ami-") and "gpu" in value["image_name"]
    [image] = ec2.describe_images(ImageIds=[value["image_id"]])["Images"]
    assert image["Name"] == value["image_name"]
    [listed] = ssm.get_parameters(Names=[GPU_AMI_PARAMETER])["Parameters"]
    assert json.loads(listed["Value"]) == value
    direct = boto3.client("ssm", endpoint_url=emulator.moto_endpoint, region_name=REGION, aws_access_key_id="x",
                          aws_secret_access_key="y")
    assert direct.get_parameter(Name=GPU_AMI_PARAMETER)["Parameter"]["Value"].startswith("{'"), \
        "moto alone serves a Python repr (if this fails, moto got fixed and the harness can stop rewriting)"


def test_ecr_tokens_are_valid_for_hours_and_json_services_fail_in_their_own_shape(paper):
    emulator, _ = paper
    ecr = client(emulator, "ecr")
    [data] = ecr.get_authorization_token()["authorizationData"]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    assert user == "AWS" and password
    hours_left = (data["expiresAt"].timestamp() - time.time()) / 3600
    assert 11.9 < hours_left <= 12
    emulator.fail_next("GetAuthorizationToken", "ThrottlingException", 400)
    assert error_of(lambda: ecr.get_authorization_token())[:2] == ("ThrottlingException", 400)
    ecr.create_repository(repositoryName="ngcx/app", imageTagMutability="IMMUTABLE")
    [repo] = ecr.describe_repositories(repositoryNames=["ngcx/app"])["repositories"]
    assert repo["imageTagMutability"] == "IMMUTABLE"


def test_answers_moto_gets_right_reach_the_client_byte_for_byte(paper):
    emulator, _ = paper
    body = b"Action=DescribeVpcs&Version=2016-11-15"
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
               "Authorization": f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/{REGION}/ec2/aws4_request, "
                                "SignedHeaders=host, Signature=0"}
    answers = []
    for endpoint in (emulator.endpoint, emulator.moto_endpoint):
        request = urllib.request.Request(endpoint + "/", data=body, headers=headers, method="POST")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as answer:
            answers.append((answer.status, answer.headers.get("Content-Type"), answer.read()))
    assert answers[0] == answers[1] and b"<vpcSet>" in answers[0][2]


def test_with_access_keys_a_wrong_credential_fails_as_on_aws_and_changes_nothing():
    secret = "right-secret-" + secrets.token_hex(8)
    with Ec2Emulator(PaperHosts(), access_keys={"AKIARIGHTKEY00000000": secret}) as emulator:
        def as_user(service: str, key: str, secret_key: str, token: str | None = None):
            return boto3.client(service, endpoint_url=emulator.endpoint, region_name=REGION,
                                aws_access_key_id=key, aws_secret_access_key=secret_key, aws_session_token=token,
                                config=Config(retries={"total_max_attempts": 1}))

        good = as_user("ec2", "AKIARIGHTKEY00000000", secret, token="a-session-token")
        ami = json.loads(as_user("ssm", "AKIARIGHTKEY00000000", secret).get_parameter(
            Name=GPU_AMI_PARAMETER)["Parameter"]["Value"])["image_id"]
        wrong_secret = as_user("ec2", "AKIARIGHTKEY00000000", "wrong-secret")
        unknown_key = as_user("ec2", "AKIAUNKNOWNKEY000000", secret)
        for ec2 in (wrong_secret, unknown_key):
            code, status, message = error_of(lambda ec2=ec2: launch(ec2, ami))
            assert (code, status) == ("AuthFailure", 401) and secret not in message
        assert error_of(lambda: as_user("ssm", "AKIARIGHTKEY00000000", "wrong").get_parameter(
            Name=GPU_AMI_PARAMETER))[0] == "InvalidSignatureException"
        assert error_of(lambda: as_user("ecr", "AKIAUNKNOWNKEY000000", secret).get_authorization_token())[0] == \
            "UnrecognizedClientException"
        assert error_of(lambda: as_user("sts", "AKIAUNKNOWNKEY000000", secret).get_caller_identity())[:2] == \
            ("InvalidClientTokenId", 403)
        assert emulator.performed("RunInstances") == 0 and emulator.instances() == []
        launch(good, ami)
        assert len(emulator.instances()) == 1
        assert emulator.proxy_errors == []


def test_one_emulator_at_a_time_because_moto_keeps_one_state_per_process(paper):
    with pytest.raises(RuntimeError, match="already running"):
        Ec2Emulator(PaperHosts()).start()


# --- real machines -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def host_image(docker_client, base_image) -> str:
    if not Path("/sys/fs/cgroup").is_dir():
        missing("no /sys/fs/cgroup on this machine: an inner dockerd needs the cgroup tree")
    return ensure_host_image(docker_client)


@pytest.fixture
def machines(docker_client, host_image) -> Iterator[tuple[Ec2Emulator, DockerHosts]]:
    hosts = DockerHosts(docker_client, label="ngcx-aws-emulator")
    with Ec2Emulator(hosts, boot_seconds=0.5, start_seconds=0.5) as emulator:
        yield emulator, hosts
        assert emulator.proxy_errors == [] and emulator.host_errors == []
    mine = {"label": f"{hosts.label}={hosts.owner}"}
    assert containers(docker_client, mine) == [], "close() removed every machine"


def _console(hosts: DockerHosts, instance_id: str, needle: str, count: int = 1, timeout: float = 60) -> None:
    until(f"{needle!r} x{count} on {instance_id}'s console",
          lambda: hosts.console_output(instance_id).count(needle) >= count, timeout=timeout, every=0.2)


def _page(url: str, timeout: float = 20) -> str:
    session = requests.Session()
    session.trust_env = False      # bridge addresses must not go through a proxy

    def fetch() -> str:
        try:
            answer = session.get(url, timeout=2)
        except requests.RequestException:
            return ""
        return answer.text if answer.status_code == 200 else ""
    return until(f"{url} answers", fetch, timeout=timeout, every=0.2)


@pytest.mark.docker
def test_user_data_runs_on_the_machine_and_its_address_reaches_it(docker_client, machines):
    emulator, hosts = machines
    ec2 = client(emulator, "ec2")
    marker = secrets.token_hex(8)
    user_data = (f"#!/bin/sh\nset -e\nmkdir -p /srv/www\necho {marker} > /srv/www/index.html\n"
                 "echo ran >> /var/lib/cloud/ngcx-runs\n"
                 "nohup python3 -m http.server 8000 --directory /srv/www >/dev/null 2>&1 &\n")
    t0 = time.monotonic()
    instance_id = launch(ec2, gpu_ami(emulator), UserData=user_data)["InstanceId"]
    assert state(ec2, instance_id) == "pending"
    ec2.get_waiter("instance_running").wait(InstanceIds=[instance_id], WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    running = describe(ec2, instance_id)
    ip = running["PublicIpAddress"]
    assert running["PrivateIpAddress"] == ip
    container = docker_client.containers.get(NAME_PREFIX + instance_id)
    assert container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"] == ip
    assert _page(f"http://{ip}:8000/").strip() == marker, "the address reaches the machine and user-data ran"
    print(f"\n[aws emulator] RunInstances to user-data serving: {time.monotonic() - t0:.1f} s")
    assert hosts.run_command(instance_id, "cat /srv/www/index.html", 10).output.strip() == marker

    ec2.stop_instances(InstanceIds=[instance_id])
    until("stopped", lambda: state(ec2, instance_id) == "stopped", timeout=40, every=0.2)
    container.reload()
    assert container.status == "exited"
    ec2.start_instances(InstanceIds=[instance_id])
    until("running", lambda: state(ec2, instance_id) == "running", timeout=30, every=0.2)
    _console(hosts, instance_id, "ngcx-host: user-data already ran on this instance")
    assert hosts.run_command(instance_id, "cat /var/lib/cloud/ngcx-runs", 10).output.split() == ["ran"]
    container.reload()
    assert describe(ec2, instance_id)["PrivateIpAddress"] == \
        container.attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]

    ec2.terminate_instances(InstanceIds=[instance_id])
    until("terminated", lambda: state(ec2, instance_id) == "terminated", timeout=30, every=0.2)
    assert containers(docker_client, {"name": NAME_PREFIX + instance_id}) == []


@pytest.mark.docker
def test_create_image_of_a_stopped_machine_boots_copies_with_its_disk(docker_client, machines):
    emulator, hosts = machines
    ec2 = client(emulator, "ec2")
    source = launch(ec2, gpu_ami(emulator), UserData="#!/bin/sh\necho baked > /var/lib/cloud/baked\n")["InstanceId"]
    ec2.get_waiter("instance_running").wait(InstanceIds=[source], WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    _console(hosts, source, "ngcx-host: user-data exited 0")
    ec2.stop_instances(InstanceIds=[source])
    ec2.get_waiter("instance_stopped").wait(InstanceIds=[source], WaiterConfig={"Delay": 1, "MaxAttempts": 40})
    image_id = ec2.create_image(InstanceId=source, Name="ngcx-host-e2e")["ImageId"]
    ec2.get_waiter("image_available").wait(ImageIds=[image_id], WaiterConfig={"Delay": 1, "MaxAttempts": 60})

    copy = launch(ec2, image_id, UserData="#!/bin/sh\necho copy-ran\n")["InstanceId"]
    ec2.get_waiter("instance_running").wait(InstanceIds=[copy], WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    _console(hosts, copy, "ngcx-host: user-data exited 0")
    assert "copy-ran" in hosts.console_output(copy), "the copy ran its own user-data"
    assert hosts.run_command(copy, "cat /var/lib/cloud/baked", 10).output.strip() == "baked", \
        "the copy's disk came from the image"
    ec2.terminate_instances(InstanceIds=[source, copy])
    ec2.deregister_image(ImageId=image_id)
    until("both machines gone", lambda: not containers(docker_client, {"label": f"{hosts.label}={hosts.owner}"}),
          timeout=30, every=0.2)
