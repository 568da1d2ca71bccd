"""Auto Scaling (ESS 2022-02-22) in the Alibaba Cloud emulator (aliyun_ess.py), through the real
aliyun-python-sdk-core CommonRequest (product "Ess"), as ngcx sends it.

What a user of ESS notices: an enabled group of 2 launches 2 ECS instances that run the scaling
configuration's user-data and become servers of the attached ALB server group (its haproxy sends them
traffic); lowering the desired capacity takes one out of the server group first (draining), holds it in
Removing:Wait until CompleteLifecycleAction (its token found through DescribeLifecycleActions), and only
then is its machine gone (or at the hook's HeartbeatTimeout, as Timeout); a launch ECS refuses is a Failed
activity that says why; a lost answer retried with the same ClientToken makes no second group; a wrong
signature is refused; a target-tracking rule on the hosts' own metric scales the group out.

The machines are test_aws_autoscaling's ProcessHosts (a process per instance on its own loopback address,
running the user-data with sh). Time in the balancer's drains and the group runs at TIME_SCALE.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import CommonRequest

from emulators.aliyun_ecs import EcsEmulator
from emulators.balancer_plane import HAPROXY
from emulators.test_aws_autoscaling import ProcessHosts, replica_user_data
from emulators.traffic import get, spread
from support import missing

AK, SECRET = "LTAI5tEssEmulatorTest", "ess-secret-never-printed-41"
ESS, ALB, ECS = "2022-02-22", "2020-06-16", "2014-05-26"
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
A10 = "ecs.gn7i-c8g1.2xlarge"
TIME_SCALE = 0.05               # an ESS minute is 3 s here; a 20 s drain is 1 s
PRODUCTS = {ESS: "Ess", ALB: "Alb", ECS: "Ecs"}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@contextlib.contextmanager
def ess_cloud(hosts: ProcessHosts | None = None) -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    """The ECS emulator with ALB and ESS on fast clocks, its hosts processes (shared with the client's tests)."""
    if shutil.which(HAPROXY) is None:
        missing("haproxy not installed (apt: haproxy; scripts/setup.sh installs it)")
    hosts = hosts if hosts is not None else ProcessHosts()
    with EcsEmulator(hosts, access_keys={AK: SECRET}, boot_seconds=0.05, start_seconds=0.05) as emulator:
        alb = emulator.alb
        alb.provision_seconds, alb.job_seconds, alb.health_scale, alb.drain_scale = 0.1, 0.05, 0.1, TIME_SCALE
        emulator.ess.time_scale = TIME_SCALE
        yield emulator, hosts
        assert emulator.host_errors == [] and emulator.ess.errors == [] and emulator.alb.plane_errors == []


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    with ess_cloud() as made:
        yield made


def call(emu: EcsEmulator, action: str, version: str = ESS, secret: str = SECRET, **params: Any) -> dict[str, Any]:
    """One CommonRequest; `A__1__B` names the parameter `A.1.B`."""
    client = AcsClient(AK, secret, "cn-hangzhou", port=emu.port, auto_retry=False, max_retry_time=0)
    request = CommonRequest(domain="127.0.0.1", version=version, action_name=action, product=PRODUCTS[version])
    request.set_method("POST")
    request.set_protocol_type("http")
    for key, value in params.items():
        request.add_query_param(key.replace("__", "."), value)
    return json.loads(client.do_action_with_exception(request))


def refused(emu: EcsEmulator, action: str, **params: Any) -> str:
    with pytest.raises(ServerException) as info:
        call(emu, action, **params)
    return info.value.get_error_code()


def until(what: Callable[[], Any], why: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"timed out waiting: {why}"
        time.sleep(0.05)
    return found


def balancer(emu: EcsEmulator, name: str) -> dict[str, Any]:
    """An ALB in two zones, an HTTP server group (drain 20 s) checking any path, a listener on 80."""
    switches = call(emu, "DescribeVSwitches", ECS)["VSwitches"]["VSwitch"][:2]
    vpc = switches[0]["VpcId"]
    zones = {f"ZoneMappings__{n}__{k}": s[f"{k}"] for n, s in enumerate(switches, 1) for k in ("ZoneId", "VSwitchId")}
    lb = call(emu, "CreateLoadBalancer", ALB, VpcId=vpc, AddressType="Internet", LoadBalancerName=name,
              LoadBalancerEdition="Standard", LoadBalancerBillingConfig__PayType="PostPay", **zones)["LoadBalancerId"]
    group = call(emu, "CreateServerGroup", ALB, ServerGroupName=name, VpcId=vpc, Protocol="HTTP",
                 HealthCheckConfig__HealthCheckPath="/health", HealthCheckConfig__HealthyThreshold=2,
                 ConnectionDrainConfig__ConnectionDrainEnabled=True,
                 ConnectionDrainConfig__ConnectionDrainTimeout=20)["ServerGroupId"]
    until(lambda: call(emu, "GetLoadBalancerAttribute", ALB, LoadBalancerId=lb)["LoadBalancerStatus"] == "Active",
          "the balancer is Active")
    call(emu, "CreateListener", ALB, LoadBalancerId=lb, ListenerProtocol="HTTP", ListenerPort=80,
         DefaultActions__1__Type="ForwardGroup",
         DefaultActions__1__ForwardGroupConfig__ServerGroupTuples__1__ServerGroupId=group)
    address = until(lambda: _address(emu, lb), "the listener serves")
    return {"lb": lb, "group": group, "switches": [s["VSwitchId"] for s in switches], "address": address}


def _address(emu: EcsEmulator, lb: str) -> tuple[str, int] | None:
    try:
        return emu.balancer_address(lb, 80)
    except LookupError:
        return None


def scaling_group(emu: EcsEmulator, net: dict[str, Any], name: str, desired: int, **extra: Any) -> tuple[str, str]:
    """A group over the balancer's vSwitches, attached to its server group on port 8000, with a configuration
    that boots the replica; not enabled yet. (group id, configuration id)"""
    switches = {f"VSwitchIds__{n}": s for n, s in enumerate(net["switches"], 1)}
    sizes = {"MinSize": 0, "MaxSize": 3, "DesiredCapacity": desired} | extra
    group = call(emu, "CreateScalingGroup", ScalingGroupName=name, ServerGroups__1__ServerGroupId=net["group"],
                 ServerGroups__1__Port=8000, ServerGroups__1__Weight=100, ServerGroups__1__Type="ALB",
                 Tags__1__Key="ngcx:service", Tags__1__Value=name, **switches, **sizes)["ScalingGroupId"]
    config = call(emu, "CreateScalingConfiguration", ScalingGroupId=group, ImageId=IMAGE, InstanceType=A10,
                  UserData=base64.b64encode(replica_user_data("v1").encode()).decode(),
                  Tags=json.dumps({"ngcx:service": name}))["ScalingConfigurationId"]
    return group, config


def members(emu: EcsEmulator, group: str) -> dict[str, str]:
    rows = call(emu, "DescribeScalingInstances", ScalingGroupId=group)["ScalingInstances"]["ScalingInstance"]
    return {r["InstanceId"]: r["LifecycleState"] for r in rows}


def servers(emu: EcsEmulator, group: str) -> dict[str, str]:
    rows = call(emu, "ListServerGroupServers", ALB, ServerGroupId=group)["Servers"]
    return {r["ServerId"]: r["Status"] for r in rows}


def test_a_group_boots_real_servers_of_the_alb_and_drains_them_through_the_hook(cloud) -> None:
    emu, hosts = cloud
    net = balancer(emu, "ess-emu")
    group, config = scaling_group(emu, net, "ess-emu", desired=2)
    hook = call(emu, "CreateLifecycleHook", ScalingGroupId=group, LifecycleHookName="drain",
                LifecycleTransition="SCALE_IN", HeartbeatTimeout=600, DefaultResult="CONTINUE")["LifecycleHookId"]
    assert members(emu, group) == {}                                 # Inactive until enabled
    call(emu, "EnableScalingGroup", ScalingGroupId=group, ActiveScalingConfigurationId=config)
    ids = sorted(until(lambda: members(emu, group) if len(members(emu, group)) == 2 else None, "2 instances"))
    until(lambda: members(emu, group) == dict.fromkeys(ids, "InService"), "both InService")
    assert servers(emu, net["group"]) == dict.fromkeys(ids, "Available")
    until(lambda: len(spread(net["address"], 16)) == 2, "both machines answer through the balancer")
    view = call(emu, "DescribeScalingGroups", ScalingGroupName="ess-emu")["ScalingGroups"]["ScalingGroup"][0]
    assert (view["LifecycleState"], view["ActiveCapacity"], view["ServerGroups"]["ServerGroup"][0]["Port"]) == (
        "Active", 2, 8000)

    call(emu, "ModifyScalingGroup", ScalingGroupId=group, DesiredCapacity=1)
    states = members(emu, group)
    [victim] = [i for i, s in states.items() if s == "Removing:Wait"]
    [kept] = [i for i, s in states.items() if s == "InService"]
    until(lambda: victim not in servers(emu, net["group"]), "the victim drained out of the server group")
    assert hosts.alive(victim) and members(emu, group)[victim] == "Removing:Wait"     # the hook still holds it
    assert set(spread(net["address"], 8)) == {hosts.machines[kept][0] + " v1"}
    [activity] = call(emu, "DescribeScalingActivities", ScalingGroupId=group, StatusCode="InProgress")[
        "ScalingActivities"]["ScalingActivity"]
    [action] = call(emu, "DescribeLifecycleActions", ScalingActivityId=activity["ScalingActivityId"],
                    LifecycleActionStatus="Pending")["LifecycleActions"]["LifecycleAction"]
    assert action["InstanceIds"]["InstanceId"] == [victim] and action["LifecycleHookId"] == hook
    call(emu, "CompleteLifecycleAction", LifecycleHookId=hook, LifecycleActionToken=action["LifecycleActionToken"],
         LifecycleActionResult="CONTINUE")
    until(lambda: not hosts.alive(victim) and victim in hosts.deleted, "the victim's machine is gone")
    assert members(emu, group) == {kept: "InService"}
    assert refused(emu, "CompleteLifecycleAction", LifecycleHookId=hook,
                   LifecycleActionToken=action["LifecycleActionToken"]) == "LifecycleActionToken.NotFound"
    assert get(net["address"])[0] == 200

    assert refused(emu, "DeleteScalingGroup", ScalingGroupId=group) == "IncorrectScalingGroupStatus"
    call(emu, "DeleteScalingGroup", ScalingGroupId=group, ForceDelete=True)
    until(lambda: not hosts.alive(kept), "the last machine is gone")
    assert call(emu, "DescribeScalingGroups", ScalingGroupName="ess-emu")["ScalingGroups"]["ScalingGroup"] == []
    assert refused(emu, "DescribeScalingInstances", ScalingGroupId=group) == "InvalidScalingGroupId.NotFound"


def test_a_lost_answer_retried_with_its_client_token_makes_one_group(cloud) -> None:
    emu, _ = cloud
    switches = call(emu, "DescribeVSwitches", ECS)["VSwitches"]["VSwitch"]
    params = {"ScalingGroupName": "ess-token", "MinSize": 0, "MaxSize": 1, "VSwitchIds__1": switches[0]["VSwitchId"],
              "ClientToken": "ngcx-token-1"}
    emu.fail_next("CreateScalingGroup", "InternalError", 500, after_effect=True)     # made; the answer lost
    assert refused(emu, "CreateScalingGroup", **params) == "InternalError"
    first = call(emu, "CreateScalingGroup", **params)["ScalingGroupId"]
    assert call(emu, "CreateScalingGroup", **params)["ScalingGroupId"] == first
    assert refused(emu, "CreateScalingGroup", **{**params, "MaxSize": 2}) == "IdempotentParameterMismatch"
    assert refused(emu, "CreateScalingGroup", **{**params, "ClientToken": "other"}) == "ScalingGroupName.Duplicate"
    groups = call(emu, "DescribeScalingGroups", ScalingGroupName="ess-token")["ScalingGroups"]["ScalingGroup"]
    assert [g["ScalingGroupId"] for g in groups] == [first]
    call(emu, "DeleteScalingGroup", ScalingGroupId=first)


def test_a_wrong_signature_is_refused(cloud) -> None:
    emu, _ = cloud
    with pytest.raises(ServerException) as caught:
        call(emu, "DescribeScalingGroups", secret="not-the-secret")
    assert caught.value.get_error_code() == "SignatureDoesNotMatch"
    assert "not-the-secret" not in str(caught.value)


def test_target_tracking_on_the_hosts_metric_scales_out(cloud) -> None:
    emu, hosts = cloud
    net = balancer(emu, "ess-custom")
    group, config = scaling_group(emu, net, "ess-custom", desired=1, MinSize=1)
    call(emu, "ModifyScalingGroup", ScalingGroupId=group, MaxSize=2)
    call(emu, "EnableScalingGroup", ScalingGroupId=group)              # its only configuration
    rule = call(emu, "CreateScalingRule", ScalingGroupId=group, ScalingRuleName="inflight",
                ScalingRuleType="TargetTrackingScalingRule", MetricName="InFlight", TargetValue=4)
    assert rule["ScalingRuleId"].startswith("asr-")
    until(lambda: members(emu, group) and set(members(emu, group).values()) == {"InService"}, "one serving")

    def busy() -> bool:
        emu.ess.put_metric(group, "InFlight", 8.0)
        return any(d[0] == "ess-custom" for d in emu.ess.decisions)

    until(busy, "the controller scales out on the metric", timeout=20)
    assert [d[1:3] for d in emu.ess.decisions if d[0] == "ess-custom"] == [(1, 2)]
    ids = until(lambda: (m := members(emu, group)) and len(m) == 2 and set(m.values()) == {"InService"} and m,
                "two serving")
    assert call(emu, "DescribeScalingRules", ScalingGroupId=group)["ScalingRules"]["ScalingRule"][0][
        "MetricName"] == "InFlight"
    call(emu, "DeleteScalingGroup", ScalingGroupId=group, ForceDelete=True)
    until(lambda: not any(hosts.alive(i) for i in ids), "their machines are gone")


def test_an_uncompleted_wait_ends_at_the_heartbeat_timeout(cloud) -> None:
    """No CompleteLifecycleAction: the hook's HeartbeatTimeout (30 s: 1.5 s here) ends the wait, as Timeout."""
    emu, hosts = cloud
    switches = call(emu, "DescribeVSwitches", ECS)["VSwitches"]["VSwitch"]
    group = call(emu, "CreateScalingGroup", ScalingGroupName="ess-timeout", MinSize=0, MaxSize=1, DesiredCapacity=1,
                 VSwitchIds__1=switches[0]["VSwitchId"])["ScalingGroupId"]
    call(emu, "CreateScalingConfiguration", ScalingGroupId=group, ImageId=IMAGE, InstanceType=A10,
         UserData=base64.b64encode(replica_user_data("t").encode()).decode())
    call(emu, "CreateLifecycleHook", ScalingGroupId=group, LifecycleTransition="SCALE_IN", HeartbeatTimeout=30)
    call(emu, "EnableScalingGroup", ScalingGroupId=group)
    [instance] = until(lambda: [i for i, s in members(emu, group).items() if s == "InService"], "one in service")
    call(emu, "ModifyScalingGroup", ScalingGroupId=group, DesiredCapacity=0)
    assert members(emu, group) == {instance: "Removing:Wait"}
    until(lambda: members(emu, group) == {} and not hosts.alive(instance), "released at the timeout", timeout=10)
    activity = call(emu, "DescribeScalingActivities", ScalingGroupId=group)["ScalingActivities"]["ScalingActivity"][0]
    assert (activity["StatusCode"], activity["Progress"]) == ("Successful", 100)
    [action] = call(emu, "DescribeLifecycleActions", ScalingActivityId=activity["ScalingActivityId"])[
        "LifecycleActions"]["LifecycleAction"]
    assert (action["LifecycleActionStatus"], action["LifecycleActionResult"]) == ("Timeout", "CONTINUE")
    call(emu, "DeleteScalingGroup", ScalingGroupId=group)


def test_a_launch_the_zone_cannot_serve_is_a_failed_activity_that_says_why(cloud) -> None:
    emu, _ = cloud
    switch = call(emu, "DescribeVSwitches", ECS)["VSwitches"]["VSwitch"][0]
    group = call(emu, "CreateScalingGroup", ScalingGroupName="ess-nostock", MinSize=0, MaxSize=1, DesiredCapacity=1,
                 VSwitchIds__1=switch["VSwitchId"])["ScalingGroupId"]
    call(emu, "CreateScalingConfiguration", ScalingGroupId=group, ImageId=IMAGE, InstanceType=A10)
    emu.set_stock(switch["ZoneId"], A10, False)
    try:
        call(emu, "EnableScalingGroup", ScalingGroupId=group)
    finally:
        emu.set_stock(switch["ZoneId"], A10, True)
    [activity] = call(emu, "DescribeScalingActivities", ScalingGroupId=group)["ScalingActivities"]["ScalingActivity"]
    assert activity["StatusCode"] == "Failed" and "OperationDenied.NoStock" in activity["StatusMessage"]
    assert members(emu, group) == {}
    call(emu, "DeleteScalingGroup", ScalingGroupId=group)
