"""Native stacks of the ResNet-18 servers' SIGSEGV (issue 24 item 4), on the lent GPU.

The bisect (old_runtime_bisect.sh, bisect/) put the end of the crash between 01_cd8916c (crashes) and
02_4d9c653 (clean) with two starts each; faulthandler's dumps show no Python thread as current, so the fault
is in native code. This starts servers of the given runtime trees in turn, each by e63d613's own harness
class (bench/gpu_issue12.py Server: Popen, /v2/health/ready polled by urllib every 0.5 s) on the plans the
harness prepared, with segv_native.so preloaded (the faulting thread's name and native stack, after
faulthandler's Python stacks), and records for every start whether it died.

usage: python3 .carry/oldrepro/old_runtime_native.py [--trees 00,01,02] [--until 540]
       (repository root; the folder from make_oldrepro.sh carried; $OUT from the device tool: native.tgz
       lands there)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = Path("/tmp/native")
PLANS = Path("/tmp/i12")
PRELOAD = Path("/tmp/segv_native.so")


def harness():
    """e63d613's bench/gpu_issue12.py as a module (its Server class is what started the crashing servers)."""
    spec = importlib.util.spec_from_file_location("gpu_issue12", HERE / "bench" / "gpu_issue12.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare() -> dict:
    """The plans, made by e63d613's harness as in every earlier run (ResNet-50 and ResNet-18, FP16)."""
    subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-o", str(PRELOAD), str(HERE / "segv_native.c"),
                    "-ldl"], check=True)
    with tarfile.open(HERE / "trees.tgz") as tar:
        tar.extractall(HERE, filter="data")
    with open(WORK / "prep.txt", "w") as sink:
        subprocess.run([sys.executable, "bench/gpu_issue12.py", "--out", str(WORK / "prep"), "--work", str(PLANS),
                        "--seconds", "0.5", "--skip", "shm,body,bs1,transport,small,mps"], cwd=HERE, stdout=sink,
                       stderr=subprocess.STDOUT, check=True)
    return json.loads((WORK / "prep" / "gpu_issue12.json").read_text())["plans"]["resnet18"]


def env_for(tree: str) -> dict[str, str]:
    """The harness's environment (_shim_env) with this tree's runtime as ngcx_runtime, plus the preload."""
    shim = Path(f"/tmp/shim_{tree}")
    shim.mkdir(exist_ok=True)
    if not (shim / "ngcx_runtime").exists():
        (shim / "ngcx_runtime").symlink_to(HERE / "trees" / tree / "runtime")
    env = dict(os.environ)
    env.pop("NGCX_RUNTIME_MPS", None)
    env.update(PYTHONPATH=str(shim), PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0", PYTHONFAULTHANDLER="1",
               NGCX_RUNTIME_CACHE=str(PLANS / "cache"), LD_PRELOAD=str(PRELOAD))
    return env


def start(h, tree: str, plan: str, n: int) -> dict:
    """One server of `tree` (the crashed phase's arguments: resnet18_1inst_nobatch), ready-waited, 2 s more
    alive or not, then stopped; its log kept as logs/TREE_N.log."""
    log = WORK / "logs" / f"{tree}_{n}.log"
    t0 = time.monotonic()
    row = {"tree": tree, "n": n}
    try:
        server = h.Server([plan, "--max-queue-delay-ms", "1", "--max-connections", "1024", "--max-batch", "1"],
                          env_for(tree), log)
    except RuntimeError as exc:
        row.update(died=True, when="before ready", error=str(exc).splitlines()[0][:80])
    else:
        time.sleep(2.0)
        code = server.proc.poll()
        row.update(ready_s=server.ready_s, died=code is not None, when="after ready" if code else "")
        server.stop()
        row["exit"] = server.proc.returncode
    row["seconds"] = round(time.monotonic() - t0, 1)
    row["native"] = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("native ")][:3]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default="00,01,02", help="prefixes of trees/order.txt entries, started in turn")
    ap.add_argument("--until", type=float, default=540.0, help="no new start after this many seconds")
    args = ap.parse_args()
    t0 = time.monotonic()
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    plan = prepare()["dir"]
    print(f"plans prepared in {time.monotonic() - t0:.0f} s", flush=True)
    order = (HERE / "trees" / "order.txt").read_text().split()
    trees = [next(t for t in order if t.startswith(p)) for p in args.trees.split(",")]
    h = harness()
    n = 0
    while time.monotonic() - t0 < args.until:
        n += 1
        for tree in trees:
            if time.monotonic() - t0 >= args.until:
                break
            row = start(h, tree, plan, n)
            print(json.dumps(row), flush=True)
            with open(WORK / "starts.jsonl", "a") as out:
                out.write(json.dumps(row) + "\n")
    for tree in trees:
        rows = [json.loads(line) for line in (WORK / "starts.jsonl").read_text().splitlines()]
        mine = [r for r in rows if r["tree"] == tree]
        print(f"{tree}: died in {sum(r['died'] for r in mine)} of {len(mine)} starts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
