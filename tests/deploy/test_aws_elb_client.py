"""A service's AWS load balancer (cli/deploy/aws/elb.py) against the AWS double, through the real boto3 `elbv2`.

What a user notices: `ensure` run twice (or after a lost answer, or a throttled call) leaves one balancer,
one target group and one listener, tagged and wired so the balancer reaches the hosts' port; requests to the
balancer reach the replicas that pass the health route and never one that fails it; a deregistered replica
finishes its in-flight request, then is gone after the (scaled) drain; delete leaves nothing and may run
twice; gc's `tagged` finds what a killed ngcx left; no message carries the secret key.

The replicas are instances of the double whose machines have loopback addresses (127.0.0.4N), each served
by a small HTTPS server there (the hosts' own self-signed TLS, as spec.target_protocol says); the balancer's
traffic goes to `emulator.balancer_address` (its haproxy). Balancer time runs at TIME_SCALE.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from emulators.aws_ec2 import Ec2Emulator
from emulators.test_aws_emulator import until as poll
from emulators.test_aws_imds import LoopbackHosts
from emulators.traffic import get, get_tls, running, spread, tls_server_context

from ngcx.core.errors import UserError
from ngcx.deploy.aws import elb as aws_elb
from ngcx.deploy.balancer import BalancerRef, BalancerSpec

KEY, SECRET = "AKIAELBCLIENTTEST001", "elb-secret-never-printed-5c1f"
TIME_SCALE = 0.1
AMI = "ami-12c6146b"
OWNER_TAGS = {"ngcx:owner": "unit-owner"}


class Replica(ThreadingHTTPServer):
    """A host on a loopback address serving HTTPS: the health route answers `health`; /slow waits for `release`."""

    daemon_threads = True

    def __init__(self, host: str, tls: ssl.SSLContext) -> None:
        super().__init__((host, 0), _Handler)
        self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.name, self.health, self.served = host, 200, 0
        self.entered, self.release = threading.Event(), threading.Event()
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: haproxy hangs up on its checks once it read the status line."""

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Replica
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status = self.server.health if self.path == "/v2/health/ready" else 200
        if self.path == "/slow":
            self.server.entered.set()
            self.server.release.wait(20)
        if self.path != "/v2/health/ready":
            self.server.served += 1
        body = self.server.name.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        """Silent."""




