"""`ngcx deploy --cloud aws|aliyun --replicas 3 --certificate ID`, for real: a service of the example project
behind the cloud's own load balancer (the emulators' ALB, whose data plane is a real haproxy that terminates
TLS with the user's certificate), then its life under constant load — a rolling update, a killed host
replaced by `reconcile`, scale in — and destroy.

What a user notices (issue 21): one https URL, the balancer's, checked by the user's own CA (SSL_CERT_FILE),
that answers inferences with the service's key; the replicas spread over the zones; a new version replaces
the old without one failed request, and so does scaling in; a host the cloud stopped is replaced by
`ngcx deployments reconcile` and the balancer stops sending to it; destroy leaves no balancer, target/server
group or host; a service without --certificate is refused before any cloud call.

The emulators give each balancer its own loopback address (127.0.100.0/24) as its DNS name and serve its
listener there on 443 (balancer_plane.py), so the test makes one CA and one server certificate naming every
address of that range, registers it with the cloud (ACM import / the ALB emulator's certificate store) and
runs the CLI with SSL_CERT_FILE pointing at the CA. Balancer time (health checks, drains) runs at TIME_SCALE.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from deploy_helpers import LOAD_CLIENTS, MODEL, Load
from e2e.clouds import Cloud, state_of
from emulators.balancer_plane import LOOPBACK_NET
from emulators.traffic import certs

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TIME_SCALE = 0.1          # balancer seconds: 5 s health checks every 0.5 s, a 30 s drain in 3 s
CHANGED = ("--max-queue-delay-ms", "2")   # the "new version": the image's own command with another queue delay


def _can_bind_443() -> bool:
    """Whether this process may listen on 443 at all: a balancer already listening there (one a failed test
    left) says yes, only a refusal of the privileged port says no."""
    with socket.socket() as s:
        try:
            s.bind((str(next(LOOPBACK_NET.hosts())), 443))
        except PermissionError:
            return False
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
        return True


@pytest.fixture(params=["aws", "aliyun"])
def svc_cloud(request, tmp_path_factory) -> Iterator[tuple[Cloud, str, dict[str, str], Path]]:
    """(cloud, certificate id, env with SSL_CERT_FILE, ca.pem): the emulator's balancers on their own loopback
    addresses with fast checks, and the user's certificate registered with the cloud.

    Why Alibaba Cloud by default: the service path through the CLI is shared (service.py, balancer.py); what
    differs per cloud is its balancer client and double, tested on both clouds apart (tests/deploy/
    test_aliyun_alb_client.py, test_aws_elb_client.py), and the autoscaled-service e2e drives AWS's balancer
    end to end (test_service_groups.py). A second cloud here costs CI about three minutes:
    NGCX_E2E_SERVICE_CLOUDS=aliyun,aws runs both."""
    wanted = os.environ.get("NGCX_E2E_SERVICE_CLOUDS", "aliyun").split(",")
    if request.param not in wanted:
        pytest.skip(f"{request.param}: not in NGCX_E2E_SERVICE_CLOUDS={','.join(wanted)} (aliyun,aws runs both)")
    if not _can_bind_443():
        pytest.skip("the emulated balancers listen on 443 of 127.0.100.x: needs root or CAP_NET_BIND_SERVICE")
    cloud: Cloud = request.getfixturevalue(request.param)
    certificate, ca = balancers_on_loopback(cloud, tmp_path_factory.mktemp(f"{cloud.name}-ca"))
    try:
        yield cloud, certificate, {"SSL_CERT_FILE": str(ca)}, ca
    finally:
        balancers_back(cloud)


def balancers_on_loopback(cloud: Cloud, folder: Path) -> tuple[str, Path]:
    """The cloud's balancers on their own loopback addresses, on TIME_SCALE, and one CA-signed certificate for
    every such address registered with the cloud (ACM import / the ALB emulator's store): (its id, the CA)."""
    ca, cert, key = certs().ca_signed(folder, [str(ip) for ip in LOOPBACK_NET.hosts()])
    emulator = cloud.emulator
    if cloud.name == "aws":
        import boto3

        emulator.elbv2.own_addresses, emulator.elbv2.time_scale = True, TIME_SCALE
        acm = boto3.client("acm", endpoint_url=emulator.endpoint, region_name=cloud.env["AWS_DEFAULT_REGION"],
                           aws_access_key_id=cloud.env["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=cloud.env["AWS_SECRET_ACCESS_KEY"])
        return acm.import_certificate(Certificate=cert.read_bytes(), PrivateKey=key.read_bytes(),
                                      CertificateChain=ca.read_bytes())["CertificateArn"], ca
    alb = emulator.alb
    alb.own_addresses = True
    alb.provision_seconds, alb.job_seconds, alb.health_scale, alb.drain_scale = 0.5, 0.2, TIME_SCALE, TIME_SCALE
    return alb.add_certificate(cert.read_bytes(), key.read_bytes()), ca


def balancers_back(cloud: Cloud) -> None:
    if cloud.name == "aws":
        cloud.emulator.elbv2.own_addresses, cloud.emulator.elbv2.time_scale = False, 1.0
    else:
        cloud.emulator.alb.own_addresses = False


def payload(project: Path) -> tuple[bytes, Any]:
    """The example's inference request (JSON) and its expected logits (with their tolerances)."""
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    array = example.inputs["image"]
    body = json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.reshape(-1).tolist()}]}).encode()
    return body, example.outputs["logits"]


