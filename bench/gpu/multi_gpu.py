"""Served ResNet-50 throughput on one GPU and on every visible GPU of the host: does serve use them all?

    python3 bench/gpu/multi_gpu.py --out FILE.json [--runs 3] [--seconds 8] [--batch 64] [--clients N]
                                   [--request shm|body] [--instances-per-gpu 1] [--work DIR]

Run from the repo root on a GPU host (NCCL_NVLS_ENABLE=0 is set for the servers: NVLink multicast stays off).
Asked for by issue 50, part 3 ("every GPU of the host serves"; done when 2 GPUs give >= 1.9x and 4 GPUs >= 3.7x
the same server on one GPU).

What it does: one ResNet-50 plan (torchvision, random weights, `ngcx-runtime optimize --precision fp16`, the
PyTorch backend) served by `python -m ngcx_runtime.serve` twice per run, in turn: with `--gpus 0` (one GPU), and
with no placement flag at all (the default: an instance on every visible GPU, one batcher feeding them). Each
server gets the same load: N keep-alive clients (default 16 per visible GPU, over forked processes) sending batch-B
requests through Triton's system shared memory (default; --request body puts the tensor in the HTTP body), for
--seconds after a one-second warm-up. A run is one such pair; --runs of them (>= 3) give the median img/s of each
server with min-max, and the median all/one throughput ratio with min-max (each run's ratio from its own pair).
After each all-GPU server's load, its /metrics' nv_inference_instance_exec_count{device="cuda:N"} says how many
batches each GPU ran: the proof that every GPU worked, next to the figure.

Import path: like bench/gpu/serving.py (whose prepare, Server, load and request makers this reuses), a symlink
shim makes ngcx_runtime importable from an uninstalled checkout in every child process.

Unproven when written: only single-GPU machines were lent, so the ratios for 2 and 4 GPUs were never measured; on
one GPU both servers are the same placement and the ratio is ~1.0 (the JSON says how many GPUs were visible).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))      # bench/gpu: serving.py's helpers

import serving  # noqa: E402


def visible_gpus(env: dict[str, str]) -> int:
    """What serve itself will count (runtime/placement.py host_visible_gpus), asked in a child as serve runs."""
    code = "from ngcx_runtime.placement import host_visible_gpus as h; print(h() or 0)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=serving.REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"cannot count the GPUs: {proc.stderr[-500:]}")
    return int(proc.stdout.strip().splitlines()[-1])


def device_calls(port: int) -> dict[str, int]:
    """nv_inference_instance_exec_count per device label, from the server's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    calls: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_instance_exec_count{"):
            labels, _, value = line.rpartition(" ")
            device = labels.split('device="', 1)[1].split('"', 1)[0]
            calls[device] = calls.get(device, 0) + int(float(value))
    return calls


def one_server(tag: str, args: list[str], env: dict[str, str], logs: Path, make: Any, clients: int,
               seconds: float, batch: int) -> dict[str, Any]:
    """Start, load, read the per-device counters, stop; one row."""
    server = serving.Server(args, env, logs / f"server_{tag}.log")
    try:
        res = serving.load(server.port, make, clients, seconds)
        row: dict[str, Any] = {"server": tag, "args": args, "ready_s": server.ready_s, **res}
        row["img_s"] = round(res.get("req_s", 0.0) * batch, 1)
        row["device_exec_count"] = device_calls(server.port)
        return row
    finally:
        server.stop()
        serving._cleanup_shm()


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    ap.add_argument("--runs", type=int, default=3, help="pairs of (one GPU, all GPUs) servers; at least 3")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per load (after 1 s of warm-up)")
    ap.add_argument("--batch", type=int, default=64, help="images per request")
    ap.add_argument("--clients", type=int, default=None, help="concurrent clients (default 16 per visible GPU)")
    ap.add_argument("--request", choices=("shm", "body"), default="shm")
    ap.add_argument("--instances-per-gpu", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None, help="work folder (plan, plan cache); reuse it to skip the "
                                                            "optimize step")
    args = ap.parse_args()
    if args.runs < 3:
        ap.error("--runs must be at least 3 (a median of fewer says little)")
    env = serving._shim_env()
    work = args.work or Path(tempfile.mkdtemp(prefix="ngcx-multi-gpu-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env["NGCX_RUNTIME_CACHE"] = str(work / "cache")
    gpus = visible_gpus(env)
    if gpus < 1:
        print("multi_gpu: no GPU visible here; this bench serves on GPUs", file=sys.stderr)
        return 2
    clients = args.clients or 16 * gpus
    report: dict[str, Any] = {"command": " ".join(sys.argv), "visible_gpus": gpus, "clients": clients,
                              "batch": args.batch, "request": args.request, "seconds": args.seconds, "rows": []}
    if gpus == 1:
        report["note"] = "one GPU visible: both servers place on GPU 0, so the ratio only checks the 1-GPU path"

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))

    prep = serving.prepare(work, args.seconds, env, models="resnet50", r50_profile="1,8,32,64,128,256")
    report.update({k: prep[k] for k in ("gpu", "torch", "torchvision", "inproc")})
    plan = prep["plans"]["resnet50"]
    inp, out = plan["inputs"][0][0], plan["outputs"][0][0]
    maker = serving.ShmRequest if args.request == "shm" else serving.BinaryRequest
    make = maker("resnet50", inp, out, args.batch)
    common = [plan["dir"], "--max-queue-delay-ms", "1", "--max-connections", "1024", "--max-batch", "256",
              "--instances-per-gpu", str(args.instances_per_gpu)]
    write()
    ratios: list[float] = []
    for run in range(args.runs):
        pair = {}
        for tag, extra in (("one_gpu", ["--gpus", "0"]), ("all_gpus", [])):
            row = one_server(f"{tag}_{run}", common + extra, env, logs, make, clients, args.seconds, args.batch)
            row["run"] = run
            report["rows"].append(row)
            pair[tag] = row["img_s"]
            print(json.dumps(row), flush=True)
            write()
        if pair["one_gpu"] > 0:
            ratios.append(pair["all_gpus"] / pair["one_gpu"])
    for tag in ("one_gpu", "all_gpus"):
        report[f"{tag}_img_s"] = summary([r["img_s"] for r in report["rows"] if r["server"].startswith(tag)])
    report["ratio_all_over_one"] = summary(ratios) if ratios else None
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write()
    print(json.dumps({"visible_gpus": gpus, "ratio": report["ratio_all_over_one"],
                      "one_gpu_img_s": report["one_gpu_img_s"], "all_gpus_img_s": report["all_gpus_img_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
