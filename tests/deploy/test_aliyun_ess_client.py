"""A service's Alibaba Cloud scaling group (cli/deploy/aliyun/ess.py) against the emulated ESS, through the real
aliyun-python-sdk-core.

What a user notices: ensure run twice leaves one scaling group; a new host image makes a new scaling
configuration the group launches from; delete leaves nothing and may run twice; gc's `tagged` finds what a
killed ngcx left; a lost answer makes no duplicate; a group of another owner is refused; a rejected
credential is one line without the secret; and target tracking on the ALB's real request counts (requests
through the emulator's haproxy) scales the group out from 1 to 2 under load and back in when it drops,
draining through the lifecycle hook, with zero failed requests. Scale to zero: a recycle-mode group scaled
to 0 keeps its instance Stopped (economical mode); requests to the ALB then get 503 and the wake alarm task
(put_wake, twice: one rule, one alarm) starts that same instance again, which serves; put_wake off and delete
leave nothing.

The double is aliyun_ecs.EcsEmulator with its ALB (aliyun_alb.py) and ESS (aliyun_ess.py); the hosts are
ProcessHosts (a process per instance on its own loopback address, running the user-data: a tiny replica on
port 8000). Time in the balancer's drains and the group runs at TIME_SCALE (an ESS minute is 3 s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from emulators.aliyun_ecs import EcsEmulator
from emulators.test_aliyun_ess import (
    AK,
    ECS,
    SECRET,
    balancer,
    call,
    ess_cloud,
    members,
    servers,
    until,
)
from emulators.test_aws_autoscaling import ProcessHosts, replica_user_data
from emulators.traffic import PacedLoad, get

from ngcx.core.errors import UserError
from ngcx.deploy.aliyun.ess import WAKE_METRIC, GroupRef, GroupSpec, Metric, ScalingGroups
from ngcx.deploy.balancer import BalancerRef
from support import aliyun_sdk_on

OWNER = {"ngcx:owner": "ess-owner", "ngcx:service": "svc1"}
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
OTHER_IMAGE = "ubuntu_24_04_x64_20G_alibase_20240923.vhd"


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    with ess_cloud() as made:
        yield made


@pytest.fixture(scope="module")
def net(cloud) -> dict[str, Any]:
    return balancer(cloud[0], "ess-client")                 # drains 20 s: 1 s here


@pytest.fixture
def groups(cloud, monkeypatch) -> Iterator[ScalingGroups]:
    """ScalingGroups on ngcx's Api (its retries and errors); every tagged group is gone after."""
    from ngcx.clouds.aliyun import Api

    aliyun_sdk_on(monkeypatch, cloud[0].endpoint, AK, SECRET)
    made = ScalingGroups(Api("cn-hangzhou", deadline_s=20))
    yield made
    for ref in made.tagged({}):
        made.delete(ref)


def spec_for(net: dict[str, Any], name: str, **changes: Any) -> GroupSpec:
    settings: dict[str, Any] = {
        "name": name, "image_id": IMAGE, "user_data": replica_user_data("v1"), "instance_type": "ecs.gn7i-c8g1.2xlarge",
        "vswitches": tuple(net["switches"]), "server_group_id": net["group"], "port": 8000, "min_size": 0,
        "max_size": 2, "desired": 0, "tags": OWNER, "drain_wait_s": 600}
    return GroupSpec(**(settings | changes))


def _count(emu: EcsEmulator, name: str) -> tuple[int, int]:
    """(groups named `name`, their scaling configurations)."""
    found = call(emu, "DescribeScalingGroups", ScalingGroupName=name)["ScalingGroups"]["ScalingGroup"]
    configs = sum(len(call(emu, "DescribeScalingConfigurations", ScalingGroupId=g["ScalingGroupId"])[
        "ScalingConfigurations"]["ScalingConfiguration"]) for g in found)
    return len(found), configs


def test_ensure_is_idempotent_a_new_image_is_a_new_configuration_and_delete_leaves_nothing(cloud, groups,
                                                                                            net) -> None:
    emu, hosts = cloud
    first = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1))
    again = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1))
    assert again == first and _count(emu, "ngcx-svc-a") == (1, 1)
    [member] = until(lambda: groups.instances(first), "one instance")
    until(lambda: groups.instances(first)[0].state == "InService", "in service")
    assert servers(emu, net["group"]).get(member.instance_id) == "Available"       # in the ALB server group
    assert hosts.alive(member.instance_id)

    moved = groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1, image_id=OTHER_IMAGE))
    assert moved.group_id == first.group_id and moved.config_id != first.config_id
    assert _count(emu, "ngcx-svc-a") == (1, 2)
    view = call(emu, "DescribeScalingGroups", ScalingGroupName="ngcx-svc-a")["ScalingGroups"]["ScalingGroup"][0]
    assert view["ActiveScalingConfigurationId"] == moved.config_id
    assert groups.ensure_group(spec_for(net, "ngcx-svc-a", desired=1, min_size=1, image_id=OTHER_IMAGE)) == moved

    groups.set_size(moved, 0, 2, 0)                       # ModifyScalingGroup: drains through the hook
    assert [(m.instance_id, m.state) for m in groups.instances(moved)] == [(member.instance_id, "Removing:Wait")]
    until(lambda: member.instance_id not in servers(emu, net["group"]), "out of the server group")
    groups.complete_lifecycle(moved, member.instance_id)
    until(lambda: not hosts.alive(member.instance_id), "drained and released")
    assert groups.instances(moved) == []
    with pytest.raises(UserError, match="min"):
        groups.set_size(moved, 2, 1, 1)
    groups.delete(moved)
    groups.delete(moved)
    assert _count(emu, "ngcx-svc-a") == (0, 0)
    assert groups.tagged(OWNER) == []


