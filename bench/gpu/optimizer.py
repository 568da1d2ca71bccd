"""Issue 50: ngcx's measured optimizer (`optimize --tune`) against torch.compile(mode="max-autotune") FP16, same run.

    python3 bench/gpu/optimizer.py --out FILE.json [--models vit_b16,resnet50] [--batches 1,8,64,256]
                                   [--repeats 3] [--iters 30] [--candidates NAME,...]

Run from a checkout's root on a GPU host with torch and torchvision (no install: the script puts
runtime/ on its import path as ngcx_runtime, as bench/gpu/resnet50.py does). Saved runs and their
commands: bench/results/gpu/optimizer/ (the runtime suite shows the newest beside each other).

Models, random weights made here (no download): ResNet-50 (torchvision, weights=None) and ViT-B/16
(built below: 12 blocks, width 768, 12 heads, MLP 3072, 197 tokens, nn.Linear + scaled_dot_product_attention).
For each model:
  baseline  model.half().cuda(), torch.compile(model, mode="max-autotune", dynamic=False): what a user writes,
            at its best for each batch size: FP16 inputs on the GPU, NCHW as given, one static graph per batch
            size. Why dynamic=False: without it, the second batch size a compiled model sees makes torch.compile
            recompile with a dynamic batch dimension (automatic dynamic shapes), and that graph served ResNet-50
            at batch 256 in 14.28 ms where a static one takes 8.75 ms (bench/results/gpu/optimizer/
            optimizer_resnet50_b1_256_h200.json against the plan's own FP16 max-autotune trial): ngcx's plan has
            a static variant per batch size, so the fair baseline has one too.
  ngcx      torch.export of the FP32 model -> `optimize --tune --precision fp16 --batch B1,..` (times every
            candidate per batch size on this GPU, keeps the fastest within the tolerance) -> plan.load;
            FP16 inputs on the GPU in the layout the plan's variant wants (Engine.infer_device).
Each repeat times both at every batch size, alternating which goes first (CUDA events around each
call, after warm-up; the repeat's figure is the median call), so a repeat's ratio compares figures
taken seconds apart. The report keeps median / min / max over the repeats, both models' accuracy
against FP32 on the same seeded examples, compile and optimize times, and a torch.profiler table of
the top CUDA kernels of both at the target batch sizes (what bounds a target not reached).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
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

TARGETS = {("vit_b16", 64): 1.5, ("vit_b16", 256): 1.5, ("resnet50", 256): 1.2}   # ngcx / baseline throughput
# Each model takes the ones that apply to it: the transformer FP16 max-autotune and the GEMM epilogues, ResNet-50
# those two and its channels-last frozen and cuDNN-fused ones. ~34 s per compile per batch size on an H200
# (bench/results/gpu/optimizer/README.md): pass two batch sizes a call to stay under one 10-minute device call.
DEFAULT_CANDIDATES = ("fp16 max-autotune", "fp16 gemm-epilogue max-autotune", "fp16 max-autotune channels-last frozen",
                     "fp16 cudnn-fused channels-last")
LATENCY_BATCH = 1          # ngcx's latency no worse than the baseline's (ratio >= 1.0)
EXAMPLES = 64              # seeded samples the accuracy of both is measured on


def vit_b16(torch):
    """ViT-B/16 (Dosovitskiy et al.): 16x16 patches of a 224x224 image, 12 pre-norm blocks, 1000 classes."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, dim: int = 768, heads: int = 12, mlp: int = 3072):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class ViT(nn.Module):
        def __init__(self, dim: int = 768, depth: int = 12, classes: int = 1000):
            super().__init__()
            self.patch = nn.Conv2d(3, dim, 16, 16)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
            self.blocks = nn.Sequential(*[Block(dim) for _ in range(depth)])
            self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.norm(self.blocks(x))[:, 0])

    return ViT().eval()


def build(torch, name: str):
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None).eval()
    return vit_b16(torch)


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values]}


def median_ms(torch, fn, iters: int, warmup: int = 10) -> float:
    from ngcx_runtime.candidates.variant import time_ms

    with torch.inference_mode():
        return statistics.median(time_ms(fn, iters, warmup))


def accuracy(torch, fn, examples, ref, chunk: int) -> dict[str, float]:
    """Top-1 agreement and max relative error against FP32 on the examples (choose.compare, as the plan's)."""
    import numpy as np

    from ngcx_runtime.choose import compare

    outs = []
    with torch.inference_mode():
        for i in range(0, len(examples), chunk):
            outs.append(np.asarray(fn(examples[i:i + chunk]), dtype=np.float32))
    err = compare(ref, np.concatenate(outs))
    return {"top1": err.top1, "max_rel_error": round(err.max_rel_error, 6)}


