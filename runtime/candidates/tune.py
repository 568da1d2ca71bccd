"""Build, time and check every candidate on this GPU, per batch size; choose.py decides (torch + CUDA).

For each candidate that can pay off here (candidates/__init__.py's applicable()), one compiled
module serves every batch size of the profile (one static graph each). At each size it is
  checked: the user's examples (or seeded random inputs, said so) in chunks of that size, padded,
           against the FP32 reference, eager and with TF32 off, computed once;
  timed:   CUDA events around each call, after a warm-up that also compiles and records the graph,
           median kept (choose.py).
A candidate that fails to build or run is a trial with its failure, never an abort.
"""

from __future__ import annotations

import gc
import hashlib
import time
from typing import Any

import numpy as np
import torch

from .. import choose
from . import ALL, Candidate, ModelTraits, applicable
from .variant import Variant, base_module, build, time_ms

EXAMPLES_DEFAULT = 32        # seeded random samples when the user gives none
WARMUP, ITERS = 10, 30


def traits(ep) -> ModelTraits:
    """Convolutions, FP8-able linear layers and whether an input is an image, read off the exported graph."""
    convs = linears = 0
    params = dict(ep.named_parameters())
    sig = {s.arg.name: s.target for s in ep.graph_signature.input_specs if getattr(s, "target", None)}
    image = False
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in ep.graph_signature.user_inputs:
            val = node.meta.get("val")
            image = image or (val is not None and val.dim() == 4 and val.dtype.is_floating_point)
        if node.op != "call_function":
            continue
        name = str(node.target)
        if "convolution" in name or "conv2d" in name:
            convs += 1
        elif "aten.linear" in name:
            w = params.get(sig.get(getattr(node.args[1], "name", ""), ""))
            if w is not None and w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0:
                linears += 1
    return ModelTraits(convolutions=convs, linears=linears, image_input=image)


