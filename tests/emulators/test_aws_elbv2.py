"""Application Load Balancers on the AWS double (tests/emulators/aws_elbv2.py), driven through real boto3 `elbv2`.

What a product developer relies on: a balancer's listener answers through a real haproxy (`balancer_address`)
and sends requests only to targets that pass the target group's health check; DescribeTargetHealth says
initial / healthy / unhealthy (with AWS's reason) / draining / unused as AWS does; a deregistered target
finishes its in-flight request and gets no new ones, then is gone after the deregistration delay; creating
the same balancer or group twice answers the same ARN (so a lost answer can be retried); deleting the
balancer stops its proxy; throttling answers `Throttling`, which boto3's retries get through.

The targets are small HTTP servers on loopback addresses (127.0.0.N): as `ip` targets, or as the machines
of instances (PaperHosts handing out those addresses). Balancer time runs at `TIME_SCALE` (a 5 s health check
interval takes 0.5 s).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.exceptions import ClientError

from emulators.aws_ec2 import Ec2Emulator
from emulators.test_aws_emulator import client, error_of, gpu_ami, launch, state
from emulators.test_aws_emulator import until as poll
from emulators.test_aws_imds import LoopbackHosts
from emulators.traffic import get, running, spread

TIME_SCALE = 0.1
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
CHECK = {"HealthCheckPath": "/v2/health/ready", "HealthCheckIntervalSeconds": 5, "HealthCheckTimeoutSeconds": 2,
         "HealthyThresholdCount": 3, "UnhealthyThresholdCount": 2}


class Backend(ThreadingHTTPServer):
    """A replica on a loopback address: /v2/health/ready answers `health` (or hangs), /slow waits for `release`."""

    daemon_threads = True

    def __init__(self, host: str) -> None:
        super().__init__((host, 0), _BackendHandler)
        self.name = host
        self.health = 200
        self.hang = threading.Event()            # set: the health route never answers (a check times out)
        self.entered = threading.Event()         # a /slow request arrived
        self.release = threading.Event()         # ... and may finish
        self.served = 0
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: haproxy's health checks hang up without reading the whole answer."""

    def close(self) -> None:
        self.release.set()
        self.hang.clear()
        self.shutdown()
        self.server_close()


class _BackendHandler(BaseHTTPRequestHandler):
    server: Backend
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        status = 200
        if self.path == "/v2/health/ready":
            while self.server.hang.is_set() and not self.server.release.wait(0.05):
                pass
            status = self.server.health
        elif self.path == "/slow":
            self.server.entered.set()
            self.server.release.wait(30)
        if self.path != "/v2/health/ready":
            self.server.served += 1
        body = self.server.name.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent."""


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[Ec2Emulator, LoopbackHosts]]:
    hosts = LoopbackHosts()
    with Ec2Emulator(hosts, boot_seconds=0.1, start_seconds=0.1) as emulator:
        emulator.elbv2.time_scale = TIME_SCALE
        yield emulator, hosts


@pytest.fixture
def emulator(cloud: tuple[Ec2Emulator, LoopbackHosts]) -> Iterator[Ec2Emulator]:
    """The module's emulator; every balancer and group a test made is deleted after it."""
    emulator = cloud[0]
    yield emulator
    elb = client(emulator, "elbv2")
    for balancer in elb.describe_load_balancers()["LoadBalancers"]:
        elb.delete_load_balancer(LoadBalancerArn=balancer["LoadBalancerArn"])
    for group in elb.describe_target_groups()["TargetGroups"]:
        elb.delete_target_group(TargetGroupArn=group["TargetGroupArn"])
    assert emulator.proxy_errors == []


@pytest.fixture
def backends() -> Iterator[Callable[[str], Backend]]:
    made: list[Backend] = []

    def make(host: str) -> Backend:
        made.append(Backend(host))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


# --- helpers -----------------------------------------------------------------------------------------