def show(cloud: Cloud, ref: str) -> dict:
    done = cloud.ngcx("deployments", "show", ref, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def stop_host(cloud: Cloud, instance_id: str) -> None:
    """The cloud stops a replica's host (as a spot reclaim or a console click would), through its own API."""
    if cloud.name == "aws":
        import boto3

        ec2 = boto3.client("ec2", endpoint_url=cloud.emulator.endpoint, region_name=cloud.env["AWS_DEFAULT_REGION"],
                           aws_access_key_id=cloud.env["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=cloud.env["AWS_SECRET_ACCESS_KEY"])
        ec2.stop_instances(InstanceIds=[instance_id], Force=True)
    else:
        from ngcx.clouds.aliyun import Api

        Api("cn-hangzhou").ecs("StopInstance", {"InstanceId": instance_id, "ForceStop": "true"}, write=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if [state_of(i) for i in cloud.emulator.instances() if i["id"] == instance_id] == ["stopped"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{instance_id} did not stop")


def balancer_view(cloud: Cloud, svc: dict) -> dict[str, str]:
    """Instance id -> the cloud balancer's state of it (ngcx's own Elb / Alb, the SDK against the emulator)."""
    from ngcx.deploy import target
    from ngcx.deploy.balancer import BalancerRef

    return target(cloud.name).balancer().health(BalancerRef(**svc["balancer"]))


def balancers_left(cloud: Cloud, svc: dict) -> list:
    from ngcx.deploy import target

    return target(cloud.name).balancer().tagged({"ngcx:service": str(svc["id"])})


def test_a_cloud_service_answers_through_its_balancer_rolls_heals_scales_and_is_destroyed(svc_cloud, monkeypatch):
    cloud, certificate, tls_env, ca = svc_cloud
    for name, value in {**cloud.env, **tls_env}.items():      # the in-process checks: the same cloud and store
        monkeypatch.setenv(name, value)
    body, logits = payload(cloud.project)
    base = ("deploy", "--cloud", cloud.name, "--gpu", cloud.gpu, "--gpu-mode", "auto")

    t0 = time.monotonic()
    made = cloud.ngcx(*base, "--replicas", "3", "--certificate", certificate, env=tls_env)
    to_answer = time.monotonic() - t0
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    host = urlsplit(url).hostname or ""
    assert url == f"https://{host}" and host in {str(ip) for ip in LOOPBACK_NET.hosts()}, url
    print(f"{cloud.name}: deploy --replicas 3 to the balancer answering: {to_answer:.1f} s")
    # the service's own ref: the cloud's state is shared with test_canary_clouds.py, whose service came first
    ref = re.search(r"service (s\d+) ready", made.stderr).group(1)
    key = cloud.ngcx("deployments", "key", ref).stdout.strip()
    assert key.startswith("ngcx_") and key not in made.stderr + made.stdout
    svc = show(cloud, ref)
    assert svc["status"] == "ready" and svc["endpoint"] == url and len(svc["members"]) == 3
    zones = [m["zone"] for m in svc["members"]]
    assert len(set(zones)) == 3, f"the replicas are not spread over the zones: {zones}"
    assert set(balancer_view(cloud, svc).values()) == {"healthy"}

    # one inference through the balancer, its certificate checked by the user's CA; never the key unverified
    from ngcx.project.client import Client

    client = Client(url, timeout=60, key=key, verify=True)
    try:
        answer = client.infer(MODEL, _inputs(cloud.project))
    finally:
        client.close()
    np.testing.assert_allclose(np.asarray(answer["logits"]).reshape(-1), logits.array.reshape(-1), rtol=logits.rtol,
                               atol=logits.atol)
    with pytest.raises(ValueError, match="not pinned"):
        Client(url, key=key).infer(MODEL, _inputs(cloud.project))
    context = ssl.create_default_context(cafile=str(ca))

    # rolling update to a new version under constant load: zero failed requests
    command = _image_command(cloud) + list(CHANGED)
    with Load(url, key, body, context) as load:
        load.settle()
        t0 = time.monotonic()
        rolled = cloud.ngcx(*base, "--service", ref, "--", *command, env=tls_env)
        rolling = time.monotonic() - t0
        assert rolled.returncode == 0, f"after {rolling:.0f} s: {rolled.stderr[-3000:]}"
        load.settle()
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    print(f"{cloud.name}: rolling update of 3 replicas: {rolling:.1f} s under {LOAD_CLIENTS} clients, "
          f"{load.total()} requests, 0 failed")
    svc = show(cloud, ref)
    assert svc["config"]["cmd"] == command and len(svc["members"]) == 3
    assert {m["status"] for m in svc["members"]} == {"ready"}

    # the cloud stops one host: reconcile replaces it, and the balancer no longer sends to it
    victim = svc["members"][0]
    stop_host(cloud, victim["instance_id"])
    fixed = cloud.ngcx("deployments", "reconcile", ref, env=tls_env)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert f"replica {victim['id']}'s host is stopped; replacing it" in fixed.stderr, fixed.stderr[-2000:]
    svc = show(cloud, ref)
    assert len(svc["members"]) == 3 and victim["id"] not in {m["id"] for m in svc["members"]}
    view = balancer_view(cloud, svc)
    assert victim["instance_id"] not in view and set(view.values()) == {"healthy"}, view
    with Load(url, key, body, context) as load:
        load.settle(40)
    assert not load.errors, load.errors[:5]

    # scale in to 1 under load: the leaving replicas drain, nothing fails
    with Load(url, key, body, context) as load:
        load.settle()
        scaled = cloud.ngcx("deployments", "scale", ref, "1", env=tls_env)
        load.settle()
    assert scaled.returncode == 0, scaled.stderr[-2000:]
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    svc = show(cloud, ref)
    assert len(svc["members"]) == 1 and len(balancer_view(cloud, svc)) == 1

    # destroy: no balancer, group or host of the service is left
    members = {m["instance_id"] for m in svc["members"]}
    gone = cloud.ngcx("deployments", "destroy", ref, "--yes")
    assert gone.returncode == 0, gone.stderr[-2000:]
    assert balancers_left(cloud, svc) == []
    states = {i["id"]: state_of(i) for i in cloud.emulator.instances()}
    assert all(states.get(i, "terminated") in ("terminated", "shutting-down", "deleted", "") for i in members), states
    assert show(cloud, ref)["status"] == "destroyed"

    # a service without a certificate is refused in one line, before anything is made (service.py asks for the
    # zones first, which reads the cloud: see service_zones)
    calls = len(cloud.emulator.calls)
    refused = cloud.ngcx(*base, "--replicas", "2")
    assert refused.returncode != 0 and f"a service on {cloud.name} needs --certificate" in refused.stderr
    assert len([ln for ln in refused.stderr.splitlines() if ln.startswith("ngcx: error")]) == 1, refused.stderr
    writes = [name for name, _ in cloud.emulator.calls[calls:] if not name.startswith(("Describe", "List", "Get"))]
    assert not writes, f"a refused service wrote to the cloud: {writes}"
    _clean_warm_pool(cloud)


def _inputs(project: Path) -> dict:
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    return {"image": example.inputs["image"]}


def _image_command(cloud: Cloud) -> list[str]:
    """The image's own command (its CMD), as `docker image inspect` says."""
    import docker

    return list(docker.from_env().images.get("ngcx-app/onnx-zero-code:latest").attrs["Config"]["Cmd"])


def _clean_warm_pool(cloud: Cloud) -> None:
    """Hosts the rolling update stopped into the warm pool belong to no service: destroyed, so the session's
    later tests start from what they expect."""
    for record in cloud.records():
        if record["status"] not in ("destroyed", "failed", "replaced") and record.get("service_id") is None:
            cloud.ngcx("deployments", "destroy", str(record["id"]), "--yes")
