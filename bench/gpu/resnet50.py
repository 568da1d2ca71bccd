"""ResNet-50 on one GPU: eager FP32/FP16 vs `ngcx-runtime optimize --precision fp16` (pytorch backend),
in-process and served through the KServe HTTP server.

Random weights (torchvision weights=None; no download). Run from the repo root, on a GPU host:
    python3 bench/gpu/resnet50.py --out $OUT/resnet50.json [--batches 1,256] [--concurrency 1,4,16]
Saved runs: bench/results/gpu/resnet50/ (the runtime suite reports the newest H100 one).
Reference (runtime.md §9, H100, torch.compile reduce-overhead, FP16, channels_last, inputs on the
GPU): ~2,200 img/s at batch 1, ~24,000 img/s at batch 256.

Rows:
  eager_*            torch eager, inputs already on the GPU
  plan_device        the loaded ngcx plan, inputs already on the GPU (compute only; compare to reference)
  plan_host          Engine.infer() with host numpy in and out (adds H2D/D2H), one batch at a time
  plan_host_pipelined  the same with infer_async, two batches in flight (what the server's batcher does)
  served_*           over HTTP to ngcx_runtime.serve with the binary tensor extension, N clients
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for gpu_shim (shared with tests/gpu)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import gpu_shim  # noqa: E402

gpu_shim.ensure_ngcx_runtime()


def _sync_time(torch, fn, iters: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def _pipelined_time(engine, feeds, iters: int, warmup: int = 3) -> float:
    """Seconds per batch with host numpy in/out and two batches in flight (launch N+1, then
    wait for N), the way the server's batcher drives an engine that has infer_async."""
    def run(n: int) -> None:
        pending = None
        for _ in range(n):
            launched = engine.infer_async(feeds)
            if pending is not None:
                pending()
            pending = launched
        if pending is not None:
            pending()

    run(warmup)
    t0 = time.perf_counter()
    run(iters)
    return (time.perf_counter() - t0) / iters


def _row(name: str, batch: int, sec: float, **extra) -> dict[str, Any]:
    row = {
        "name": name,
        "batch": batch,
        "ms_per_batch": round(sec * 1e3, 3),
        "img_per_s": round(batch / sec, 1),
    }
    row.update(extra)
    print(json.dumps(row), flush=True)
    return row


def _iters(batch: int) -> int:
    return 300 if batch == 1 else 40


class Normalized:
    """UINT8 NCHW pixels in, ImageNet normalization inside the model: 1 byte/pixel on the wire."""

    @staticmethod
    def build(torch, net):
        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net
                mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
                std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
                # (p/255 - mean)/std as one multiply-add; no explicit cast in the graph, so the
                # plan's .half() decides the compute dtype (uint8 * fp16 promotes to fp16)
                self.register_buffer("scale", 1.0 / (255.0 * std))
                self.register_buffer("shift", mean / std)

            def forward(self, pixels):
                x = pixels * self.scale - self.shift
                return self.net(x)

        return Wrapper().eval()


def eager_rows(torch, model, batches: list[int]) -> list[dict]:
    rows = []
    for prec, dt in (("fp32", torch.float32), ("fp16", torch.float16)):
        m = model.to("cuda", dt).to(memory_format=torch.channels_last)
        for b in batches:
            x = torch.randn(b, 3, 224, 224, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
            with torch.inference_mode():
                sec = _sync_time(torch, lambda m=m, x=x: m(x), _iters(b))
            rows.append(
                _row(
                    f"eager_{prec}",
                    b,
                    sec,
                    channels_last=True,
                    note="cudnn TF32 allowed (torch default)" if prec == "fp32" else None,
                )
            )
    model.to("cpu", torch.float32)
    torch.cuda.empty_cache()
    return rows


def export_pt2(torch, module, path: Path, example) -> Path:
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(path))
    return path


