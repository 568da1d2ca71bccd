"""`ngcx-runtime bench PLAN_DIR|MODEL`: PLASTER figures for a plan, in-process and over HTTP.

PLASTER (NVIDIA's inference checklist): Programmability aside, it measures Latency (min/p50/p90/
p99 per request), Accuracy (delta against the FP32 source model on the same inputs), Size (model
and plan bytes), Throughput (inferences/s), Energy (joules per inference from NVML's energy
counter where a GPU is) and Rate of learning aside. Serving overhead shows up as the gap between
the in-process rows and the HTTP rows (--url, or --serve to start the KServe server in-process).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .engine import Engine, TensorSpec
from .errors import RuntimeUserError

BENCH_VERSION = 1


def make_inputs(specs: list[TensorSpec], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs of the engine's dtypes; dynamic non-batch dims become 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for s in specs:
        shape = tuple(batch if i == 0 else (d if d > 0 else 1) for i, d in enumerate(s.shape))
        if s.numpy_dtype.kind == "f":
            feeds[s.name] = rng.standard_normal(shape).astype(s.numpy_dtype)
        elif s.numpy_dtype.kind == "b":
            feeds[s.name] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            feeds[s.name] = rng.integers(0, 100, shape).astype(s.numpy_dtype)
    return feeds


def latency_stats(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "min": round(float(ms.min()), 4),
        "p50": round(float(np.percentile(ms, 50)), 4),
        "p90": round(float(np.percentile(ms, 90)), 4),
        "p99": round(float(np.percentile(ms, 99)), 4),
        "mean": round(float(ms.mean()), 4),
    }


class EnergyMeter:
    """NVML's cumulative energy counter (mJ) around a measured window; n/a without NVML."""

    def __init__(self) -> None:
        from . import probe

        self.nvml = None
        self.reason = None
        try:
            self.nvml = probe.Nvml()
            self.nvml.energy_mj(0)
        except (OSError, AttributeError) as exc:
            self.reason = f"n/a: no NVML ({str(exc).splitlines()[0]})"
            self.nvml = None

    def read(self) -> int | None:
        return self.nvml.energy_mj(0) if self.nvml else None

    def close(self) -> None:
        if self.nvml:
            self.nvml.close()


def run_load(
    make_call: Callable[[], Callable[[], None]], concurrency: int, duration: float, warmup: int = 3
) -> dict[str, Any]:
    """`concurrency` threads, each builds its own caller (gevent-based clients are per thread),
    warms up, waits for the others, then calls for `duration` s recording per-request latency."""
    lat: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    window: dict[str, float] = {}

    def open_window() -> None:  # runs once, before any thread is released
        window["start"] = time.perf_counter()
        window["deadline"] = window["start"] + duration

    ready = threading.Barrier(concurrency + 1, action=open_window)

    def worker(w: int) -> None:
        try:
            call = make_call()
            for _ in range(warmup):
                call()
        except Exception as exc:  # noqa: BLE001 - reported in the result, not swallowed
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        try:
            while time.perf_counter() < window["deadline"] or not lat[w]:
                t0 = time.perf_counter()
                call()
                lat[w].append(time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}"[:300])

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - window.get("start", time.perf_counter())
    if errors:
        raise RuntimeUserError(f"benchmark requests failed: {errors[0].splitlines()[0]}")
    flat = [x for per in lat for x in per]
    return {"requests": len(flat), "seconds": elapsed, "latencies": flat}


def _row(
    mode: str, batch: int, conc: int, res: dict, energy_mj: int | None, client: str | None = None
) -> dict:
    inferences = res["requests"] * batch
    row = {
        "mode": mode,
        "batch": batch,
        "concurrency": conc,
        "requests": res["requests"],
        "inferences": inferences,
        "seconds": round(res["seconds"], 3),
        "throughput_inf_s": round(inferences / res["seconds"], 2),
        "latency_ms": latency_stats(res["latencies"]),
        "energy_j_per_inference": (round(energy_mj / 1e3 / inferences, 6) if energy_mj is not None else None),
    }
    if client:
        row["client"] = client
    return row


def bench_in_process(engine: Engine, batches: list[int], duration: float, meter: EnergyMeter) -> list[dict]:
    """One caller (the Engine contract serializes infer()), each batch size in turn."""
    rows = []
    for b in batches:
        feeds = make_inputs(engine.inputs, b)
        e0 = meter.read()
        res = run_load(lambda f=feeds: lambda: engine.infer(f), 1, duration)
        e1 = meter.read()
        rows.append(_row("in-process", b, 1, res, None if e0 is None else e1 - e0))
    return rows


