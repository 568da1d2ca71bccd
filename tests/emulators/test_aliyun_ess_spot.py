"""Spot capacity of an Alibaba Cloud scaling group: ngcx's client (cli/deploy/aliyun/ess.py, GroupSpec spot /
on_demand_base / instance_types, Member.market) against the emulated ESS spot (aliyun_ess_spot.py) and the
metadata service's reclaim notice (aliyun_metadata.py), through the real aliyun-python-sdk-core.

What a user notices: a group of 3 with a 1-host on-demand floor runs 1 on-demand and 2 spot hosts
(COST_OPTIMIZED, SpotAsPriceGo, the types in their order); when the region has no spot stock a new host is
on-demand instead (compensation), not missing. A reclaimed spot host: its metadata service answers the
release time (and no other host's does); under constant load through the ALB the group launches a
replacement, takes the doomed host out of the server group with its drain before ECS releases it, and not
one request fails.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from typing import Any

import pytest

from emulators import test_aliyun_ess_refresh
from emulators.aliyun_ecs import EcsEmulator
from emulators.test_aliyun_ess import balancer, call, ess_cloud, servers, until
from emulators.test_aliyun_ess_refresh import serving, spec_for
from emulators.test_aws_autoscaling import ProcessHosts
from emulators.traffic import PacedLoad, spread
from ngcx.deploy.aliyun.ess import ScalingGroups

A10, T4 = "ecs.gn7i-c8g1.2xlarge", "ecs.gn6i-c4g1.xlarge"
LOAD_RATE = 20.0                # requests per second through the ALB, on one thread
NOTICE_S = 6.0                  # the reclaim notice (ECS gives 5 minutes; the drain here is 1 s)


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[EcsEmulator, ProcessHosts]]:
    with ess_cloud(ProcessHosts(first=160)) as made:
        yield made


groups = test_aliyun_ess_refresh.groups      # ScalingGroups on ngcx's Api; every tagged group gone after


@pytest.fixture(scope="module")
def net(cloud) -> dict[str, Any]:
    return balancer(cloud[0], "ess-spot")


def markets(groups: ScalingGroups, ref: Any) -> list[str]:
    return sorted(m.market for m in groups.instances(ref) if m.state == "InService")


def termination_time(emu: EcsEmulator, ip: str) -> tuple[int, str]:
    """GET instance/spot/termination-time from the host's own address, as the host would."""
    host, port = emu.metadata_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(ip, 0))
    try:
        conn.request("GET", "/latest/meta-data/instance/spot/termination-time")
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def test_a_spot_group_keeps_its_on_demand_floor_and_compensates_when_spot_runs_out(cloud, net, groups) -> None:
    emu, _ = cloud
    spec = spec_for(net, "ess-spot-mix", min_size=3, max_size=4, desired=3, spot=True, on_demand_base=1,
                    instance_types=(A10, T4))
    ref = groups.ensure_group(spec)
    until(lambda: len(serving(groups, ref)) == 3, "three serving", timeout=30)
    assert markets(groups, ref) == ["on-demand", "spot", "spot"]
    [group] = call(emu, "DescribeScalingGroups", ScalingGroupName=ref.name)["ScalingGroups"]["ScalingGroup"]
    assert (group["MultiAZPolicy"], group["OnDemandBaseCapacity"], group["OnDemandPercentageAboveBaseCapacity"],
            group["SpotInstanceRemedy"], group["CompensateWithOnDemand"]) == ("COST_OPTIMIZED", 1, 0, True, True)
    [config] = call(emu, "DescribeScalingConfigurations", ScalingGroupId=ref.group_id)["ScalingConfigurations"][
        "ScalingConfiguration"]
    assert (config["SpotStrategy"], config["InstanceTypes"]["InstanceType"]) == ("SpotAsPriceGo", [A10, T4])
    assert groups.ensure_group(spec) == ref                          # the same settings: nothing new made
    emu.ess.spot_market = False
    try:
        groups.set_size(ref, 3, 4, 4)
        until(lambda: len(serving(groups, ref)) == 4, "a fourth host serving", timeout=30)
    finally:
        emu.ess.spot_market = True
    assert markets(groups, ref) == ["on-demand", "on-demand", "spot", "spot"]     # compensated, not missing


def test_a_reclaimed_spot_host_is_drained_and_replaced_with_zero_failed_requests(cloud, net, groups) -> None:
    emu, hosts = cloud
    spec = spec_for(net, "ess-spot-reclaim", min_size=2, max_size=2, desired=2, spot=True, on_demand_base=1)
    ref = groups.ensure_group(spec)
    until(lambda: len(serving(groups, ref)) == 2, "two serving", timeout=30)
    [victim] = [m.instance_id for m in groups.instances(ref) if m.market == "spot"]
    [kept] = [m.instance_id for m in groups.instances(ref) if m.market == "on-demand"]
    assert termination_time(emu, hosts.machines[victim][0])[0] == 404           # nothing announced yet
    until(lambda: len(spread(net["address"], 16)) == 2, "both answer through the ALB")
    load = PacedLoad(net["address"], rate=LOAD_RATE, limit_s=60, limit=1200)
    try:
        started = time.monotonic()
        when = emu.ess.reclaim(victim, NOTICE_S)
        assert termination_time(emu, hosts.machines[victim][0]) == (200, when)
        assert termination_time(emu, hosts.machines[kept][0])[0] == 404
        until(lambda: victim not in servers(emu, net["group"]), "the doomed host left the server group", timeout=10)
        drained_s = time.monotonic() - started
        assert drained_s < NOTICE_S and hosts.alive(victim)                    # out before ECS releases it
        until(lambda: not hosts.alive(victim), "ECS released the reclaimed host", timeout=NOTICE_S + 5)
        until(lambda: len(s := serving(groups, ref)) == 2 and victim not in s and s, "two serving again")
        time.sleep(max(0.0, started + NOTICE_S + 1 - time.monotonic()))     # the load goes on past the notice
    finally:
        load.stop()
    answered = sum(load.seen.values())
    print(f"\nreclaim: the doomed host drained {drained_s:.1f} s after the notice ({NOTICE_S:.0f} s); "
          f"{answered} answered at {LOAD_RATE:.0f} req/s, {len(load.failures)} failed")
    assert load.failures == [] and answered >= LOAD_RATE * NOTICE_S / 2
    assert markets(groups, ref) == ["on-demand", "spot"]                      # the replacement is spot again