def plan_rows(
    torch, pt2: Path, batches: list[int], tag: str, input_dtype, profile: list[int]
) -> tuple[list[dict], Any, dict]:
    from ngcx_runtime import plan
    from ngcx_runtime.bench import make_inputs
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    res = optimize(
        pt2,
        pt2.parent / f"plan_{tag}",
        OptimizeOptions(precision="fp16", batch_profile=profile, name=f"resnet50_{tag}"),
        backend="pytorch",
    )
    info["optimize_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    res2 = optimize(
        pt2,
        pt2.parent / f"plan_{tag}_again",
        OptimizeOptions(precision="fp16", batch_profile=profile, name=f"resnet50_{tag}"),
        backend="pytorch",
    )
    info["second_optimize"] = {"cache_hit": res2.cache_hit, "seconds": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    engine = plan.load(res.plan_dir)
    info["load_seconds_incl_compile"] = round(time.perf_counter() - t0, 1)
    info["manifest"] = {
        k: res.manifest[k]
        for k in (
            "backend",
            "backend_version",
            "precision",
            "gpu",
            "compute_capability",
            "batch_profile",
            "compile",
            "inputs",
            "outputs",
        )
    }
    rows = []
    for b in batches:
        x = (
            torch.randn(b, 3, 224, 224, device="cuda").to(input_dtype)
            if input_dtype.is_floating_point
            else torch.randint(0, 256, (b, 3, 224, 224), device="cuda", dtype=input_dtype)
        )
        x = x.contiguous(memory_format=torch.channels_last)  # what Engine.infer feeds too
        sec = _sync_time(torch, lambda x=x: engine.infer_device([x]), _iters(b))
        rows.append(_row(f"plan_device_{tag}", b, sec))
        feeds = make_inputs(engine.inputs, b)
        sec = _sync_time(torch, lambda f=feeds: engine.infer(f), max(10, _iters(b) // 4), warmup=3)
        rows.append(_row(f"plan_host_{tag}", b, sec, input_datatype=engine.inputs[0].datatype))
        sec = _pipelined_time(engine, feeds, max(10, _iters(b) // 4))
        rows.append(_row(f"plan_host_pipelined_{tag}", b, sec, input_datatype=engine.inputs[0].datatype,
                         note="infer_async, two batches in flight (what the server's batcher does)"))
    info["plan_dir"] = str(res.plan_dir)
    return rows, engine, info


SERVE_CMD = (
    "import sys; sys.path.insert(0, 'bench'); import gpu_shim; gpu_shim.ensure_ngcx_runtime(); "
    "from ngcx_runtime.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _wait_ready(url: str, proc, timeout: float = 300.0) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("server not ready in time")


def served_rows(
    engine, plan_dir: Path, batches: list[int], concurrency: list[int], duration: float, tag: str
) -> list[dict]:
    """`ngcx-runtime serve PLAN_DIR` in its own process (as deployed), clients in this one."""
    import signal
    import socket
    import subprocess

    from ngcx_runtime.bench import EnergyMeter, bench_http

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    repo = Path(__file__).resolve().parents[2]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVE_CMD,
            "serve",
            str(plan_dir),
            "--port",
            str(port),
            "--max-queue-delay-ms",
            "0.5",
        ],
        cwd=repo,
    )
    meter = EnergyMeter()
    rows: list[dict] = []
    try:
        _wait_ready(url, proc)
        rows.append({"name": f"served_{tag}_startup", "seconds_to_ready": round(time.perf_counter() - t0, 1)})
        for r in bench_http(url, engine.name, engine, batches, concurrency, duration, meter):
            r["name"] = f"served_{tag}"
            print(json.dumps(r), flush=True)
            rows.append(r)
    finally:
        meter.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


def stage(report: dict, name: str, fn):
    t0 = time.perf_counter()
    try:
        out = fn()
        report["stages"][name] = {"status": "ok", "seconds": round(time.perf_counter() - t0, 1)}
        return out
    except Exception as exc:  # noqa: BLE001 - record and go on with the other measurements
        report["stages"][name] = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}"[:500],
            "traceback": traceback.format_exc()[-2000:],
        }
        print(f"[{name}] FAILED: {exc}\n{traceback.format_exc()[-2000:]}", flush=True)
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--profile", default="1,4,16,64,256", help="plan batch buckets (CUDA graphs)")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--skip-uint8", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    conc = [int(c) for c in args.concurrency.split(",")]
    profile = [int(c) for c in args.profile.split(",")]
    report: dict[str, Any] = {
        "stages": {},
        "rows": [],
        "reference": {
            "source": "runtime.md 9 (H100, torch 2.11 cu130, reduce-overhead FP16 channels_last, GPU inputs)",
            "img_per_s": {"1": 2216, "256": 24022},
        },
    }

    def write():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))

    try:
        import torch
        import torchvision
    except ImportError as exc:
        report["skipped"] = f"{exc.name} is not installed here"
        write()
        print(report["skipped"])
        return 0
    if not torch.cuda.is_available():
        report["skipped"] = "no CUDA device visible to torch"
        write()
        print(report["skipped"])
        return 0
    report["env"] = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "cuda": torch.version.cuda,
    }
    work = Path(tempfile.mkdtemp(prefix="rn50-"))
    os.environ.setdefault("NGCX_RUNTIME_CACHE", str(work / "cache"))
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    report["rows"] += stage(report, "eager", lambda: eager_rows(torch, model, batches)) or []
    write()

    pt2 = stage(
        report,
        "export_fp32",
        lambda: export_pt2(torch, model, work / "resnet50.pt2", torch.randn(2, 3, 224, 224)),
    )
    if pt2:
        out = stage(
            report, "plan_fp32io", lambda: plan_rows(torch, pt2, batches, "fp16", torch.float16, profile)
        )
        if out:
            rows, engine, info = out
            report["rows"] += rows
            report["plan_fp16"] = info
            write()
            report["rows"] += (
                stage(
                    report,
                    "served_fp16",
                    lambda: served_rows(engine, Path(info["plan_dir"]), batches, conc, args.duration, "fp16"),
                )
                or []
            )
            del engine
            torch.cuda.empty_cache()
            write()
    if not args.skip_uint8:
        wrapped = Normalized.build(torch, model)
        pt2u = stage(
            report,
            "export_uint8",
            lambda: export_pt2(
                torch,
                wrapped,
                work / "resnet50_u8.pt2",
                torch.randint(0, 256, (2, 3, 224, 224), dtype=torch.uint8),
            ),
        )
        if pt2u:
            out = stage(
                report, "plan_uint8", lambda: plan_rows(torch, pt2u, batches, "uint8", torch.uint8, profile)
            )
            if out:
                rows, engine, info = out
                report["rows"] += rows
                report["plan_uint8"] = info
                write()
                report["rows"] += (
                    stage(
                        report,
                        "served_uint8",
                        lambda: served_rows(
                            engine, Path(info["plan_dir"]), batches, conc, args.duration, "uint8"
                        ),
                    )
                    or []
                )
    write()
    print(json.dumps(report["stages"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
