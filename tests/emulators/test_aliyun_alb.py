"""ALB (2020-06-16) in the Alibaba Cloud emulator, driven through the real aliyun-python-sdk-core CommonRequest
as ngcx sends it (product "Alb"; the domain is the emulator instead of alb.cn-hangzhou.aliyuncs.com, as
NGCX_ALIYUN_ECS_ENDPOINT makes it): ClientToken, signatures, faults, the asynchronous lifecycles, errors a
user meets, and real traffic through the haproxy data plane to emulated hosts.

The machines are LoopbackMachines: each ECS instance is a small HTTP server on its own 127.0.0.N (a distinct
host:port for haproxy), answering its instance id, a health route the test can fail, and a slow route for
connection draining. Stopping an instance stops its server, as a stopped VM stops answering.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import CommonRequest

from emulators.aliyun_ecs import EcsEmulator
from emulators.balancer_plane import HAPROXY
from emulators.hosts_api import CommandResult
from emulators.traffic import get
from support import missing

AK, SECRET = "test-ak", "test-secret"
ALB, ECS = "2020-06-16", "2014-05-26"
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
A10 = "ecs.gn7i-c8g1.2xlarge"
READY = "/v2/health/ready"
OCTETS = itertools.count(20)


class Machine(ThreadingHTTPServer):
    """One emulated host: GET / answers its instance id, READY answers 200 or 503, /slow takes 1.5 s."""

    daemon_threads = True

    def __init__(self, instance_id: str, ip: str, port: int = 0) -> None:
        super().__init__((ip, port), _Handler)
        self.instance_id, self.ready, self.inflight, self.served = instance_id, True, 0, 0
        self.counter = threading.Lock()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: Machine

    def do_GET(self) -> None:
        machine = self.server
        if self.path == READY:
            self._answer(200 if machine.ready else 503, b"ready" if machine.ready else b"not ready")
            return
        with machine.counter:
            machine.inflight += 1
        if self.path == "/slow":
            time.sleep(1.5)
        with machine.counter:
            machine.inflight -= 1
            machine.served += 1
        self._answer(200, machine.instance_id.encode())

    def _answer(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass    # haproxy gave up on a health check (its timeout): nobody to answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class LoopbackMachines:
    """HostBackend whose machines are Machine servers, each on its own loopback address."""

    def __init__(self) -> None:
        self.machines: dict[str, Machine] = {}
        self.addresses: dict[str, tuple[str, int]] = {}

    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        machine = Machine(instance_id, f"127.0.0.{next(OCTETS)}")
        self.machines[instance_id] = machine
        self.addresses[instance_id] = machine.server_address[:2]
        return self.addresses[instance_id][0]

    def start(self, instance_id: str) -> str:
        ip, port = self.addresses[instance_id]
        self.machines[instance_id] = Machine(instance_id, ip, port)
        return ip

    def stop(self, instance_id: str) -> None:
        machine = self.machines.pop(instance_id)
        machine.shutdown()
        machine.server_close()

    def delete(self, instance_id: str) -> None:
        if instance_id in self.machines:
            self.stop(instance_id)

    def snapshot(self, instance_id: str, image_id: str) -> None: ...
    def delete_image(self, image_id: str) -> None: ...
    def console_output(self, instance_id: str) -> str:
        return ""

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        return CommandResult(0, "")

    def close(self) -> None:
        for instance_id in list(self.machines):
            self.stop(instance_id)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends even 127.0.0.1 through HTTP(S)_PROXY (it ignores NO_PROXY)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hosts() -> LoopbackMachines:
    return LoopbackMachines()


@pytest.fixture
def emu(hosts: LoopbackMachines) -> Iterator[EcsEmulator]:
    """Short transitions; drains at a fifth of the configured seconds; no haproxy unless a test turns
    data_plane on (serving() does, with health checks at half the configured seconds)."""
    with EcsEmulator(hosts, boot_seconds=0.05, start_seconds=0.05, stop_seconds=0.05) as emulator:
        alb = emulator.alb
        alb.provision_seconds, alb.job_seconds, alb.health_scale, alb.drain_scale = 0.1, 0.1, 0.2, 0.2
        alb.data_plane = False
        yield emulator


def sdk(emu: EcsEmulator, secret: str = SECRET, **kwargs: Any) -> AcsClient:
    return AcsClient(AK, secret, "cn-hangzhou", port=emu.port, **kwargs)


def api(client: AcsClient, action: str, version: str = ALB, **params: Any) -> dict[str, Any]:
    product = "Alb" if version == ALB else "Ecs"
    request = CommonRequest(domain="127.0.0.1", version=version, action_name=action, product=product)
    request.set_method("POST")
    for key, value in params.items():
        request.add_query_param(key.replace("__", "."), value)
    return json.loads(client.do_action_with_exception(request))


def refused(client: AcsClient, action: str, **params: Any) -> tuple[int, str]:
    with pytest.raises(ServerException) as info:
        api(client, action, **params)
    return info.value.get_http_status(), info.value.get_error_code()


def until(what: Callable[[], Any], why: str, timeout: float = 8.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"timed out waiting: {why}"
        time.sleep(0.05)
    return found


def zones(emu: EcsEmulator, count: int = 2) -> dict[str, str]:
    vswitches = api(sdk(emu), "DescribeVSwitches", ECS)["VSwitches"]["VSwitch"][:count]
    params = {}
    for n, vsw in enumerate(vswitches, 1):
        params[f"ZoneMappings__{n}__ZoneId"], params[f"ZoneMappings__{n}__VSwitchId"] = vsw["ZoneId"], vsw["VSwitchId"]
    return params


def vpc(emu: EcsEmulator) -> str:
    return api(sdk(emu), "DescribeVpcs", ECS)["Vpcs"]["Vpc"][0]["VpcId"]


def create_lb(emu: EcsEmulator, client: AcsClient | None = None, **extra: Any) -> str:
    params = {"VpcId": vpc(emu), "AddressType": "Internet", "LoadBalancerName": "ngcx-svc",
              "LoadBalancerEdition": "Standard", "LoadBalancerBillingConfig__PayType": "PostPay", **zones(emu), **extra}
    return api(client or sdk(emu), "CreateLoadBalancer", **params)["LoadBalancerId"]


def active(client: AcsClient, lb_id: str) -> dict[str, Any]:
    return until(lambda: (a := api(client, "GetLoadBalancerAttribute", LoadBalancerId=lb_id))["LoadBalancerStatus"]
                 == "Active" and a, f"{lb_id} Active")


def create_group(emu: EcsEmulator, client: AcsClient, **extra: Any) -> str:
    params = {"ServerGroupName": "ngcx-replicas", "ServerGroupType": "Instance", "VpcId": vpc(emu), "Protocol": "HTTP",
              "HealthCheckConfig__HealthCheckEnabled": True, "HealthCheckConfig__HealthCheckPath": READY,
              "HealthCheckConfig__HealthCheckProtocol": "HTTP", "HealthCheckConfig__HealthCheckInterval": 1,
              "HealthCheckConfig__HealthCheckTimeout": 1, "HealthCheckConfig__HealthyThreshold": 2,
              "HealthCheckConfig__UnhealthyThreshold": 2, "HealthCheckConfig__HealthCheckCodes__1": "http_2xx", **extra}
    return api(client, "CreateServerGroup", **params)["ServerGroupId"]


def create_listener(client: AcsClient, lb_id: str, group_id: str, port: int = 80) -> str:
    return api(client, "CreateListener", LoadBalancerId=lb_id, ListenerProtocol="HTTP", ListenerPort=port,
               DefaultActions__1__Type="ForwardGroup",
               DefaultActions__1__ForwardGroupConfig__ServerGroupTuples__1__ServerGroupId=group_id)["ListenerId"]


def launch(emu: EcsEmulator, count: int) -> list[str]:
    client = sdk(emu)
    ids = api(client, "RunInstances", ECS, ImageId=IMAGE, InstanceType=A10, Amount=count)["InstanceIdSets"]
    ids = ids["InstanceIdSet"]
    until(lambda: all(i["status"] == "Running" for i in emu.instances() if i["id"] in ids), "instances Running")
    return ids


def servers_param(hosts: LoopbackMachines, ids: list[str], **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for n, instance_id in enumerate(ids, 1):
        params[f"Servers__{n}__ServerId"], params[f"Servers__{n}__ServerType"] = instance_id, "Ecs"
        params[f"Servers__{n}__Port"] = hosts.addresses[instance_id][1]
        params.update({f"Servers__{n}__{k}": v for k, v in extra.items()})
    return params


def statuses(client: AcsClient, group_id: str) -> dict[str, str]:
    found = api(client, "ListServerGroupServers", ServerGroupId=group_id)["Servers"]
    return {s["ServerId"]: s["Status"] for s in found}


def abnormal(client: AcsClient, listener_id: str) -> dict[str, dict[str, Any]]:
    answer = api(client, "GetListenerHealthStatus", ListenerId=listener_id)["ListenerHealthStatus"]
    return {s["ServerId"]: s for s in answer[0]["ServerGroupInfos"][0]["NonNormalServers"]}




# --- control plane -----------------------------------------------------------------------------

def test_create_is_idempotent_by_client_token_and_the_balancer_becomes_active(emu: EcsEmulator) -> None:
    client, emu.alb.provision_seconds = sdk(emu), 0.5
    first = create_lb(emu, ClientToken="svc-1-lb")
    assert api(client, "GetLoadBalancerAttribute", LoadBalancerId=first)["LoadBalancerStatus"] == "Provisioning"
    assert create_lb(emu, ClientToken="svc-1-lb") == first and emu.performed("CreateLoadBalancer") == 1
    assert refused(client, "CreateLoadBalancer", VpcId=vpc(emu), AddressType="Intranet", ClientToken="svc-1-lb",
                   LoadBalancerName="ngcx-svc", LoadBalancerEdition="Standard",
                   LoadBalancerBillingConfig__PayType="PostPay", **zones(emu)) == (400, "IdempotentParameterMismatch")
    attribute = active(client, first)
    assert attribute["DNSName"] == f"{first}.cn-hangzhou.alb.aliyuncs.com" and attribute["AddressType"] == "Internet"
    assert len(attribute["ZoneMappings"]) == 2 and attribute["LoadBalancerBillingConfig"]["PayType"] == "PostPay"
    assert refused(client, "CreateLoadBalancer", VpcId=vpc(emu), AddressType="Internet", LoadBalancerName="one",
                   LoadBalancerEdition="Standard", LoadBalancerBillingConfig__PayType="PostPay",
                   **zones(emu, 1)) == (400, "IllegalParam.ZoneMappings")
    assert refused(client, "GetLoadBalancerAttribute", LoadBalancerId="alb-nope") == (
        404, "ResourceNotFound.LoadBalancer")


def test_a_wrong_signature_is_refused_and_creates_nothing(emu: EcsEmulator) -> None:
    with pytest.raises(ServerException) as info:
        create_lb(emu, sdk(emu, secret="wrong-secret"))
    # The gateway's code (the SDK rewrites it to InvalidAccessKeySecret only for typed requests).
    assert (info.value.get_http_status(), info.value.get_error_code()) == (400, "SignatureDoesNotMatch")
    assert api(sdk(emu), "ListLoadBalancers")["TotalCount"] == 0
    assert emu.calls[-2][0] == "CreateLoadBalancer" and "Signature" not in emu.calls[-2][1]


def test_in_use_and_missing_resources_answer_albs_errors(emu: EcsEmulator) -> None:
    client, emu.alb.provision_seconds = sdk(emu), 1.0      # long enough to be seen Provisioning on a busy machine
    lb_id, group_id = create_lb(emu), create_group(emu, client)
    assert refused(client, "CreateListener", LoadBalancerId=lb_id, ListenerProtocol="HTTP", ListenerPort=80,
                   DefaultActions__1__Type="ForwardGroup",
                   DefaultActions__1__ForwardGroupConfig__ServerGroupTuples__1__ServerGroupId=group_id) == (
        400, "IncorrectStatus.LoadBalancer")
    active(client, lb_id)
    listener_id = create_listener(client, lb_id, group_id)
    assert refused(client, "CreateListener", LoadBalancerId=lb_id, ListenerProtocol="HTTP", ListenerPort=80,
                   DefaultActions__1__Type="ForwardGroup",
                   DefaultActions__1__ForwardGroupConfig__ServerGroupTuples__1__ServerGroupId=group_id) == (
        400, "ResourceAlreadyExist.Listener")
    assert refused(client, "CreateListener", LoadBalancerId=lb_id, ListenerProtocol="HTTPS", ListenerPort=443,
                   DefaultActions__1__Type="ForwardGroup",
                   DefaultActions__1__ForwardGroupConfig__ServerGroupTuples__1__ServerGroupId="sgp-nope",
                   Certificates__1__CertificateId="123-cn-hangzhou") == (404, "ResourceNotFound.ServerGroup")
    until(lambda: api(client, "ListListeners", LoadBalancerIds__1=lb_id)["Listeners"][0]["ListenerStatus"]
          == "Running", "listener Running")
    assert refused(client, "DeleteServerGroup", ServerGroupId=group_id) == (400, "ResourceInUse.ServerGroup")
    assert api(client, "DeleteLoadBalancer", LoadBalancerId=lb_id)["JobId"]    # its listeners go with it
    assert refused(client, "GetListenerAttribute", ListenerId=listener_id) == (404, "ResourceNotFound.Listener")
    assert api(client, "DeleteServerGroup", ServerGroupId=group_id)["JobId"]
    assert refused(client, "DeleteLoadBalancer", LoadBalancerId=lb_id) == (404, "ResourceNotFound.LoadBalancer")


def test_tags_filter_load_balancers_and_list_tag_resources(emu: EcsEmulator) -> None:
    client = sdk(emu)
    mine = [create_lb(emu, Tag__1__Key="ngcx:service", Tag__1__Value=f"svc-{n}") for n in range(3)]
    other = create_lb(emu, Tag__1__Key="team", Tag__1__Value="x")
    tagged = api(client, "ListLoadBalancers", Tag__1__Key="ngcx:service")
    assert tagged["TotalCount"] == 3 and {lb["LoadBalancerId"] for lb in tagged["LoadBalancers"]} == set(mine)
    one = api(client, "ListLoadBalancers", Tag__1__Key="ngcx:service", Tag__1__Value="svc-1")["LoadBalancers"]
    assert [lb["LoadBalancerId"] for lb in one] == [mine[1]] and one[0]["Tags"] == [
        {"Key": "ngcx:service", "Value": "svc-1"}]
    first = api(client, "ListLoadBalancers", MaxResults=2)
    rest = api(client, "ListLoadBalancers", MaxResults=2, NextToken=first["NextToken"])
    assert len(first["LoadBalancers"]) == 2 and rest["NextToken"] == ""
    assert {lb["LoadBalancerId"] for lb in first["LoadBalancers"] + rest["LoadBalancers"]} == {*mine, other}
    group_id = create_group(emu, client)
    api(client, "TagResources", ResourceType="servergroup", ResourceId__1=group_id, Tag__1__Key="ngcx:service",
        Tag__1__Value="svc-0")
    found = api(client, "ListTagResources", ResourceType="servergroup", Tag__1__Key="ngcx:service")["TagResources"]
    assert found == [{"ResourceId": group_id, "ResourceType": "servergroup", "TagKey": "ngcx:service",
                      "TagValue": "svc-0"}]
    assert refused(client, "TagResources", ResourceType="listener", ResourceId__1="lsn-nope", Tag__1__Key="k") == (
        404, "ResourceNotFound.Listener")


def test_servers_are_added_asynchronously_and_a_busy_group_answers_conflict_lock(
        emu: EcsEmulator, hosts: LoopbackMachines) -> None:
    client, emu.alb.job_seconds = sdk(emu), 0.5             # long enough to be seen Adding on a busy machine
    group_id = create_group(emu, client)
    first, second = launch(emu, 2)
    assert api(client, "AddServersToServerGroup", ServerGroupId=group_id, **servers_param(hosts, [first]))["JobId"]
    assert statuses(client, group_id) == {first: "Adding"}
    assert refused(client, "AddServersToServerGroup", ServerGroupId=group_id,
                   **servers_param(hosts, [second])) == (400, "Conflict.Lock")
    until(lambda: statuses(client, group_id) == {first: "Available"}, "server Available")
    assert refused(client, "AddServersToServerGroup", ServerGroupId=group_id, Servers__1__ServerId="i-nope",
                   Servers__1__ServerType="Ecs", Servers__1__Port=80) == (404, "ResourceNotFound.Instance")
    assert refused(client, "RemoveServersFromServerGroup", ServerGroupId=group_id,
                   **servers_param(hosts, [second])) == (404, "ResourceNotFound.BackendServer")
    api(client, "RemoveServersFromServerGroup", ServerGroupId=group_id, **servers_param(hosts, [first]))
    assert statuses(client, group_id) == {first: "Removing"}
    until(lambda: statuses(client, group_id) == {}, "server removed")
    api(client, "UpdateServerGroupAttribute", ServerGroupId=group_id, HealthCheckConfig__HealthCheckPath="/healthz",
        HealthCheckConfig__HealthCheckCodes__1="http_2xx", HealthCheckConfig__HealthCheckCodes__2="http_3xx")
    group = api(client, "ListServerGroups", ServerGroupIds__1=group_id)["ServerGroups"][0]
    assert group["ServerGroupStatus"] == "Configuring" and group["HealthCheckConfig"]["HealthCheckPath"] == "/healthz"
    assert group["HealthCheckConfig"]["HealthCheckCodes"] == ["http_2xx", "http_3xx"]
    assert group["HealthCheckConfig"]["HealthCheckInterval"] == 1     # what the update did not name stays
    assert refused(client, "UpdateServerGroupAttribute", ServerGroupId=group_id,
                   HealthCheckConfig__HealthCheckCodes__1="http_6xx") == (400, "IllegalParam.HealthCheckConfig."
                                                                                "HealthCheckCodes")


def test_throttling_and_a_lost_answer_are_retried_safely_with_the_client_token(emu: EcsEmulator) -> None:
    client = sdk(emu, auto_retry=False)
    emu.fail_next("CreateLoadBalancer", "Throttling", 400)
    with pytest.raises(ServerException) as info:
        create_lb(emu, client, ClientToken="svc-2-lb")
    assert (info.value.get_http_status(), info.value.get_error_code()) == (400, "Throttling")
    assert api(client, "ListLoadBalancers")["TotalCount"] == 0
    first = create_lb(emu, client, ClientToken="svc-2-lb")      # the caller's retry
    emu.fail_next("CreateServerGroup", "ServiceUnavailable", 503, after_effect=True)
    with pytest.raises(ServerException) as lost:
        create_group(emu, client, ClientToken="svc-2-sg")
    assert lost.value.get_http_status() == 503
    group_id = create_group(emu, client, ClientToken="svc-2-sg")
    listed = api(client, "ListServerGroups")["ServerGroups"]
    assert [g["ServerGroupId"] for g in listed] == [group_id] and emu.performed("CreateServerGroup") == 1
    assert first and emu.performed("CreateLoadBalancer") == 1


# --- data plane: real traffic through haproxy ----------------------------------------------------

def serving(emu: EcsEmulator, hosts: LoopbackMachines, count: int,
            **group: Any) -> tuple[AcsClient, str, str, str, list[str]]:
    """An Active balancer with an HTTP :80 listener forwarding to `count` healthy instances (checks every 0.5 s:
    shorter ones time out now and then on a busy 2-core machine, and a flapping server fails the assertions)."""
    if shutil.which(HAPROXY) is None:
        missing("haproxy not installed (apt: haproxy; scripts/setup.sh installs it)")
    emu.alb.data_plane, emu.alb.health_scale = True, 0.5
    client = sdk(emu)
    lb_id, group_id, ids = create_lb(emu), create_group(emu, client, **group), launch(emu, count)
    api(client, "AddServersToServerGroup", ServerGroupId=group_id, **servers_param(hosts, ids))
    active(client, lb_id)
    listener_id = create_listener(client, lb_id, group_id)
    until(lambda: set(statuses(client, group_id).values()) == {"Available"}, "servers Available")
    until(lambda: not abnormal(client, listener_id), "every server Healthy")
    return client, lb_id, group_id, listener_id, ids


def test_traffic_reaches_healthy_servers_only(emu: EcsEmulator, hosts: LoopbackMachines) -> None:
    client, lb_id, _, listener_id, ids = serving(emu, hosts, 3)
    address = emu.balancer_address(lb_id, 80)
    assert emu.balancer_address(f"{lb_id}.cn-hangzhou.alb.aliyuncs.com", 80) == address
    seen = [get(address) for _ in range(30)]
    assert {status for status, _ in seen} == {200} and {body for _, body in seen} == set(ids)
    sick, stopped, well = ids
    hosts.machines[sick].ready = False
    bad = until(lambda: (a := abnormal(client, listener_id)).get(sick, {}).get("Status") == "Unhealthy" and a,
                "the failing server Unhealthy")
    assert bad[sick]["Reason"]["ReasonCode"] and bad[sick]["Port"] == hosts.addresses[sick][1]
    api(client, "StopInstance", ECS, InstanceId=stopped)
    until(lambda: abnormal(client, listener_id).get(stopped, {}).get("Status") == "Unhealthy", "stopped: Unhealthy")
    assert {get(address) for _ in range(20)} == {(200, well)}


def test_a_removed_server_drains_its_request_and_gets_no_new_ones(emu: EcsEmulator, hosts: LoopbackMachines) -> None:
    client, lb_id, group_id, _, ids = serving(emu, hosts, 2, ConnectionDrainConfig__ConnectionDrainEnabled=True,
                                              ConnectionDrainConfig__ConnectionDrainTimeout=10)
    address = emu.balancer_address(lb_id, 80)
    slow: list[tuple[int, str]] = []
    request = threading.Thread(target=lambda: slow.append(get(address, "/slow")))
    request.start()
    busy = until(lambda: [i for i in ids if hosts.machines[i].inflight], "the slow request on a server")[0]
    other = next(i for i in ids if i != busy)
    api(client, "RemoveServersFromServerGroup", ServerGroupId=group_id, **servers_param(hosts, [busy]))
    assert statuses(client, group_id)[busy] == "Removing"
    until(lambda: {get(address) for _ in range(10)} == {(200, other)}, "new requests only to the other server", 3)
    request.join(timeout=10)
    assert slow == [(200, busy)]
    until(lambda: busy not in statuses(client, group_id), "the drained server removed")
    assert {get(address) for _ in range(10)} == {(200, other)}
