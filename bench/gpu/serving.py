"""Served throughput on one GPU: shared memory vs the body, batch-1 merging, instances and MPS, transports.

    python3 bench/gpu/serving.py --out DIR [--seconds 4] [--skip shm,body,bs1,mps,small,transport] [--tag T]

Run from the repo root on a GPU host; writes DIR/serving[_T].json. Asked for by issue 12 (its Performance
section and the HTTP transport decision, item 7); saved runs: bench/results/gpu/serving/ and
bench/results/http-transport/.

What it measures, on the GPU it finds (named in the report), random-weight torchvision models
through `ngcx-runtime optimize --precision fp16` (PyTorch backend: torch.compile + CUDA graphs):

  inproc      ResNet-50 / ResNet-18 plans in one process: inputs already on the GPU (the
              GPU-resident figure) and host numpy in and out (serial and pipelined, what the
              server's batcher does).
  shm         ResNet-50 batch 256 served through Triton's system shared memory (inputs and outputs
              in /dev/shm regions, one per connection), vs the in-process host figure (target >= 90 %).
  body        the same batch 256 with the tensor in the HTTP body (binary extension).
  bs1         ResNet-50 batch 1 from many clients (dynamic batching merges them) vs the GPU-resident
              batch-1 figure (target >= 70 %); one process, and 4 processes through MPS.
  small       ResNet-18 batch 1 from many clients: 1 instance vs 4 instances vs 4 MPS processes, with
              merging off (--max-batch 1: the seeds' "inference one process cannot fill") and on.
  transport   the same ResNet-50 server on the hand-written stdlib transport and on uvicorn+httptools
              (--transport uvicorn): batch 1 and 256, throughput and p50/p99 latency.

Clients are separate processes (fork) with keep-alive raw sockets, so the load generator is not
the server's interpreter lock. Every server is `python -m ngcx_runtime.serve` in its own process,
as deployed. Each phase is recorded even when another fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(tempfile.gettempdir()) / "ngcx-shim"


def _shim_env() -> dict[str, str]:
    """ngcx_runtime importable in every subprocess of an uninstalled checkout (runtime/ is its source)."""
    SHIM.mkdir(exist_ok=True)
    link = SHIM / "ngcx_runtime"
    if not link.exists():
        link.symlink_to(REPO / "runtime")
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SHIM}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.pop("NGCX_RUNTIME_MPS", None)
    return env


# ----------------------------------------------------------------------------- preparing plans (subprocess)

TIMING = r'''
import json, sys, time, os
import numpy as np, torch
from ngcx_runtime import plan
from ngcx_runtime.bench import make_inputs
def timed(fn, n, warm=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n
def pipelined(engine, feeds, n):
    def run(k):
        pending = None
        for _ in range(k):
            launched = engine.infer_async(feeds)
            if pending is not None: pending()
            pending = launched
        if pending is not None: pending()
    run(3); t = time.perf_counter(); run(n); return (time.perf_counter() - t) / n
'''

PREPARE = TIMING + r'''
import torchvision
from ngcx_runtime.optimize import OptimizeOptions, optimize
work, seconds = sys.argv[1], float(sys.argv[2])
wanted = sys.argv[3].split(",") if len(sys.argv) > 3 else ["resnet50", "resnet18"]
r50_profile = [int(b) for b in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1, 4, 16, 64, 256]
out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "torchvision": torchvision.__version__,
       "plans": {}, "inproc": []}
for name, profile in [(n, p) for n, p in (("resnet50", r50_profile), ("resnet18", [1, 4, 16, 32]))
                      if n in wanted]:
    torch.manual_seed(0)
    net = getattr(torchvision.models, name)(weights=None).eval()
    ep = torch.export.export(net, (torch.randn(2, 3, 224, 224),),
                             dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
    pt2 = os.path.join(work, f"{name}.pt2"); torch.export.save(ep, pt2)
    t = time.perf_counter()
    res = optimize(pt2, os.path.join(work, f"plan_{name}"), OptimizeOptions(precision="fp16", batch_profile=profile,
                   name=name), backend="pytorch")
    out["plans"][name] = {"dir": str(res.plan_dir), "optimize_s": round(time.perf_counter() - t, 1),
                          "profile": profile}
    engine = plan.load(res.plan_dir)
    out["plans"][name]["inputs"] = [[s.name, s.datatype, list(s.shape)] for s in engine.inputs]
    out["plans"][name]["outputs"] = [[s.name, s.datatype, list(s.shape)] for s in engine.outputs]
    for b in ([1, 256] if name == "resnet50" else [1]):
        x = torch.randn(b, 3, 224, 224, device="cuda").half().contiguous(memory_format=torch.channels_last)
        iters = 300 if b == 1 else 60
        sec = timed(lambda: engine.infer_device([x]), iters)
        row = {"model": name, "batch": b, "gpu_resident_img_s": round(b / sec, 1)}
        feeds = make_inputs(engine.inputs, b)
        row["host_serial_img_s"] = round(b / timed(lambda: engine.infer(feeds), max(20, iters // 4), 3), 1)
        row["host_pipelined_img_s"] = round(b / pipelined(engine, feeds, max(20, iters // 4)), 1)
        out["inproc"].append(row); print(json.dumps(row), flush=True)
    del engine; torch.cuda.empty_cache()
print("RESULT " + json.dumps(out), flush=True)
'''


def prepare(work: Path, seconds: float, env: dict[str, str], models: str = "resnet50,resnet18",
            r50_profile: str = "1,4,16,64,256") -> dict[str, Any]:
    """Plans (ResNet-50 with the batch buckets `r50_profile`) and their in-process figures, in a child process."""
    proc = subprocess.run([sys.executable, "-c", PREPARE, str(work), str(seconds), models, r50_profile], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    sys.stdout.write(proc.stdout[-4000:])
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"prepare failed ({proc.returncode}): {proc.stderr[-3000:]}")


# ----------------------------------------------------------------------------- servers

class Server:
    """`python -m ngcx_runtime.serve ARGS` in its own process group, ready-waited and SIGTERM-stopped."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = log
        self.t0 = time.perf_counter()
        with open(log, "w") as sink:             # the child keeps its own descriptor
            self.proc = subprocess.Popen([sys.executable, "-m", "ngcx_runtime.serve", *args, "--port",
                                          str(self.port)], env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.ready_s = self._wait_ready()

    def _wait_ready(self, timeout: float = 400) -> float:
        import urllib.request

        deadline = time.monotonic() + timeout
        mark = "all " if "--mps" in self.proc.args or "--processes" in self.proc.args else None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if mark is not None:
                if "processes are serving" in self.log.read_text():
                    return round(time.perf_counter() - self.t0, 1)
            else:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=2) as r:
                        if r.status == 200:
                            return round(time.perf_counter() - self.t0, 1)
                except OSError:
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready in {timeout} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        with _suppress():
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(self.proc.pid, signal.SIGKILL)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)


