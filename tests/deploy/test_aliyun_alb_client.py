"""A service's Alibaba Cloud load balancer (cli/deploy/aliyun/alb.py) against the emulated ALB, on loopback.

What a user notices: `ensure` run again (or after a lost answer, or after ngcx died mid-way) leaves one
balancer, one server group and one listener; requests to the balancer reach every registered replica whose
health route answers and no other; a deregistered replica finishes the request it is serving and then
leaves; `delete` leaves nothing (and is fine twice); gc's `tagged` finds what a killed ngcx left.

ngcx's own Ecs and Alb classes call the emulator (tests/emulators/aliyun_ecs.py + aliyun_alb.py) through
the real aliyun-python-sdk-core, as NGCX_ALIYUN_ECS_ENDPOINT makes them. The replicas are the emulator
tests' LoopbackMachines (an HTTP server per instance on its own 127.0.0.N); traffic goes through the
emulator's haproxy data plane. Emulated checks and drains run at a tenth of the configured seconds.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from emulators.aliyun_ecs import EcsEmulator
from emulators.balancer_plane import HAPROXY
from emulators.test_aliyun_alb import LoopbackMachines, get

from ngcx.clouds.aliyun import AliyunError
from ngcx.core.errors import UserError
from ngcx.deploy.balancer import BalancerRef, BalancerSpec
from support import aliyun_sdk_on, missing

AK, SECRET = "LTAI5tAlbClientTest", "alb-client-secret-never-printed"
TAGS = {"ngcx:owner": "owner-1", "ngcx:service": "svc-1"}
SPEC = BalancerSpec("ngcx-svc-1", ("cn-hangzhou-h",), TAGS, target_protocol="HTTP", drain_s=30)


@pytest.fixture
def hosts() -> LoopbackMachines:
    return LoopbackMachines()


@pytest.fixture
def emu(hosts: LoopbackMachines) -> Iterator[EcsEmulator]:
    with EcsEmulator(hosts, access_keys={AK: SECRET}, boot_seconds=0.05, start_seconds=0.05,
                     stop_seconds=0.05) as emulator:
        alb = emulator.alb
        alb.provision_seconds, alb.job_seconds, alb.health_scale, alb.drain_scale = 0.1, 0.1, 0.1, 0.1
        alb.data_plane = False
        yield emulator


@pytest.fixture
def alb(emu: EcsEmulator, isolated_state: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """ngcx's Alb over ngcx's Ecs, its network prepared as a deploy prepares it."""
    from ngcx.clouds.aliyun import Api
    from ngcx.deploy.aliyun.alb import Alb
    from ngcx.deploy.aliyun.ecs import Ecs

    aliyun_sdk_on(monkeypatch, emu.endpoint, AK, SECRET)
    ecs = Ecs(Api("cn-hangzhou", deadline_s=20))
    ecs.prepare_network("10.0.0.0/8")
    return Alb(ecs)


@pytest.fixture
def plane(emu: EcsEmulator) -> EcsEmulator:
    """The emulator with its haproxy data plane on."""
    if shutil.which(HAPROXY) is None:
        missing("haproxy not installed (apt: haproxy; scripts/setup.sh installs it)")
    emu.alb.data_plane = True
    return emu


def until(what: Callable[[], Any], why: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"timed out waiting: {why}"
        time.sleep(0.05)
    return found


def everything(alb: Any) -> tuple[list[str], list[str], list[str]]:
    """Every load balancer, server group and listener id in the region."""
    lbs = [lb["LoadBalancerId"] for lb in alb.api.alb("ListLoadBalancers")["LoadBalancers"]]
    groups = [g["ServerGroupId"] for g in alb.api.alb("ListServerGroups")["ServerGroups"]]
    listeners = [li["ListenerId"] for li in alb.api.alb("ListListeners")["Listeners"]]
    return lbs, groups, listeners


def launch(alb: Any, emu: EcsEmulator, count: int) -> list[str]:
    ecs = alb.ecs
    ids = ecs.api.ecs("RunInstances", {"ImageId": "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
                                       "InstanceType": "ecs.gn7i-c8g1.2xlarge", "ZoneId": "cn-hangzhou-h",
                                       "VSwitchId": ecs.vswitches["cn-hangzhou-h"], "Amount": count,
                                       "SecurityGroupId": ecs.security_group}, write=True)
    ids = ids["InstanceIdSets"]["InstanceIdSet"]
    until(lambda: all(s.state == "running" for s in ecs.describe(ids).values()), "instances running")
    return ids


def serving(alb: Any, emu: EcsEmulator, hosts: LoopbackMachines, count: int) -> tuple[BalancerRef, list[str]]:
    """A balancer with `count` registered replicas, all of them healthy."""
    ref, ids = alb.ensure(SPEC), launch(alb, emu, count)
    for instance_id in ids:
        alb.register(ref, instance_id, hosts.addresses[instance_id][1])
    until(lambda: alb.health(ref) == dict.fromkeys(ids, "healthy"), "every replica healthy")
    return ref, ids


# --- ensure: one of each, however often and however interrupted --------------------------------------

def test_ensure_twice_makes_one_balancer_group_and_listener(alb: Any, emu: EcsEmulator,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    spec = replace(SPEC, target_protocol="HTTPS")          # the default: the hosts' own TLS
    ref = alb.ensure(spec)
    assert alb.ensure(spec) == ref and everything(alb) == ([ref.balancer_id], [ref.group_id], [ref.listener_id])
    assert ref.dns_name == f"{ref.balancer_id}.cn-hangzhou.alb.aliyuncs.com"
    assert "no certificate for ngcx-svc-1" in capsys.readouterr().err
    lb = alb.api.alb("GetLoadBalancerAttribute", {"LoadBalancerId": ref.balancer_id})
    assert lb["AddressType"] == "Internet" and len(lb["ZoneMappings"]) == 2
    assert lb["ZoneMappings"][0]["ZoneId"] == "cn-hangzhou-h" and lb["Tags"] == [
        {"Key": k, "Value": v} for k, v in sorted(TAGS.items())]
    group = alb.api.alb("ListServerGroups", {"ServerGroupIds.1": ref.group_id})["ServerGroups"][0]
    check = group["HealthCheckConfig"]
    assert (group["Protocol"], check["HealthCheckProtocol"], check["HealthCheckPath"], check["HealthCheckCodes"]) == (
        "HTTPS", "HTTPS", "/v2/health/ready", ["http_2xx"])
    assert group["ConnectionDrainConfig"] == {"ConnectionDrainEnabled": True, "ConnectionDrainTimeout": 30}
    listener = alb.api.alb("GetListenerAttribute", {"ListenerId": ref.listener_id})
    assert (listener["ListenerProtocol"], listener["ListenerPort"]) == ("HTTP", 80)   # no certificate: HTTP on 80
    assert emu.performed("CreateLoadBalancer") == emu.performed("CreateListener") == 1
    rules = alb.api.ecs("DescribeSecurityGroupAttribute", {"SecurityGroupId": alb.ecs.security_group})
    admitted = [r["SourceCidrIp"] for r in rules["Permissions"]["Permission"] if r["PortRange"] == "8000/8000"]
    assert admitted == ["10.0.0.0/8", "172.16.0.0/20", "172.17.0.0/20"]     # allow_from, then the ALB's vSwitches


def test_a_certificate_makes_an_https_listener_on_the_spec_port(alb: Any) -> None:
    ref = alb.ensure(replace(SPEC, certificate_id="12345-cn-hangzhou"))
    listener = alb.api.alb("GetListenerAttribute", {"ListenerId": ref.listener_id})
    assert (listener["ListenerProtocol"], listener["ListenerPort"]) == ("HTTPS", 443)
    assert listener["Certificates"] == [{"CertificateId": "12345-cn-hangzhou"}]


def test_a_lost_answer_or_a_killed_ngcx_leaves_one_balancer(alb: Any, emu: EcsEmulator) -> None:
    emu.fail_next("CreateLoadBalancer", "ServiceUnavailable", 503, after_effect=True)   # created, answer lost
    ref = alb.ensure(SPEC)
    assert emu.performed("CreateLoadBalancer") == 1 and everything(alb)[0] == [ref.balancer_id]
    other = replace(SPEC, name="ngcx-svc-2", tags={**TAGS, "ngcx:service": "svc-2"})
    emu.fail_next("CreateServerGroup", "UnknownCode", 400, after_effect=True)   # created; ngcx dies on the answer
    with pytest.raises(AliyunError) as died:
        alb.ensure(other)
    assert SECRET not in str(died.value) and "CreateServerGroup" in str(died.value)
    second = alb.ensure(other)
    lbs, groups, listeners = everything(alb)
    assert sorted(lbs) == sorted([ref.balancer_id, second.balancer_id]) and len(groups) == len(listeners) == 2
    assert emu.performed("CreateLoadBalancer") == emu.performed("CreateServerGroup") == 2


def test_throttling_is_waited_out_and_a_missing_permission_names_the_alb_action(alb: Any, emu: EcsEmulator) -> None:
    emu.fail_next("ListLoadBalancers", "Throttling.User", 400)
    emu.fail_next("CreateLoadBalancer", "Throttling", 400)
    ref = alb.ensure(SPEC)
    assert everything(alb)[0] == [ref.balancer_id] and emu.performed("CreateLoadBalancer") == 1
    emu.fail_next("DeleteListener", "Forbidden.RAM", 403)
    with pytest.raises(UserError) as denied:
        alb.delete(ref)
    assert "may not call it (Forbidden.RAM)" in str(denied.value) and "alb:DeleteListener" in denied.value.hint
    assert SECRET not in str(denied.value) + denied.value.hint


# --- traffic, health and draining ----------------------------------------------------------------------

def test_requests_reach_every_healthy_replica_and_none_that_fails_its_health_route(
        alb: Any, plane: EcsEmulator, hosts: LoopbackMachines) -> None:
    ref, ids = serving(alb, plane, hosts, 3)
    address = plane.balancer_address(ref.dns_name, 80)
    assert {body for status, body in (get(address) for _ in range(30)) if status == 200} == set(ids)
    sick = ids[0]
    hosts.machines[sick].ready = False
    until(lambda: alb.health(ref)[sick] == "unhealthy", "the failing replica unhealthy")
    assert alb.health(ref) == {**dict.fromkeys(ids, "healthy"), sick: "unhealthy"}
    assert {get(address) for _ in range(20)} <= {(200, i) for i in ids[1:]}


def test_a_deregistered_replica_finishes_its_request_drains_and_leaves(
        alb: Any, plane: EcsEmulator, hosts: LoopbackMachines) -> None:
    ref, ids = serving(alb, plane, hosts, 2)
    address = plane.balancer_address(ref.dns_name, 80)
    slow: list[tuple[int, str]] = []
    request = threading.Thread(target=lambda: slow.append(get(address, "/slow")))
    request.start()
    busy = until(lambda: [i for i in ids if hosts.machines[i].inflight], "the slow request on a replica")[0]
    other = next(i for i in ids if i != busy)
    alb.deregister(ref, busy, hosts.addresses[busy][1])
    alb.deregister(ref, busy, hosts.addresses[busy][1])     # again: already on its way out
    assert alb.health(ref) == {busy: "draining", other: "healthy"}
    until(lambda: {get(address) for _ in range(10)} == {(200, other)}, "new requests to the other replica only")
    request.join(timeout=10)
    assert slow == [(200, busy)]
    until(lambda: alb.health(ref) == {other: "healthy"}, "the drained replica gone (3 s emulated drain)")
    alb.deregister(ref, busy, hosts.addresses[busy][1])     # gone: done


def test_register_is_idempotent_and_waits_out_a_removal(alb: Any, emu: EcsEmulator, hosts: LoopbackMachines) -> None:
    emu.alb.job_seconds = 0.3                               # each change holds the group (Conflict.Lock)
    ref, (first, second) = alb.ensure(replace(SPEC, drain_s=5)), launch(alb, emu, 2)
    for instance_id in (first, second, first):
        alb.register(ref, instance_id, 8000)
    servers = alb.api.alb("ListServerGroupServers", {"ServerGroupId": ref.group_id})["Servers"]
    assert sorted(s["ServerId"] for s in servers) == sorted([first, second])
    alb.deregister(ref, first, 8000)
    alb.register(ref, first, 8000)                          # back while Removing: added once it is gone
    assert alb.health(ref)[first] == "initial" and emu.performed("AddServersToServerGroup") == 3


# --- delete and gc -------------------------------------------------------------------------------------

def test_delete_leaves_nothing_and_a_new_ensure_makes_a_new_balancer(alb: Any, emu: EcsEmulator) -> None:
    ref = alb.ensure(SPEC)
    assert alb.tagged(TAGS) == [ref] and alb.tagged({"ngcx:owner": "owner-1"}) == [ref]
    assert alb.tagged({"ngcx:owner": "someone-else"}) == []
    alb.delete(ref)
    assert everything(alb) == ([], [], []) and alb.tagged(TAGS) == []
    alb.delete(ref)                                         # already gone: done
    again = alb.ensure(SPEC)                                # the same name's ClientTokens answered the old ids
    assert again.balancer_id != ref.balancer_id and everything(alb)[0] == [again.balancer_id]
    tokens = [params["ClientToken"] for action, params in emu.calls if action == "CreateLoadBalancer"]
    assert len(set(tokens)) == 2 and tokens[-1].endswith("-1") and emu.performed("CreateLoadBalancer") == 2


def test_gc_finds_and_deletes_what_a_killed_ngcx_left(alb: Any, emu: EcsEmulator) -> None:
    emu.fail_next("CreateListener", "IllegalParam.ListenerPort", 400)      # ngcx stops before the listener
    with pytest.raises(AliyunError):
        alb.ensure(SPEC)
    lbs, groups, _ = everything(alb)
    assert alb.tagged({"ngcx:owner": "owner-1"}) == [BalancerRef(lbs[0], groups[0], "", f"{lbs[0]}.cn-hangzhou"
                                                                                         ".alb.aliyuncs.com")]
    alone = alb.api.alb("CreateServerGroup", {"ServerGroupName": "ngcx-svc-9", "VpcId": alb._vpc(),
                                              "HealthCheckConfig.HealthCheckEnabled": False,
                                              "Tag.1.Key": "ngcx:owner", "Tag.1.Value": "owner-1"})["ServerGroupId"]
    found = alb.tagged({"ngcx:owner": "owner-1"})
    assert BalancerRef("", alone, "", "") in found and len(found) == 2
    for ref in found:
        alb.delete(ref)
    assert everything(alb) == ([], [], [])
