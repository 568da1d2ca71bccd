"""The `service` suite's cloud rounds: a 3-replica service on an emulated cloud, made, rolled, repaired.

Run by bench/suites/service.py (`python -m bench service`). The cloud is the real SDK against the emulator
(boto3 + moto behind tests/emulators/aws_ec2.py; the Aliyun SDK + tests/emulators/aliyun_ecs.py), whose
instances are real machines (containers with their own dockerd) and whose balancer's data plane is a real
haproxy terminating TLS with the bench's own CA-signed certificate (imported into ACM / the ALB emulator's
certificate store; the CLI trusts the CA through SSL_CERT_FILE). What is emulated, not real: the API-side
instance delays (EC2's published pending -> running 17.8 s, start 16.4 s: deploy_phases.py) and the
balancer's clock, run at TIME_SCALE (health checks every 0.5 s instead of 5 s; a 30 s drain in 3 s), so the
figures are the hosts' own work (boot, dockerd, container start, model load) plus ngcx's calls. The hosts log
in to the registry with `--registry-login token`: unlike tests/e2e/clouds.py, the bench does not route its
machines to the emulators' metadata services, which role logins need (the login is a second of the pull).

Per round, after one push and one bake: make the service (3 fresh hosts from the baked image), roll it to a
new version (the image's command with another --max-queue-delay-ms: 3 new hosts, the 3 old ones stopped into
the warm pool), stop one host through the cloud API and time `reconcile` until its replacement is healthy
(a warm host), destroy; then make it again on the stopped hosts the round left (the warm path), destroy, and
destroy the warm pool, so every round starts alike.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

TIME_SCALE = 0.1
GPU = {"aws": "A10G", "aliyun": "A10"}
REGISTRY = {"aws": "ecr://us-east-1/bench", "aliyun": "acr://cn-hangzhou/bench"}
REGION = {"aws": "us-east-1", "aliyun": "cn-hangzhou"}


def rounds(root: Path, work: Path, repeat: int, cloud: str) -> list[dict[str, float]]:
    """`repeat` rounds on one emulated cloud (module docstring); seconds per figure and round."""
    import docker
    from clouds import reach_from_hosts
    from emulators.docker_hosts import DockerHosts, RegistryRelay, bridge_gateway

    from .deploy_phases import METADATA, _emulator, _env, ngcx

    client = docker.from_env()
    gateway = bridge_gateway(client)
    with RegistryRelay("127.0.0.1:5000", listen_host=gateway) as relay, contextlib.ExitStack() as stack:
        hosts = DockerHosts(client, insecure_registries=[relay.address])
        emu = stack.enter_context(_emulator(cloud, hosts, gateway))
        # as deploy_phases (and tests/e2e/clouds.py): hosts reach the metadata service and the API
        api = reach_from_hosts(stack, emu, hosts, gateway, METADATA[cloud])
        env = {**_env(cloud, emu, relay.address, api, work / f"service-{cloud}"), "HTTP_PROXY": "",
               "HTTPS_PROXY": "", "http_proxy": "", "https_proxy": ""}
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        certificate, ca = _certificate(cloud, emu, env, work)
        env["SSL_CERT_FILE"] = str(ca)
        ngcx(root, env, "push", "ngcx-app/onnx-zero-code:latest", "--registry", REGISTRY[cloud])
        ngcx(root, env, "hosts", "bake", "--cloud", cloud, "--region", REGION[cloud], "--registry-login", "token")
        return [_round(root, env, cloud, emu, certificate, i) for i in range(repeat)]


def _certificate(cloud: str, emu: Any, env: dict[str, str], work: Path) -> tuple[str, Path]:
    """The user's certificate at the balancer, registered with the cloud; (its id, the CA that signed it)."""
    from emulators.balancer_plane import LOOPBACK_NET
    from emulators.traffic import certs

    folder = work / f"ca-{cloud}"
    folder.mkdir(parents=True, exist_ok=True)
    ca, cert, key = certs().ca_signed(folder, [str(ip) for ip in LOOPBACK_NET.hosts()])
    if cloud == "aws":
        import boto3

        emu.elbv2.own_addresses, emu.elbv2.time_scale = True, TIME_SCALE
        acm = boto3.client("acm", endpoint_url=emu.endpoint, region_name=env["AWS_DEFAULT_REGION"],
                           aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                           aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        arn = acm.import_certificate(Certificate=cert.read_bytes(), PrivateKey=key.read_bytes(),
                                     CertificateChain=ca.read_bytes())["CertificateArn"]
        return arn, ca
    alb = emu.alb
    alb.own_addresses = True
    alb.provision_seconds, alb.job_seconds, alb.health_scale, alb.drain_scale = 0.5, 0.2, TIME_SCALE, TIME_SCALE
    return alb.add_certificate(cert.read_bytes(), key.read_bytes()), ca


def _round(root: Path, env: dict[str, str], cloud: str, emu: Any, certificate: str, index: int) -> dict[str, float]:
    import docker

    from .deploy_phases import ngcx
    from .service import timed

    base = ["deploy", "--cloud", cloud, "--gpu", GPU[cloud], "--gpu-mode", "auto", "--certificate", certificate,
            "--registry-login", "token"]
    made_s = timed(root, env, *base, "--replicas", "3")
    ref = _newest_service(root, env)
    command = list(docker.from_env().images.get("ngcx-app/onnx-zero-code:latest").attrs["Config"]["Cmd"])
    update_s = timed(root, env, *base, "--service", ref, "--", *command, "--max-queue-delay-ms", str(2 + index))
    members = json.loads(ngcx(root, env, "deployments", "show", ref, "--json").stdout)["members"]
    _stop_host(cloud, emu, env, members[0]["instance_id"])
    replace_s = timed(root, env, "deployments", "reconcile", ref)
    ngcx(root, env, "deployments", "destroy", ref, "--yes")
    warm_s = timed(root, env, *base, "--replicas", "3")
    ngcx(root, env, "deployments", "destroy", _newest_service(root, env), "--yes")
    for record in json.loads(ngcx(root, env, "deployments", "ls", "--json").stdout):   # the warm pool
        ngcx(root, env, "deployments", "destroy", str(record["id"]), "--yes")
    return {"made_baked": made_s, "update": update_s, "replace": replace_s, "made_warm": warm_s}


def _newest_service(root: Path, env: dict[str, str]) -> str:
    from .deploy_phases import ngcx

    listed = json.loads(ngcx(root, env, "deployments", "ls", "--json").stdout)
    return f"s{max(r['service_id'] for r in listed if r.get('service_id'))}"


def _stop_host(cloud: str, emu: Any, env: dict[str, str], instance_id: str) -> None:
    """The cloud stops a replica's host through its own API (a spot reclaim, a console click), then it is off."""
    if cloud == "aws":
        import boto3

        boto3.client("ec2", endpoint_url=emu.endpoint, region_name=env["AWS_DEFAULT_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]
                     ).stop_instances(InstanceIds=[instance_id], Force=True)
    else:
        from ngcx.clouds.aliyun import Api

        from .deploy_phases import environ

        with environ(env):
            Api(REGION[cloud]).ecs("StopInstance", {"InstanceId": instance_id, "ForceStop": "true"}, write=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if any(i["id"] == instance_id and _state(i) == "stopped" for i in emu.instances()):
            return
        time.sleep(0.5)
    raise SystemExit(f"{instance_id} did not stop")


def _state(instance: dict) -> str:
    from e2e.clouds import state_of

    return state_of(instance)
