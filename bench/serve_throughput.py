"""Local throughput of `ngcx-runtime serve`'s HTTP path (CPU, ONNX Runtime), clients in this process.

Why: the server must not be the bottleneck in front of a GPU (ResNet-50 batch 256 FP16 is
~77 MB per request). Two measurements:

  io     binary FP32 requests of [batch, 3, 224, 224] to a near-free model (GlobalAveragePool),
         so the figure is the server's body path (readinto -> np.frombuffer -> engine -> binary
         response), with a raw-socket ceiling for the same payload size.
  batch  batch-1 requests from N client threads to conv_net (64x64): req/s, latency and the
         mean merged batch, to show dynamic batching at work.

Usage:  python bench/serve_throughput.py io --batch 16 --concurrency 1 --seconds 4
        python bench/serve_throughput.py batch --concurrency 8 --delay-ms 2 --seconds 4
Numbers on a loaded 2-core box are noisy: print the load average next to them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))


def _gap_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["y"])], "gap",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 1, 1])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _clients(port: int, path: str, header: bytes, payload: bytes, conc: int, secs: float):
    """conc keep-alive http.client threads for secs; returns (requests done, latencies in ms)."""
    counts, lats = [0] * conc, [[] for _ in range(conc)]
    stop = time.monotonic() + secs

    def worker(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop:
            t = time.perf_counter()
            c.putrequest("POST", path)
            c.putheader("Content-Length", str(len(header) + len(payload)))
            c.putheader("Inference-Header-Content-Length", str(len(header)))
            c.endheaders()
            c.send(header)
            c.send(payload)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(body[:200])
            lats[i].append((time.perf_counter() - t) * 1e3)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(secs + 120)
    return sum(counts), np.concatenate([np.asarray(x) for x in lats]) if any(lats) else np.zeros(1)


def _binary_header(name: str, x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()


def _socket_ceiling(nbytes: int, secs: float) -> float:
    """MB/s of one Python sendall -> recv_into loop over loopback with the same payload size."""
    buf, out = bytearray(nbytes), bytes(nbytes)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        c, _ = srv.accept()
        mv = memoryview(buf)
        while True:
            got = 0
            while got < nbytes:
                n = c.recv_into(mv[got:])
                if not n:
                    return
                got += n
            c.sendall(b"k")

    threading.Thread(target=serve, daemon=True).start()
    c = socket.create_connection(srv.getsockname())
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < secs:
        c.sendall(out)
        c.recv(1)
        n += 1
    dt = time.monotonic() - t0
    c.close()
    srv.close()
    return n * nbytes / dt / 1e6


def run_io(args, tmp: Path) -> None:
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    engine = load(_gap_model(tmp / "gap.onnx"), backend="onnxruntime")
    x = np.random.default_rng(0).random((args.batch, 3, 224, 224), dtype=np.float32)
    with start_server(engine, "127.0.0.1", 0, max_batch=max(args.batch, 256), max_queue_delay_ms=0) as h:
        n, lat = _clients(h.port, "/v2/models/gap/infer", _binary_header("x", x), x.tobytes(),
                          args.concurrency, args.seconds)
        calls = h.stats()["engine_calls"]
    mb = x.nbytes / 1e6
    print(f"io: batch {args.batch} ({mb:.1f} MB FP32/request), {args.concurrency} client(s): "
          f"{n / args.seconds:.1f} req/s, {n * mb / args.seconds:.0f} MB/s, "
          f"p50 {np.percentile(lat, 50):.2f} ms "
          f"({calls} engine calls); raw-socket ceiling {_socket_ceiling(x.nbytes, 2):.0f} MB/s; "
          f"load {os.getloadavg()[0]:.1f}")


def run_batch(args, tmp: Path) -> None:
    import models

    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    engine = load(models.conv_net(tmp / "conv.onnx", size=64), backend="onnxruntime")
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    with start_server(engine, "127.0.0.1", 0, max_batch=64, max_queue_delay_ms=args.delay_ms) as h:
        n, lat = _clients(h.port, "/v2/models/conv/infer", _binary_header("input", x), x.tobytes(),
                          args.concurrency, args.seconds)
        s = h.stats()
    print(f"batch: {args.concurrency} clients, batch-1 requests, queue delay {args.delay_ms} ms: "
          f"{n / args.seconds:.0f} req/s, p50 {np.percentile(lat, 50):.2f} ms, "
          f"p99 {np.percentile(lat, 99):.2f} ms, "
          f"{s['engine_calls']} engine calls for {s['requests']} requests "
          f"(mean batch {s['inferences'] / max(1, s['engine_calls']):.1f}); load {os.getloadavg()[0]:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["io", "batch"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--delay-ms", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (run_io if args.mode == "io" else run_batch)(args, Path(d))


if __name__ == "__main__":
    main()