# ----------------------------------------------------------------------------- clients (forked processes)

def _http(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: b\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One HTTP response on a keep-alive socket (Content-Length framed): (status, body)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(max(1 << 20, length - len(body)))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    buf[:] = body[length:]
    return status, bytes(body[:length])


def _connection(port: int, setup: list[bytes], request: bytes, deadline: float, warm_until: float,
                lat: list[float], errors: list[str]) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    try:
        for req in setup:
            sock.sendall(req)
            status, body = _read_response(sock, buf)
            if status != 200:
                errors.append(f"setup {status}: {body[:200]!r}")
                return
        while True:
            t = time.perf_counter()
            if t >= deadline:
                return
            sock.sendall(request)
            status, body = _read_response(sock, buf)
            done = time.perf_counter()
            if status != 200:
                errors.append(f"{status}: {body[:200]!r}")
                return
            if done >= warm_until and done <= deadline:
                lat.append(done - t)
    except OSError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        sock.close()


def _client_proc(index: int, port: int, threads: int, make: Any, start: float, warm: float, seconds: float,
                 queue: Any) -> None:
    jobs = [make(index, t) for t in range(threads)]
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    while time.time() < start:                   # every process starts its clients together
        time.sleep(0.001)
    t0 = time.perf_counter()
    workers = [threading.Thread(target=_connection, args=(port, setup, request, t0 + warm + seconds, t0 + warm,
                                                          lats[i], errors))
               for i, (setup, request) in enumerate(jobs)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    queue.put(([x for lat in lats for x in lat], errors))


def load(port: int, make: Any, connections: int, seconds: float, warm: float = 1.0, procs: int | None = None
         ) -> dict[str, Any]:
    """`connections` keep-alive clients over up to 8 forked processes for warm + seconds; counts the window."""
    import numpy as np

    procs = procs or min(connections, 8)
    per = [connections // procs + (1 if i < connections % procs else 0) for i in range(procs)]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start = time.time() + 0.5 + 0.05 * procs
    ps = [ctx.Process(target=_client_proc, args=(i, port, n, make, start, warm, seconds, queue))
          for i, n in enumerate(per) if n]
    for p in ps:
        p.start()
    lat: list[float] = []
    errors: list[str] = []
    for _ in ps:
        got, errs = queue.get(timeout=warm + seconds + 300)
        lat += got
        errors += errs
    for p in ps:
        p.join(30)
    if not lat:
        return {"requests": 0, "errors": errors[:5]}
    ms = np.asarray(lat) * 1e3
    return {"requests": len(lat), "req_s": round(len(lat) / seconds, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3),
            "errors": errors[:5], "error_count": len(errors)}


# ----------------------------------------------------------------------------- request makers

class BinaryRequest:
    """A binary-tensor infer request of random FP16 images (the body path)."""

    def __init__(self, model: str, inp: str, out: str, batch: int):
        import numpy as np

        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float16).tobytes()
        head = json.dumps({"inputs": [{"name": inp, "shape": [batch, 3, 224, 224], "datatype": "FP16",
                                       "parameters": {"binary_data_size": len(x)}}],
                           "outputs": [{"name": out, "parameters": {"binary_data": True}}]}).encode()
        extra = f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(head)}\r\n"
        self.request = _http(f"/v2/models/{model}/infer", head + x, extra)

    def __call__(self, proc: int, thread: int) -> tuple[list[bytes], bytes]:
        return [], self.request


class ShmRequest:
    """Input and output in /dev/shm regions of this connection, registered over the same connection."""

    def __init__(self, model: str, inp: str, out: str, batch: int, classes: int = 1000):
        self.model, self.inp, self.out, self.batch, self.classes = model, inp, out, batch, classes
        self.in_bytes = batch * 3 * 224 * 224 * 2
        self.out_bytes = batch * classes * 2
        self.keys: list[str] = []

    def __call__(self, proc: int, thread: int) -> tuple[list[bytes], bytes]:
        import numpy as np

        tag = f"ngcxb_{os.getpid()}_{proc}_{thread}"
        for key, size in ((f"{tag}_in", self.in_bytes), (f"{tag}_out", self.out_bytes)):
            with open(f"/dev/shm/{key}", "wb") as f:
                f.truncate(size)
        x = np.random.default_rng(thread).standard_normal((self.batch, 3, 224, 224)).astype(np.float16)
        with open(f"/dev/shm/{tag}_in", "r+b") as f:
            f.write(x.tobytes())
        setup = [_http(f"/v2/systemsharedmemory/region/{tag}_{k}/register",
                       json.dumps({"key": f"/{tag}_{k}", "offset": 0, "byte_size": size}).encode(),
                       "Content-Type: application/json\r\n")
                 for k, size in (("in", self.in_bytes), ("out", self.out_bytes))]
        body = json.dumps({"inputs": [{"name": self.inp, "shape": [self.batch, 3, 224, 224], "datatype": "FP16",
                                       "parameters": {"shared_memory_region": f"{tag}_in",
                                                      "shared_memory_byte_size": self.in_bytes}}],
                           "outputs": [{"name": self.out, "parameters": {"shared_memory_region": f"{tag}_out",
                                                                         "shared_memory_byte_size": self.out_bytes}}]})
        return setup, _http(f"/v2/models/{self.model}/infer", body.encode(), "Content-Type: application/json\r\n")


def _cleanup_shm() -> None:
    for p in Path("/dev/shm").glob("ngcxb_*"):
        with _suppress():
            p.unlink()


# ----------------------------------------------------------------------------- phases

ONLY: set[str] = set()


def served_rows(report: dict, tag: str, args: list[str], env: dict[str, str], out: Path,
                loads: list[tuple[str, Any, int, int]], seconds: float) -> None:
    """Start one server, run each (name, request maker, connections, batch) load, stop it."""
    if ONLY and tag not in ONLY:
        return
    t0 = time.perf_counter()
    try:
        server = Server(args, env, out / f"server_{tag}.log")
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        report["phases"][tag] = {"status": "failed", "error": str(exc)[:300] + " ... " + str(exc)[-1200:]}
        print(f"[{tag}] FAILED to start: {str(exc)[:300]} ... {str(exc)[-500:]}", flush=True)
        return
    rows = []
    try:
        for name, make, conns, batch in loads:
            try:
                res = load(server.port, make, conns, seconds)
            except Exception as exc:  # noqa: BLE001
                res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-1500:]}
            row = {"phase": tag, "load": name, "connections": conns, "batch": batch, **res}
            if "req_s" in res:
                row["img_s"] = round(res["req_s"] * batch, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.stop()
        _cleanup_shm()
    report["rows"] += rows
    report["phases"][tag] = {"status": "ok", "ready_s": server.ready_s, "seconds": round(time.perf_counter() - t0, 1),
                             "args": args}


def mps_state() -> dict[str, Any]:
    import shutil

    return {"nvidia-cuda-mps-control": shutil.which("nvidia-cuda-mps-control"),
            "dev_nvidia0": Path("/dev/nvidia0").exists()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--only", default="", help="comma-separated server phases to run (e.g. resnet18_1inst_batch)")
    ap.add_argument("--tag", default="", help="suffix of the report file (serving_TAG.json)")
    ap.add_argument("--skip", default="", help="comma-separated phases to skip: shm,body,bs1,mps,small,transport")
    ap.add_argument("--work", type=Path, default=None,
                    help="work folder (plans, plan cache); reuse it to skip rebuilding the plans in a later run")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    ONLY.update(filter(None, args.only.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    env = _shim_env()
    work = args.work or Path(tempfile.mkdtemp(prefix="ngcx-gpu-serving-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"                        # server logs stay in the work folder (tar them if wanted)
    logs.mkdir(exist_ok=True)
    env["NGCX_RUNTIME_CACHE"] = str(work / "cache")
    report: dict[str, Any] = {"command": " ".join(sys.argv), "phases": {}, "rows": [], "mps": mps_state(),
                              "cpu_count": os.cpu_count()}

    def write() -> None:
        (args.out / f"serving{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(report, indent=1))

    t0 = time.perf_counter()
    prep = prepare(work, args.seconds, env)
    report.update({k: prep[k] for k in ("gpu", "torch", "torchvision", "plans", "inproc")})
    report["phases"]["prepare"] = {"status": "ok", "seconds": round(time.perf_counter() - t0, 1)}
    write()
    r50, r18 = prep["plans"]["resnet50"], prep["plans"]["resnet18"]
    i50, o50 = r50["inputs"][0][0], r50["outputs"][0][0]
    i18, o18 = r18["inputs"][0][0], r18["outputs"][0][0]
    s = args.seconds
    common = ["--max-queue-delay-ms", "1", "--max-connections", "1024"]
    if not {"shm", "body", "bs1"} <= skip:
        loads = []
        if "shm" not in skip:
            loads += [(f"shm_bs256_c{c}", ShmRequest("resnet50", i50, o50, 256), c, 256) for c in (1, 2, 4, 8)]
        if "body" not in skip:
            loads += [("body_bs256_c2", BinaryRequest("resnet50", i50, o50, 256), 2, 256)]
        if "bs1" not in skip:
            loads += [(f"body_bs1_c{c}", BinaryRequest("resnet50", i50, o50, 1), c, 1) for c in (1, 16, 64)]
        served_rows(report, "resnet50_stdlib", [r50["dir"], *common], env, logs, loads, s)
        write()
    if "transport" not in skip:
        loads = [(f"body_bs1_c{c}", BinaryRequest("resnet50", i50, o50, 1), c, 1) for c in (1, 16, 64)]
        loads += [(f"body_bs256_c{c}", BinaryRequest("resnet50", i50, o50, 256), c, 256) for c in (1, 2)]
        served_rows(report, "resnet50_uvicorn", [r50["dir"], *common, "--transport", "uvicorn"], env, logs,
                    loads, s)
        write()
    if "small" not in skip:
        small = [("body_bs1_c32", BinaryRequest("resnet18", i18, o18, 1), 32, 1)]
        served_rows(report, "resnet18_1inst_nobatch", [r18["dir"], *common, "--max-batch", "1"], env, logs,
                    small, s)
        served_rows(report, "resnet18_4inst_nobatch", [r18["dir"], *common, "--max-batch", "1", "--instances", "4"],
                    env, logs, small, s)
        served_rows(report, "resnet18_1inst_batch", [r18["dir"], *common], env, logs, small, s)
        served_rows(report, "resnet18_4inst_batch", [r18["dir"], *common, "--instances", "4"], env, logs,
                    small, s)
        write()
    if "mps" not in skip:
        served_rows(report, "resnet18_4mps_nobatch", [r18["dir"], *common, "--max-batch", "1", "--mps", "4"], env,
                    logs, [("body_bs1_c32", BinaryRequest("resnet18", i18, o18, 1), 32, 1)], s)
        served_rows(report, "resnet18_4mps_batch", [r18["dir"], *common, "--mps", "4"], env, logs,
                    [("body_bs1_c32", BinaryRequest("resnet18", i18, o18, 1), 32, 1)], s)
        served_rows(report, "resnet50_4mps", [r50["dir"], *common, "--mps", "4"], env, logs,
                    [(f"body_bs1_c{c}", BinaryRequest("resnet50", i50, o50, 1), c, 1) for c in (16, 64)], s)
        write()
    report["total_s"] = round(time.perf_counter() - t0, 1)
    write()
    print(json.dumps({k: v.get("status") for k, v in report["phases"].items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
