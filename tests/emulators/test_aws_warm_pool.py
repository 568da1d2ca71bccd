"""Scale to zero on the emulated EC2 Auto Scaling, through the real boto3: a warm pool, the balancer's 503 alarm.

What a user of a warm pool notices: the pool holds prepared, stopped instances (their machines really off); a
scale-out starts one of them (no new instance id) that comes back InService and takes traffic; a scale-in
drains the victims and returns them to the pool, stopped; with the group at zero the balancer answers 503,
its HTTPCode_ELB_503_Count alarm goes to ALARM and a step-scaling policy wakes the group from the pool; a
forced delete leaves nothing running.

The machines are ProcessHosts (test_aws_autoscaling.py) that can stop and start again: a stop kills the
process, a start runs the same user-data again on the same address (the disk kept). Time runs at TIME_SCALE:
a CloudWatch period is 6 s, a 20 s deregistration delay 2 s.
"""

from __future__ import annotations

import base64
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
    ProcessHosts,
    boto,
    healthy,
    make_balancer,
    no_proxy,  # noqa: F401  (autouse: this module's tests run without the machine's proxy)
    replica_user_data,
)
from emulators.test_aws_emulator import until
from emulators.traffic import get, spread

TIME_SCALE = 0.1


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[Ec2Emulator, AutoScaling, ProcessHosts]]:
    hosts = ProcessHosts(first=120)           # addresses of their own next to test_aws_autoscaling's
    with Ec2Emulator(hosts, access_keys={KEY: SECRET}, boot_seconds=0.05, start_seconds=0.05) as emulator:
        emulator.elbv2.time_scale = TIME_SCALE
        scaling = AutoScaling(emulator, time_scale=TIME_SCALE)
        yield emulator, scaling, hosts
        assert emulator.proxy_errors == [] and emulator.host_errors == [] and scaling.errors == []


def make_group(emulator: Ec2Emulator, name: str, net: dict[str, Any] | None, desired: int) -> None:
    ec2, asg = boto(emulator, "ec2"), boto(emulator, "autoscaling")
    template = ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={
        "ImageId": AMI, "InstanceType": "g5.xlarge",
        "UserData": base64.b64encode(replica_user_data("w").encode()).decode()})["LaunchTemplate"]
    subnets = net["subnets"] if net else [ec2.describe_subnets()["Subnets"][0]["SubnetId"]]
    asg.create_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, MaxSize=2, DesiredCapacity=desired,
                                  LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"],
                                                  "Version": "$Latest"},
                                  TargetGroupARNs=[net["group"]] if net else [], VPCZoneIdentifier=",".join(subnets))
    asg.put_warm_pool(AutoScalingGroupName=name, PoolState="Stopped", MinSize=0,
                      InstanceReusePolicy={"ReuseOnScaleIn": True})