class _StdlibClient:
    """KServe v2 infer over http.client with the binary tensor extension (no tritonclient needed)."""

    def __init__(self, url: str, model: str):
        from http.client import HTTPConnection
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.conn = HTTPConnection(u.hostname, u.port or 80, timeout=120)
        self.path = f"/v2/models/{model}/infer"

    def infer(self, feeds: dict[str, np.ndarray], specs: list[TensorSpec], outputs: list[str]) -> None:
        from .engine import NUMPY_TO_KSERVE

        header = {
            "inputs": [
                {
                    "name": k,
                    "shape": list(v.shape),
                    "datatype": NUMPY_TO_KSERVE[v.dtype],
                    "parameters": {"binary_data_size": v.nbytes},
                }
                for k, v in feeds.items()
            ],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        }
        head = json.dumps(header).encode()
        arrays = [np.ascontiguousarray(v).reshape(-1).view(np.uint8) for v in feeds.values()]
        self.conn.putrequest("POST", self.path)
        self.conn.putheader("Inference-Header-Content-Length", str(len(head)))
        self.conn.putheader("Content-Type", "application/octet-stream")
        self.conn.putheader("Content-Length", str(len(head) + sum(a.nbytes for a in arrays)))
        self.conn.endheaders()
        self.conn.send(head)
        for a in arrays:  # tensor bytes straight from the arrays: no join, no copy
            self.conn.send(a.data)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")


HTTP_CLIENTS = ("stdlib", "tritonclient")


def _client_factory(url: str, model: str, engine_inputs: list[TensorSpec], outputs: list[str],
                    client: str = "stdlib"):
    """The HTTP client every served figure is measured with, chosen by the caller and named in each row.

    Why not "tritonclient when installed": the same command then measured different things on different
    machines (issue 24: ResNet-50 bs 256 served 1.2-1.7k img/s through tritonclient.http against 5-15k through
    the stdlib client, whose binary-extension request is one send of the tensor's bytes). `stdlib` is the
    default; `tritonclient` measures the stock client users run, and fails in one line where it is missing."""
    if client not in HTTP_CLIENTS:
        raise RuntimeUserError(f"--http-client {client!r}: use one of {', '.join(HTTP_CLIENTS)}")
    if client == "stdlib":

        def make_std():
            c = _StdlibClient(url, model)
            return lambda feeds: c.infer(feeds, engine_inputs, outputs)

        return make_std, "http.client (binary tensor extension)"
    try:
        import tritonclient.http as httpclient
    except ImportError:
        raise RuntimeUserError("--http-client tritonclient: tritonclient is not installed here; "
                               "pip install 'tritonclient[http]', or use --http-client stdlib") from None
    from .engine import NUMPY_TO_KSERVE

    host = url.split("://", 1)[-1].rstrip("/")

    def make_triton():
        client = httpclient.InferenceServerClient(host, connection_timeout=120, network_timeout=120)

        def call(feeds):
            ins = []
            for k, v in feeds.items():
                i = httpclient.InferInput(k, list(v.shape), NUMPY_TO_KSERVE[v.dtype])
                i.set_data_from_numpy(v, binary_data=True)
                ins.append(i)
            outs = [httpclient.InferRequestedOutput(o, binary_data=True) for o in outputs]
            client.infer(model, ins, outputs=outs)

        return call

    return make_triton, "tritonclient.http (binary tensor extension)"


