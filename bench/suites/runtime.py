"""runtime: `ngcx-runtime bench` on this CPU (ONNX Runtime): fp32 vs int8 plans, in-process vs served.

The model is tests/runtime/models.py's conv_net at 64x64 with 32 channels (3 convolutions, ~0.1
GFLOP per image): small enough for a 2-core box, big enough that the convolutions, not Python,
dominate at batch 8. Each repetition is one `ngcx-runtime bench --serve` run per plan; a row's
min / median / max is over the repetitions. The GPU figures are not measured here: the last
GPU run's saved results (bench/results/gpu/resnet50/h100/) are summarized beside them with the device named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult, SuiteSkipped, script

BATCHES = "1,8"
CONCURRENCY = "1,4"
DURATION_S = "1.0"
GPU_RESULTS = ROOT / "bench" / "results" / "gpu" / "resnet50" / "h100"
OPTIMIZER_RESULTS = ROOT / "bench" / "results" / "gpu" / "optimizer"     # bench/gpu/optimizer.py's saved runs


def _model(work: Path) -> tuple[Path, Path]:
    """The ONNX model and a calibration .npz (64 samples) for the int8 plan and the accuracy delta."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    try:
        import models
        import numpy as np
    except ImportError as exc:
        raise SuiteSkipped(f"needs the test extras (onnx, numpy): {exc}") from None
    src = models.conv_net(work / "conv.onnx", channels=32, size=64)
    rng = np.random.default_rng(7)
    cal = work / "calibration.npz"
    np.savez(cal, input=rng.standard_normal((64, 3, 64, 64)).astype(np.float32))
    return src, cal