def test_lost_answers_make_no_duplicate(cloud, groups, net) -> None:
    emu = cloud[0]
    emu.fail_next("CreateScalingGroup", "InternalError", 500, after_effect=True)          # made; answer lost
    emu.fail_next("CreateScalingConfiguration", "ServiceUnavailable", 503, after_effect=True)
    emu.fail_next("DescribeScalingGroups", "Throttling", 400)
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-r"))
    assert _count(emu, "ngcx-svc-r") == (1, 1)
    assert groups.ensure_group(spec_for(net, "ngcx-svc-r")) == ref
    groups.delete(ref)
    made_again = groups.ensure_group(spec_for(net, "ngcx-svc-r"))      # its first token names a deleted group
    assert made_again.group_id != ref.group_id and _count(emu, "ngcx-svc-r") == (1, 1)


def test_tagged_finds_what_a_killed_ngcx_left_and_another_owner_is_refused(cloud, groups, net) -> None:
    emu = cloud[0]
    groups.ensure_group(spec_for(net, "ngcx-svc-b"))                         # its record never written
    call(emu, "CreateScalingGroup", ScalingGroupName="ngcx-svc-c", MinSize=0, MaxSize=1,
         VSwitchIds__1=net["switches"][0], Tags__1__Key="ngcx:owner", Tags__1__Value="ess-owner")   # no config yet
    found = {ref.name: ref for ref in groups.tagged({"ngcx:owner": "ess-owner"})}
    assert set(found) == {"ngcx-svc-b", "ngcx-svc-c"} and found["ngcx-svc-c"].config_id == ""
    assert groups.tagged({"ngcx:owner": "someone-else"}) == []
    with pytest.raises(UserError, match="not this owner's"):
        groups.ensure_group(spec_for(net, "ngcx-svc-b", tags={"ngcx:owner": "someone-else"}))
    for ref in found.values():
        groups.delete(ref)
    assert groups.tagged({"ngcx:owner": "ess-owner"}) == []


def test_an_error_is_one_line_without_the_secret(cloud, groups, monkeypatch) -> None:
    from ngcx.clouds.aliyun import Api

    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "wrong-secret-never-printed")
    wrong = ScalingGroups(Api("cn-hangzhou", deadline_s=5))
    with pytest.raises(UserError) as caught:
        wrong.instances(GroupRef("ngcx-svc-x", "asg-x", ""))
    text = str(caught.value) + str(getattr(caught.value, "hint", ""))
    assert "SignatureDoesNotMatch" in text and "\n" not in str(caught.value) and "wrong-secret" not in text



def test_target_tracking_on_real_requests_scales_out_and_back_in_without_a_failed_request(cloud, groups,
                                                                                            net) -> None:
    emu, hosts = cloud
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-t", min_size=1, desired=1, max_size=2, drain_wait_s=600))
    until(lambda: [m.state for m in groups.instances(ref)] == ["InService"], "one serving")
    until(lambda: get(net["address"])[0] == 200, "the balancer sends it requests")
    rule = groups.put_target_tracking(ref, 1.0, Metric())    # 1 request per emulated second per server
    assert groups.put_target_tracking(ref, 1.0) == rule      # changed in place, not a second rule
    load = PacedLoad(net["address"])
    try:
        started = time.monotonic()
        load.rate = 40.0                                      # ~2 per emulated second on one server: 2 wanted
        until(lambda: [m.state for m in groups.instances(ref)] == ["InService"] * 2, "scaled out to 2 serving",
              timeout=40)
        scaled_out_s = time.monotonic() - started
        until(lambda: len(load.seen) == 2, "both answer", timeout=10)
        load.rate = 2.0                                       # ~0.1 per emulated second: 1 is enough
        started = time.monotonic()
        victim = until(lambda: next((m for m in groups.instances(ref) if m.state == "Removing:Wait"), None),
                       "a member waits in Removing:Wait", timeout=40)
        until(lambda: victim.instance_id not in servers(emu, net["group"]), "drained out of the server group")
        groups.complete_lifecycle(ref, victim.instance_id)    # the host is idle
        until(lambda: not hosts.alive(victim.instance_id), "the victim's machine is gone", timeout=20)
        scaled_in_s = time.monotonic() - started
        time.sleep(1.0)
        groups.complete_lifecycle(ref, victim.instance_id)    # no wait left: done, not an error
    finally:
        load.stop()
    assert [m.state for m in groups.instances(ref)] == ["InService"]
    assert load.failures == [], load.failures[:5]
    assert [d[1:3] for d in emu.ess.decisions if d[0] == "ngcx-svc-t"][:2] == [(1, 2), (2, 1)], emu.ess.decisions
    assert members(emu, ref.group_id) == {m.instance_id: "InService" for m in groups.instances(ref)}
    print(f"scale-out {scaled_out_s:.1f} s, scale-in {scaled_in_s:.1f} s, requests {sum(load.seen.values())}")