def compute_capability(device: str) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def examples_for(specs, given: dict[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The user's examples, or seeded standard-normal ones (integers: zeros) of each input's shape."""
    if given:
        missing = [s.name for s in specs if s.name not in given]
        if missing:
            raise ValueError(f"the examples lack input(s) {', '.join(missing)}; key them by input name")
        feeds = {s.name: np.ascontiguousarray(given[s.name]) for s in specs}
        source = "the user's examples"
    else:
        rng = np.random.default_rng(0)
        feeds = {}
        for s in specs:
            shape = (EXAMPLES_DEFAULT, *[d if d > 0 else 1 for d in s.shape[1:]])
            dt = np.dtype(s.numpy_dtype)
            feeds[s.name] = (rng.standard_normal(shape).astype(np.float32) if dt.kind == "f"
                             else np.zeros(shape, dt))
        source = f"{EXAMPLES_DEFAULT} seeded standard-normal samples (no examples given)"
    h = hashlib.sha256()
    for k in sorted(feeds):
        h.update(k.encode() + feeds[k].tobytes())
    count = len(next(iter(feeds.values())))
    return feeds, {"source": source, "count": count, "sha256": h.hexdigest()}


def _chunks(feeds: dict[str, np.ndarray], bucket: int):
    """(n, padded arrays) for each chunk of `bucket` samples."""
    total = len(next(iter(feeds.values())))
    for start in range(0, total, bucket):
        part = {k: v[start:start + bucket] for k, v in feeds.items()}
        n = len(next(iter(part.values())))
        if n < bucket:
            part = {k: np.concatenate([v, np.zeros((bucket - n, *v.shape[1:]), v.dtype)]) for k, v in part.items()}
        yield n, part


def _tensors(specs, feeds: dict[str, np.ndarray], device: str, dtype, variant: Variant | None = None) -> list:
    out = []
    for s in specs:
        t = torch.from_numpy(feeds[s.name]).to(device)
        if t.is_floating_point():
            t = t.to(dtype)
        out.append(variant.layout(t) if variant else t)
    return out


def _first(out) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def reference(ep, specs, feeds, device: str) -> np.ndarray:
    """The FP32 answer on the examples: eager, TF32 off (the number the tolerance is against)."""
    mod = base_module(ep, device, torch.float32)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            outs = [_first(mod(*_tensors(specs, part, device, torch.float32)))[:n].float().cpu().numpy()
                    for n, part in _chunks(feeds, 64)]
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    del mod
    return np.concatenate(outs)


def _outputs(variant: Variant, specs, feeds, bucket: int, device: str) -> np.ndarray:
    outs = []
    with torch.inference_mode():
        for n, part in _chunks(feeds, bucket):
            # copied out at once: a CUDA-graph replay overwrites its outputs on the next call
            out = _first(variant(*_tensors(specs, part, device, torch.float16, variant)))
            outs.append(out[:n].float().cpu().numpy())
    return np.concatenate(outs)


def _timing_inputs(specs, bucket: int, device: str, variant: Variant) -> list:
    rng = np.random.default_rng(1)
    feeds = {}
    for s in specs:
        shape = (bucket, *[d if d > 0 else 1 for d in s.shape[1:]])
        dt = np.dtype(s.numpy_dtype)
        feeds[s.name] = rng.standard_normal(shape).astype(np.float32) if dt.kind == "f" else np.zeros(shape, dt)
    return _tensors(specs, feeds, device, torch.float16, variant)


def trial(variant: Variant, specs, feeds, ref: np.ndarray, bucket: int, device: str) -> choose.Trial:
    t = choose.Trial(variant.candidate.name, bucket)
    try:
        t.error = choose.compare(ref, _outputs(variant, specs, feeds, bucket, device))
        xs = _timing_inputs(specs, bucket, device, variant)
        with torch.inference_mode():
            t.ms = time_ms(lambda: variant(*xs), ITERS, WARMUP)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is recorded, not fatal
        t.failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    return t


def tune(ep, specs, device: str, buckets: list[int], tol: choose.Tolerance, examples: dict | None,
         allow_sparsity: bool, only: list[str] | None = None, log=print) -> dict[str, Any]:
    """Every applicable candidate at every bucket, timed and checked; the plan's "optimizer" section."""
    feeds, ex_info = examples_for(specs, examples)
    cands, skipped = applicable(traits(ep), compute_capability(device), allow_sparsity, only)
    ref = reference(ep, specs, feeds, device)
    amax = _calibrate(ep, specs, feeds, device) if any(c.fp8 == "static" for c in cands) else None
    trials: list[choose.Trial] = []
    for cand in cands:
        t0 = time.perf_counter()
        try:
            variant = build(ep, cand, device, amax)
        except Exception as exc:  # noqa: BLE001 - recorded as this candidate's failure at every size
            trials += [choose.Trial(cand.name, b, failure=f"build: {type(exc).__name__}: {str(exc)[:300]}")
                       for b in buckets]
            continue
        for b in buckets:
            trials.append(trial(variant, specs, feeds, ref, b, device))
            tr = trials[-1]
            log(f"ngcx-runtime optimize: {cand.name} batch {b}: "
                + (f"{tr.median_ms:.3f} ms, top-1 {tr.error.top1:.4f}, max rel err {tr.error.max_rel_error:.4g}"
                   if tr.ms and tr.error else f"failed ({tr.failure})"))
        log(f"ngcx-runtime optimize: {cand.name}: {time.perf_counter() - t0:.1f}s with compiles")
        del variant
        _release()
    section = choose.record(trials, tol, buckets, ex_info, skipped)
    section["compute_capability"] = compute_capability(device)
    if amax:
        section["calibrated_amax"] = {k: round(v, 6) for k, v in amax.items()}
    return section


def _calibrate(ep, specs, feeds, device: str) -> dict[str, float]:
    """Static FP8's per-layer activation ranges, from the FP16 model on the examples."""
    from . import fp8

    mod = base_module(ep, device, torch.float16)

    def run(m) -> None:
        with torch.inference_mode():
            for _n, part in _chunks(feeds, 64):
                m(*_tensors(specs, part, device, torch.float16))

    return fp8.calibrate(mod, run)


def _release() -> None:
    """Drop a candidate's compiled graphs and CUDA-graph pools before the next one is built."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def choices(section: dict[str, Any], buckets: list[int]) -> dict[int, Candidate]:
    """Bucket -> the candidate the plan chose (FP16 max-autotune where it fell back)."""
    out = {}
    for b in buckets:
        name = choose.chosen(section, b)
        out[b] = ALL.get(name, ALL["fp16 max-autotune"])
    return out
