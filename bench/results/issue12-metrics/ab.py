"""A/B of served batch-1 latency: the runtime before issue 12 (old) vs with metrics (new), same engine.

Each variant runs `ngcx-runtime serve MODEL` in its own process; this process is the one client,
sending binary (tritonclient-style) requests over one keep-alive connection. Variants alternate.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

MODEL, N, ROUNDS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
HERE = os.path.dirname(os.path.abspath(__file__))
x = np.random.default_rng(0).random((1, 512), dtype=np.float32)
header = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                 "parameters": {"binary_data_size": x.nbytes}}],
                     "parameters": {"binary_data_output": True}}).encode()
body = header + x.tobytes()


def run(variant: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.join(HERE, variant)}
    p = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.cli", "serve", MODEL, "--port", "0", "--name", "lin",
                          "--max-queue-delay-ms", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    for line in p.stdout:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v2/models/", line)
        if m:
            break
    c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)))

    def one() -> None:
        c.request("POST", "/v2/models/lin/infer", body, {"Inference-Header-Content-Length": str(len(header))})
        r = c.getresponse()
        r.read()
        assert r.status == 200, r.status

    for _ in range(500):
        one()
    lat = []
    for _ in range(N):
        t = time.perf_counter()
        one()
        lat.append(time.perf_counter() - t)
    p.terminate()
    p.wait()
    us = np.array(lat) * 1e6
    return {"variant": variant, "p50_us": round(float(np.percentile(us, 50)), 1),
            "mean_us": round(float(us.mean()), 1), "p99_us": round(float(np.percentile(us, 99)), 1)}


rows = [run(v) for _ in range(ROUNDS) for v in ("old", "new")]
for r in rows:
    print(json.dumps(r))
for v in ("old", "new"):
    mine = [r for r in rows if r["variant"] == v]
    print(v, "median of p50:", float(np.median([r["p50_us"] for r in mine])),
          "median of mean:", float(np.median([r["mean_us"] for r in mine])))
