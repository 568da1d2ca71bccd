"""A service's Auto Scaling group (cli/deploy/aws/asg.py) against the AWS double, through the real boto3.

What a user notices: ensure run twice leaves one launch template and one group; a new AMI makes a new
template version the group launches; delete leaves nothing and may run twice; gc's `tagged` finds what a
killed ngcx left; a rejected credential is one line without the secret; and target tracking on the
balancer's real request counts (requests through the emulator's haproxy) scales the group out from 1 to 2
under load and back in when it drops, draining through the lifecycle hook, with zero failed requests.

The double is aws_ec2.Ec2Emulator + aws_autoscaling.AutoScaling; the hosts are ProcessHosts (a process per
instance on its own loopback address, running the user-data: a tiny replica on port 8000). Time in the
balancer and the group runs at TIME_SCALE (an AWS minute is 3 s), so the scaling test takes seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from emulators.aws_autoscaling import AutoScaling
from emulators.aws_ec2 import Ec2Emulator
from emulators.test_aws_autoscaling import (
    AMI,
    KEY,
    SECRET,
    TIME_SCALE,
    ProcessHosts,
    healthy,
    make_balancer,
    replica_user_data,
)
from emulators.test_aws_emulator import until
from emulators.traffic import PacedLoad

from ngcx.core.errors import UserError
from ngcx.deploy.aws import asg as aws_asg
from ngcx.deploy.aws.asg import AutoScalingGroups, GroupSpec

OWNER = {"ngcx:owner": "asg-owner", "ngcx:service": "svc1"}
OTHER_AMI = "ami-0000000000000001"


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[Ec2Emulator, AutoScaling, ProcessHosts]]:
    hosts = ProcessHosts()
    with Ec2Emulator(hosts, access_keys={KEY: SECRET}, boot_seconds=0.05, start_seconds=0.05) as emulator:
        emulator.elbv2.time_scale = TIME_SCALE
        scaling = AutoScaling(emulator, time_scale=TIME_SCALE)
        yield emulator, scaling, hosts
        assert emulator.proxy_errors == [] and emulator.host_errors == [] and scaling.errors == []


@pytest.fixture
def groups(cloud, monkeypatch, tmp_path) -> Iterator[AutoScalingGroups]:
    """AutoScalingGroups on ngcx's Api (its retries and errors); every group and template is gone after."""
    from ngcx.clouds.aws import Api

    emulator = cloud[0]
    for name, value in {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": emulator.endpoint, "HOME": str(tmp_path),
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "AWS_PROFILE",
                 "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    made = AutoScalingGroups(Api("us-east-1", deadline_s=20))
    yield made
    for ref in made.tagged({}):
        made.delete(ref)


def spec_for(net: dict[str, Any], name: str, **changes: Any) -> GroupSpec:
    settings: dict[str, Any] = {
        "name": name, "image_id": AMI, "user_data": replica_user_data("v1"), "instance_type": "g5.xlarge",
        "subnets": tuple(net["subnets"]), "target_group_arn": net["group"], "min_size": 0, "max_size": 2,
        "desired": 0, "tags": OWNER, "grace_s": 30, "drain_wait_s": 600}
    return GroupSpec(**(settings | changes))


@pytest.fixture(scope="module")
def net(cloud) -> dict[str, Any]:
    return make_balancer(cloud[0], "asg-client", delay_s=20)        # a 1 s drain here


def _count(groups: AutoScalingGroups, name: str) -> tuple[int, int]:
    all_groups = groups.api.call("autoscaling", "describe_auto_scaling_groups")["AutoScalingGroups"]
    templates = groups.api.call("ec2", "describe_launch_templates")["LaunchTemplates"]
    return (sum(g["AutoScalingGroupName"] == name for g in all_groups),
            sum(t["LaunchTemplateName"] == name for t in templates))


def test_ensure_is_idempotent_a_new_ami_is_a_new_version_and_delete_leaves_nothing(cloud, groups, net) -> None:
    emulator, _, hosts = cloud
    first = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1))
    again = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1))
    assert again == first and first.version == "1"
    assert _count(groups, "ngcx-svc-a") == (1, 1)
    [member] = until("one instance", lambda: groups.instances(first))
    until("its machine serves", lambda: healthy(emulator, net["group"]).get(member.instance_id) == "healthy",
          timeout=20)
    assert groups.instances(first)[0].state == "InService"

    moved = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1, image_id=OTHER_AMI))
    assert (moved.template_id, moved.version) == (first.template_id, "2")
    assert _count(groups, "ngcx-svc-a") == (1, 1)
    launch = groups.api.call("autoscaling", "describe_auto_scaling_groups", AutoScalingGroupNames=["ngcx-svc-a"])[
        "AutoScalingGroups"][0]["LaunchTemplate"]
    assert launch["Version"] == "2"

    groups.set_size(moved, 0, 2, 0)                       # UpdateAutoScalingGroup: drains through the hook
    assert [(m.instance_id, m.state) for m in groups.instances(moved)] == [(member.instance_id, "Terminating:Wait")]
    assert healthy(emulator, net["group"])[member.instance_id] == "draining"
    groups.complete_lifecycle(moved, member.instance_id)
    until("drained and terminated", lambda: not hosts.alive(member.instance_id), timeout=10)
    assert groups.instances(moved) == []
    with pytest.raises(UserError, match="min"):
        groups.set_size(moved, 2, 1, 1)
    groups.delete(moved)
    groups.delete(moved)
    assert _count(groups, "ngcx-svc-a") == (0, 0)
    until("the machine is gone", lambda: not hosts.alive(member.instance_id), timeout=10)
    assert groups.tagged(OWNER) == []