def _run_json(argv: list[str], work: Path) -> dict:
    """Run an ngcx-runtime command with --json; its plan cache in the work folder, not the user's."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "NGCX_RUNTIME_CACHE": str(work / "runtime-cache")})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def _plans(work: Path, src: Path, cal: Path) -> dict[str, Path]:
    rt = script("ngcx-runtime")
    plans = {}
    for precision in ("fp32", "int8"):
        plan = work / f"plan-{precision}"
        argv = [rt, "optimize", str(src), "-o", str(plan), "--precision", precision, "--batch", "1,8",
                "--backend", "onnxruntime", "--json"]
        if precision == "int8":
            argv[-1:-1] = ["--calibration-data", str(cal)]
        _run_json(argv, work)
        plans[precision] = plan
    return plans


def _row_key(row: dict) -> str:
    return f"{row['mode']} batch {row['batch']} x{row['concurrency']}"


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Bench both plans `repeat` times (alternating), then ratios int8/fp32 and served/in-process."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise SuiteSkipped("onnxruntime is not installed here (pip install -e '.[test]')") from None
    src, cal = _model(work)
    plans = _plans(work, src, cal)
    rt = script("ngcx-runtime")
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    accuracy: dict[str, object] = {}
    for _ in range(result.repeat):
        for precision, plan in plans.items():
            doc = _run_json([rt, "bench", str(plan), "--batch", BATCHES, "--concurrency", CONCURRENCY,
                             "--duration", DURATION_S, "--serve", "--calibration-data", str(cal), "--json"], work)
            accuracy[precision] = doc.get("accuracy")
            for row in doc["results"]:
                s = samples.setdefault((precision, _row_key(row)), {"tput": [], "p50": []})
                s["tput"].append(row["throughput_inf_s"])
                s["p50"].append(row["latency_ms"]["p50"])
    command = (f".venv/bin/ngcx-runtime bench plan-{{fp32,int8}} --batch {BATCHES} --concurrency {CONCURRENCY} "
               f"--duration {DURATION_S} --serve --calibration-data calibration.npz --json")
    result.measurements = [
        Measurement(name=f"{precision} {key}", tool="ngcx-runtime", unit="inf/s", better="higher",
                    wall=Stats.of(s["tput"]), command=command,
                    note=f"p50 latency median {Stats.of(s['p50']).median:.2f} ms")
        for (precision, key), s in samples.items()]
    by = {m.name: m for m in result.measurements}
    result.ratios = [r for r in (
        _ratio("int8 / fp32, in-process batch 8", by, "int8 in-process batch 8 x1", "fp32 in-process batch 8 x1"),
        _ratio("int8 / fp32, in-process batch 1", by, "int8 in-process batch 1 x1", "fp32 in-process batch 1 x1"),
        _ratio("served / in-process, fp32 batch 8, 1 client", by, "fp32 http batch 8 x1", "fp32 in-process batch 8 x1"),
        _ratio("served (4 clients) / in-process, fp32 batch 1", by, "fp32 http batch 1 x4",
               "fp32 in-process batch 1 x1"),
    ) if r]
    result.extra["accuracy"] = accuracy
    result.extra["model"] = "tests/runtime/models.py conv_net(channels=32, size=64), ONNX Runtime CPU EP"
    result.extra["gpu_reference"] = gpu_reference()
    result.extra["gpu_optimizer"] = optimizer_reference()
    result.notes = [
        "Throughput (inferences/s, higher is better). served = KServe v2 HTTP in front of the same plan; "
        "'x4' = 4 client threads (the dynamic batcher merges their requests).",
        "GPU figures are not re-measured by this suite; gpu_reference in runtime.json summarizes the last "
        "saved GPU run (bench/gpu/resnet50.py on the device named there).",
        *optimizer_notes(result.extra["gpu_optimizer"]),
    ]


def _ratio(name: str, by: dict[str, Measurement], num: str, den: str) -> Ratio | None:
    if num not in by or den not in by:
        return None
    return Ratio(name=name, numerator=num, denominator=den, wall=round(by[num].wall.median / by[den].wall.median, 3),
                 better="higher")


def gpu_reference() -> dict[str, object]:
    """The newest saved GPU ResNet-50 run, as rows of img/s, with its device (not measured now).

    Newest = last by name: the runs are named in order (resnet50_h100, _pipelined, _pipelined_v2);
    a checkout gives every file the same mtime.
    """
    runs = sorted(GPU_RESULTS.glob("resnet50_h100*.json"))
    if not runs:
        return {"status": "none saved"}
    doc = json.loads(runs[-1].read_text())
    device = (GPU_RESULTS / "device.txt").read_text().strip() if (GPU_RESULTS / "device.txt").is_file() else ""
    return {"file": os.path.relpath(runs[-1], ROOT), "device": device or doc.get("env", {}).get("gpu"),
            "software": doc.get("env"),
            "rows": [{"name": r["name"], "batch": r["batch"], "img_per_s": r["img_per_s"]}
                     for r in doc.get("rows", []) if "img_per_s" in r]}


def optimizer_reference() -> dict[str, object]:
    """bench/gpu/optimizer.py's saved runs: per model and batch, torch.compile max-autotune FP16 and ngcx's
    tuned plan side by side (img/s at the median of the repeats, the ratio's median / min / max), not measured now.
    A run saved before the bench compiled its baseline with dynamic=False (no "baseline" field) compared its
    second batch size against a graph recompiled with a dynamic batch (bench/gpu/optimizer.py's docstring): such
    a row is kept but not judged against its target."""
    runs = sorted(p for p in OPTIMIZER_RESULTS.glob("*.json"))
    rows, files = [], []
    for path in runs:
        doc = json.loads(path.read_text())
        gpu = (doc.get("env") or {}).get("gpu")
        for name, model in (doc.get("models") or {}).items():
            choices = (model.get("optimizer") or {}).get("choices") or {}
            for i, r in enumerate(model.get("rows") or []):
                static = bool(model.get("baseline")) or i == 0
                rows.append({"file": os.path.relpath(path, ROOT), "gpu": gpu, "model": name, "batch": r["batch"],
                             "plan": (choices.get(str(r["batch"])) or {}).get("candidate"),
                             "torch_compile_img_s": r["baseline_img_s"], "ngcx_img_s": r["ngcx_img_s"],
                             "speedup": r["speedup"], "target": r.get("target"),
                             "met": r.get("met") if static else None, "static_baseline": static,
                             "inductor": doc.get("inductor")})
        files.append(os.path.relpath(path, ROOT))
    if not rows:
        return {"status": "none saved", "where": os.path.relpath(OPTIMIZER_RESULTS, ROOT), "files": files}
    return {"files": files, "rows": rows}


def optimizer_notes(ref: dict[str, object]) -> list[str]:
    """One line per saved model and batch: torch.compile max-autotune FP16 beside ngcx's plan, same run."""
    if not ref.get("rows"):
        return [f"GPU optimizer (issue 50): no complete bench/gpu/optimizer.py run saved in {ref.get('where')}."]
    out = []
    for r in ref["rows"]:
        sp = r["speedup"]
        if not r.get("static_baseline", True):
            target = ", not comparable: that baseline was recompiled with a dynamic batch (before dynamic=False)"
        else:
            target = "" if r["target"] is None else f", target {r['target']}x {'met' if r['met'] else 'NOT met'}"
        plan = f" ({r['plan']})" if r.get("plan") else ""
        out.append(f"GPU optimizer ({r['file']}, {r['gpu']}): {r['model']} batch {r['batch']}: torch.compile "
                   f"max-autotune FP16 {r['torch_compile_img_s']:,.0f} img/s, ngcx plan{plan} {r['ngcx_img_s']:,.0f} "
                   f"img/s = {sp['median']:.2f}x (min {sp['min']:.2f}, max {sp['max']:.2f}){target}")
    return out
