"""One candidate made runnable: the exported program's module, transformed and compiled (torch).

The torch.compile family lives here (modes with and without CUDA graphs, channels-last, Inductor
freezing); fp8.py and sparse.py rewrite the linear layers, fused_conv.py and epilogue.py fuse epilogues,
before the compile. The same function builds a candidate while optimize times it (tune.py) and when a plan is
loaded (backends/pytorch.py), so what runs is what was measured.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
import torch._inductor.config

from . import Candidate

CUDA_GRAPH_MODES = ("max-autotune", "reduce-overhead")


class Variant:
    """A compiled module for one candidate, and the input layout it wants."""

    def __init__(self, cand: Candidate, module: Any, channels_last: bool, notes: list[str]):
        self.candidate, self.module, self.channels_last, self.notes = cand, module, channels_last, notes

    def __call__(self, *tensors):
        # Inductor reads `freezing` when it compiles, which is at the first call for each new shape;
        # its config is no guard of dynamo's, so the patch costs nothing once compiled.
        ctx = torch._inductor.config.patch(freezing=True) if self.candidate.freezing else contextlib.nullcontext()
        with ctx:
            return self.module(*tensors)

    def layout(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4 and self.channels_last:
            return t.contiguous(memory_format=torch.channels_last)
        return t


def base_module(ep, device: str, dtype) -> torch.nn.Module:
    """A private copy of the program's module on `device` in `dtype` (ep's own weights stay as they are)."""
    mod = copy.deepcopy(ep.module()).to(device)
    return mod.to(dtype) if dtype != torch.float32 else mod


def build(ep, cand: Candidate, device: str, amax: dict[str, float] | None = None, compiled: bool = True) -> Variant:
    """The candidate's module, FP16 underneath, compiled with its mode (compiled=False: eager, for checks)."""
    from . import epilogue, fp8, fused_conv, sparse

    mod = base_module(ep, device, torch.float16)
    notes: list[str] = []
    if cand.fused_conv:
        notes.append(f"{fused_conv.convert(mod)} convolutions fused with their BN, residual add and ReLU (cuDNN)")
    if cand.gemm_epilogue:
        gelus, patches = epilogue.convert(mod)
        notes.append(f"{gelus} linear layers fused with their GELU (cuBLASLt), {patches} patch convolutions as GEMMs")
    if cand.channels_last:
        mod = mod.to(memory_format=torch.channels_last)
    if cand.fp8:
        fp8.probe_rowwise_fp16(device)
        notes.append(f"{fp8.convert(mod, cand.fp8, amax)} linear layers in FP8 ({cand.fp8} scales)")
    if cand.sparse:
        notes.append(f"{sparse.convert(mod)} linear layers 2:4 sparse")
    if compiled and device.startswith("cuda"):
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        mod = torch.compile(mod, mode=cand.mode, dynamic=False)
    return Variant(cand, mod, cand.channels_last, notes)


def uses_cuda_graphs(cands: list[Candidate]) -> bool:
    return any(c.mode in CUDA_GRAPH_MODES for c in cands)


def time_ms(fn, iters: int, warmup: int) -> list[float]:
    """Per-iteration milliseconds of fn() on the current stream, by CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]
