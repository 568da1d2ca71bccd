"""Scale to zero on the emulated ESS (aliyun_ess.py recycle mode, aliyun_ess_alarms.py alarm tasks), through the
real aliyun-python-sdk-core CommonRequest.

What a user notices: a recycle-mode group scaled in keeps its instance, Stopped in economical mode (the ECS
instance is Stopped, StopCharging; its machine is down); the ALB then answers 503; an alarm task on the
balancer's 503 count runs the group's simple rule and the same instance starts again and serves through the
balancer; ExecuteScalingRule of a TotalCapacity rule stops it again; ForceDelete releases the stopped one; the
alarm task outlives the group (as the reference says) until DeleteAlarm.

The machines are ProcessHosts (test_aws_autoscaling.py: processes that stop and start again on their address).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_ess_alarms import WAKE_METRIC
from emulators.test_aliyun_ess import (
    ECS,
    balancer,
    call,
    ess_cloud,
    members,
    refused,
    scaling_group,
    servers,
    until,
)
from emulators.test_aws_autoscaling import ProcessHosts
from emulators.traffic import get


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    hosts = ProcessHosts()
    with ess_cloud(hosts) as (emulator, _):
        yield emulator, hosts


def ecs_instance(emu: EcsEmulator, instance_id: str) -> dict:
    [found] = call(emu, "DescribeInstances", ECS, InstanceIds=json.dumps([instance_id]))["Instances"]["Instance"]
    return found


def test_a_recycle_group_stops_scaled_in_instances_and_an_alarm_on_the_albs_503s_starts_them_again(cloud) -> None:
    emu, hosts = cloud
    net = balancer(emu, "ess-zero")
    group, _ = scaling_group(emu, net, "ess-zero", desired=1, MaxSize=1, ScalingPolicy="recycle")
    call(emu, "EnableScalingGroup", ScalingGroupId=group)
    [instance] = until(lambda: [i for i, s in members(emu, group).items() if s == "InService"], "one serving")
    address = hosts.machines[instance][0]
    until(lambda: get(net["address"])[0] == 200, "it answers through the balancer")

    call(emu, "ModifyScalingGroup", ScalingGroupId=group, DesiredCapacity=0)           # scale in: stopped, kept
    until(lambda: members(emu, group) == {instance: "Stopped"}, "the instance is Stopped and still the group's")
    view = ecs_instance(emu, instance)
    assert (view["Status"], view["StoppedMode"]) == ("Stopped", "StopCharging") and not hosts.alive(instance)
    assert instance not in servers(emu, net["group"])
    group_view = call(emu, "DescribeScalingGroups", ScalingGroupName="ess-zero")["ScalingGroups"]["ScalingGroup"][0]
    assert (group_view["ScalingPolicy"], group_view["DesiredCapacity"], group_view["StoppedCapacity"]) == (
        "recycle", 0, 1)
    assert get(net["address"])[0] == 503                                                 # nobody serves

    rule = call(emu, "CreateScalingRule", ScalingGroupId=group, ScalingRuleName="wake",
                ScalingRuleType="SimpleScalingRule", AdjustmentType="QuantityChangeInCapacity", AdjustmentValue=1)
    emu.fail_next("CreateAlarm", "Throttling", 400)
    alarm_params = {"ScalingGroupId": group, "Name": "wake", "MetricType": "system", "MetricName": WAKE_METRIC,
                    "Statistics": "Average", "ComparisonOperator": ">", "Threshold": 0, "EvaluationCount": 1,
                    "Period": 60, "AlarmActions__1": rule["ScalingRuleAri"],
                    "Dimensions__1__DimensionKey": "loadBalancerId", "Dimensions__1__DimensionValue": net["lb"]}
    assert refused(emu, "CreateAlarm", **alarm_params) == "Throttling"
    alarm = call(emu, "CreateAlarm", **alarm_params)["AlarmTaskId"]
    started = time.monotonic()

    until(lambda: get(net["address"])[0] == 200, "requests knock (503) until the alarm woke the instance",
          timeout=40)
    woke_s = time.monotonic() - started
    assert members(emu, group) == {instance: "InService"} and hosts.starts == [instance]
    assert hosts.machines[instance][0] == address and ecs_instance(emu, instance)["Status"] == "Running"
    assert [d[1:3] for d in emu.ess.decisions if d[0] == "ess-zero"] == [(0, 1)]
    [described] = call(emu, "DescribeAlarms", ScalingGroupId=group)["AlarmList"]["Alarm"]
    assert (described["AlarmTaskId"], described["MetricName"], described["AlarmActions"]["AlarmAction"]) == (
        alarm, WAKE_METRIC, [rule["ScalingRuleAri"]])
    until(lambda: call(emu, "DescribeAlarms", AlarmTaskId=alarm)["AlarmList"]["Alarm"][0]["State"] == "OK",
          "no more 503s: OK", timeout=20)

    empty = call(emu, "CreateScalingRule", ScalingGroupId=group, ScalingRuleName="empty",
                 ScalingRuleType="SimpleScalingRule", AdjustmentType="TotalCapacity", AdjustmentValue=0)
    token = {"ScalingRuleAri": empty["ScalingRuleAri"], "ClientToken": "ess-zero-execute-1"}
    first = call(emu, "ExecuteScalingRule", **token)["ScalingActivityId"]
    assert first and call(emu, "ExecuteScalingRule", **token)["ScalingActivityId"] == first       # replayed
    until(lambda: members(emu, group) == {instance: "Stopped"}, "stopped again")

    call(emu, "DeleteScalingGroup", ScalingGroupId=group, ForceDelete=True)           # releases the stopped one
    until(lambda: instance in hosts.deleted, "the stopped instance is released")
    assert call(emu, "DescribeInstances", ECS, InstanceIds=json.dumps([instance]))["Instances"]["Instance"] == []
    assert [a["AlarmTaskId"] for a in call(emu, "DescribeAlarms", ScalingGroupId=group)["AlarmList"]["Alarm"]] == [
        alarm]                                                   # DeleteScalingGroup leaves alarm tasks
    call(emu, "DeleteAlarm", AlarmTaskId=alarm)
    assert refused(emu, "DeleteAlarm", AlarmTaskId=alarm) == "InvalidAlarmTaskId.NotFound"
    print(f"woken by the alarm in {woke_s:.1f} s")