def _bind(call: Callable[[dict], None], feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    return lambda: call(feeds)


def bench_http(
    url: str,
    model: str,
    engine: Engine,
    batches: list[int],
    concurrency: list[int],
    duration: float,
    meter: EnergyMeter,
    client: str = "stdlib",
) -> list[dict]:
    outputs = [o.name for o in engine.outputs]
    make, client_name = _client_factory(url, model, engine.inputs, outputs, client)
    rows = []
    for b in batches:
        feeds = make_inputs(engine.inputs, b)
        for c in concurrency:
            e0 = meter.read()
            res = run_load(lambda f=feeds: _bind(make(), f), c, duration)
            e1 = meter.read()
            rows.append(_row("http", b, c, res, None if e0 is None else e1 - e0, client_name))
    return rows


def dir_bytes(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


def accuracy(
    engine: Engine, reference: Engine | None, data: dict[str, np.ndarray] | None, samples: int = 64
) -> dict[str, Any]:
    """Delta of the engine's outputs vs the FP32 reference on calibration data or seeded inputs."""
    if reference is None:
        return {"skipped": "the benchmarked model is itself the FP32 reference"}
    if data is not None:
        feeds = {k: np.asarray(v[:samples]) for k, v in data.items()}
        source = "calibration/validation data"
    else:
        feeds = make_inputs(reference.inputs, min(samples, engine.max_batch or samples), seed=123)
        source = "seeded random inputs"
    n = len(next(iter(feeds.values())))
    step = engine.max_batch or n
    got: dict[str, list] = {}
    want: dict[str, list] = {}
    for s in range(0, n, step):
        part = {k: v[s : s + step] for k, v in feeds.items()}
        for k, v in engine.infer(part).items():
            got.setdefault(k, []).append(np.asarray(v, np.float64))
        for k, v in reference.infer(part).items():
            want.setdefault(k, []).append(np.asarray(v, np.float64))
    out: dict[str, Any] = {"reference": "fp32 source model", "inputs": source, "samples": n, "outputs": {}}
    for k in want:
        a, b = np.concatenate(got[k]), np.concatenate(want[k])
        err = np.abs(a - b)
        entry = {
            "max_abs_err": float(err.max()),
            "mean_rel_err": float((err / np.maximum(np.abs(b), 1e-6)).mean()),
            "top1_agreement": None,
        }
        if a.ndim == 2 and a.shape[1] > 1:
            entry["top1_agreement"] = float((a.argmax(1) == b.argmax(1)).mean())
        out["outputs"][k] = entry
    return out


def bench(
    target: str | Path,
    batches: list[int],
    concurrency: list[int],
    duration: float,
    url: str | None = None,
    serve: bool = False,
    calibration: dict[str, np.ndarray] | None = None,
    backend: str | None = None,
    http_client: str = "stdlib",
) -> dict[str, Any]:
    from . import plan as planmod

    target = Path(target)
    engine = planmod.load(target, backend=backend)
    manifest = planmod.read_manifest(target) if target.is_dir() else None
    recorded = ((manifest or {}).get("source") or {}).get("path")     # optional in a manifest (plan.py)
    source = Path(recorded) if recorded else target
    reference = None
    if recorded and source.is_file():
        reference = planmod.load(source)
    meter = EnergyMeter()
    try:
        report: dict[str, Any] = {
            "bench_version": BENCH_VERSION,
            "target": str(target),
            "name": engine.name,
            "backend": engine.backend,
            "precision": engine.precision,
            "device": engine.device,
            "gpu": (manifest or {}).get("gpu") or planmod.host_target()["name"],
            "sizes": {
                "model_bytes": source.stat().st_size if source.is_file() else None,
                "plan_bytes": dir_bytes(target),
            },
            "accuracy": accuracy(engine, reference, calibration),
            "energy": "nvml energy counter" if meter.nvml else meter.reason,
            "results": bench_in_process(engine, batches, duration, meter),
        }
        if serve or url:
            report["http_client"] = _client_factory(url or "", engine.name, [], [], http_client)[1]
            report["results"] += _bench_served(engine, url, batches, concurrency, duration, meter, http_client)
    finally:
        meter.close()
    return report


def _bench_served(
    engine: Engine,
    url: str | None,
    batches: list[int],
    concurrency: list[int],
    duration: float,
    meter: EnergyMeter,
    client: str = "stdlib",
) -> list[dict]:
    if url:
        return bench_http(url, engine.name, engine, batches, concurrency, duration, meter, client)
    from .serve import start_server

    max_batch = max(batches) if not engine.max_batch else None
    with start_server(engine, port=0, name=engine.name, max_batch=max_batch) as handle:
        return bench_http(handle.url, handle.name, engine, batches, concurrency, duration, meter, client)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="PLASTER benchmark of a plan or model, in-process and over HTTP")
    p.add_argument("target", metavar="PLAN_DIR|MODEL")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--concurrency", default="1,4", help="HTTP client threads (in-process runs use 1)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--url", help="benchmark a running KServe server, e.g. http://127.0.0.1:8000")
    p.add_argument("--serve", action="store_true", help="start the KServe server in-process and bench it too")
    p.add_argument("--calibration-data", type=Path, help=".npz of inputs for the accuracy delta")
    p.add_argument("--backend", choices=("tensorrt", "onnxruntime", "pytorch"))
    p.add_argument("--http-client", choices=HTTP_CLIENTS, default="stdlib",
                   help="the client of the served figures, named in each row (tritonclient: the stock one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .optimize import load_calibration, parse_batches

    if args.duration <= 0:
        raise RuntimeUserError(f"--duration {args.duration}: must be positive seconds")
    calib = load_calibration(args.calibration_data)[0] if args.calibration_data else None
    report = bench(
        args.target,
        parse_batches(args.batch),
        parse_batches(args.concurrency),
        args.duration,
        url=args.url,
        serve=args.serve,
        calibration=calib,
        backend=args.backend,
        http_client=args.http_client,
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['name']}: {report['backend']} {report['precision']} on {report['device']} ({report['gpu']})"
    )
    print(
        f"size: model {report['sizes']['model_bytes']} B, plan {report['sizes']['plan_bytes']} B; "
        f"energy: {report['energy']}"
    )
    if "http_client" in report:
        print(f"http client: {report['http_client']}")
    for k, v in (report["accuracy"].get("outputs") or {}).items():
        print(
            f"accuracy {k}: max abs err {v['max_abs_err']:.3g}, mean rel err {v['mean_rel_err']:.3g}"
            + (f", top-1 agreement {v['top1_agreement']:.3f}" if v["top1_agreement"] is not None else "")
        )
    print(f"{'mode':<11}{'batch':>6}{'conc':>5}{'inf/s':>12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}")
    for r in report["results"]:
        lat = r["latency_ms"]
        print(
            f"{r['mode']:<11}{r['batch']:>6}{r['concurrency']:>5}{r['throughput_inf_s']:>12.1f}"
            f"{lat['p50']:>9.3f}{lat['p90']:>9.3f}{lat['p99']:>9.3f}"
        )
    return 0
