"""Instance refresh, spot markets and a spot reclaim (aws_refresh.py), driven by ngcx's own client (aws/asg.py)
through the real boto3, under paced load through the emulated ALB's haproxy.

What a user notices (issue 49): a rolling update replaces every host with the new version while not one request
fails (new hosts healthy in the target group before old ones drain: MaxHealthyPercentage 200); a spot group
keeps its on-demand floor; EC2 reclaiming a spot host shows the host its notices through IMDS, the group
launches a replacement and drains the reclaimed host, and again not one request fails.

Hosts are ProcessHosts (a process per instance on its own loopback address); time runs at TIME_SCALE (an AWS
minute is 3 s, a 20 s drain 1 s, the two-minute notice 6 s). The load: PacedLoad, GETs at RATE per second,
bounded by LOAD_S seconds.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from emulators import test_aws_autoscaling
from emulators.aws_ec2 import Ec2Emulator
from emulators.aws_refresh import check_params
from emulators.aws_wire import AwsError
from emulators.test_aws_autoscaling import (
    AMI,
    KEY,
    SECRET,
    healthy,
    make_balancer,
    replica_user_data,
)
from emulators.test_aws_emulator import until
from emulators.traffic import PacedLoad
from ngcx.deploy.aws.asg import AutoScalingGroups, GroupSpec

cloud = test_aws_autoscaling.cloud        # the module's emulated EC2 + Auto Scaling (a fixture)
OWNER = {"ngcx:owner": "refresh-owner"}
RATE = 20.0
LOAD_S = 120.0


@pytest.fixture
def groups(cloud, monkeypatch, tmp_path) -> Iterator[AutoScalingGroups]:
    from ngcx.clouds.aws import Api

    for name, value in {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": cloud[0].endpoint, "HOME": str(tmp_path),
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    made = AutoScalingGroups(Api("us-east-1", deadline_s=20))
    yield made
    for ref in made.tagged(OWNER):
        made.delete(ref)


@pytest.fixture(scope="module")
def net(cloud) -> dict[str, Any]:
    return make_balancer(cloud[0], "refresh", delay_s=20)


def spec(net: dict[str, Any], name: str, **changes: Any) -> GroupSpec:
    settings: dict[str, Any] = {
        "name": name, "image_id": AMI, "user_data": replica_user_data("v1"), "instance_type": "g5.xlarge",
        "subnets": tuple(net["subnets"]), "target_group_arn": net["group"], "min_size": 2, "max_size": 2,
        "desired": 2, "tags": OWNER, "grace_s": 30, "drain_wait_s": 60}
    return GroupSpec(**(settings | changes))


def serving(emulator: Ec2Emulator, groups: AutoScalingGroups, ref, count: int) -> list:
    """Until `count` of the group's hosts are InService and healthy in the target group: those hosts."""
    def ready():
        found = [m for m in groups.instances(ref) if m.state == "InService"]
        health = healthy(emulator, ref_group(groups, ref))
        return found if len(found) == count and all(health.get(m.instance_id) == "healthy" for m in found) else None
    return until(f"{count} hosts serving", ready, timeout=30, every=0.2)


def ref_group(groups: AutoScalingGroups, ref) -> str:
    group = groups.api.call("autoscaling", "describe_auto_scaling_groups", AutoScalingGroupNames=[ref.name])
    return group["AutoScalingGroups"][0]["TargetGroupARNs"][0]


