"""PyTorch backend for torch.export programs (.pt2): torch.compile + CUDA graphs on a GPU.

What optimize() records: the source program (copied as model.pt2), the precision, and the batch
buckets. The compiled kernels cannot be saved portably, so loading recompiles, but the Inductor
cache is kept inside the plan (inductor-cache/, filled while optimize warms every bucket), which
makes the second compile on the same GPU mostly a cache read.

Why buckets: mode="reduce-overhead" captures one CUDA graph per input shape; a server's dynamic
batcher sends arbitrary batch sizes, so infer() pads each request up to the next profile size
(and splits above the largest), keeping the set of graphs small and known in advance.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import TensorSpec
from ..errors import RuntimeUserError

NAME = "pytorch"
MODEL_SUFFIXES = (".pt2",)
TORCH_TO_KSERVE = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "FP32",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}


def availability() -> tuple[bool, str]:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return False, f"torch is not installed ({exc})"
    return True, ""


def version() -> str:
    import torch

    return torch.__version__


def describe() -> dict[str, Any]:
    import torch

    return {"version": torch.__version__, "device": "cuda" if torch.cuda.is_available() else "cpu"}


def _export_load(path: Path):
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure means "not a torch.export program"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeUserError(
            f"{path}: not a torch.export program ({first[:200]}); save one with "
            "torch.export.save(torch.export.export(model, args), 'model.pt2')"
        ) from None


def _input_specs(ep, dtype_name: str) -> list[TensorSpec]:
    """Inputs from the exported graph's placeholders; symbolic dims become -1."""
    specs = []
    user_inputs = set(ep.graph_signature.user_inputs)
    for node in ep.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta.get("val")
        shape = tuple(d if isinstance(d, int) else -1 for d in val.shape)
        dt = str(val.dtype).removeprefix("torch.")
        if dt in ("float32", "float16", "bfloat16"):
            dt = dtype_name
        specs.append(TensorSpec(node.name, TORCH_TO_KSERVE.get(dt, "FP32"), shape))
    return specs


def _io_dtype(precision: str) -> str:
    """Host-side dtype for float tensors: FP16 travels natively, BF16 travels as FP32 (engine.py)."""
    return "float16" if precision == "fp16" else "float32"


# Overlapping copies with compute pays only when the copies are large. On an H100 (ResNet-50,
# bench/results/gpu/resnet50/h100/resnet50_h100_pipelined.*) two batches in flight took batch 256 from 10.6k
# to 18.7k img/s (FP16 input, 77 MB) but made batch 1 (0.3 MB) slower, 838 -> 617 img/s:
# per-call events and slot hand-offs cost more than the copy they hide. Below this size the
# engine stays serial. NGCX_RUNTIME_PIPELINE_MIN_BYTES (bytes) sets another threshold, to measure it on other
# cards and batch mixes (bench/results/gpu/targets/README.md); anything but a whole number keeps the default.
PIPELINE_MIN_BYTES = (int(os.environ["NGCX_RUNTIME_PIPELINE_MIN_BYTES"])
                      if os.environ.get("NGCX_RUNTIME_PIPELINE_MIN_BYTES", "").isdigit() else 8 << 20)