def profile_table(torch, fn, rows: int = 15) -> str:
    """The top CUDA kernels of 5 calls (torch.profiler), as its table."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
    averages = prof.key_averages()
    for key in ("device_time_total", "cuda_time_total"):     # the name torch 2.4+ uses, then the older one
        try:
            return averages.table(sort_by=key, row_limit=rows, max_name_column_width=70)
        except (KeyError, AttributeError, ValueError):
            continue
    return averages.table(row_limit=rows)


def run_model(torch, name: str, args, work: Path, report: dict) -> None:
    import numpy as np

    from ngcx_runtime import plan
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    out: dict[str, Any] = report["models"].setdefault(name, {"stages": {}})
    batches = args.batch_list
    model = build(torch, name)
    gen = torch.Generator().manual_seed(3)
    examples = torch.randn(EXAMPLES, 3, 224, 224, generator=gen)
    m32 = copy.deepcopy(model).cuda()       # a copy: weights made under inference_mode could not be exported
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        ref = np.concatenate([m32(examples[i:i + 16].cuda()).float().cpu().numpy() for i in range(0, EXAMPLES, 16)])
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's defaults
    m32 = None
    # ngcx first: export the FP32 model, optimize --tune on the same examples, load the plan
    t0 = time.perf_counter()
    batch_dim = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(model, (torch.randn(2, 3, 224, 224),), dynamic_shapes=({0: batch_dim},))
    pt2 = work / f"{name}.pt2"
    torch.export.save(ep, str(pt2))
    opts = OptimizeOptions(precision="fp16", batch_profile=batches, name=name, tune=True,
                           examples={"x": examples.numpy()}, examples_sha256=f"bench-seed3-{EXAMPLES}",
                           candidates=args.candidate_list)
    res = optimize(pt2, work / f"plan_{name}", opts, backend="pytorch")
    out["optimize_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"[{name}] exported and optimized in {out['optimize_seconds']}s", flush=True)
    out["optimizer"] = res.manifest.get("optimizer")
    out["notes"] = res.manifest.get("notes")
    t0 = time.perf_counter()
    engine = plan.load(res.plan_dir)
    out["plan_load_seconds"] = round(time.perf_counter() - t0, 1)
    _save(report, args.out)
    # baseline: what a user writes, one static graph per batch size (the module docstring says why)
    m16 = build(torch, name).half().cuda()
    base = torch.compile(m16, mode="max-autotune", dynamic=False)
    out["baseline"] = 'torch.compile(model.half().cuda(), mode="max-autotune", dynamic=False)'
    xs = {b: torch.randn(b, 3, 224, 224, device="cuda", dtype=torch.float16) for b in batches}
    out["baseline_compile_seconds"] = {}
    for b in batches:
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(3):
                base(xs[b])
        torch.cuda.synchronize()
        out["baseline_compile_seconds"][str(b)] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] baseline batch {b} compiled in {out['baseline_compile_seconds'][str(b)]}s", flush=True)
    _save(report, args.out)
    chunk = 8 if 8 in batches else batches[0]      # a batch size both have compiled already
    in_name = engine.inputs[0].name
    out["accuracy"] = {
        "examples": f"{EXAMPLES} seeded standard-normal images (torch seed 3), FP32 eager reference, TF32 off",
        "baseline": accuracy(torch, lambda x: base(x.half().cuda()).float().cpu().numpy(), examples, ref, chunk),
        "ngcx": accuracy(torch, lambda x: next(iter(engine.infer({in_name: x.numpy()}).values())), examples, ref,
                         chunk),
    }
    plan_x = {b: engine._device_layout(xs[b]) for b in batches}
    rounds: dict[str, dict[str, list[float]]] = {str(b): {"baseline": [], "ngcx": []} for b in batches}
    for r in range(args.repeats):
        for b in batches:
            pair = [("baseline", lambda b=b: base(xs[b])),
                    ("ngcx", lambda b=b: engine.infer_device([plan_x[b]]))]
            for who, fn in (pair if r % 2 == 0 else pair[::-1]):
                rounds[str(b)][who].append(median_ms(torch, fn, args.iters))
        print(f"[{name}] repeat {r} (baseline/ngcx): " + ", ".join(
            f"b{b} {rounds[str(b)]['baseline'][-1]:.3f}/{rounds[str(b)]['ngcx'][-1]:.3f} ms" for b in batches),
            flush=True)
    out["rows"] = [_row(name, b, rounds[str(b)]) for b in batches]
    out["profiles"] = {}
    for b in batches:
        if (name, b) in TARGETS or b == LATENCY_BATCH:
            out["profiles"][str(b)] = {
                "baseline": profile_table(torch, lambda b=b: base(xs[b])),
                "ngcx": profile_table(torch, lambda b=b: engine.infer_device([plan_x[b]])),
            }
    _save(report, args.out)
    engine = base = m16 = None  # noqa: F841 - the plan's and the baseline's graphs go before the next model
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def _row(name: str, b: int, r: dict[str, list[float]]) -> dict[str, Any]:
    ratio = [bm / nm for bm, nm in zip(r["baseline"], r["ngcx"], strict=True)]   # time ratio = throughput ratio
    target = TARGETS.get((name, b), 1.0 if b == LATENCY_BATCH else None)
    row = {"model": name, "batch": b,
           "baseline_ms": spread(r["baseline"]), "ngcx_ms": spread(r["ngcx"]),
           "baseline_img_s": round(b / statistics.median(r["baseline"]) * 1e3, 1),
           "ngcx_img_s": round(b / statistics.median(r["ngcx"]) * 1e3, 1),
           "speedup": spread(ratio), "target": target,
           "met": None if target is None else statistics.median(ratio) >= target}
    print(json.dumps({k: row[k] for k in ("model", "batch", "baseline_img_s", "ngcx_img_s", "target", "met")}
                     | {"speedup": row["speedup"]["median"]}), flush=True)
    return row


def _save(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="vit_b16,resnet50")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30, help="timed calls per figure (median kept)")
    ap.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES),
                    help="optimize --candidates, each model taking those that apply to it (default: FP16 "
                         "max-autotune, the GEMM epilogues for the transformer, channels-last frozen and cuDNN-fused "
                         "for ResNet-50; '' = every candidate that applies)")
    ap.add_argument("--gemm-backends", default="ATEN",
                    help="Inductor's max_autotune_gemm_backends for both sides (default ATEN: cuBLAS/cuBLASLt "
                         "only; 'ATEN,TRITON' is Inductor's own, ~15 s of autotuning per GEMM shape and batch "
                         "size on an H200, over 10 minutes for ViT-B/16 alone)")
    ap.add_argument("--conv-backends", default="ATEN",
                    help="Inductor's max_autotune_conv_backends for both sides (default ATEN: cuDNN only; "
                         "'ATEN,TRITON' is Inductor's own)")
    args = ap.parse_args()
    if args.repeats < 3:
        ap.error("--repeats must be at least 3: median, min and max need that many")
    args.batch_list = sorted({int(b) for b in args.batches.split(",")})
    args.candidate_list = [c.strip() for c in args.candidates.split(",") if c.strip()] or None
    report: dict[str, Any] = {"command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
                              "candidates": args.candidate_list or "every one that applies", "models": {}}
    try:
        import torch
        import torchvision
    except ImportError as exc:
        report["skipped"] = f"{exc.name} is not installed here"
        _save(report, args.out)
        print(report["skipped"])
        return 0
    if not torch.cuda.is_available():
        report["skipped"] = "no CUDA device visible to torch"
        _save(report, args.out)
        print(report["skipped"])
        return 0
    report["env"] = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
                     "compute_capability": "{}.{}".format(*torch.cuda.get_device_capability())}
    import torch._inductor.config

    torch._inductor.config.max_autotune_conv_backends = args.conv_backends
    torch._inductor.config.max_autotune_gemm_backends = args.gemm_backends
    # cuDNN times its algorithms per shape for both sides (the baseline's convolutions are cuDNN calls too):
    # the framework at its best, as a user tuning a convnet sets it
    torch.backends.cudnn.benchmark = True
    report["inductor"] = {"max_autotune_gemm_backends": args.gemm_backends,
                          "max_autotune_conv_backends": args.conv_backends, "cudnn_benchmark": True,
                          "note": "the same Inductor and cuDNN configuration for the baseline and every ngcx "
                                  "candidate"}
    work = Path(tempfile.mkdtemp(prefix="ngcx-optimizer-"))
    os.environ.setdefault("NGCX_RUNTIME_CACHE", str(work / "cache"))
    t_all = time.perf_counter()
    for name in args.models.split(","):
        t0 = time.perf_counter()
        try:
            run_model(torch, name, args, work, report)
        except Exception as exc:  # noqa: BLE001 - record it and go on with the other model
            report["models"].setdefault(name, {})["failed"] = f"{type(exc).__name__}: {exc}"[:1000]
            report["models"][name]["traceback"] = traceback.format_exc()[-3000:]
            print(traceback.format_exc(), flush=True)
        report["models"].setdefault(name, {})["seconds"] = round(time.perf_counter() - t0, 1)
        _save(report, args.out)
    report["total_seconds"] = round(time.perf_counter() - t_all, 1)
    _save(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
