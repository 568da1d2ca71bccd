"""Lazy pulling (eStargz) against a full pull, to the first inference, on fresh containerd machines.

    python3 bench/lazy_pull.py --bin DIR --full REF --lazy REF [--model convnet] [--rounds 3] [--out FILE.json]

Issue 24 item 6 asks for lazy pulling where the engine has it. The hosts' engine (Debian's Docker 20.10) takes no
snapshotter plugin, so this measures what a host running containerd with the stargz snapshotter would get,
against the same containerd pulling the gzip image whole, interleaved over rounds; each try is a fresh machine
(the emulator's host image, tests/emulators/host/: its own containerd, empty disk volumes, /dev/fuse,
the cgroup tree as the emulator's machines get it) on the
host's network, pulling from the loopback registry, then `ctr run` of the image's own command and one KServe v2
inference (the model's first input, zeros) as soon as /v2/health/ready answers.

DIR holds `ctr-remote` (Debian's stargz-snapshotter package: the converter and client) and
`containerd-stargz-grpc` (the snapshotter: Debian packages its library but no command; built from that library,
see bench/results/lazy-pull/README.md). REF --lazy is REF --full converted with
`ctr-remote image convert --estargz --oci` and pushed to the same registry.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: `bench` as a package

from bench.core import Stats  # noqa: E402 - after the import path it needs

# Loopback only: a proxy from the environment (HTTP_PROXY) must not carry these requests.
LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))

DOCKER = "/usr/bin/docker"
MACHINE_IMAGE = "ngcx-test/ecs-host"
READY_URL = "http://127.0.0.1:8000/v2/health/ready"
MACHINE = r"""
mkdir -p /etc/containerd
printf '%s\n' 'version = 2' '[proxy_plugins]' '  [proxy_plugins.stargz]' '    type = "snapshot"' \
  '    address = "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock"' > /etc/containerd/config.toml
/x/containerd-stargz-grpc >/var/log/sgz.log 2>&1 &
containerd --config /etc/containerd/config.toml >/var/log/containerd.log 2>&1 &
i=0; until ctr version >/dev/null 2>&1 && [ -S /run/containerd-stargz-grpc/containerd-stargz-grpc.sock ]; do
  i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done
echo up; exec sleep infinity
"""


def sh(*args: str, timeout: float = 900) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:6])} failed: {(done.stderr or done.stdout)[-1500:]}")
    return done.stdout


def machine_image() -> str:
    out = sh(DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}", MACHINE_IMAGE)
    if not out.strip():
        raise SystemExit(f"no {MACHINE_IMAGE} image: run the deploy tests or bench once (tests/emulators/host/)")
    return out.split()[0]


def start_machine(name: str, bin_dir: Path) -> None:
    """A fresh machine: its own containerd and snapshotter, empty disk volumes."""
    remove_machine(name)
    sh(DOCKER, "run", "-d", "--name", name, "--network", "host", "--device", "/dev/fuse", "--cap-add", "SYS_ADMIN",
       "--security-opt", "apparmor=unconfined", "--security-opt", "seccomp=unconfined",
       "-v", f"{name}-ctd:/var/lib/containerd", "-v", f"{name}-sgz:/var/lib/containerd-stargz-grpc",
       "-v", f"{bin_dir}:/x:ro", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
       "--entrypoint", "sh", machine_image(), "-c", MACHINE)
    deadline = time.monotonic() + 60
    while "up" not in sh(DOCKER, "logs", name):
        if time.monotonic() > deadline:
            raise SystemExit(f"machine {name} did not start: {sh(DOCKER, 'logs', name)[-800:]}")
        time.sleep(0.1)


def remove_machine(name: str) -> None:
    subprocess.run([DOCKER, "rm", "-f", name], capture_output=True)
    subprocess.run([DOCKER, "volume", "rm", "-f", f"{name}-ctd", f"{name}-sgz"], capture_output=True)


def first_inference(name: str, deadline: float) -> None:
    """Wait for ready, then one inference of the model's first input (zeros) that must answer 200."""
    while True:
        try:
            with LOOPBACK.open(READY_URL, timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server was not ready in time")
        time.sleep(0.05)
    with LOOPBACK.open(f"http://127.0.0.1:8000/v2/models/{name}", timeout=10) as r:
        spec = json.load(r)["inputs"][0]
    shape = [1 if d < 0 else d for d in spec["shape"]]
    count = math.prod(shape)
    body = json.dumps({"inputs": [{"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                                   "data": [0] * count}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:8000/v2/models/{name}/infer", body,
                                 {"Content-Type": "application/json"})
    with LOOPBACK.open(req, timeout=120) as r:
        assert r.status == 200 and json.load(r)["outputs"], "the first inference did not answer"


def one(mode: str, ref: str, bin_dir: Path, model: str) -> dict:
    name = f"ngcx-lazy-{mode}"
    start_machine(name, bin_dir)
    try:
        t0 = time.monotonic()
        if mode == "lazy":
            sh(DOCKER, "exec", name, "/x/ctr-remote", "images", "rpull", "--plain-http", ref)
        else:
            sh(DOCKER, "exec", name, "ctr", "images", "pull", "--plain-http", ref)
        t1 = time.monotonic()
        snap = ["--snapshotter", "stargz"] if mode == "lazy" else []
        sh(DOCKER, "exec", name, "ctr", "run", "-d", "--net-host", *snap, ref, "app")
        first_inference(model, time.monotonic() + 600)
        t2 = time.monotonic()
        return {"mode": mode, "pull_s": round(t1 - t0, 2), "run_to_first_inference_s": round(t2 - t1, 2),
                "total_s": round(t2 - t0, 2)}
    finally:
        remove_machine(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="folder with ctr-remote and containerd-stargz-grpc")
    parser.add_argument("--full", required=True, help="the gzip image (REGISTRY/REPO:TAG on 127.0.0.1)")
    parser.add_argument("--lazy", required=True, help="the same image as eStargz")
    parser.add_argument("--model", default="convnet", help="the model the image serves (its --name)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        for mode, ref in (("full", args.full), ("lazy", args.lazy)) if r % 2 == 0 else (("lazy", args.lazy),
                                                                                       ("full", args.full)):
            row = {"round": r + 1, **one(mode, ref, args.bin.resolve(), args.model)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {}
    for mode in ("full", "lazy"):
        for key in ("pull_s", "run_to_first_inference_s", "total_s"):
            stats = Stats.of([row[key] for row in rows if row["mode"] == mode])
            summary[f"{mode} {key}"] = {"min": stats.min, "median": stats.median, "max": stats.max}
    summary["lazy / full, total (medians)"] = round(summary["lazy total_s"]["median"] /
                                                    summary["full total_s"]["median"], 2)
    report = {"command": "python3 bench/lazy_pull.py " + " ".join(
        f"--{k} {v}" for k, v in (("bin", args.bin), ("full", args.full), ("lazy", args.lazy),
                                  ("rounds", args.rounds))), "rows": rows, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