class TorchEngine:
    """An exported program, cast to the plan's precision, compiled, behind the Engine protocol."""

    backend = NAME

    def __init__(self, ep, name: str, precision: str, buckets: list[int], compile_mode: str | None,
                 device: int | str | None = None, choices: dict | None = None, amax: dict | None = None):
        import torch

        self.name, self.precision = name, precision
        self._torch = torch
        self.device = _device(torch, device)
        graphs = bool(compile_mode) if not choices else _graphs(choices)
        self._stream, self._lock = _stream_and_lock(torch, self.device, graphs=graphs)
        # Host-to-device copies go on a stream of their own, so batch N+1's inputs cross PCIe while
        # batch N computes (the GPU's copy engines run beside its SMs); the compute stream waits for them.
        self._copy_stream = torch.cuda.Stream(self.device) if self.device != "cpu" else None
        self._dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
        self._buckets = sorted(buckets) if buckets else []
        self.max_batch = self._buckets[-1] if self._buckets else 0
        self._channels_last = any(len(s.shape) == 4 for s in _input_specs(ep, "float32"))
        self.compile_note = None
        # A tuned plan's variants (below) replace the one module; on the CPU it runs the plain way.
        mod = None if choices and self.device != "cpu" else self._plain_module(ep, compile_mode)
        self._mod = mod
        # bucket -> the measured optimizer's variant for it (candidates/variant.py), when the plan has choices
        self._variants = _variants(ep, choices, self.device, amax) if choices and self.device != "cpu" else {}
        self._staging: dict[tuple, Any] = {}  # pinned host buffers, one per (slot, tensor, bucket, shape)
        # Two pipeline slots: while the GPU runs batch N from slot 0, infer_async() stages batch
        # N+1 into slot 1. A slot is handed back only after its outputs were copied out.
        self._free_slots: queue.Queue[int] = queue.Queue()
        for slot in (0, 1):
            self._free_slots.put(slot)
        self.inputs = _input_specs(ep, _io_dtype(precision))
        self.outputs: list[TensorSpec] = []
        self._out_names: list[str] = []
        self._discover_outputs(ep)

    def _plain_module(self, ep, compile_mode: str | None):
        """The program's module in the plan's precision (channels_last for images), compiled with one mode."""
        torch = self._torch
        mod = ep.module().to(self.device)
        if self._dtype != torch.float32:
            mod = mod.to(self._dtype)
        if self._channels_last:
            mod = mod.to(memory_format=torch.channels_last)
        if compile_mode and self.device.startswith("cuda"):
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(64, len(self._buckets) * 4)
            return torch.compile(mod, mode=compile_mode, dynamic=False)
        if compile_mode:
            self.compile_note = "torch.compile skipped on CPU: CUDA graphs need a GPU; running eager"
        return mod

    def _discover_outputs(self, ep) -> None:
        names = list(ep.graph_signature.user_outputs)
        out_node = next(n for n in ep.graph.nodes if n.op == "output")
        vals = [a.meta.get("val") for a in out_node.args[0]][-len(names) :]
        for n, v in zip(names, vals, strict=True):
            dt = str(v.dtype).removeprefix("torch.")
            kd = TORCH_TO_KSERVE.get(
                _io_dtype(self.precision) if dt.startswith(("float", "bfloat")) else dt, "FP32"
            )
            self.outputs.append(TensorSpec(n, kd, tuple(d if isinstance(d, int) else -1 for d in v.shape)))
            self._out_names.append(n)

    def _streamed(self):
        """This engine's lock, stream and device as the current ones (only the lock on the CPU)."""
        import contextlib

        stack = contextlib.ExitStack()
        stack.enter_context(self._lock)
        if self.device != "cpu":
            stack.enter_context(self._torch.cuda.device(self.device))
        if self._stream is not None:
            stack.enter_context(self._torch.cuda.stream(self._stream))
        return stack

    def _variant(self, n: int):
        """The measured optimizer's variant for a batch of n (the next larger bucket's), or None."""
        if not self._variants:
            return None
        bucket = next((b for b in self._buckets if b >= n), self._buckets[-1])
        return self._variants[bucket]

    def _run(self, tensors: list) -> list:
        variant = self._variant(tensors[0].shape[0]) if tensors else None
        with self._torch.inference_mode():
            out = variant(*tensors) if variant is not None else self._mod(*tensors)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return list(outs)

    def infer_device(self, tensors: list) -> list:
        """Run on tensors already on the device (bench uses this for compute-only figures)."""
        return self._run(tensors)

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._streamed():
            return self._infer(feeds)

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [s.name for s in self.inputs if s.name not in feeds]
        if missing:
            raise RuntimeUserError(f"missing input(s) {', '.join(missing)} for model {self.name}")
        n = len(next(iter(feeds.values())))
        chunks = []
        step = self.max_batch or n
        for start in range(0, n, step):
            part = {k: v[start : start + step] for k, v in feeds.items()}
            chunks.append(self._infer_bucket(part, min(step, n - start)))
        return {
            k: np.concatenate([c[k] for c in chunks]) if len(chunks) > 1 else chunks[0][k]
            for k in self._out_names
        }

    def _pinned(self, key: tuple, shape: tuple, dtype) -> Any:
        """A reused page-locked host buffer for `key` (allocated once)."""
        buf = self._staging.get(key)
        if buf is None:
            buf = self._torch.empty(shape, dtype=dtype, pin_memory=True)
            self._staging[key] = buf
        return buf

    def infer_async(self, feeds: dict[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
        with self._streamed():
            return self._infer_async(feeds)

    def _infer_async(self, feeds: dict[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
        """Launch one batch and return a function that waits for its outputs.

        Why: with host arrays, infer() is serial — copy into pinned memory, copy to the GPU,
        compute, copy back — so the GPU idles while the CPU copies. Here the copies and the
        graph replay are queued on the stream and the call returns; the caller (the server's
        batcher) stages the next batch while this one computes. Two slots of pinned buffers
        alternate; a slot is reused only after its outputs were copied out by the returned
        function. Without a GPU or beyond the largest bucket this falls back to infer().
        """
        torch = self._torch
        missing = [s.name for s in self.inputs if s.name not in feeds]
        if missing:
            raise RuntimeUserError(f"missing input(s) {', '.join(missing)} for model {self.name}")
        n = len(next(iter(feeds.values())))
        small = sum(a.nbytes for a in feeds.values()) < PIPELINE_MIN_BYTES
        if small or self.device == "cpu" or not self._buckets or n > self.max_batch:
            result = self._infer(feeds)
            return lambda: result
        bucket = next(b for b in self._buckets if b >= n)
        slot = self._free_slots.get()
        try:
            tensors = [self._stage_slot(slot, spec.name, np.ascontiguousarray(feeds[spec.name]), n, bucket)
                       for spec in self.inputs]
            outs = self._run(tensors)
            host: dict[str, Any] = {}
            for name, t in zip(self._out_names, outs, strict=True):
                t = t[:n].float() if t.dtype == torch.bfloat16 else t[:n]
                buf = self._pinned(("out", slot, name, bucket, tuple(t.shape[1:]), t.dtype),
                                   (bucket, *t.shape[1:]), t.dtype)
                buf[:n].copy_(t, non_blocking=True)
                host[name] = buf
            done = torch.cuda.Event()
            done.record()
        except BaseException:
            self._free_slots.put(slot)
            raise

        def finish() -> dict[str, np.ndarray]:
            try:
                done.synchronize()
                return {name: buf[:n].numpy().copy() for name, buf in host.items()}
            finally:
                self._free_slots.put(slot)

        return finish

    def _stage_slot(self, slot: int | str, name: str, arr: np.ndarray, n: int, bucket: int):
        """Host array -> device tensor through the slot's pinned buffer of the bucket's size.

        Why: pageable H2D copies run at a fraction of PCIe speed; one (multi-threaded) copy into
        pinned memory plus an async H2D copy is faster. The buffer is reused only once its batch
        is done: infer() waits for its outputs, infer_async() hands a slot back after finish().
        Padding rows are zeroed. An input that fills the bucket and is page-locked already (a system
        shared-memory read, shm.py) goes to the GPU straight from there: its request's thread reuses
        that buffer only after the answer, so after this batch's outputs.
        """
        torch = self._torch
        src = torch.from_numpy(arr) if arr.flags.writeable else torch.from_numpy(arr.copy())
        if n == bucket and src.is_pinned():
            return self._device_layout(self._to_device(src))
        buf = self._pinned(("in", slot, name, bucket, tuple(arr.shape[1:]), src.dtype),
                           (bucket, *arr.shape[1:]), src.dtype)
        buf[:n].copy_(src)
        if bucket > n:
            buf[n:].zero_()
        return self._device_layout(self._to_device(buf))

    def _to_device(self, buf):
        """Pinned host buffer -> device tensor, copied on the copy stream; the compute stream waits for it
        (and the caching allocator learns the tensor is used there)."""
        torch = self._torch
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            dev = buf.to(self.device, non_blocking=True)
        compute.wait_stream(self._copy_stream)
        dev.record_stream(compute)
        return dev

    def _stage(self, name: str, arr: np.ndarray, n: int, bucket: int):
        """Host array -> device tensor for the serial infer() path (pinned "sync" slot on a GPU)."""
        if self.device != "cpu" and bucket in self._buckets:
            return self._stage_slot("sync", name, arr, n, bucket)
        padded = np.concatenate([arr, np.zeros((bucket - n, *arr.shape[1:]), arr.dtype)]) if bucket > n else arr
        return self._device_layout(self._torch.from_numpy(padded).to(self.device))

    def _device_layout(self, t):
        """The plan's precision for float inputs, channels_last for images (as the batch's variant wants)."""
        if t.is_floating_point():
            t = t.to(self._dtype)
        variant = self._variant(t.shape[0]) if t.dim() else None
        if variant is not None:
            return variant.layout(t)
        if t.dim() == 4 and self._channels_last:
            t = t.contiguous(memory_format=self._torch.channels_last)
        return t

    def _infer_bucket(self, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        torch = self._torch
        bucket = next((b for b in self._buckets if b >= n), n)
        tensors = [
            self._stage(spec.name, np.ascontiguousarray(feeds[spec.name]), n, bucket) for spec in self.inputs
        ]
        outs = self._run(tensors)
        result = {}
        for name, t in zip(self._out_names, outs, strict=True):
            t = t[:n]
            if t.dtype == torch.bfloat16:
                t = t.float()
            result[name] = t.detach().cpu().numpy()
        return result


def _warm(engine: TorchEngine) -> float:
    """Compile + capture every bucket once (fills the Inductor cache); returns seconds."""
    start = time.perf_counter()
    for b in engine._buckets:
        feeds = {}
        for s in engine.inputs:
            shape = tuple(b if i == 0 else (d if d > 0 else 1) for i, d in enumerate(s.shape))
            feeds[s.name] = np.zeros(shape, s.numpy_dtype)
        for _ in range(3):  # reduce-overhead records the graph on the 2nd/3rd call
            engine.infer(feeds)
    return time.perf_counter() - start


def _set_inductor_cache(plan_dir: Path) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(plan_dir / "inductor-cache")


def optimize(src: Path, out_dir: Path, opts) -> dict[str, Any]:
    ep = _export_load(src)
    shutil.copyfile(src, out_dir / "model.pt2")
    _set_inductor_cache(out_dir)
    if getattr(opts, "tune", False):
        from . import pytorch_tuned

        return pytorch_tuned.optimize(ep, opts, _input_specs(ep, "float16"), TorchEngine)
    mode = "reduce-overhead"
    engine = TorchEngine(ep, opts.name, opts.precision, opts.batch_profile, mode)
    notes = [engine.compile_note] if engine.compile_note else []
    warm_s = _warm(engine)
    return {
        "artifact": "model.pt2",
        "device": engine.device,
        "compile": {
            "mode": mode if engine.device != "cpu" else None,
            "dynamic": False,
            "channels_last": engine._channels_last,
            "warmup_seconds": round(warm_s, 2),
        },
        "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in engine.inputs],
        "outputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in engine.outputs],
        "notes": notes,
    }


# CUDA graphs through torch.compile(mode="reduce-overhead") live in PyTorch's cudagraph trees, one
# memory pool per device shared by every compiled model of the process: a replay can overwrite the
# outputs of another engine's replay before they are copied out. Measured on an H100: two instances
# on one GPU answered concurrent requests with another request's numbers. So engines with CUDA
# graphs on the same device share one lock (launch + copy-out) and run on the device's default
# stream: under a side stream the graphs were not replayed at all (ResNet-50 batch 1 went from
# 0.41 to 2.8 ms). Several instances still overlap their host work (staging, copies, numpy), and
# MPS processes (serve --mps) are the way to run CUDA graphs side by side. Eager engines get a
# stream and lock of their own and run concurrently.
_SHARED: dict[str, tuple[Any, Any]] = {}
_SHARED_LOCK = threading.Lock()


def _stream_and_lock(torch, device: str, graphs: bool) -> tuple[Any, Any]:
    if device == "cpu":
        return None, threading.Lock()
    if not graphs:
        return torch.cuda.Stream(device), threading.Lock()
    with _SHARED_LOCK:
        if device not in _SHARED:
            _SHARED[device] = (None, threading.RLock())     # None: the device's default stream
        return _SHARED[device]


def _device(torch, device: int | str | None) -> str:
    """The torch device of an instance: the first GPU by default, GPU `device`, or "cpu"."""
    if device == "cpu" or not torch.cuda.is_available():
        if isinstance(device, int):
            raise RuntimeUserError(f"an instance on GPU {device} needs a GPU, and torch sees none here")
        return "cpu"
    index = device if isinstance(device, int) else 0
    if index >= torch.cuda.device_count():
        raise RuntimeUserError(f"an instance on GPU {index}: torch sees {torch.cuda.device_count()} GPU(s)")
    return f"cuda:{index}"


def load(plan_dir: Path, manifest: dict, gpu: bool, device: int | str | None = None) -> TorchEngine:
    _set_inductor_cache(plan_dir)
    ep = _export_load(plan_dir / manifest["artifact"])
    mode = (manifest.get("compile") or {}).get("mode") or "reduce-overhead"
    choices, amax = _plan_choices(manifest)
    engine = TorchEngine(
        ep, manifest["name"], manifest["precision"], manifest.get("batch_profile") or [], mode, device,
        choices=choices, amax=amax,
    )
    _warm(engine)
    return engine


def _plan_choices(manifest: dict) -> tuple[dict | None, dict | None]:
    """The measured optimizer's bucket -> candidate (and FP8 static ranges) from a tuned plan's manifest."""
    section = manifest.get("optimizer")
    if not isinstance(section, dict) or not section.get("choices"):
        return None, None
    from ..candidates.tune import choices

    return choices(section, manifest.get("batch_profile") or []), section.get("calibrated_amax")


def _graphs(choices: dict) -> bool:
    from ..candidates.variant import uses_cuda_graphs

    return uses_cuda_graphs(list(choices.values()))


def _variants(ep, choices: dict, device: str, amax: dict | None) -> dict:
    """One compiled variant per distinct chosen candidate, shared by the buckets that chose it."""
    from ..candidates.variant import build

    built: dict[str, Any] = {}
    for cand in choices.values():
        if cand.name not in built:
            built[cand.name] = build(ep, cand, device, amax)
    return {b: built[c.name] for b, c in choices.items()}


def load_model(src: Path, gpu: bool, name: str, device: int | str | None = None) -> TorchEngine:
    """A raw .pt2 runs eager in FP32: optimization is what `optimize` is for."""
    return TorchEngine(_export_load(src), name, "fp32", [], None, device)