# --- fixtures ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def double(tmp_path_factory) -> Iterator[tuple[Ec2Emulator, LoopbackHosts, ssl.SSLContext]]:
    hosts = LoopbackHosts()
    with Ec2Emulator(hosts, access_keys={KEY: SECRET}, boot_seconds=0.05, start_seconds=0.05) as emulator:
        emulator.elbv2.time_scale = TIME_SCALE
        yield emulator, hosts, tls_server_context(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def emulator(double) -> Ec2Emulator:
    return double[0]


@pytest.fixture
def elb(double, monkeypatch, tmp_path) -> Iterator[aws_elb.Elb]:
    """Elb on an Ec2 whose prepare_network ran; every balancer, group and instance is gone after the test."""
    from ngcx.clouds.aws import Api
    from ngcx.deploy.aws.ec2 import Ec2

    emulator = double[0]
    for name, value in {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": emulator.endpoint, "HOME": str(tmp_path),
                        "NGCX_STATE_DIR": str(tmp_path / "state"), "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy", "AWS_PROFILE",
                 "AWS_SESSION_TOKEN", "NGCX_AWS_INSTANCE_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    ec2 = Ec2(Api("us-east-1", deadline_s=20))
    ec2.prepare_network("0.0.0.0/0")
    yield aws_elb.Elb(ec2)
    for ref in aws_elb.Elb(ec2).tagged({}):
        aws_elb.Elb(ec2).delete(ref)
    left = [i["id"] for i in emulator.instances() if i["state"] not in ("terminated", "shutting-down")]
    if left:
        ec2.api.call("ec2", "terminate_instances", InstanceIds=left)
    assert emulator.proxy_errors == []


@pytest.fixture
def replicas(double) -> Iterator[Callable[[aws_elb.Elb, str], tuple[str, Replica]]]:
    """make(elb, "127.0.0.4N"): a running instance whose machine has that address, with an HTTPS replica there."""
    _, hosts, tls = double
    made: list[Replica] = []

    def make(elb: aws_elb.Elb, address: str) -> tuple[str, Replica]:
        made.append(Replica(address, tls))
        hosts.addresses.append(address)
        subnet = elb.ec2.subnets["us-east-1b"]
        instance_id = elb.ec2.api.call("ec2", "run_instances", ImageId=AMI, InstanceType="g5.xlarge", MinCount=1,
                                       MaxCount=1, SubnetId=subnet.id,
                                       SecurityGroupIds=[elb.ec2.security_group])["Instances"][0]["InstanceId"]
        until("the instance runs", lambda: getattr(elb.ec2.describe([instance_id]).get(instance_id), "state", "")
              == "running")
        return instance_id, made[-1]

    yield make
    for replica in made:
        replica.close()


def spec(name: str = "ngcx-svc-41", **extra: Any) -> BalancerSpec:
    return BalancerSpec(name=name, zones=("us-east-1b",), tags={**OWNER_TAGS, "ngcx:service": name}, **extra)


def until(what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
    return poll(what, check, timeout, every=0.1)








def elbv2(elb: aws_elb.Elb, operation: str, **params: Any) -> dict[str, Any]:
    return elb.api.call("elbv2", operation, **params)


# --- ensure ----------------------------------------------------------------------------------------------

def test_ensure_twice_makes_one_balancer_group_and_listener_tagged_and_open_to_the_hosts(elb, emulator):
    before = emulator.performed("CreateLoadBalancer"), emulator.performed("CreateTargetGroup")
    first = elb.ensure(spec(drain_s=12))
    assert elb.ensure(spec(drain_s=12)) == first
    assert (emulator.performed("CreateLoadBalancer"), emulator.performed("CreateTargetGroup")) == (
        before[0] + 1, before[1] + 1)
    [balancer] = elbv2(elb, "describe_load_balancers")["LoadBalancers"]
    assert (balancer["LoadBalancerName"], balancer["Scheme"], balancer["DNSName"]) == (
        "ngcx-svc-41", "internet-facing", first.dns_name)
    zones = [z["ZoneName"] for z in balancer["AvailabilityZones"]]
    assert "us-east-1b" in zones and len(zones) == len(elb.ec2.subnets) >= 2, "every zone, the replicas' too"
    [group] = elbv2(elb, "describe_target_groups")["TargetGroups"]
    assert {k: group[k] for k in ("TargetGroupArn", "Protocol", "Port", "TargetType", "HealthCheckPath",
                                  "HealthCheckIntervalSeconds", "HealthyThresholdCount", "Matcher")} == {
        "TargetGroupArn": first.group_id, "Protocol": "HTTPS", "Port": 8000, "TargetType": "instance",
        "HealthCheckPath": "/v2/health/ready", "HealthCheckIntervalSeconds": 5, "HealthyThresholdCount": 2,
        "Matcher": {"HttpCode": "200"}}
    attributes = elbv2(elb, "describe_target_group_attributes", TargetGroupArn=first.group_id)["Attributes"]
    assert {a["Key"]: a["Value"] for a in attributes}["deregistration_delay.timeout_seconds"] == "12"
    [listener] = elbv2(elb, "describe_listeners", LoadBalancerArn=first.balancer_id)["Listeners"]
    assert (listener["ListenerArn"], listener["Protocol"], listener["Port"]) == (first.listener_id, "HTTP", 80), \
        "no certificate: plain HTTP on 80, not HTTP on 443"
    assert listener["DefaultActions"][0]["TargetGroupArn"] == first.group_id
    tags = elbv2(elb, "describe_tags", ResourceArns=[first.balancer_id, first.group_id, first.listener_id])
    assert all({"ngcx:owner": "unit-owner", "ngcx:service": "ngcx-svc-41"}.items() <=
               {t["Key"]: t["Value"] for t in d["Tags"]}.items() for d in tags["TagDescriptions"])
    assert aws_elb.service_url(spec(), first) == f"http://{first.dns_name}"

    [front] = balancer["SecurityGroups"]
    groups = {g["GroupId"]: g for g in elb.api.call("ec2", "describe_security_groups",
                                                     GroupIds=[front, elb.ec2.security_group])["SecurityGroups"]}
    assert any(r["FromPort"] == 80 and r["IpRanges"][0]["CidrIp"] == "0.0.0.0/0"
               for r in groups[front]["IpPermissions"]), "the listener port is open to the internet"
    assert [r["FromPort"] for r in groups[elb.ec2.security_group]["IpPermissions"]
            if front in [p["GroupId"] for p in r.get("UserIdGroupPairs", [])]] == [8000], "hosts admit the balancer"


def test_an_https_listener_serves_the_acm_certificate(elb, emulator, tmp_path):
    import boto3

    tls_server_context(tmp_path)
    acm = boto3.client("acm", endpoint_url=emulator.endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                       aws_secret_access_key=SECRET)
    certificate = acm.import_certificate(Certificate=(tmp_path / "cert.pem").read_bytes(),
                                         PrivateKey=(tmp_path / "key.pem").read_bytes())["CertificateArn"]
    ref = elb.ensure(spec("ngcx-svc-tls", certificate_id=certificate))
    [listener] = elbv2(elb, "describe_listeners", LoadBalancerArn=ref.balancer_id)["Listeners"]
    assert (listener["Protocol"], listener["Port"], listener["Certificates"][0]["CertificateArn"]) == (
        "HTTPS", 443, certificate)
    assert listener["SslPolicy"] == aws_elb.SSL_POLICY
    assert aws_elb.service_url(spec("ngcx-svc-tls", certificate_id=certificate), ref) == f"https://{ref.dns_name}"
    status, _, der = get_tls(emulator.balancer_address(ref.dns_name, 443))
    assert status == 503, "listening; no replica yet"
    assert der == ssl.PEM_cert_to_DER_cert((tmp_path / "cert.pem").read_text()), "TLS ends with the ACM certificate"


def test_lost_answers_and_throttling_are_retried_into_one_of_each(elb, emulator):
    emulator.fail_next("DescribeLoadBalancers", "Throttling", 400)
    emulator.fail_next("CreateLoadBalancer", "InternalError", 500, after_effect=True)
    emulator.fail_next("CreateTargetGroup", "InternalError", 500, after_effect=True)
    emulator.fail_next("CreateListener", "ServiceUnavailable", 503, after_effect=True)
    ref = elb.ensure(spec("ngcx-svc-lost"))
    assert len(elbv2(elb, "describe_load_balancers")["LoadBalancers"]) == 1
    assert [g["TargetGroupArn"] for g in elbv2(elb, "describe_target_groups")["TargetGroups"]] == [ref.group_id]
    assert [x["ListenerArn"] for x in elbv2(elb, "describe_listeners", LoadBalancerArn=ref.balancer_id)["Listeners"]
            ] == [ref.listener_id]
    assert elb.ensure(spec("ngcx-svc-lost")) == ref, "a later run (after a killed one) finds all three"


def test_an_ensure_killed_half_way_is_finished_by_the_next_one_without_duplicates(elb, emulator):
    emulator.fail_next("CreateTargetGroup", "ValidationError", 400)       # stands for ngcx dying after the balancer
    with pytest.raises(UserError):
        elb.ensure(spec("ngcx-svc-half"))
    assert len(elbv2(elb, "describe_load_balancers")["LoadBalancers"]) == 1
    assert elbv2(elb, "describe_target_groups")["TargetGroups"] == []
    ref = elb.ensure(spec("ngcx-svc-half"))
    assert [b["LoadBalancerArn"] for b in elbv2(elb, "describe_load_balancers")["LoadBalancers"]] == [ref.balancer_id]
    assert len(elbv2(elb, "describe_target_groups")["TargetGroups"]) == 1
    assert len(elbv2(elb, "describe_listeners", LoadBalancerArn=ref.balancer_id)["Listeners"]) == 1


def test_ensure_waits_until_the_balancer_is_active_and_no_longer_than_its_bound(monkeypatch):
    from types import SimpleNamespace

    answers = iter(["provisioning", "provisioning", "active", "provisioning"])
    api = SimpleNamespace(call=lambda *_, **__: {"LoadBalancers": [{"State": {"Code": next(answers)}, "DNSName": "d"}]})
    pauses: list[float] = []
    monkeypatch.setattr(aws_elb, "sleep", pauses.append)
    elb = aws_elb.Elb(SimpleNamespace(api=api, region="us-east-1"))
    assert elb._wait_active("ngcx-svc-1", "arn") == "d" and len(pauses) == 2
    monkeypatch.setattr(aws_elb, "ACTIVE_WAIT_S", 0.5)
    with pytest.raises(UserError, match="still provisioning after"):
        elb._wait_active("ngcx-svc-1", "arn")


def test_a_name_held_by_another_owner_is_refused_in_one_line_without_the_secret(elb):
    elb.ensure(BalancerSpec(name="ngcx-svc-taken", zones=("us-east-1b",), tags={"ngcx:owner": "someone-else"}))
    with pytest.raises(UserError) as refused:
        elb.ensure(spec("ngcx-svc-taken"))
    assert "ngcx-svc-taken" in str(refused.value) and "not this service's" in str(refused.value)
    assert SECRET not in str(refused.value) and "\n" not in str(refused.value)


def test_names_fit_elbv2s_32_characters_the_same_on_every_run():
    long = "ngcx-svc-" + "0123456789abcdef" * 2
    fitted = aws_elb.fit_name(long)
    assert len(fitted) <= 32 and fitted == aws_elb.fit_name(long) != aws_elb.fit_name(long + "x")
    assert aws_elb.fit_name("ngcx-svc-17") == "ngcx-svc-17" and aws_elb.fit_name("ngcx-svc-a_b") == "ngcx-svc-a-b"


# --- targets -----------------------------------------------------------------------------------------------

def test_traffic_reaches_only_healthy_replicas(elb, emulator, replicas):
    ref = elb.ensure(spec("ngcx-svc-web"))
    (good, up), (bad, failing) = replicas(elb, "127.0.0.41"), replicas(elb, "127.0.0.42")
    failing.health = 503
    for instance_id, replica in ((good, up), (bad, failing)):
        elb.register(ref, instance_id, replica.port)
    elb.register(ref, good, up.port)                                        # again: nothing changes
    assert set(elb.health(ref).values()) <= {"initial", "unhealthy"}
    until("one healthy, one unhealthy", lambda: elb.health(ref) == {good: "healthy", bad: "unhealthy"})
    address = emulator.balancer_address(ref.dns_name, 80)
    assert spread(address, 12) == Counter({"127.0.0.41": 12}), "the failing replica gets nothing"
    assert failing.served == 0

    up.health = 500
    until("the good one fails too", lambda: elb.health(ref)[good] == "unhealthy")
    assert set(spread(address, 4)) == {"<503>"}


def test_deregister_lets_the_in_flight_request_finish_then_the_replica_is_gone(elb, emulator, replicas):
    ref = elb.ensure(spec("ngcx-svc-drain", drain_s=30))                    # 3 s at TIME_SCALE
    (old, leaving), (new, staying) = replicas(elb, "127.0.0.43"), replicas(elb, "127.0.0.44")
    elb.register(ref, old, leaving.port)
    until("old healthy", lambda: elb.health(ref) == {old: "healthy"})
    address = emulator.balancer_address(ref.dns_name, 80)
    answers: list[tuple[int, str]] = []
    in_flight = threading.Thread(target=lambda: answers.append(get(address, "/slow")), daemon=True)
    in_flight.start()
    assert leaving.entered.wait(5), "the slow request reached the old replica"
    elb.register(ref, new, staying.port)
    until("new healthy", lambda: elb.health(ref).get(new) == "healthy")

    elb.deregister(ref, old, leaving.port)
    assert elb.health(ref) == {old: "draining", new: "healthy"}
    assert set(spread(address, 6)) == {"127.0.0.44"}, "no new request goes to the draining replica"
    elb.deregister(ref, old, leaving.port)                                  # a retry while draining
    leaving.release.set()
    in_flight.join(10)
    assert answers == [(200, "127.0.0.43")], "the in-flight request completed"
    until("gone after the drain", lambda: elb.health(ref) == {new: "healthy"}, timeout=8)
    elb.deregister(ref, old, leaving.port)                                  # gone already: done


# --- delete, gc ----------------------------------------------------------------------------------------------

def test_tagged_finds_the_service_and_delete_leaves_nothing_twice(elb, emulator):
    ref = elb.ensure(spec("ngcx-svc-gone"))
    other = elb.ensure(BalancerSpec(name="ngcx-svc-other", zones=("us-east-1b",), tags={"ngcx:owner": "another"}))
    assert elb.tagged(OWNER_TAGS) == [ref]
    assert elb.tagged({**OWNER_TAGS, "ngcx:service": "ngcx-svc-gone"}) == [ref]
    pids = emulator.elbv2.plane(ref.balancer_id).pids()
    elb.delete(ref)
    assert [b["LoadBalancerArn"] for b in elbv2(elb, "describe_load_balancers")["LoadBalancers"]] == [other.balancer_id]
    assert [g["TargetGroupArn"] for g in elbv2(elb, "describe_target_groups")["TargetGroups"]] == [other.group_id]
    assert elb.tagged(OWNER_TAGS) == []
    with pytest.raises(KeyError):
        emulator.balancer_address(ref.dns_name, 80)
    assert pids
    until("its haproxy stopped", lambda: not any(running(pid) for pid in pids))
    elb.delete(ref)                                                         # already gone: done


def test_tagged_finds_a_group_an_interrupted_delete_left(elb):
    ref = elb.ensure(spec("ngcx-svc-half"))
    elbv2(elb, "delete_load_balancer", LoadBalancerArn=ref.balancer_id)   # killed before the group went
    assert elb.tagged(OWNER_TAGS) == [BalancerRef("", ref.group_id, "", "")]
    elb.delete(elb.tagged(OWNER_TAGS)[0])
    assert elb.tagged(OWNER_TAGS) == [] and elbv2(elb, "describe_target_groups")["TargetGroups"] == []


def test_a_balancer_on_its_own_address_answers_https_at_the_dns_name_the_api_gives(elb, emulator, tmp_path):
    """own_addresses (the e2e's setting): DNSName is the balancer's loopback address, where its listener serves
    TLS on its own port with the ACM certificate, verified by the CA that signed it (as the CLI checks it)."""
    import http.client

    import boto3
    from emulators.balancer_plane import LOOPBACK_NET
    from emulators.traffic import certs

    if os.geteuid() != 0:
        pytest.skip("the listener binds port 443 of a loopback address: root only")
    ca, cert, key = certs().ca_signed(tmp_path, [str(ip) for ip in list(LOOPBACK_NET.hosts())[:8]])
    acm = boto3.client("acm", endpoint_url=emulator.endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                       aws_secret_access_key=SECRET)
    arn = acm.import_certificate(Certificate=cert.read_bytes(), PrivateKey=key.read_bytes(),
                                 CertificateChain=ca.read_bytes())["CertificateArn"]
    emulator.elbv2.own_addresses = True
    try:
        ref = elb.ensure(spec("ngcx-svc-own", certificate_id=arn))
    finally:
        emulator.elbv2.own_addresses = False
    assert ref.dns_name in {str(ip) for ip in LOOPBACK_NET.hosts()}
    [found] = elbv2(elb, "describe_load_balancers", LoadBalancerArns=[ref.balancer_id])["LoadBalancers"]
    assert found["DNSName"] == ref.dns_name
    conn = http.client.HTTPSConnection(ref.dns_name, 443, timeout=10,
                                       context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request("GET", "/")
        assert conn.getresponse().status == 503, "verified TLS at the DNS name; no replica yet"
    finally:
        conn.close()
