"""GPU proofs for ngcx-runtime on a real NVIDIA GPU: probe, tensor cores, cuDNN, NCCL.

Run from the repo root: `python3 tests/gpu/gpu_checks.py --json OUT.json`. Each check reports
"passed", "failed" (with the error) or "skipped" (with the reason, e.g. no GPU here); nothing is
reported as passed that did not run. On a CPU-only machine every GPU check skips.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

PROBE_CMD = (
    "import sys; sys.path.insert(0, 'bench'); import gpu_shim; gpu_shim.ensure_ngcx_runtime(); "
    "from ngcx_runtime.cli import main; sys.exit(main(['info', '--json']))"
)


def check(fn) -> dict[str, Any]:
    """Run one check; exceptions become a 'failed' entry with the error line, never a crash."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - a failed check is a result
        out = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
            "traceback": traceback.format_exc()[-1500:],
        }
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def probe_check() -> dict[str, Any]:
    """`ngcx-runtime info --json` in a fresh interpreter (no torch loaded first), cross-checked
    against what torch itself reports for cuDNN and NCCL."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_CMD], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        return {"status": "failed", "error": proc.stderr.strip().splitlines()[-1:]}
    report = json.loads(proc.stdout)
    out: dict[str, Any] = {"report": report}
    if not report["gpus"]:
        out["status"] = "skipped"
        out["reason"] = report.get("driver_note", "no GPU")
        return out
    mismatches, findings = [], []
    torch_info = report["frameworks"].get("torch", {})
    if "error" in torch_info or not torch_info:
        mismatches.append(f"torch did not import next to the probe: {torch_info.get('error', 'absent')}")
    for lib in ("cudnn", "nccl"):
        entry = report["libraries"][lib]
        used = entry.get("framework_loaded") or entry
        theirs = torch_info.get(lib)
        if used.get("version") and theirs and used["version"] != theirs:
            mismatches.append(
                f"{lib}: probe read {used['version']} from the file torch mapped, torch says {theirs}"
            )
        if entry.get("framework_loaded") and entry.get("version") != entry["framework_loaded"].get("version"):
            findings.append(
                f"{lib}: the linker's default is {entry.get('version')} ({entry.get('path')}), torch "
                f"uses its own {entry['framework_loaded'].get('version')} "
                f"({entry['framework_loaded'].get('path')})"
            )
    out["findings"] = findings
    libs_ok = all("version" in report["libraries"][k] for k in ("cudart", "cublas", "cudnn", "nccl"))
    out["cross_check"] = mismatches or "probe matches torch for cudnn and nccl"
    out["status"] = "passed" if libs_ok and not mismatches else "failed"
    return out


def _torch_cuda():
    import torch

    if not torch.cuda.is_available():
        raise SkipCheck("torch sees no CUDA device")
    return torch


class SkipCheck(Exception):
    pass


def matmul_check() -> dict[str, Any]:
    """Tensor-core GEMM throughput, 8192^3, fp16 and bf16 (H100 SXM dense peak ~989 TFLOP/s)."""
    torch = _torch_cuda()
    n, iters = 8192, 30
    out: dict[str, Any] = {"shape": [n, n, n]}
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            c = a @ b
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
        ref = a[:64].float() @ b[:, :64].float()
        err = float((c[:64, :64].float() - ref).abs().max() / ref.abs().max())
        out[name] = {
            "ms_per_gemm": round(ms, 3),
            "tflops": round(2 * n**3 / ms / 1e9, 1),
            "rel_err_vs_fp32": round(err, 5),
        }
    out["status"] = "passed" if all(out[k]["rel_err_vs_fp32"] < 2e-2 for k in ("fp16", "bf16")) else "failed"
    return out


def cudnn_check() -> dict[str, Any]:
    """A conv through cuDNN (FP32, TF32 off) equals the CPU conv; plus an FP16 conv timing."""
    torch = _torch_cuda()
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.allow_tf32 = False
    x = torch.randn(8, 64, 56, 56)
    w = torch.randn(128, 64, 3, 3) * 0.05
    ref = torch.nn.functional.conv2d(x, w, padding=1)
    got = torch.nn.functional.conv2d(x.cuda(), w.cuda(), padding=1).cpu()
    err = float((got - ref).abs().max())
    xh, wh = x.cuda().half().to(memory_format=torch.channels_last), w.cuda().half()
    for _ in range(3):
        torch.nn.functional.conv2d(xh, wh, padding=1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        torch.nn.functional.conv2d(xh, wh, padding=1)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / 50 * 1e3
    torch.backends.cudnn.allow_tf32 = True
    return {
        "status": "passed" if err < 1e-3 else "failed",
        "cudnn_version": torch.backends.cudnn.version(),
        "fp32_max_abs_err_vs_cpu": err,
        "fp16_conv_ms": round(ms, 4),
        "tolerance": 1e-3,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_worker(rank: int, world: int, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    expect = world * (world + 1) / 2
    ok = bool((t == expect).all())
    big = torch.ones(64 << 20, device="cuda")  # 256 MiB fp32
    for _ in range(3):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / 10
    busbw = big.numel() * 4 * 2 * (world - 1) / world / sec / 1e9 if world > 1 else None
    if rank == 0:
        queue.put(
            {
                "ok": ok,
                "value": float(t[0]),
                "expected": expect,
                "ms_256MiB": round(sec * 1e3, 3),
                "bus_bandwidth_GBps": round(busbw, 1) if busbw else None,
                "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            }
        )
    dist.destroy_process_group()


def nccl_check() -> dict[str, Any]:
    """All-reduce over every visible GPU through NCCL (world_size=1 on a single-GPU machine)."""
    torch = _torch_cuda()
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    if any(p.exitcode != 0 for p in procs):
        return {"status": "failed", "error": f"worker exit codes {[p.exitcode for p in procs]}"}
    res = queue.get(timeout=10)
    res.update(
        {
            "world_size": world,
            "status": "passed" if res["ok"] else "failed",
            "note": "single-rank all-reduce (1 GPU visible)" if world == 1 else f"{world}-GPU all-reduce",
        }
    )
    return res


def ort_smoke() -> dict[str, Any]:
    """ngcx-runtime optimize (fp16) + load on the ONNX Runtime backend here: which EP runs it."""
    import gpu_shim

    gpu_shim.ensure_ngcx_runtime()
    sys.path.insert(0, str(REPO / "tests" / "runtime"))
    import tempfile

    import models

    from ngcx_runtime import plan
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    tmp = Path(tempfile.mkdtemp())
    os.environ["NGCX_RUNTIME_CACHE"] = str(tmp / "cache")
    src = models.conv_net(tmp / "conv.onnx")
    res = optimize(
        src, tmp / "plan", OptimizeOptions(precision="fp16", batch_profile=[1, 8]), backend="onnxruntime"
    )
    eng = plan.load(res.plan_dir)
    ref = plan.load(src).infer(models.sample_inputs("conv", 4))["logits"]
    got = eng.infer(models.sample_inputs("conv", 4))["logits"]
    err = float(abs(got - ref).max())
    return {
        "status": "passed" if err < 1e-2 else "failed",
        "providers": eng.providers,
        "device": eng.device,
        "target": res.manifest["target"],
        "fp16_max_abs_err": err,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    for name, fn in (
        ("probe", probe_check),
        ("matmul", matmul_check),
        ("cudnn_conv", cudnn_check),
        ("nccl_allreduce", nccl_check),
        ("onnxruntime_backend", ort_smoke),
    ):

        def guarded(fn=fn):
            try:
                return fn()
            except SkipCheck as exc:
                return {"status": "skipped", "reason": str(exc)}
            except ImportError as exc:
                return {"status": "skipped", "reason": f"{exc.name or exc} is not installed here"}

        results[name] = check(guarded)
        brief = {k: v for k, v in results[name].items() if k not in ("report", "traceback")}
        print(f"[{name}] {json.dumps(brief)[:600]}", flush=True)
    results["summary"] = {k: v["status"] for k, v in results.items()}
    print(json.dumps(results["summary"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if "failed" in results["summary"].values() else 0


if __name__ == "__main__":
    sys.exit(main())
