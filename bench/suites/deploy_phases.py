"""Deploy -> first successful inference, per phase (api, boot, pull, start, ready), for every path.

    .venv/bin/python -m bench.suites.deploy_phases [--repeat 3] [--running-only] [--out FILE.json]

(from the repo root; FILE.json defaults to bench/results/deploy_phases.json; `python -m bench deploy` runs the
same measurement as a suite).

Paths (issue 10's performance table, issue 11's for AWS): local (image present), and through the real
Alibaba Cloud SDK / boto3 against the ECS emulator / moto + tests/emulators/aws_ec2.py, whose instances are
real machines (tests/emulators): a running host reused,
a stopped host restarted, a fresh host from a baked image, a fresh host that pulls, and a fresh host from the
baked image serving the app's next release (it pulls only the layers the release changed). The emulator's
API-side delays are set to published figures where one exists, since no Alibaba Cloud figure is
published (cold-start.md §1), and the same for AWS: start from stopped 16.4 s, launch 17.8 s (EC2 pending -> running,
cold-start.md [V1]); the machine's own boot (its dockerd) and every pull are real, on this host.
Each row ends with a real KServe inference checked against the example's expected logits.
--running-only measures the running host alone (per cloud: one fresh host that pulls, not a row, then
--repeat redeploys onto it): ~6 minutes instead of ~26.
Needs: scripts/setup.sh done, the onnx-zero-code example built (`ngcx build` in a copy with its model
exported), the registry on 127.0.0.1:5000.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e")]

START_S, LAUNCH_S = 16.4, 17.8      # cold-start.md [V1]: EC2 start-from-stopped and cold launch, pending -> running
AK, AWS_KEY, SECRET = "LTAIbenchKey", "AKIANGCXBENCH0000001", "bench-secret-not-printed"
PHASES = ("api", "boot", "pull", "start", "ready")
NEW_RELEASE = "fresh-host (baked, new release)"


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """This process's environment with `env` on top, put back after (in-process calls of the library that read
    the round's state store and the emulator's endpoint and keys from it)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ngcx(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ngcx", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"ngcx {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done


def last_record(cwd: Path, env: dict[str, str]) -> dict:
    return json.loads(ngcx(cwd, env, "deployments", "ls", "--all", "--json").stdout)[0]


def measured(cwd: Path, env: dict[str, str], args: list[str]) -> dict:
    """One deploy timed from the outside (wall) and from its record (phases), then one real inference."""
    from deploy_helpers import one_inference

    t0 = time.monotonic()
    done = ngcx(cwd, env, "deploy", *args)
    wall = time.monotonic() - t0
    t1 = time.monotonic()
    one_inference(cwd, done.stdout.strip(), env)
    first_inference = time.monotonic() - t1
    rec = last_record(cwd, env)
    return {"path": rec["path"], "wall_s": round(wall, 3), "first_inference_s": round(first_inference, 3),
            **{p: rec["phases"].get(p) for p in PHASES}, "record": rec["id"]}


def project_copy(work: Path) -> Path:
    root = work / "onnx-zero-code"
    shutil.copytree(REPO / "examples" / "onnx-zero-code", root, ignore=shutil.ignore_patterns("model", "calib.npz"))
    subprocess.run([sys.executable, "export.py"], cwd=root, check=True, capture_output=True, timeout=300)
    ngcx(root, {"NGCX_BASE": "offline"}, "build")
    return root


def local_rows(root: Path, work: Path, repeat: int) -> list[dict]:
    env = {"NGCX_STATE_DIR": str(work / "state-local")}
    rows = [measured(root, env, ["--cloud", "local"]) for _ in range(repeat)]
    ngcx(root, env, "deployments", "destroy", str(rows[-1]["record"]), "--yes")
    return rows


def cloud_rows(root: Path, work: Path, repeat: int, running_only: bool = False) -> dict[str, list[dict]]:
    """Every VM path on every emulated cloud: keys '<cloud> <path>' (e.g. 'aliyun running-host')."""
    import docker
    from clouds import reach_from_hosts
    from emulators.docker_hosts import DockerHosts, RegistryRelay, bridge_gateway

    client = docker.from_env()
    gateway = bridge_gateway(client)
    rows: dict[str, list[dict]] = {}
    with RegistryRelay("127.0.0.1:5000", listen_host=gateway) as relay:
        for cloud in ("aliyun", "aws"):
            hosts = DockerHosts(client, insecure_registries=[relay.address])
            with contextlib.ExitStack() as stack:
                emu = stack.enter_context(_emulator(cloud, hosts, gateway))
                # as tests/e2e/clouds.py: hosts reach the metadata service (their pull role) and the API
                api = reach_from_hosts(stack, emu, hosts, gateway, METADATA[cloud])
                env = {**_env(cloud, emu, relay.address, api, work / cloud), "HTTP_PROXY": "", "HTTPS_PROXY": "",
                       "http_proxy": "", "https_proxy": ""}
                paths = _running_path if running_only else _paths
                rows.update({f"{cloud} {k}": v for k, v in paths(root, env, cloud, relay, repeat).items()})
    return rows


METADATA = {"aliyun": "100.100.100.200:80", "aws": "169.254.169.254:80"}   # each cloud's own metadata address


def _emulator(cloud: str, hosts, gateway: str):
    if cloud == "aliyun":
        from emulators.aliyun_ecs import EcsEmulator

        return EcsEmulator(hosts, access_keys={AK: SECRET}, boot_seconds=LAUNCH_S, start_seconds=START_S,
                           metadata_host=gateway)
    from emulators.aws_ec2 import Ec2Emulator

    return Ec2Emulator(hosts, access_keys={AWS_KEY: SECRET}, boot_seconds=LAUNCH_S, start_seconds=START_S,
                       metadata_host=gateway)


def _env(cloud: str, emu, relay: str, api: str, home: Path) -> dict[str, str]:
    common = {"NGCX_STATE_DIR": str(home / "state"), "DOCKER_CONFIG": str(home / "docker"), "HOME": str(home)}
    if cloud == "aliyun":
        return {**common, "ALIBABA_CLOUD_ACCESS_KEY_ID": AK, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET,
                "NGCX_ALIYUN_ECS_ENDPOINT": emu.endpoint, "NGCX_ACR_ENDPOINT": "127.0.0.1:5000",
                "NGCX_ACR_VPC_ENDPOINT": relay, "NGCX_ACR_INSTANCE_ID": "cri-bench", "NGCX_ACR_API_HOST_ENDPOINT": api}
    return {**common, "AWS_ACCESS_KEY_ID": AWS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": emu.endpoint, "AWS_EC2_METADATA_DISABLED": "true",
            "NGCX_ECR_ENDPOINT": "127.0.0.1:5000", "NGCX_ECR_VPC_ENDPOINT": relay, "NGCX_ECR_API_HOST_ENDPOINT": api}


def _deploy_args(root: Path, env: dict[str, str], cloud: str) -> tuple[list[str], str, str]:
    """(the deploy's arguments, the registry, the region) for `cloud`, the app pushed there."""
    gpu, registry, region = {"aliyun": ("A10", "acr://cn-hangzhou/bench", "cn-hangzhou"),
                             "aws": ("A10G", "ecr://us-east-1/bench-aws", "us-east-1")}[cloud]  # own repo: own key
    Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
    ngcx(root, env, "push", "ngcx-app/onnx-zero-code:latest", "--registry", registry)
    return ["--cloud", cloud, "--gpu", gpu, "--gpu-mode", "auto"], registry, region


def _running_path(root: Path, env: dict[str, str], cloud: str, relay, repeat: int) -> dict[str, list[dict]]:
    """--running-only: one fresh host that pulls (not a row), then `repeat` redeploys onto it."""
    deploy, _registry, _region = _deploy_args(root, env, cloud)
    measured(root, env, deploy)
    rows = [measured(root, env, deploy) for _ in range(repeat)]
    ngcx(root, env, "deployments", "destroy", str(rows[-1]["record"]), "--yes")
    return {"running-host": rows}


def _paths(root: Path, env: dict[str, str], cloud: str, relay, repeat: int) -> dict[str, list[dict]]:
    """A fresh host that pulls, then the bake, then per repetition: fresh (baked), running x2, stopped;
    then per repetition a new release of the app on a fresh host of the same baked image."""
    rows: dict[str, list[dict]] = {"running-host": [], "stopped-host": [], "fresh-host (baked)": [],
                                   "fresh-host (pull)": [], NEW_RELEASE: []}
    deploy, registry, region = _deploy_args(root, env, cloud)
    before = relay.bytes_from_target
    row = measured(root, env, deploy)       # fresh, no baked image: the whole image crosses the VPC endpoint
    row["relay_bytes"] = relay.bytes_from_target - before
    rows["fresh-host (pull)"].append(row)
    ngcx(root, env, "deployments", "destroy", str(row["record"]), "--yes")
    t0 = time.monotonic()
    ngcx(root, env, "hosts", "bake", "--cloud", cloud, "--region", region)
    bake_s = time.monotonic() - t0
    for _ in range(repeat):
        rows["fresh-host (baked)"].append(measured(root, env, deploy))
        for _ in range(2):                      # the same host again: running, then stopped
            rows["running-host"].append(measured(root, env, deploy))
        ngcx(root, env, "deployments", "stop", str(last_record(root, env)["id"]))
        rows["stopped-host"].append(measured(root, env, deploy))
        ngcx(root, env, "deployments", "destroy", str(last_record(root, env)["id"]), "--yes")
    rows[NEW_RELEASE] = _new_releases(root, env, deploy, registry, relay, repeat)
    rows["bake_s"] = [{"wall_s": round(bake_s, 1)}]
    return rows


def _new_releases(root: Path, env: dict[str, str], deploy: list[str], registry: str, relay,
                  repeat: int) -> list[dict]:
    """The app's next releases, each on a fresh host of the image baked with the first: the host has the base,
    Python and CUDA layers, so the pull is the layers a release changed (here ngcx.yaml's: one serving setting).
    This is the bake's point for every image on the same stack; the release is put back after."""
    spec = root / "ngcx.yaml"
    original = spec.read_text()
    out = []
    try:
        for i in range(repeat):
            spec.write_text(re.sub(r"max_queue_delay_ms: [0-9.]+", f"max_queue_delay_ms: {2 + i}.0", original, count=1))
            ngcx(root, {"NGCX_BASE": "offline"}, "build")
            ngcx(root, env, "push", "ngcx-app/onnx-zero-code:latest", "--registry", registry)
            before = relay.bytes_from_target
            row = measured(root, env, deploy)
            row["relay_bytes"] = relay.bytes_from_target - before
            out.append(row)
            ngcx(root, env, "deployments", "destroy", str(row["record"]), "--yes")
    finally:
        spec.write_text(original)
        ngcx(root, {"NGCX_BASE": "offline"}, "build")
    return out


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in ("wall_s", *PHASES, "first_inference_s"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            out[key] = {"min": min(values), "median": round(statistics.median(values), 3), "max": max(values)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--running-only", action="store_true", help="the running host alone (module docstring)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "deploy_phases.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ngcx-bench-deploy-"))
    try:
        root = project_copy(work)
        local = {} if args.running_only else {"local": local_rows(root, work, args.repeat)}
        results = {**local, **cloud_rows(root, work, args.repeat, args.running_only)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"machine": {"cores": os.cpu_count(), "load": os.getloadavg(), "python": platform.python_version()},
              "emulator": {"start_seconds": START_S, "boot_seconds": LAUNCH_S},
              "command": f"python -m bench.suites.deploy_phases --repeat {args.repeat}"
                         + (" --running-only" if args.running_only else ""),
              "rows": results, "summary": {k: summary(v) for k, v in results.items() if not k.endswith("bake_s")}}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'path':22} " + " ".join(f"{p:>7}" for p in (*PHASES, "total")) + "   (median s)")
    for path, stats in report["summary"].items():
        cells = [stats.get(p, {}).get("median") for p in PHASES]
        total = stats.get("wall_s", {}).get("median")
        print(f"{path:22} " + " ".join(f"{c:7.2f}" if c is not None else "      -" for c in (*cells, total)))


if __name__ == "__main__":
    main()