def test_a_refresh_rolls_every_host_to_the_new_version_with_no_failed_request(cloud, groups, net) -> None:
    emulator, _, hosts = cloud
    ref = groups.ensure_group(spec(net, "ngcx-svc-roll"))
    olds = {m.instance_id for m in serving(emulator, groups, ref, 2)}
    load = PacedLoad(net["address"], rate=RATE, limit_s=LOAD_S)
    try:
        until("both old hosts answer", lambda: len(load.seen) == 2, timeout=10)
        refresh_id = groups.start_refresh(ref, spec(net, "ngcx-svc-roll", user_data=replica_user_data("v2")))
        again = groups.start_refresh(ref, spec(net, "ngcx-svc-roll", user_data=replica_user_data("v2")))
        assert again == refresh_id                                  # a retry joins the running refresh
        state = until("the refresh done", lambda: (s := groups.refresh_state(ref, refresh_id)).status in (
            "done", "failed", "cancelled") and s, timeout=60, every=0.2)
        assert (state.status, state.percent) == ("done", 100), state
        news = serving(emulator, groups, ref, 2)
        until("the old hosts' machines gone", lambda: not any(hosts.alive(i) for i in olds), timeout=20)
        before = sum(load.seen.values())
        until("the new hosts answer", lambda: sum(load.seen.values()) > before + 20, timeout=10)
    finally:
        load.stop()
    assert load.failures == [], load.failures[:5]
    assert not olds & {m.instance_id for m in news}
    late = [body for body in load.seen if body.endswith("v2")]
    assert len(late) == 2, load.seen                               # both new hosts served v2
    group = groups.api.call("autoscaling", "describe_auto_scaling_groups",
                            AutoScalingGroupNames=[ref.name])["AutoScalingGroups"][0]
    assert group["LaunchTemplate"]["Version"] == "2" and group["DesiredCapacity"] == 2
    groups.cancel_refresh(ref, refresh_id)                         # nothing running: done, not an error


def test_a_refresh_whose_hosts_never_get_healthy_fails_and_keeps_the_old_ones(cloud, groups, net) -> None:
    emulator, scaling, _ = cloud
    ref = groups.ensure_group(spec(net, "ngcx-svc-bad", min_size=1, max_size=1, desired=1, grace_s=1))
    [old] = serving(emulator, groups, ref, 1)
    scaling.refresh.launch_timeout_s = 5.0                         # the new host's health: 5 s, not (1 + 600) x 0.05
    try:
        refresh_id = groups.start_refresh(ref, spec(net, "ngcx-svc-bad", user_data="#!/bin/sh\nexit 1\n", grace_s=1))
        state = until("the refresh ended", lambda: (s := groups.refresh_state(ref, refresh_id)).status in (
            "done", "failed", "cancelled") and s, timeout=60, every=0.2)
    finally:
        scaling.refresh.launch_timeout_s = None
    assert state.status == "failed" and "healthy" in state.reason, state
    assert [m.instance_id for m in serving(emulator, groups, ref, 1)] == [old.instance_id]


def test_a_spot_group_keeps_its_on_demand_floor_and_a_reclaim_drains_before_the_host_goes(cloud, groups,
                                                                                           net) -> None:
    emulator, scaling, hosts = cloud
    ref = groups.ensure_group(spec(net, "ngcx-svc-spot", min_size=3, max_size=3, desired=3, spot=True,
                                   on_demand_base=1, instance_types=("g5.xlarge", "g6.xlarge")))
    members = serving(emulator, groups, ref, 3)
    assert sorted(m.market for m in members) == ["on-demand", "spot", "spot"], members
    group = groups.api.call("autoscaling", "describe_auto_scaling_groups",
                            AutoScalingGroupNames=[ref.name])["AutoScalingGroups"][0]
    assert group["CapacityRebalance"] is True
    assert group["MixedInstancesPolicy"]["InstancesDistribution"]["OnDemandBaseCapacity"] == 1
    rolled = groups.start_refresh(ref, spec(net, "ngcx-svc-spot", min_size=3, max_size=3, desired=3, spot=True,
                                            on_demand_base=1, instance_types=("g5.xlarge", "g6.xlarge"),
                                            user_data=replica_user_data("v2")))
    until("the spot group refreshed", lambda: groups.refresh_state(ref, rolled).status == "done", timeout=60,
          every=0.2)
    members = serving(emulator, groups, ref, 3)
    assert sorted(m.market for m in members) == ["on-demand", "spot", "spot"], members   # the floor kept
    victim = next(m for m in members if m.market == "spot")
    address = emulator._private_ip(victim.instance_id)          # the host's own address: IMDS's caller
    assert metadata(emulator, address, "spot/instance-action")[0] == 404
    load = PacedLoad(net["address"], rate=RATE, limit_s=LOAD_S)
    try:
        until("all three answer", lambda: len(load.seen) == 3, timeout=10)
        scaling.refresh.reclaim("us-east-1", victim.instance_id)
        status, body = until("the interruption notice in IMDS", lambda: (
            found := metadata(emulator, address, "spot/instance-action"))[0] == 200 and found, timeout=10)
        assert json.loads(body)["action"] == "terminate"
        assert metadata(emulator, address, "events/recommendations/rebalance")[0] == 200
        until("the reclaimed host's machine gone", lambda: not hosts.alive(victim.instance_id), timeout=30)
        after = serving(emulator, groups, ref, 3)
        before = sum(load.seen.values())
        until("the replacement answers", lambda: sum(load.seen.values()) > before + 20, timeout=10)
    finally:
        load.stop()
    assert load.failures == [], load.failures[:5]
    assert victim.instance_id not in {m.instance_id for m in after}
    assert sorted(m.market for m in after) == ["on-demand", "spot", "spot"], after


