"""The Auto Scaling emulator (aws_autoscaling.py) through the real boto3: machines, drains, faults, signatures.

What a user of EC2 Auto Scaling notices: a group of 2 boots 2 machines that run the launch template's
user-data and become healthy targets of the attached target group (the balancer's haproxy sends them
traffic); lowering the desired capacity takes one out of the balancer first (draining), holds it in
Terminating:Wait until CompleteLifecycleAction, and only then is its machine gone; a throttled call is
retried by boto3; a wrong signature is refused.

The machines are ProcessHosts: a process per instance on a loopback address of its own, running the
user-data with sh (HOST_ADDRESS = its address, as a VM's script would read its own IP). Cheap next to
DockerHosts (a container with its own dockerd each), which this 2-core machine pays for in minutes; the
emulator takes any HostBackend. Time in the balancer and the group runs at TIME_SCALE.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from emulators.aws_autoscaling import AutoScaling
from emulators.aws_ec2 import Ec2Emulator
from emulators.hosts_api import CommandResult
from emulators.test_aws_emulator import until
from emulators.traffic import get, spread

KEY, SECRET = "AKIAASGEMULATORTEST1", "asg-secret-never-printed-77aa"
REGION = "us-east-1"
AMI = "ami-12c6146b"
TIME_SCALE = 0.05               # a minute of AWS time is 3 s here; a 20 s drain is 1 s
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")

# The replica a host's user-data starts: the health route, `/` answers who served it, /slow takes 1 s.
REPLICA = r"""
import os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
NAME = os.environ["HOST_ADDRESS"] + " " + os.environ.get("REPLICA_TAG", "")
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/slow":
            time.sleep(1.0)
        body = NAME.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer((os.environ["HOST_ADDRESS"], 8000), H).serve_forever()
"""


def replica_user_data(tag: str) -> str:
    """A host's boot script: start the replica on port 8000 (REPLICA_TAG says which template version)."""
    return f"#!/bin/sh\nREPLICA_TAG={shlex.quote(tag)} exec {shlex.quote(sys.executable)} -c {shlex.quote(REPLICA)}\n"


class ProcessHosts:
    """A HostBackend whose machines are processes on loopback addresses 127.0.61.N, running the user-data."""

    def __init__(self, first: int = 10) -> None:
        """`first`: addresses start after 127.0.61.<first> (a module of its own may keep apart from others')."""
        self.machines: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        self.addresses: dict[str, str] = {}       # every machine's address, stopped ones too (their "disk")
        self.deleted: list[str] = []
        self.starts: list[str] = []               # machines started again after a stop, in order
        self.folder = Path(tempfile.mkdtemp(prefix="process-hosts-"))
        self._lock = threading.Lock()
        self._next = first

    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        with self._lock:
            self._next += 1
            address = self.addresses[instance_id] = f"127.0.61.{self._next}"
        (self.folder / f"{instance_id}.sh").write_bytes(user_data)
        self._boot(instance_id, address)
        return address

    def _boot(self, instance_id: str, address: str) -> None:
        """Run the machine's user-data on its address (a first boot, or a start after a stop)."""
        log = (self.folder / f"{instance_id}.log").open("ab")
        process = subprocess.Popen(["sh", str(self.folder / f"{instance_id}.sh")],
                                   env={**os.environ, "HOST_ADDRESS": address, "INSTANCE_ID": instance_id},
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with self._lock:
            self.machines[instance_id] = (address, process)

    def alive(self, instance_id: str) -> bool:
        with self._lock:
            found = self.machines.get(instance_id)
        return found is not None and found[1].poll() is None

    def _kill(self, instance_id: str) -> None:
        with self._lock:
            found = self.machines.pop(instance_id, None)
        if found is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(found[1].pid, signal.SIGTERM)
            found[1].wait(10)

    def start(self, instance_id: str) -> str:
        """A stopped machine boots again on its own address (a warm pool's, ESS recycle mode's start)."""
        address = self.addresses[instance_id]
        self._boot(instance_id, address)
        with self._lock:
            self.starts.append(instance_id)
        return address

    def stop(self, instance_id: str) -> None:
        self._kill(instance_id)

    def delete(self, instance_id: str) -> None:
        self._kill(instance_id)
        with self._lock:
            self.deleted.append(instance_id)

    def snapshot(self, instance_id: str, image_id: str) -> None:
        raise RuntimeError("process hosts have no disks")

    def delete_image(self, image_id: str) -> None:
        """Nothing to drop."""

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=timeout)
        return CommandResult(done.returncode, done.stdout)

    def console_output(self, instance_id: str) -> str:
        return (self.folder / f"{instance_id}.log").read_text(errors="replace")[-65536:]

    def close(self) -> None:
        for instance_id in list(self.machines):
            self._kill(instance_id)


