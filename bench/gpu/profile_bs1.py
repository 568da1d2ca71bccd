"""Profile one ResNet-50 server under batch 1 from 64 clients with py-spy (issue 24, item 3).

    python3 bench/gpu/profile_bs1.py OUT_DIR [PY_SPY]

Run from a checkout's root on a GPU host with torch; PY_SPY is the py-spy binary (default: `py-spy` on PATH).
Writes OUT_DIR/prof_gil.txt (samples of the thread holding the GIL), OUT_DIR/prof_all.txt (every thread) and
OUT_DIR/stats.json (the model's statistics: batch sizes, queue and compute times). Saved run:
bench/results/gpu/targets/ (pyspy_gil_bs1_c64_h100.txt, stats_bs1_c64_h100.json).
"""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    spy = sys.argv[2] if len(sys.argv) > 2 else "py-spy"
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/ngcx-profile-bs1")
    (work / "logs").mkdir(parents=True, exist_ok=True)
    env = serving._shim_env()
    env["NGCX_RUNTIME_CACHE"] = str(work / "cache")
    r50 = serving.prepare(work, 3, env, "resnet50")["plans"]["resnet50"]
    make = serving.BinaryRequest("resnet50", r50["inputs"][0][0], r50["outputs"][0][0], 1)
    srv = serving.Server([r50["dir"], "--max-queue-delay-ms", "1", "--max-connections", "1024"], env,
                         work / "logs" / "server.log")
    try:
        print("warm", json.dumps(serving.load(srv.port, make, 64, 3)), flush=True)
        for mode in ("gil", "all"):
            argv = [spy, "record", "-p", str(srv.proc.pid), "-d", "5", "-r", "250", "-f", "raw", "-o",
                    str(out / f"prof_{mode}.txt"), "--threads", "--nonblocking"] + (["--gil"] if mode == "gil" else [])
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(mode, json.dumps(serving.load(srv.port, make, 64, 5)), flush=True)
            print(proc.communicate()[0][-800:], flush=True)
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/v2/models/resnet50/stats", timeout=10) as r:
            (out / "stats.json").write_bytes(r.read())
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