def test_throttled_and_lost_answers_make_no_duplicate(cloud, groups, net) -> None:
    emulator = cloud[0]
    emulator.fail_next("CreateLaunchTemplate", "InternalError", 500, after_effect=True)     # made; answer lost
    emulator.fail_next("CreateAutoScalingGroup", "Throttling", 400)
    emulator.fail_next("CreateAutoScalingGroup", "InternalError", 500, after_effect=True)
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-r"))
    assert _count(groups, "ngcx-svc-r") == (1, 1) and ref.version == "1"
    assert groups.ensure_group(spec_for(net, "ngcx-svc-r")) == ref
    groups.delete(ref)


def test_tagged_finds_what_a_killed_ngcx_left(groups, net) -> None:
    groups.ensure_group(spec_for(net, "ngcx-svc-b"))                        # its record never written
    groups.api.call("ec2", "create_launch_template", LaunchTemplateName="ngcx-svc-c", LaunchTemplateData={
        "ImageId": AMI}, TagSpecifications=[{"ResourceType": "launch-template", "Tags": [
            {"Key": k, "Value": v} for k, v in OWNER.items()]}])             # killed before its group
    found = {ref.name: ref for ref in groups.tagged({"ngcx:owner": "asg-owner"})}
    assert set(found) == {"ngcx-svc-b", "ngcx-svc-c"}
    assert groups.tagged({"ngcx:owner": "someone-else"}) == []
    for ref in found.values():
        groups.delete(ref)
    assert groups.tagged({"ngcx:owner": "asg-owner"}) == []


def test_gc_deletes_a_group_no_service_row_names_and_leaves_an_interrupted_services_to_reconcile(
        groups, net, monkeypatch, tmp_path) -> None:
    """A kill -9 after the group was made: its service's row (intent first) names it by its name, so gc leaves it
    for `reconcile`, which finds it again; a group of this owner that no row names (a row never written, or
    another store's row gone) is an orphan gc deletes, template and all."""
    from ngcx.deploy import service_group, store

    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    svc = store.create_service("aws", "us-east-1", 1, {"image": "x", "group": {
        "min_size": 1, "max_size": 2, "target_requests": 60.0}})
    store.update_service(svc.id, pid=2 ** 22 + 7)                                 # its ngcx is gone
    owner = store.owner_id()
    kept = groups.ensure_group(spec_for(net, svc.name, tags={"ngcx:owner": owner, "ngcx:service": str(svc.id)}))
    stray = spec_for(net, f"ngcx-svc-{owner}-99", tags={"ngcx:owner": owner, "ngcx:service": "99"})
    groups.ensure_group(stray)
    found = service_group.orphan_groups("aws")
    assert [(item["name"], item["status"]) for item in found] == [(stray.name, "scaling group")]
    service_group.delete_orphan_group("aws", found[0])
    assert [ref.name for ref in groups.tagged({"ngcx:owner": owner})] == [svc.name]
    assert _count(groups, stray.name) == (0, 0)
    store.update_service(svc.id, status="destroyed", pid=None)                  # destroyed, its group left behind
    assert [item["name"] for item in service_group.orphan_groups("aws")] == [kept.name]


def test_an_error_is_one_line_without_the_secret(groups) -> None:
    import boto3

    from ngcx.clouds.aws import Api

    session = boto3.Session(aws_access_key_id=KEY, aws_secret_access_key="wrong-secret-never-printed")
    wrong = AutoScalingGroups(Api("us-east-1", deadline_s=5, sess=session))
    with pytest.raises(UserError) as caught:
        wrong.instances(aws_asg.GroupRef("ngcx-svc-x", "", ""))
    text = str(caught.value)
    assert "SignatureDoesNotMatch" in text and "\n" not in text and "wrong-secret" not in text