def boto(emulator: Ec2Emulator, service: str, attempts: int = 1, secret: str = SECRET) -> Any:
    config = Config(retries={"mode": "standard", "total_max_attempts": attempts}, connect_timeout=5, read_timeout=60)
    return boto3.client(service, endpoint_url=emulator.endpoint, region_name=REGION, config=config,
                        aws_access_key_id=KEY, aws_secret_access_key=secret)


def make_balancer(emulator: Ec2Emulator, name: str, delay_s: int = 20) -> dict[str, Any]:
    """An internet-facing ALB over two default subnets, an HTTP target group on port 8000 checking the
    health route, a listener on 80: {balancer, group, subnets, address}."""
    ec2, elb = boto(emulator, "ec2"), boto(emulator, "elbv2")
    subnets = sorted(ec2.describe_subnets()["Subnets"], key=lambda s: s["AvailabilityZone"])[:2]
    vpc = subnets[0]["VpcId"]
    balancer = elb.create_load_balancer(Name=name, Subnets=[s["SubnetId"] for s in subnets],
                                        Scheme="internet-facing")["LoadBalancers"][0]["LoadBalancerArn"]
    group = elb.create_target_group(Name=name, Protocol="HTTP", Port=8000, VpcId=vpc, TargetType="instance",
                                    HealthCheckPath="/v2/health/ready", HealthCheckIntervalSeconds=5,
                                    HealthCheckTimeoutSeconds=2, HealthyThresholdCount=2,
                                    UnhealthyThresholdCount=2)["TargetGroups"][0]["TargetGroupArn"]
    elb.modify_target_group_attributes(TargetGroupArn=group, Attributes=[
        {"Key": "deregistration_delay.timeout_seconds", "Value": str(delay_s)}])
    elb.create_listener(LoadBalancerArn=balancer, Protocol="HTTP", Port=80,
                        DefaultActions=[{"Type": "forward", "TargetGroupArn": group}])
    return {"balancer": balancer, "group": group, "subnets": [s["SubnetId"] for s in subnets],
            "address": emulator.balancer_address(balancer, 80)}


def healthy(emulator: Ec2Emulator, group: str) -> dict[str, str]:
    rows = boto(emulator, "elbv2").describe_target_health(TargetGroupArn=group)["TargetHealthDescriptions"]
    return {r["Target"]["Id"]: r["TargetHealth"]["State"] for r in rows}


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[Ec2Emulator, AutoScaling, ProcessHosts]]:
    hosts = ProcessHosts()
    with Ec2Emulator(hosts, access_keys={KEY: SECRET}, boot_seconds=0.05, start_seconds=0.05) as emulator:
        emulator.elbv2.time_scale = TIME_SCALE
        scaling = AutoScaling(emulator, time_scale=TIME_SCALE)
        yield emulator, scaling, hosts
        assert emulator.proxy_errors == [] and emulator.host_errors == [] and scaling.errors == []


def test_a_group_boots_real_machines_that_serve_and_drains_them_through_the_hook(cloud) -> None:
    emulator, scaling, hosts = cloud
    net = make_balancer(emulator, "asg-emu", delay_s=20)           # 1 s here
    ec2, asg = boto(emulator, "ec2"), boto(emulator, "autoscaling")
    template = ec2.create_launch_template(LaunchTemplateName="asg-emu", LaunchTemplateData={
        "ImageId": AMI, "InstanceType": "g5.xlarge",
        "UserData": base64.b64encode(replica_user_data("v1").encode()).decode()})["LaunchTemplate"]
    asg.create_auto_scaling_group(AutoScalingGroupName="asg-emu", MinSize=0, MaxSize=3, DesiredCapacity=2,
                                  LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"],
                                                  "Version": "$Latest"},
                                  TargetGroupARNs=[net["group"]], VPCZoneIdentifier=",".join(net["subnets"]),
                                  HealthCheckType="ELB", HealthCheckGracePeriod=30)
    asg.put_lifecycle_hook(AutoScalingGroupName="asg-emu", LifecycleHookName="drain",
                           LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING", HeartbeatTimeout=600)

    def members() -> dict[str, str]:
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["asg-emu"])["AutoScalingGroups"][0]
        return {i["InstanceId"]: i["LifecycleState"] for i in group["Instances"]}

    ids = sorted(members())
    assert len(ids) == 2
    until("both machines run the user-data and are healthy targets",
          lambda: healthy(emulator, net["group"]) == dict.fromkeys(ids, "healthy"), timeout=20)
    assert members() == dict.fromkeys(ids, "InService")
    answered = spread(net["address"], 16)
    assert len(answered) == 2 and all(name.endswith(" v1") for name in answered), answered

    asg.set_desired_capacity(AutoScalingGroupName="asg-emu", DesiredCapacity=1)
    states = members()
    [victim] = [i for i, s in states.items() if s == "Terminating:Wait"]
    [kept] = [i for i, s in states.items() if s == "InService"]
    assert healthy(emulator, net["group"])[victim] == "draining"
    time.sleep(1.5)                                                 # past the drain: the hook still holds it
    assert hosts.alive(victim) and members()[victim] == "Terminating:Wait"
    assert set(spread(net["address"], 8)) == {hosts.machines[kept][0] + " v1"}   # no new request to the victim
    asg.complete_lifecycle_action(AutoScalingGroupName="asg-emu", LifecycleHookName="drain", InstanceId=victim,
                                  LifecycleActionResult="CONTINUE")
    until("the victim's machine is gone", lambda: not hosts.alive(victim) and victim in hosts.deleted, timeout=10)
    until("terminated", lambda: ec2.describe_instances(InstanceIds=[victim])["Reservations"][0]["Instances"][0][
        "State"]["Name"] == "terminated", timeout=10)
    assert members() == {kept: "InService"}
    with pytest.raises(ClientError) as caught:
        asg.complete_lifecycle_action(AutoScalingGroupName="asg-emu", LifecycleHookName="drain", InstanceId=victim,
                                      LifecycleActionResult="CONTINUE")
    assert caught.value.response["Error"]["Code"] == "ValidationError"
    assert get(net["address"])[0] == 200

    with pytest.raises(ClientError) as caught:
        asg.delete_auto_scaling_group(AutoScalingGroupName="asg-emu")
    assert caught.value.response["Error"]["Code"] == "ResourceInUse"
    asg.delete_auto_scaling_group(AutoScalingGroupName="asg-emu", ForceDelete=True)
    until("the last machine is gone", lambda: not hosts.alive(kept), timeout=10)
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=["asg-emu"])["AutoScalingGroups"] == []