def _wake_parts(emu: EcsEmulator, ref: GroupRef) -> tuple[list[str], list[str]]:
    """(the group's rules named <group>-wake, its alarm tasks) as the emulated ESS has them."""
    rules = call(emu, "DescribeScalingRules", ScalingGroupId=ref.group_id)["ScalingRules"]["ScalingRule"]
    alarms = call(emu, "DescribeAlarms", ScalingGroupId=ref.group_id)["AlarmList"]["Alarm"]
    return ([r["ScalingRuleId"] for r in rules if r["ScalingRuleName"] == f"{ref.name}-wake"],
            [a["AlarmTaskId"] for a in alarms])


def test_scale_to_zero_keeps_the_instance_stopped_and_the_wake_alarm_starts_it_again_on_503s(cloud,
                                                                                           groups) -> None:
    emu, hosts = cloud
    net = balancer(emu, "ess-wake")                          # its own: only this group's instance behind it
    lb = BalancerRef(net["lb"], net["group"], "", "")
    ref = groups.ensure_group(spec_for(net, "ngcx-svc-z", desired=1, max_size=1, drain_wait_s=600))
    groups.set_idle_stop(ref, True)
    groups.put_wake(ref, lb, True)
    groups.put_wake(ref, lb, True)                           # idempotent: one rule, one alarm task
    rules, alarms = _wake_parts(emu, ref)
    assert len(rules) == 1 and len(alarms) == 1
    [alarm] = call(emu, "DescribeAlarms", AlarmTaskId=alarms[0])["AlarmList"]["Alarm"]
    assert (alarm["MetricName"], alarm["Dimensions"]["Dimension"][0]["DimensionValue"]) == (WAKE_METRIC, net["lb"])
    [member] = until(lambda: [m for m in groups.instances(ref) if m.state == "InService"], "one serving")
    until(lambda: get(net["address"])[0] == 200, "it serves through the balancer")

    groups.set_size(ref, 0, 1, 0)                            # idle: scale to zero, through the drain hook
    until(lambda: member.instance_id not in servers(emu, net["group"]), "drained out of the server group")
    groups.complete_lifecycle(ref, member.instance_id)
    until(lambda: [(m.instance_id, m.state) for m in groups.instances(ref)] == [(member.instance_id, "Stopped")],
          "kept, Stopped")
    [view] = call(emu, "DescribeInstances", ECS, InstanceIds=json.dumps([member.instance_id]))["Instances"]["Instance"]
    assert (view["Status"], view["StoppedMode"]) == ("Stopped", "StopCharging")
    assert not hosts.alive(member.instance_id) and groups.sizes(ref) == (0, 1, 0)

    started = time.monotonic()
    until(lambda: get(net["address"])[0] == 200, "requests get 503 until the wake alarm started it", timeout=40)
    woke_s = time.monotonic() - started
    assert [(m.instance_id, m.state) for m in groups.instances(ref)] == [(member.instance_id, "InService")]
    assert groups.sizes(ref) == (0, 1, 1) and member.instance_id in hosts.starts
    assert [d[1:3] for d in emu.ess.decisions if d[0] == "ngcx-svc-z"] == [(0, 1)]

    groups.put_wake(ref, lb, False)
    groups.put_wake(ref, lb, False)                          # absent is done
    assert _wake_parts(emu, ref) == ([], [])
    groups.put_wake(ref, lb, True)
    groups.delete(ref)                                       # the alarm task too (it outlives the group on ESS)
    assert call(emu, "DescribeAlarms", ScalingGroupId=ref.group_id)["AlarmList"]["Alarm"] == []
    assert groups.sizes(ref) is None
    until(lambda: not hosts.alive(member.instance_id), "its machine is released")
    print(f"woken by 503s in {woke_s:.1f} s")
