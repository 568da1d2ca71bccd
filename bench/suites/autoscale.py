"""autoscale: an autoscaled service (`ngcx deploy --cloud aws --min 1 --max 3`, issue 22) under a load step.

Usage: `.venv/bin/python -m bench autoscale --repeat 3` from the repository root (the suite puts tests/ and
tests/e2e on the import path itself: their emulators and load client are what it drives).

Per round, one service on the emulated AWS (boto3 + moto behind tests/emulators/aws_ec2.py and
aws_autoscaling.py; instances are real machines: containers with their own dockerd, booting the launch
template's user-data from the baked image and pulling with their instance role through the emulated IMDS;
the ALB's data plane a real haproxy terminating TLS with the bench's CA-signed certificate):
- made: `ngcx deploy --min 1 --max 3 --target-requests 60` until the balancer answers (one host);
- the load step: 1 client paced at RATE requests/s for three policy periods, then 8 clients: the time to the
  group's scale-out decision (the cloud's target tracking, not ngcx) and to a new host healthy in the balancer;
- back to 1 client: the time to the scale-in decision (a host leaves: deregistered, draining) and the drain
  (from leaving to gone: the deregistration delay, 30 s at TIME_SCALE, and the lifecycle hook);
- destroy. Zero failed requests or the suite stops.
What is emulated, not real: the API-side launch delay, the balancer's and the group's clock at TIME_SCALE
(an AWS minute, the policy's period, is 6 s; AWS seconds = these / TIME_SCALE for the decision and drain
figures, not for the host's own boot, pull and model load, which are real). AWS's own alarms need 3
one-minute datapoints above the target to scale out (the emulator 1), so on AWS add about two minutes.
The ratio: scale-out reaction / the 1-host service made (what the policy's detection adds to a host's own start).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Stats, SuiteResult, SuiteSkipped, ratio

TIME_SCALE = 0.1
RATE = 4.0            # requests/s per client
TARGET = 60           # requests per host per (emulated) minute: 1 client fits one host, 8 need three
STEP_MAX_S = 300.0
NOTES = [
    "One autoscaled service per round on the emulated AWS (moto + tests/emulators/aws_autoscaling.py): the group's "
    "hosts are real machines (containers with their own dockerd) that boot the launch template's user-data from the "
    "baked image and pull with their instance role; the ALB's data plane is a real haproxy. Load: paced clients "
    f"({RATE:g} requests/s each), 1 for three policy periods, then 8, then 1 again; --target-requests {TARGET}. "
    "Every round ended with 0 failed requests (the suite stops otherwise).",
    f"Emulated clock: the balancer's and the group's time run at x{TIME_SCALE} (the policy's one-minute period is "
    f"{60 * TIME_SCALE:g} s, the 30 s deregistration delay {30 * TIME_SCALE:g} s): the decision, scale-in and drain "
    f"figures are AWS seconds x {TIME_SCALE}; a host's boot, pull and model load (most of the reaction) are real. "
    "AWS's target-tracking alarm needs 3 one-minute datapoints above the target to scale out (the emulator 1): "
    "add about 2 minutes on AWS.",
    "What the figures vary with: the reaction with how many hosts boot at once on this 2-core machine (the step "
    "asks for 2 more); the scale-in with whether a host is still booting when the load drops (target tracking "
    "makes no decision while an instance warms up, as AWS), then 3 periods below the target.",
    "The ratio says what the policy's detection adds to a host's own start (a 1-host service made from nothing).",
]


def run(result: SuiteResult, work: Path, out: Path) -> None:
    if subprocess.run(["/usr/bin/docker", "info"], capture_output=True).returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
    rounds = _rounds(work, max(result.repeat, 1))
    figures = {
        "made": ("aws: deploy --min 1 --max 3 -> balancer answering (1 host)", "ngcx deploy --cloud aws --min 1 "
                 f"--max 3 --target-requests {TARGET} --certificate ARN"),
        "decide": ("aws: load step 1 -> 8 clients -> the group's scale-out decision", "target tracking"),
        "ready": ("aws: load step 1 -> 8 clients -> a new host healthy in the balancer", "target tracking"),
        "scale_in": ("aws: load back to 1 client -> a host leaving (draining)", "target tracking"),
        "drain": ("aws: a leaving host drained and gone", "deregistration delay + lifecycle hook"),
    }
    by = {}
    for key, (name, command) in figures.items():
        by[key] = Measurement(name=name, tool="ngcx", unit="s", better="lower",
                              wall=Stats.of([r[key] for r in rounds]), command=command)
        result.measurements.append(by[key])
    result.ratios.append(ratio("scale-out reaction / a 1-host service made", by["ready"], by["made"]))
    result.extra = {"aws": rounds}
    result.notes = NOTES


def _rounds(work: Path, repeat: int) -> list[dict[str, float]]:
    import docker
    from e2e.clouds import reach_from_hosts
    from emulators.aws_autoscaling import AutoScaling
    from emulators.aws_ec2 import Ec2Emulator
    from emulators.docker_hosts import DockerHosts, RegistryRelay, bridge_gateway

    from .deploy_phases import AWS_KEY, LAUNCH_S, SECRET, START_S, _env, ngcx, project_copy
    from .service_clouds import _certificate

    root = project_copy(work)
    client = docker.from_env()
    gateway = bridge_gateway(client)
    with contextlib.ExitStack() as stack:
        relay = stack.enter_context(RegistryRelay("127.0.0.1:5000", listen_host=gateway))
        hosts = DockerHosts(client, insecure_registries=[relay.address])
        emu = stack.enter_context(Ec2Emulator(hosts, access_keys={AWS_KEY: SECRET}, boot_seconds=LAUNCH_S,
                                              start_seconds=START_S, metadata_host=gateway))
        api = reach_from_hosts(stack, emu, hosts, gateway, "169.254.169.254:80")
        scaling = AutoScaling(emu, time_scale=TIME_SCALE)
        env = {**_env("aws", emu, relay.address, work / "autoscale"), "NGCX_ECR_API_HOST_ENDPOINT": api,
               "HTTP_PROXY": "", "HTTPS_PROXY": "", "http_proxy": "", "https_proxy": ""}
        Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        certificate, ca = _certificate("aws", emu, env, work)
        env["SSL_CERT_FILE"] = str(ca)
        ngcx(root, env, "push", "ngcx-app/onnx-zero-code:latest", "--registry", "ecr://us-east-1/bench")
        ngcx(root, env, "hosts", "bake", "--cloud", "aws", "--region", "us-east-1")
        found = [_round(root, env, emu, scaling, certificate, ca, f"s{n + 1}") for n in range(repeat)]
        if scaling.errors:
            raise SystemExit(f"the Auto Scaling double failed: {scaling.errors}")
        return found


def _round(root: Path, env: dict[str, str], emu: Any, scaling: Any, certificate: str, ca: Path,
           ref: str) -> dict[str, float]:
    """One service, `ref` (a fresh state store: round n makes s<n>), through the step and back; seconds."""
    import json
    import ssl

    import boto3
    from deploy_helpers import Load
    from e2e.test_service_clouds import payload

    from .deploy_phases import ngcx
    from .service import timed

    made_s = timed(root, env, "deploy", "--cloud", "aws", "--gpu", "A10G", "--gpu-mode", "auto", "--certificate",
                   certificate, "--min", "1", "--max", "3", "--target-requests", str(TARGET))
    svc = json.loads(ngcx(root, env, "deployments", "show", ref, "--json").stdout)
    key = ngcx(root, env, "deployments", "key", ref).stdout.strip()
    clients = {name: boto3.client(name, endpoint_url=emu.endpoint, region_name="us-east-1",
                                  aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                                  aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
               for name in ("autoscaling", "elbv2")}
    group, target_group = svc["config"]["group"]["ref"]["name"], svc["balancer"]["group_id"]
    body, _ = payload(root)
    context = ssl.create_default_context(cafile=str(ca))
    decided = len([d for d in scaling.decisions if d[0] == group])
    with Load(svc["endpoint"], key, body, context, clients=1, rate=RATE) as base:
        base.settle(10)
        time.sleep(3 * scaling.period_s)
        t_step = time.monotonic()
        with Load(svc["endpoint"], key, body, context, clients=7, rate=RATE) as step:
            t_decide = _until(lambda: len([d for d in scaling.decisions if d[0] == group]) > decided)
            t_ready = _until(lambda: _healthy(clients["elbv2"], target_group) >= 2)
            step.settle(20)
        t_drop = time.monotonic()
        t_leave = _until(lambda: any(i["LifecycleState"].startswith("Terminating")
                                     for i in _instances(clients["autoscaling"], group)))
        t_gone = _until(lambda: len(_instances(clients["autoscaling"], group)) == 1)
        base.settle(10)
    if base.errors or step.errors:
        raise SystemExit(f"failed requests under the load step: {(base.errors + step.errors)[:5]}")
    ngcx(root, env, "deployments", "destroy", ref, "--yes")
    return {"made": made_s, "decide": t_decide - t_step, "ready": t_ready - t_step, "scale_in": t_leave - t_drop,
            "drain": t_gone - t_leave, "requests": float(base.total() + step.total())}


def _until(check: Any) -> float:
    deadline = time.monotonic() + STEP_MAX_S
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.2)
    raise SystemExit(f"not within {STEP_MAX_S:.0f} s: {check}")


def _healthy(elbv2: Any, target_group: str) -> int:
    rows = elbv2.describe_target_health(TargetGroupArn=target_group)["TargetHealthDescriptions"]
    return sum(1 for r in rows if r["TargetHealth"]["State"] == "healthy")


def _instances(autoscaling: Any, group: str) -> list[dict]:
    found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return found[0]["Instances"] if found else []