def until(what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll every 0.1 s (a fifth of the scaled health check interval) until check() is true."""
    return poll(what, check, timeout, every=0.1)


def network(emulator: Ec2Emulator) -> tuple[str, list[str]]:
    """A VPC and two subnets in two zones (an ALB needs two)."""
    ec2 = client(emulator, "ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{n}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for n, zone in ((1, "us-east-1a"), (2, "us-east-1b"))]
    return vpc, subnets


def service(emulator: Ec2Emulator, name: str, target_type: str = "ip",
            listen: bool = True) -> tuple[Any, dict[str, Any], str]:
    """A balancer, a target group checking /v2/health/ready and (listen) an HTTP:80 listener forwarding to it."""
    elb = client(emulator, "elbv2")
    vpc, subnets = network(emulator)
    balancer = elb.create_load_balancer(Name=name, Subnets=subnets, Scheme="internet-facing",
                                        Type="application")["LoadBalancers"][0]
    group = elb.create_target_group(Name=f"{name}-tg", Protocol="HTTP", Port=8000, VpcId=vpc,
                                    TargetType=target_type, **CHECK)["TargetGroups"][0]["TargetGroupArn"]
    if listen:
        elb.create_listener(LoadBalancerArn=balancer["LoadBalancerArn"], Protocol="HTTP", Port=80,
                            DefaultActions=[{"Type": "forward", "TargetGroupArn": group}])
    return elb, balancer, group


def health(elb, group: str, **targets: Any) -> dict[str, dict[str, Any]]:
    """Target id -> its TargetHealth (plus HealthCheckPort and Port)."""
    found = elb.describe_target_health(TargetGroupArn=group, **targets)["TargetHealthDescriptions"]
    return {d["Target"]["Id"]: {**d["TargetHealth"], "Port": d["Target"]["Port"], "HealthCheckPort":
                                d["HealthCheckPort"]} for d in found}


def states(elb, group: str) -> dict[str, str]:
    return {target: h["State"] for target, h in health(elb, group).items()}






# --- the data plane ------------------------------------------------------------------------------------

def test_traffic_reaches_only_healthy_instances_and_a_failing_one_drops_out(emulator, cloud, backends):
    hosts = cloud[1]
    elb, balancer, group = service(emulator, "web", target_type="instance")
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    replicas = {}
    for octet in (11, 12, 13):
        hosts.addresses.append(f"127.0.0.{octet}")
        instance_id = launch(ec2, ami)["InstanceId"]
        until("running", lambda i=instance_id: state(ec2, i) == "running")
        replicas[instance_id] = backends(f"127.0.0.{octet}")
    (a, first), (b, second), (c, third) = replicas.items()
    third.health = 503
    elb.register_targets(TargetGroupArn=group, Targets=[{"Id": i, "Port": r.port} for i, r in replicas.items()])
    assert {h["State"] for h in health(elb, group).values()} == {"initial"}

    until("two healthy, one unhealthy", lambda: states(elb, group) == {a: "healthy", b: "healthy", c: "unhealthy"})
    shown = health(elb, group)
    assert shown[a] == {"State": "healthy", "Port": first.port, "HealthCheckPort": str(first.port)}
    assert shown[c]["Reason"] == "Target.ResponseCodeMismatch"
    assert shown[c]["Description"] == "Health checks failed with these codes: [503]"
    address = emulator.balancer_address(balancer["DNSName"], 80)
    assert set(spread(address)) == {"127.0.0.11", "127.0.0.12"}, "round robin over the healthy ones only"

    first.health = 500
    until("the first goes unhealthy", lambda: states(elb, group)[a] == "unhealthy")
    assert set(spread(address)) == {"127.0.0.12"}
    assert third.served == 0

    ec2.terminate_instances(InstanceIds=[b])        # EC2 deregisters it: draining, then gone
    assert health(elb, group)[b]["Reason"] == "Target.DeregistrationInProgress"


def test_target_health_says_unused_initial_and_timeout_as_aws_does(emulator, backends):
    elb, balancer, group = service(emulator, "shapes", listen=False)
    replica, slow = backends("127.0.0.21"), backends("127.0.0.22")
    slow.hang.set()
    elb.register_targets(TargetGroupArn=group, Targets=[{"Id": "127.0.0.21", "Port": replica.port},
                                                       {"Id": "127.0.0.22", "Port": slow.port}])
    assert health(elb, group)["127.0.0.21"] == {
        "State": "unused", "Reason": "Target.NotInUse", "HealthCheckPort": str(replica.port), "Port": replica.port,
        "Description": "Target group is not configured to receive traffic from the load balancer"}
    unknown = health(elb, group, Targets=[{"Id": "127.0.0.99", "Port": 8000}])["127.0.0.99"]
    assert (unknown["State"], unknown["Reason"]) == ("unused", "Target.NotRegistered")

    elb.create_listener(LoadBalancerArn=balancer["LoadBalancerArn"], Protocol="HTTP", Port=8080,
                        DefaultActions=[{"Type": "forward", "TargetGroupArn": group}])
    assert health(elb, group)["127.0.0.21"]["State"] == "initial"
    until("healthy and timed out", lambda: states(elb, group) == {"127.0.0.21": "healthy", "127.0.0.22": "unhealthy"})
    timed_out = health(elb, group)["127.0.0.22"]
    assert (timed_out["Reason"], timed_out["Description"]) == ("Target.Timeout", "Request timed out")
    assert set(spread(emulator.balancer_address(balancer["LoadBalancerArn"], 8080), 6)) == {"127.0.0.21"}

    elb.modify_target_group(TargetGroupArn=group, Matcher={"HttpCode": "202,204"})    # the plane follows moto
    until("the new matcher fails it", lambda: states(elb, group)["127.0.0.21"] == "unhealthy")
    assert health(elb, group)["127.0.0.21"]["Description"] == "Health checks failed with these codes: [200]"


def test_deregistering_drains_the_in_flight_request_then_forgets_the_target(emulator, backends):
    elb, balancer, group = service(emulator, "drain")
    elb.modify_target_group_attributes(TargetGroupArn=group, Attributes=[
        {"Key": "deregistration_delay.timeout_seconds", "Value": "30"}])          # 3 s at TIME_SCALE
    old, new = backends("127.0.0.31"), backends("127.0.0.32")
    elb.register_targets(TargetGroupArn=group, Targets=[{"Id": "127.0.0.31", "Port": old.port}])
    until("old healthy", lambda: states(elb, group) == {"127.0.0.31": "healthy"})
    address = emulator.balancer_address(balancer["DNSName"], 80)
    answers: list[tuple[int, str]] = []
    in_flight = threading.Thread(target=lambda: answers.append(get(address, "/slow")), daemon=True)
    in_flight.start()
    assert old.entered.wait(5), "the slow request reached the old replica"

    elb.register_targets(TargetGroupArn=group, Targets=[{"Id": "127.0.0.32", "Port": new.port}])
    until("new healthy", lambda: states(elb, group)["127.0.0.32"] == "healthy")
    elb.deregister_targets(TargetGroupArn=group, Targets=[{"Id": "127.0.0.31", "Port": old.port}])
    draining = health(elb, group)["127.0.0.31"]
    assert draining == {"State": "draining", "Reason": "Target.DeregistrationInProgress", "Port": old.port,
                        "Description": "Target deregistration is in progress", "HealthCheckPort": str(old.port)}
    assert health(elb, group, Targets=[{"Id": "127.0.0.31"}])["127.0.0.31"]["State"] == "draining"
    assert set(spread(address, 8)) == {"127.0.0.32"}, "no new request goes to a draining target"
    elb.deregister_targets(TargetGroupArn=group, Targets=[{"Id": "127.0.0.31", "Port": old.port}])  # a retry

    old.release.set()
    in_flight.join(10)
    assert answers == [(200, "127.0.0.31")], "the in-flight request completed"
    until("gone after the delay", lambda: states(elb, group) == {"127.0.0.32": "healthy"}, timeout=8)


# --- the API around it ---------------------------------------------------------------------------------

def test_the_same_create_twice_answers_the_same_arn_and_other_settings_are_refused(emulator):
    elb = client(emulator, "elbv2")
    vpc, subnets = network(emulator)
    before = emulator.performed("CreateLoadBalancer")
    emulator.fail_next("CreateLoadBalancer", "InternalError", 500, after_effect=True)
    assert error_of(lambda: elb.create_load_balancer(Name="api", Subnets=subnets))[:2] == ("InternalError", 500)
    first = elb.create_load_balancer(Name="api", Subnets=list(reversed(subnets)))["LoadBalancers"][0]
    assert [b["LoadBalancerArn"] for b in elb.describe_load_balancers()["LoadBalancers"]] == [first["LoadBalancerArn"]]
    assert emulator.performed("CreateLoadBalancer") == before + 1, "the retry adopted the balancer the lost answer made"
    code, status, message = error_of(lambda: elb.create_load_balancer(Name="api", Subnets=subnets,
                                                                      Scheme="internal"))
    assert (code, status) == ("DuplicateLoadBalancerName", 400) and "'api'" in message

    group = elb.create_target_group(Name="api-tg", Protocol="HTTP", Port=8000, VpcId=vpc, **CHECK)["TargetGroups"][0]
    again = elb.create_target_group(Name="api-tg", Protocol="HTTP", Port=8000, VpcId=vpc, **CHECK)["TargetGroups"][0]
    assert again["TargetGroupArn"] == group["TargetGroupArn"]
    assert error_of(lambda: elb.create_target_group(Name="api-tg", Protocol="HTTP", Port=9000, VpcId=vpc,
                                                    **CHECK))[:2] == ("DuplicateTargetGroupName", 400)

    forward = [{"Type": "forward", "TargetGroupArn": group["TargetGroupArn"]}]
    listener = elb.create_listener(LoadBalancerArn=first["LoadBalancerArn"], Protocol="HTTP", Port=80,
                                   DefaultActions=forward)["Listeners"][0]["ListenerArn"]
    other = elb.create_listener(LoadBalancerArn=first["LoadBalancerArn"], Protocol="HTTP", Port=8080,
                                DefaultActions=forward)["Listeners"][0]["ListenerArn"]
    again = elb.create_listener(LoadBalancerArn=first["LoadBalancerArn"], Protocol="HTTP", Port=80,
                                DefaultActions=forward)["Listeners"]
    assert [x["ListenerArn"] for x in again] == [listener] != [other]
    assert error_of(lambda: elb.create_listener(LoadBalancerArn=first["LoadBalancerArn"], Protocol="HTTPS", Port=80,
                                                DefaultActions=forward))[:2] == ("DuplicateListener", 400)
    listed = elb.describe_listeners(LoadBalancerArn=first["LoadBalancerArn"])["Listeners"]
    assert sorted(x["Port"] for x in listed) == [80, 8080]




def test_deleting_the_balancer_stops_its_haproxy(emulator):
    elb, balancer, _ = service(emulator, "gone")
    address = emulator.balancer_address(balancer["DNSName"], 80)
    assert get(address)[0] == 503, "a listener without healthy targets answers 503, as an ALB does"
    pids = emulator.elbv2.plane(balancer["LoadBalancerArn"]).pids()
    assert pids and all(running(pid) for pid in pids)
    elb.delete_load_balancer(LoadBalancerArn=balancer["LoadBalancerArn"])
    until("its haproxy processes are gone", lambda: not any(running(pid) for pid in pids))

    def refused() -> bool:
        try:
            socket.create_connection(address, timeout=1).close()
        except OSError:
            return True
        return False

    until("the listener's port refuses connections", refused)
    with pytest.raises(KeyError):
        emulator.balancer_address(balancer["DNSName"], 80)


def test_throttling_answers_throttling_and_botos_retry_gets_through(emulator):
    elb = client(emulator, "elbv2")
    emulator.fail_next("DescribeLoadBalancers", "Throttling", 400, times=2)
    with pytest.raises(ClientError) as caught:
        elb.describe_load_balancers()
    assert caught.value.response["Error"] == {"Type": "Sender", "Code": "Throttling", "Message": "Rate exceeded"}
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert client(emulator, "elbv2", attempts=3).describe_load_balancers()["LoadBalancers"] == []


def test_a_wrong_signature_is_refused_for_elbv2_too(emulator):
    emulator.access_keys = {"AKIAEMULATORTEST0000": "emulator-secret"}
    try:
        assert client(emulator, "elbv2").describe_load_balancers()["LoadBalancers"] == []
        import boto3
        from botocore.config import Config

        stranger = boto3.client("elbv2", endpoint_url=emulator.endpoint, region_name="us-east-1",
                                aws_access_key_id="AKIAEMULATORTEST0000", aws_secret_access_key="wrong",
                                config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
        assert error_of(stranger.describe_load_balancers)[:2] == ("SignatureDoesNotMatch", 403)
    finally:
        emulator.access_keys = None
