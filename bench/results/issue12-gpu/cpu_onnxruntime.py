"""Issue 12's performance comparisons on a CPU with ONNX Runtime, as ratios to in-process.

    .venv/bin/python bench/results/issue12-gpu/cpu_onnxruntime.py > bench/results/issue12-gpu/cpu_onnxruntime.json

Model: tests/runtime/models.conv_net at 64x64, 32 channels (FP32, ONNX Runtime CPU EP). Rows:
in-process engine.infer at batch 64 and 1; served through system shared memory at batch 64 (input
and output in /dev/shm regions); served at batch 1 from many clients (binary body, dynamic
batching); 1 instance vs 2 instances at batch 1 without merging. Clients and server are separate
processes (bench/gpu_issue12.py's load generator). Figures on a shared 2-core box are noisy.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests" / "runtime")]

import gpu_issue12 as gi  # noqa: E402
import models  # noqa: E402

SIZE, CHANNELS, CLASSES = 64, 32, 10


class Shm:
    def __init__(self, batch: int):
        self.batch = batch

    def __call__(self, proc: int, thread: int):
        tag = f"ngcxb_{os.getpid()}_{proc}_{thread}"
        x = np.random.default_rng(thread).standard_normal((self.batch, 3, SIZE, SIZE)).astype(np.float32)
        sizes = {"in": x.nbytes, "out": self.batch * CLASSES * 4}
        for k, n in sizes.items():
            with open(f"/dev/shm/{tag}_{k}", "wb") as f:
                f.truncate(n)
        with open(f"/dev/shm/{tag}_in", "r+b") as f:
            f.write(x.tobytes())
        setup = [gi._http(f"/v2/systemsharedmemory/region/{tag}_{k}/register",
                          json.dumps({"key": f"/{tag}_{k}", "byte_size": n}).encode()) for k, n in sizes.items()]
        doc = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                           "parameters": {"shared_memory_region": f"{tag}_in", "shared_memory_byte_size": x.nbytes}}],
               "outputs": [{"name": "logits", "parameters": {"shared_memory_region": f"{tag}_out",
                                                             "shared_memory_byte_size": sizes["out"]}}]}
        return setup, gi._http("/v2/models/conv/infer", json.dumps(doc).encode())


class Body:
    def __init__(self, batch: int):
        x = np.random.default_rng(0).standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32).tobytes()
        head = json.dumps({"inputs": [{"name": "input", "shape": [batch, 3, SIZE, SIZE], "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(x)}}],
                           "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
        self.request = gi._http("/v2/models/conv/infer", head + x,
                                f"Inference-Header-Content-Length: {len(head)}\r\n")

    def __call__(self, proc: int, thread: int):
        return [], self.request


def inproc(path: Path, batch: int, seconds: float = 3.0) -> float:
    from ngcx_runtime.plan import load

    engine = load(path, backend="onnxruntime")
    x = {"input": np.random.default_rng(0).standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)}
    for _ in range(3):
        engine.infer(x)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        engine.infer(x)
        n += 1
    return round(n * batch / (time.perf_counter() - t0), 1)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="cpu12-"))
    path = models.conv_net(work / "conv.onnx", channels=CHANNELS, size=SIZE)
    env = gi._shim_env()
    out = {"cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "model": f"conv_net {SIZE}x{SIZE}x{CHANNELS}",
           "inproc_img_s": {"64": inproc(path, 64), "1": inproc(path, 1)}, "served": []}

    def served(tag: str, args: list[str], loads: list) -> None:
        server = gi.Server([str(path), "--name", "conv", "--max-queue-delay-ms", "1", *args], env,
                           work / f"{tag}.log")
        try:
            for name, make, conns, batch in loads:
                res = gi.load(server.port, make, conns, 3.0, procs=min(conns, 2))
                out["served"].append({"server": tag, "load": name, "connections": conns, "batch": batch,
                                      "img_s": round(res.get("req_s", 0) * batch, 1), "p50_ms": res.get("p50_ms"),
                                      "p99_ms": res.get("p99_ms"), "errors": res.get("error_count")})
        finally:
            server.stop()
            gi._cleanup_shm()

    served("1 instance", [], [("shm_bs64", Shm(64), 2, 64), ("body_bs64", Body(64), 2, 64),
                              ("body_bs1_many", Body(1), 16, 1)])
    served("1 instance, no merging", ["--max-batch", "1"], [("body_bs1", Body(1), 8, 1)])
    served("2 instances, no merging", ["--max-batch", "1", "--instances", "2"], [("body_bs1", Body(1), 8, 1)])
    base = out["inproc_img_s"]
    for row in out["served"]:
        row["ratio_to_inproc"] = round(row["img_s"] / base[str(64 if row["batch"] == 64 else 1)], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