def test_a_throttled_call_is_retried_by_boto3(cloud) -> None:
    emulator, _, _ = cloud
    emulator.fail_next("DescribeAutoScalingGroups", "Throttling", 400)
    before = sum(1 for action, _ in emulator.calls if action == "DescribeAutoScalingGroups")
    assert boto(emulator, "autoscaling", attempts=3).describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert sum(1 for action, _ in emulator.calls if action == "DescribeAutoScalingGroups") == before + 2
    emulator.fail_next("DescribeAutoScalingGroups", "Throttling", 400)
    with pytest.raises(ClientError) as caught:
        boto(emulator, "autoscaling", attempts=1).describe_auto_scaling_groups()
    assert caught.value.response["Error"]["Code"] == "Throttling"


def test_a_wrong_signature_is_refused(cloud) -> None:
    emulator, _, _ = cloud
    with pytest.raises(ClientError) as caught:
        boto(emulator, "autoscaling", secret="not-the-secret").describe_auto_scaling_groups()
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert "not-the-secret" not in str(caught.value)


def test_target_tracking_on_a_custom_metric_scales_out(cloud) -> None:
    """The hosts' own metric (PutMetricData into CloudWatch), as the runtime's in-flight requests would be."""
    emulator, scaling, hosts = cloud
    ec2, asg, watch = boto(emulator, "ec2"), boto(emulator, "autoscaling"), boto(emulator, "cloudwatch")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    template = ec2.create_launch_template(LaunchTemplateName="asg-custom", LaunchTemplateData={
        "ImageId": AMI, "InstanceType": "g5.xlarge",
        "UserData": base64.b64encode(replica_user_data("c").encode()).decode()})["LaunchTemplate"]
    asg.create_auto_scaling_group(AutoScalingGroupName="asg-custom", MinSize=1, MaxSize=2, DesiredCapacity=1,
                                  LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"]},
                                  VPCZoneIdentifier=subnet)
    asg.put_scaling_policy(AutoScalingGroupName="asg-custom", PolicyName="inflight",
                           PolicyType="TargetTrackingScaling", TargetTrackingConfiguration={
                               "TargetValue": 4.0, "CustomizedMetricSpecification": {
                                   "Namespace": "ngcx", "MetricName": "InFlight", "Statistic": "Average",
                                   "Dimensions": [{"Name": "service", "Value": "asg-custom"}]}})

    def busy() -> bool:
        watch.put_metric_data(Namespace="ngcx", MetricData=[{"MetricName": "InFlight", "Value": 8.0, "Dimensions": [
            {"Name": "service", "Value": "asg-custom"}]}])
        return any(d[0] == "asg-custom" for d in scaling.decisions)

    until("the controller scales out on the custom metric", busy, timeout=20, every=0.5)
    assert [d[1:3] for d in scaling.decisions if d[0] == "asg-custom"] == [(1, 2)]

    def resized() -> dict | None:    # the controller records its decision, then applies it: wait for the group
        group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["asg-custom"])["AutoScalingGroups"][0]
        return group if group["DesiredCapacity"] == 2 and len(group["Instances"]) == 2 else None

    group = until("the group is resized to two instances", resized, timeout=10)
    ids = [i["InstanceId"] for i in group["Instances"]]
    until("both machines run", lambda: all(hosts.alive(i) for i in ids), timeout=10)
    asg.delete_auto_scaling_group(AutoScalingGroupName="asg-custom", ForceDelete=True)
    until("their machines are gone", lambda: not any(hosts.alive(i) for i in ids), timeout=10)
