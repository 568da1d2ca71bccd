"""Issue 24's two served-GPU targets, each figure from ROUNDS rounds: median, min and max, and the worst round.

    python3 bench/gpu/targets.py --out DIR [--rounds 3] [--seconds 3] [--work DIR]
                                 [--profile 1,4,16,64,256] [--serve-args ARGS]

Run from a checkout's root on a GPU host (torch, torchvision); the script puts the checkout's
runtime/ on its servers' import path itself (serving.py's shim), so a plain clone works. Writes
DIR/targets.json; saved runs: bench/results/gpu/targets/.

  shm  ResNet-50 FP16, batch 256 through Triton's system shared memory from 8 connections, over the
       same round's in-process figure with host numpy in and out (pipelined, what the batcher does).
       Target: >= 90 % in the worst round.
  bs1  ResNet-50 FP16, batch 1 from 64 clients (the batcher merges them), over the same round's
       GPU-resident batch-1 figure in process. Target: >= 70 %.

One server (`python -m ngcx_runtime.serve PLAN --max-queue-delay-ms 1` plus --serve-args: `--mps 4` is
four processes behind the port, runtime/mps.py) and one reference process (the
same plan loaded in process) stay up for the whole run; each round measures the references first (the
server idle), then the two served loads (the reference process idle), so a round's ratio compares
figures taken seconds apart: the GPU's clocks drift over minutes (the references of one earlier run
spread 22.6k-24.3k img/s when taken all before the served rounds: targets_before_parts_h100.json).
HTTP client, fixed for every figure: serving.py's load generator (keep-alive raw sockets, 8 forked
processes), named in the report as "client".
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402  (bench/gpu/serving.py: plans, servers, load generator)

CLIENT = "bench/gpu/serving.py load(): keep-alive raw sockets from up to 8 forked processes"
TARGETS = {"shm": 0.90, "bs1": 0.70}

REFS = serving.TIMING + r'''
engine = plan.load(sys.argv[1])
x1 = torch.randn(1, 3, 224, 224, device="cuda").half().contiguous(memory_format=torch.channels_last)
feeds = make_inputs(engine.inputs, 256)
print("READY", flush=True)
for line in sys.stdin:
    gpu_bs1 = 1 / timed(lambda: engine.infer_device([x1]), 300)
    host_bs256 = 256 / pipelined(engine, feeds, 40)
    print("ROUND " + json.dumps({"round": int(line), "gpu_resident_bs1_img_s": round(gpu_bs1, 1),
                                 "host_pipelined_bs256_img_s": round(host_bs256, 1)}), flush=True)
'''


class References:
    """The plan in a process of its own, measured on demand (one line in, one ROUND line out)."""

    def __init__(self, plan_dir: str, env: dict[str, str], log: Path):
        self.log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-c", REFS, plan_dir], env=env, cwd=serving.REPO, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        self._expect("READY")

    def _expect(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"the reference process ended ({self.proc.wait()}): see {self.log.name}")

    def round(self, r: int) -> dict[str, float]:
        self.proc.stdin.write(f"{r}\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("ROUND ")[6:])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
        self.log.close()


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Per target and server: served img/s and the ratio to the same round's reference, over rounds."""
    refs = report["references"]
    out: dict[str, Any] = {}
    for row in report["rows"]:
        target = "shm" if row["load"].startswith("shm") else "bs1"
        ref = refs[row["round"]]["host_pipelined_bs256_img_s" if target == "shm" else "gpu_resident_bs1_img_s"]
        if "img_s" not in row:
            continue
        key = f"{target} {row['phase']}"
        out.setdefault(key, {"served": [], "ratio": [], "p99_ms": []})
        out[key]["served"].append(row["img_s"])
        out[key]["ratio"].append(row["img_s"] / ref)
        out[key]["p99_ms"].append(row["p99_ms"])
    summary = {}
    for key, figs in out.items():
        target = key.split()[0]
        summary[key] = {"served_img_s": spread(figs["served"]), "ratio": spread(figs["ratio"]),
                        "p99_ms": spread(figs["p99_ms"]), "target": TARGETS[target],
                        "met_in_worst_round": min(figs["ratio"]) >= TARGETS[target]}
    summary["references"] = {k: spread([r[k] for r in refs]) for k in refs[0] if k != "round"}
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--work", type=Path, default=None, help="work folder (plans); reuse it to skip rebuilding")
    ap.add_argument("--profile", default="1,4,16,64,256",
                    help="ResNet-50's batch buckets (optimize --batch); a new profile needs a new --work")
    ap.add_argument("--serve-args", default="", help="more `ngcx_runtime.serve` arguments, e.g. '--instances 2'")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be at least 3: median, min and max need that many")
    args.out.mkdir(parents=True, exist_ok=True)
    env = serving._shim_env()
    work = args.work or Path(tempfile.mkdtemp(prefix="ngcx-gpu-targets-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env["NGCX_RUNTIME_CACHE"] = str(work / "cache")
    report: dict[str, Any] = {"command": " ".join(sys.argv), "client": CLIENT, "rows": [], "references": []}

    def write() -> None:
        (args.out / "targets.json").write_text(json.dumps(report, indent=1))

    t0 = time.perf_counter()
    prep = serving.prepare(work, args.seconds, env, "resnet50", args.profile)
    report.update({k: prep[k] for k in ("gpu", "torch", "torchvision", "plans")})
    r50 = prep["plans"]["resnet50"]
    i50, o50 = r50["inputs"][0][0], r50["outputs"][0][0]
    loads = [("shm_bs256_c8", serving.ShmRequest("resnet50", i50, o50, 256), 8, 256),
             ("body_bs1_c64", serving.BinaryRequest("resnet50", i50, o50, 1), 64, 1)]
    refs = References(r50["dir"], env, work / "logs" / "references.log")
    server = serving.Server([r50["dir"], "--max-queue-delay-ms", "1", "--max-connections", "1024",
                             *shlex.split(args.serve_args)], env, work / "logs" / "server.log")
    report["server_ready_s"] = server.ready_s
    phase = "resnet50 " + (args.serve_args.strip() or "1 process")
    try:
        for r in range(args.rounds):
            report["references"].append(refs.round(r))
            for name, make, conns, batch in loads:
                res = serving.load(server.port, make, conns, args.seconds)
                row = {"phase": phase, "load": name, "round": r, "connections": conns, "batch": batch, **res}
                if "req_s" in res:
                    row["img_s"] = round(res["req_s"] * batch, 1)
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
            write()
    finally:
        server.stop()
        serving._cleanup_shm()
        refs.close()
    report["summary"] = summarize(report)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    write()
    print(json.dumps(report["summary"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