def test_target_tracking_on_real_requests_scales_out_and_back_in_without_a_failed_request(cloud, groups,
                                                                                            net) -> None:
    emulator, scaling, hosts = cloud
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-t", min_size=1, desired=1, max_size=2, drain_wait_s=600))
    [first] = until("one instance", lambda: groups.instances(ref))
    until("it serves", lambda: healthy(emulator, net["group"]).get(first.instance_id) == "healthy", timeout=20)
    metric = aws_asg.requests_per_target(net["balancer"], net["group"])
    groups.put_target_tracking(ref, 60.0, metric)          # 60 requests per target per (3 s) minute
    load = PacedLoad(net["address"])
    try:
        started = time.monotonic()
        load.rate = 40.0                                    # ~120 per period on one target: 2 wanted
        until("scaled out to 2 serving", lambda: len([m for m in groups.instances(ref) if m.state == "InService"])
              == 2 and all(s == "healthy" for s in healthy(emulator, net["group"]).values()), timeout=40, every=0.2)
        scaled_out_s = time.monotonic() - started
        until("both answer", lambda: len(load.seen) == 2, timeout=10)
        load.rate = 2.0                                     # ~6 per period: 1 is enough
        started = time.monotonic()
        victim = until("a member waits in Terminating:Wait", lambda: next(
            (m for m in groups.instances(ref) if m.state == "Terminating:Wait"), None), timeout=40, every=0.2)
        groups.complete_lifecycle(ref, victim.instance_id)  # the host is idle: the drain decides the rest
        until("the victim's machine is gone", lambda: not hosts.alive(victim.instance_id), timeout=20)
        scaled_in_s = time.monotonic() - started
        time.sleep(1.0)
        groups.complete_lifecycle(ref, victim.instance_id)  # no wait left: done, not an error
    finally:
        load.stop()
    assert [m.state for m in groups.instances(ref)] == ["InService"]
    assert load.failures == [], load.failures[:5]
    assert [d[1:3] for d in scaling.decisions if d[0] == "ngcx-svc-t"][:2] == [(1, 2), (2, 1)], scaling.decisions
    print(f"scale-out {scaled_out_s:.1f} s, scale-in {scaled_in_s:.1f} s, requests {sum(load.seen.values())}")


def test_scale_to_zero_stops_the_host_into_the_warm_pool_and_the_balancers_503_wakes_it(cloud, groups, net) -> None:
    """set_idle_stop + put_wake (what `--min 0` makes): the idle group scales in to a stopped host (EC2 says
    stopped: no GPU billed), a request gets the balancer's 503, the alarm on it starts that same host, and it
    serves. put_wake twice is one policy and one alarm; off and delete leave none."""
    from ngcx.deploy.balancer import BalancerRef

    emulator, scaling, hosts = cloud
    balancer = BalancerRef(net["balancer"], net["group"], "", "")
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-z", min_size=0, desired=1, max_size=1, drain_wait_s=60))
    [first] = until("one instance", lambda: groups.instances(ref))
    until("it serves", lambda: healthy(emulator, net["group"]).get(first.instance_id) == "healthy", timeout=20)
    groups.set_idle_stop(ref, True)
    groups.put_wake(ref, balancer, True, warmup_s=300)
    groups.put_wake(ref, balancer, True, warmup_s=300)
    cloudwatch = groups.api.client("cloudwatch")
    [alarm] = cloudwatch.describe_alarms(AlarmNamePrefix="ngcx-svc-z")["MetricAlarms"]
    assert alarm["MetricName"] == "HTTPCode_ELB_503_Count" and len(alarm["AlarmActions"]) == 1
    policies = groups.api.call("autoscaling", "describe_policies", AutoScalingGroupName="ngcx-svc-z")["ScalingPolicies"]
    assert sorted(p["PolicyName"] for p in policies) == ["ngcx-svc-z-wake"]

    groups.set_size(ref, 0, 1, 0)                                   # what the idle policy does
    asleep = until("the host stopped in the warm pool", lambda: [
        m for m in groups.instances(ref) if m.state == "Warmed:Stopped"], timeout=40, every=0.2)
    assert [m.instance_id for m in asleep] == [first.instance_id]
    assert aws_asg.STATES["Warmed:Stopped"] == "stopped"
    load = PacedLoad(net["address"], rate=2.0, limit_s=60)
    try:
        until("a 503 from the balancer", lambda: any(f.startswith("503") for f in load.failures), timeout=10)
        until("the same host back in service and answering", lambda: load.seen, timeout=40, every=0.2)
    finally:
        load.stop()
    assert [(m.instance_id, m.state) for m in groups.instances(ref)] == [(first.instance_id, "InService")]
    assert {f[:3] for f in load.failures} == {"503"}, load.failures[:5]
    assert [d[1:3] for d in scaling.decisions if d[0] == "ngcx-svc-z"] == [(0, 1)], scaling.decisions

    groups.put_wake(ref, balancer, False)
    assert cloudwatch.describe_alarms(AlarmNamePrefix="ngcx-svc-z")["MetricAlarms"] == []
    groups.put_wake(ref, balancer, True)
    groups.delete(ref)
    assert cloudwatch.describe_alarms(AlarmNamePrefix="ngcx-svc-z")["MetricAlarms"] == []
    assert _count(groups, "ngcx-svc-z") == (0, 0)