def states(emulator: Ec2Emulator, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """({group instance: LifecycleState}, {pool instance: LifecycleState})."""
    asg = boto(emulator, "autoscaling")
    groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    pool = asg.describe_warm_pool(AutoScalingGroupName=name)["Instances"]
    return ({i["InstanceId"]: i["LifecycleState"] for g in groups for i in g["Instances"]},
            {i["InstanceId"]: i["LifecycleState"] for i in pool})


def ec2_state(emulator: Ec2Emulator, instance_id: str) -> str:
    found = boto(emulator, "ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
    return found[0]["Instances"][0]["State"]["Name"]


def test_scale_to_zero_through_the_warm_pool_and_the_503_alarm(cloud) -> None:
    emulator, scaling, hosts = cloud
    net = make_balancer(emulator, "warm", delay_s=20)                      # 2 s here
    asg, watch = boto(emulator, "autoscaling"), boto(emulator, "cloudwatch")
    make_group(emulator, "warm", net, desired=1)
    [first] = states(emulator, "warm")[0]

    # the pool: max 2 - desired 1 = one prepared instance, stopped, its machine off
    until("one pool instance Warmed:Stopped", lambda: list(states(emulator, "warm")[1].values()) == ["Warmed:Stopped"],
          timeout=20, every=0.2)
    [warm] = states(emulator, "warm")[1]
    pool = asg.describe_warm_pool(AutoScalingGroupName="warm")
    assert pool["WarmPoolConfiguration"]["PoolState"] == "Stopped"
    [row] = pool["Instances"]
    assert row["HealthStatus"] == "Healthy" and row["InstanceType"] == "g5.xlarge"
    assert row["LaunchTemplate"]["LaunchTemplateName"] == "warm" and row["LaunchTemplate"]["Version"] == "1"
    assert warm != first and ec2_state(emulator, warm) == "stopped" and not hosts.alive(warm)
    assert warm in hosts.addresses                                          # it booted once (prepared)
    until("the group's instance serves", lambda: healthy(emulator, net["group"]) == {first: "healthy"}, timeout=20)

    # scale-out: the warm one starts (no new instance id), InService, registered, serving
    asg.set_desired_capacity(AutoScalingGroupName="warm", DesiredCapacity=2)
    group, pool_now = states(emulator, "warm")
    assert set(group) == {first, warm} and pool_now == {}
    until("both healthy targets", lambda: healthy(emulator, net["group"]) == {first: "healthy", warm: "healthy"},
          timeout=20)
    assert states(emulator, "warm")[0] == {first: "InService", warm: "InService"}
    assert hosts.starts == [warm] and ec2_state(emulator, warm) == "running"
    assert len(spread(net["address"], 16)) == 2

    # scale-in to zero: both drain, then go back to the pool stopped
    asg.set_desired_capacity(AutoScalingGroupName="warm", DesiredCapacity=0)
    assert set(states(emulator, "warm")[0].values()) == {"Terminating"}
    until("both back in the pool, stopped", lambda: states(emulator, "warm") == (
        {}, {first: "Warmed:Stopped", warm: "Warmed:Stopped"}), timeout=20, every=0.2)
    assert not hosts.alive(first) and not hosts.alive(warm) and first not in hosts.deleted
    assert {ec2_state(emulator, i) for i in (first, warm)} == {"stopped"}
    assert get(net["address"])[0] == 503

    # the wake: a step policy on the balancer's own 503 count; its warm-up (18 s here) keeps the 503s answered
    # while the woken host boots from adding a second one
    policy = asg.put_scaling_policy(AutoScalingGroupName="warm", PolicyName="warm-wake", PolicyType="StepScaling",
                                    AdjustmentType="ChangeInCapacity", MetricAggregationType="Sum",
                                    EstimatedInstanceWarmup=180,
                                    StepAdjustments=[{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}])
    label = net["balancer"].partition(":loadbalancer/")[2]
    watch.put_metric_alarm(AlarmName="warm-wake", Namespace="AWS/ApplicationELB", MetricName="HTTPCode_ELB_503_Count",
                           Dimensions=[{"Name": "LoadBalancer", "Value": label}], Statistic="Sum", Period=60,
                           EvaluationPeriods=1, Threshold=1.0, ComparisonOperator="GreaterThanOrEqualToThreshold",
                           TreatMissingData="notBreaching", AlarmActions=[policy["PolicyARN"]],
                           Tags=[{"Key": "ngcx:service", "Value": "warm"}])

    def woken() -> bool:
        get(net["address"])
        return any(d[0] == "warm" for d in scaling.decisions)

    until("the alarm wakes the group", woken, timeout=30, every=0.5)
    [alarm] = watch.describe_alarms(AlarmNames=["warm-wake"])["MetricAlarms"]
    assert alarm["StateValue"] == "ALARM" and "greater than or equal to" in alarm["StateReason"]
    [decision] = [d for d in scaling.decisions if d[0] == "warm"]
    assert decision[1:3] == (0, 1) and decision[3] >= 1
    # the controller records its decision, then applies it: wait for the group to hold the woken host
    until("the group holds one host", lambda: len(states(emulator, "warm")[0]) == 1, timeout=10)
    group, pool_now = states(emulator, "warm")
    [woke] = group
    assert woke in (first, warm) and set(pool_now) == {first, warm} - {woke}
    assert asg.describe_auto_scaling_groups(AutoScalingGroupNames=["warm"])["AutoScalingGroups"][0][
        "DesiredCapacity"] == 1
    until("the woken host serves", lambda: get(net["address"])[0] == 200, timeout=20, every=0.2)
    assert states(emulator, "warm")[0] == {woke: "InService"}
    points = watch.get_metric_statistics(Namespace="AWS/ApplicationELB", MetricName="HTTPCode_ELB_503_Count",
                                         Dimensions=[{"Name": "LoadBalancer", "Value": label}],
                                         StartTime=time.time() - 600, EndTime=time.time() + 60, Period=600,
                                         Statistics=["Sum"])["Datapoints"]
    assert points and points[0]["Sum"] >= 1
    until("the alarm is OK again (no 503 since)", lambda: watch.describe_alarms(AlarmNames=["warm-wake"])[
        "MetricAlarms"][0]["StateValue"] == "OK", timeout=20, every=0.5)
    assert [d[1:3] for d in scaling.decisions if d[0] == "warm"] == [(0, 1)]
    served = watch.get_metric_statistics(Namespace="AWS/ApplicationELB", MetricName="RequestCount",
                                         Dimensions=[{"Name": "LoadBalancer", "Value": label}],
                                         StartTime=time.time() - 600, EndTime=time.time() + 60, Period=600,
                                         Statistics=["Sum"])["Datapoints"]
    assert served and served[0]["Sum"] >= 1

    watch.delete_alarms(AlarmNames=["warm-wake"])
    asg.delete_policy(AutoScalingGroupName="warm", PolicyName="warm-wake")
    asg.delete_auto_scaling_group(AutoScalingGroupName="warm", ForceDelete=True)
    until("no machine left", lambda: not any(hosts.alive(i) for i in (first, warm)), timeout=10)
    until("all terminated", lambda: {ec2_state(emulator, i) for i in (first, warm)} == {"terminated"}, timeout=10)


def test_delete_warm_pool_terminates_its_instances_and_a_pool_keeps_a_group_in_use(cloud) -> None:
    emulator, _, hosts = cloud
    asg = boto(emulator, "autoscaling")
    make_group(emulator, "pool-only", None, desired=0)
    until("two pool instances stopped", lambda: list(states(emulator, "pool-only")[1].values()) == [
        "Warmed:Stopped"] * 2, timeout=20, every=0.2)
    ids = list(states(emulator, "pool-only")[1])
    with pytest.raises(Exception) as caught:
        asg.delete_auto_scaling_group(AutoScalingGroupName="pool-only")
    assert caught.value.response["Error"]["Code"] == "ResourceInUse"
    asg.delete_warm_pool(AutoScalingGroupName="pool-only", ForceDelete=True)
    assert states(emulator, "pool-only") == ({}, {})
    until("terminated", lambda: {ec2_state(emulator, i) for i in ids} == {"terminated"}, timeout=10)
    assert set(ids) <= set(hosts.deleted)
    asg.delete_auto_scaling_group(AutoScalingGroupName="pool-only")
    with pytest.raises(Exception) as caught:
        asg.describe_warm_pool(AutoScalingGroupName="pool-only")
    assert caught.value.response["Error"]["Code"] == "ValidationError"


@pytest.mark.parametrize(("kind", "desired", "adjustment", "magnitude", "after"), [
    ("ChangeInCapacity", 0, 1, 0, 1),
    ("ChangeInCapacity", 3, -2, 0, 1),
    ("ExactCapacity", 3, 5, 0, 5),
    ("PercentChangeInCapacity", 8, 50, 0, 12),
    ("PercentChangeInCapacity", 1, 50, 0, 2),           # 0.5 rounds to 1
    ("PercentChangeInCapacity", 3, 50, 0, 4),           # 1.5 rounds down to 1
    ("PercentChangeInCapacity", 3, -50, 0, 2),          # -1.5 rounds up to -1
    ("PercentChangeInCapacity", 10, 10, 3, 13),         # MinAdjustmentMagnitude
])
def test_step_adjustments_compute_the_new_capacity_as_aws_does(kind: str, desired: int, adjustment: int,
                                                               magnitude: int, after: int) -> None:
    from emulators.aws_alarms import _adjusted

    assert _adjusted(desired, kind, adjustment, magnitude) == after