def test_parameters_the_api_does_not_know_are_refused() -> None:
    check_params("StartInstanceRefresh", {"AutoScalingGroupName": "g", "Preferences.MaxHealthyPercentage": "200",
                                          "DesiredConfiguration.MixedInstancesPolicy.LaunchTemplate.Overrides."
                                          "member.1.InstanceType": "g5.xlarge"})
    with pytest.raises(AwsError, match="Unknown parameter"):
        check_params("StartInstanceRefresh", {"AutoScalingGroupName": "g", "Preferences.MaxSurge": "1"})


def metadata(emulator: Ec2Emulator, address: str, leaf: str) -> tuple[int, str]:
    """(status, body) of an IMDSv2 GET of meta-data/`leaf`, asked from the instance's own address."""
    host, _, port = emulator.metadata_address.rpartition(":")
    def call(method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        conn = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(address, 0))
        try:
            conn.request(method, path, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.read().decode()
        finally:
            conn.close()
    _, token = call("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    return call("GET", f"/latest/meta-data/{leaf}", {"X-aws-ec2-metadata-token": token})


def test_a_spot_group_stopped_and_started_after_two_refreshes_keeps_its_split_and_serves(cloud, groups,
                                                                                         net) -> None:
    """Issue 49's `deployments start` after an update and a rollback: the group at 0 hosts, then back to 2;
    the new hosts get healthy in the target group and keep the on-demand floor (one on demand, one spot)."""
    emulator, _, _ = cloud
    mixed = {"spot": True, "on_demand_base": 1, "instance_types": ("g5.xlarge", "g6.xlarge")}
    ref = groups.ensure_group(spec(net, "ngcx-svc-restart", **mixed))
    serving(emulator, groups, ref, 2)
    for version in ("v2", "v1"):                                  # an update, then its rollback
        rolled = groups.start_refresh(ref, spec(net, "ngcx-svc-restart", user_data=replica_user_data(version),
                                                **mixed))
        state = until(f"the refresh to {version} ended", lambda rolled=rolled: (s := groups.refresh_state(
            ref, rolled)).status in ("done", "failed", "cancelled") and s, timeout=60, every=0.2)
        assert state.status == "done", state
        serving(emulator, groups, ref, 2)
    groups.set_size(ref, 0, 0, 0)
    until("no host left", lambda: not [m for m in groups.instances(ref) if m.state != "Terminated"], timeout=30)
    groups.set_size(ref, 2, 2, 2)
    members = serving(emulator, groups, ref, 2)
    assert sorted(m.market for m in members) == ["on-demand", "spot"], members
