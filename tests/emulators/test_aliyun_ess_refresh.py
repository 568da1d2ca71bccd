"""Rolling an Alibaba Cloud scaling group to a new version: ngcx's client (cli/deploy/aliyun/ess.py start_refresh /
refresh_state / cancel_refresh, ess_refresh.py) against the emulated ESS instance refresh (aliyun_ess_refresh.py),
through the real aliyun-python-sdk-core.

What a user notices: under constant load through the ALB, a group of 3 hosts moves from v1 to v2 with zero
failed requests; never fewer than 3 hosts serve (each new host is in the server group before an old one
leaves it); it goes in batches (progress between 0 and 100 %); at the end every host is new and answers v2,
and the group launches v2 from then on. Asking again while it runs is the same refresh; a cancel stops it and
the group keeps launching v1; a parameter the ESS model does not know is refused as the real gateway would.

The hosts are ProcessHosts (a process per instance, running the user-data: a replica answering "<ip> <tag>");
time in the balancer's drains and the group runs at TIME_SCALE (test_aliyun_ess.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from emulators.aliyun_ecs import EcsEmulator
from emulators.test_aliyun_ess import AK, SECRET, balancer, call, ess_cloud, refused, until
from emulators.test_aws_autoscaling import ProcessHosts, replica_user_data
from emulators.traffic import PacedLoad, spread
from ngcx.deploy.aliyun.ess import GroupRef, GroupSpec, ScalingGroups
from ngcx.deploy.vm_groups import RefreshState
from support import aliyun_sdk_on

OWNER = {"ngcx:owner": "ess-refresh", "ngcx:service": "svc1"}
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
A10 = "ecs.gn7i-c8g1.2xlarge"
LOAD_RATE = 20.0                # requests per second through the ALB, on one thread
FINISHED = ("done", "failed", "cancelled")


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    with ess_cloud(ProcessHosts(first=120)) as made:
        yield made


@pytest.fixture(scope="module")
def net(cloud) -> dict[str, Any]:
    return balancer(cloud[0], "ess-refresh")                # drains 20 s: 1 s here


@pytest.fixture
def groups(cloud, monkeypatch) -> Iterator[ScalingGroups]:
    from ngcx.clouds.aliyun import Api

    aliyun_sdk_on(monkeypatch, cloud[0].endpoint, AK, SECRET)
    made = ScalingGroups(Api("cn-hangzhou", deadline_s=20))
    yield made
    for ref in made.tagged({}):
        made.delete(ref)


def spec_for(net: dict[str, Any], name: str, tag: str = "v1", **changes: Any) -> GroupSpec:
    """A group behind the module's ALB whose hosts answer `<ip> <tag>`; a 30 s drain hook (1.5 s here)."""
    settings: dict[str, Any] = {
        "name": name, "image_id": IMAGE, "user_data": replica_user_data(tag), "instance_type": A10,
        "vswitches": tuple(net["switches"]), "server_group_id": net["group"], "port": 8000, "min_size": 0,
        "max_size": 3, "desired": 0, "tags": OWNER, "drain_wait_s": 30}
    return GroupSpec(**(settings | changes))


def serving(groups: ScalingGroups, ref: GroupRef) -> list[str]:
    return sorted(m.instance_id for m in groups.instances(ref) if m.state == "InService")


def active_config(emu: EcsEmulator, ref: GroupRef) -> str:
    [group] = call(emu, "DescribeScalingGroups", ScalingGroupName=ref.name)["ScalingGroups"]["ScalingGroup"]
    return str(group["ActiveScalingConfigurationId"])


def test_a_refresh_replaces_every_host_new_before_old_with_zero_failed_requests(cloud, net, groups) -> None:
    emu, _ = cloud
    spec = spec_for(net, "ess-roll", min_size=3, desired=3)
    ref = groups.ensure_group(spec)
    old = until(lambda: len(s := serving(groups, ref)) == 3 and s, "three serving", timeout=30)
    until(lambda: len(spread(net["address"], 24)) == 3, "all three answer through the ALB")
    v2 = dataclasses.replace(spec, user_data=replica_user_data("v2"))
    load = PacedLoad(net["address"], rate=LOAD_RATE, limit_s=120, limit=2400)
    states: list[RefreshState] = []
    least = 3
    started = time.monotonic()
    try:
        refresh = groups.start_refresh(ref, v2)
        assert groups.start_refresh(ref, v2) == refresh             # asked again while it runs: the same task

        def finished() -> bool:
            nonlocal least
            least = min(least, len(serving(groups, ref)))
            states.append(groups.refresh_state(ref, refresh))
            return states[-1].status in FINISHED

        until(finished, "the refresh finishes", timeout=90)
        rolled_s = time.monotonic() - started
        until(lambda: {body.split()[1] for body in spread(net["address"], 12)} == {"v2"}, "only v2 answers")
    finally:
        load.stop()
    answered = sum(load.seen.values())
    print(f"\nrolled 3 hosts in {rolled_s:.1f} s under {LOAD_RATE:.0f} req/s: {answered} answered, "
          f"{len(load.failures)} failed")
    assert states[-1] == RefreshState("done", 100, "")
    assert load.failures == [] and answered >= LOAD_RATE * rolled_s / 2      # the load ran throughout
    assert {body.split()[1] for body in load.seen} == {"v1", "v2"}
    assert least >= 3                                               # MinHealthyPercentage 100: new before old
    assert any(s.status == "running" and 0 < s.percent < 100 for s in states)      # in batches
    new = serving(groups, ref)
    assert len(new) == 3 and not set(new) & set(old)
    configs = {m["ScalingConfigurationId"] for m in call(emu, "DescribeScalingInstances", ScalingGroupId=ref.group_id)[
        "ScalingInstances"]["ScalingInstance"] if m["InstanceId"] in new}
    assert configs == {active_config(emu, ref)} and configs != {ref.config_id}    # the group launches v2 now


def test_a_cancelled_refresh_stops_and_the_group_keeps_its_version(cloud, net, groups) -> None:
    emu, _ = cloud
    spec = spec_for(net, "ess-cancel", max_size=1, min_size=1, desired=1)
    ref = groups.ensure_group(spec)
    until(lambda: len(serving(groups, ref)) == 1, "one serving", timeout=30)
    assert refused(emu, "StartInstanceRefresh", ScalingGroupId=ref.group_id, BatchSize=1) == "InvalidParameter"
    assert refused(emu, "StartInstanceRefresh", ScalingGroupId=ref.group_id,
                   MaxHealthyPercentage=250) == "InvalidParameter"
    refresh = groups.start_refresh(ref, dataclasses.replace(spec, user_data=replica_user_data("v2")))
    groups.cancel_refresh(ref, refresh)
    state = until(lambda: (s := groups.refresh_state(ref, refresh)).status in FINISHED and s, "cancelled")
    assert state.status == "cancelled"
    groups.cancel_refresh(ref, refresh)                             # a finished task: nothing to do, no error
    assert active_config(emu, ref) == ref.config_id
    assert groups.refresh_state(ref, "ir-none").status == "failed"
