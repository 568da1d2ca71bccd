"""Which axis is the batch: decided at load from two inferences, not from the `-1`s of a signature.

Why: a trained LSTM whose input is batch-major ([batch, time, C]) but whose outputs are
time-major ([time, batch, C]) advertises a dynamic dim 0 everywhere. Trusting that, the
server merged concurrent requests along dim 0 and answered every merged request with a 500
(issue 12, item 6). Symbolic dim names do not settle it either: exporters name dims freely.

The evidence: run the warm-up sample at batch 1, then the same sample twice at batch 2. For
each output exactly one axis must go from 1 to 2 with every other dim unchanged (that is its
batch axis), and both halves along it must equal the batch-1 output (within a tolerance for
kernels that differ by batch size). Anything else (an axis that does not scale, several that
do, a batch of 2 that fails, halves that differ because dim 0 of the input was really time)
and the model is served unbatched: each request runs alone, correct and never a 500.

Handlers (handler.py) declare their signature in code written for this server, whose contract
says dim 0 is the batch: they are not probed (their predict() may have side effects), and
batching.py's runtime check still stops merging if a merged batch does not split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .engine import BYTES, Engine
from .errors import RuntimeUserError

RTOL = 1e-2          # batch-size dependent kernels (GEMM tiling, FP16) change the last bits, not more
ATOL_SCALE = 1e-2    # absolute tolerance, relative to the largest magnitude of the output


@dataclass(frozen=True)
class BatchLayout:
    """How requests of one model are batched.

    batched: dim 0 of every input is a batch dim (a request's batch is checked against max batch).
    merge: concurrent requests may be concatenated on input dim 0 and split on `output_axes`.
    """

    batched: bool
    merge: bool
    output_axes: dict[str, int] = field(default_factory=dict)
    evidence: str = ""

    def describe(self) -> str:
        """One line for the log and the model metadata."""
        if not self.batched:
            return f"unbatched: {self.evidence}"
        if not self.merge:
            return f"batch on input dim 0, requests not merged: {self.evidence}"
        axes = sorted(set(self.output_axes.values())) or [0]
        where = (f"output dim {axes[0]}" if len(axes) == 1 else
                 "output dims " + ", ".join(f"{n}:{a}" for n, a in sorted(self.output_axes.items())))
        return f"batch on input dim 0 and {where}: {self.evidence}"

    def as_json(self) -> dict:
        return {"batched": self.batched, "merge": self.merge, "input_batch_axis": 0 if self.batched else None,
                "output_batch_axes": dict(self.output_axes) if self.batched else {}, "evidence": self.evidence}

    def unmerged(self, why: str) -> BatchLayout:
        return BatchLayout(self.batched, False, self.output_axes, why)


def unbatched(why: str) -> BatchLayout:
    return BatchLayout(False, False, {}, why)


def warmup_feeds(engine: Engine) -> tuple[Engine | None, dict[str, np.ndarray] | None]:
    """(engine to warm, feeds): a handler's own `warmup_inputs`, else zeros of the input shapes with
    dynamic dims = 1. BYTES inputs have no neutral value: without warmup_inputs only the model a
    handler wraps is warmed, and (None, None) when there is none."""
    custom = getattr(engine, "warmup_inputs", None)
    feeds = custom() if callable(custom) else None
    if feeds is not None:
        return engine, feeds
    target: Engine | None = engine
    if any(s.datatype == BYTES for s in engine.inputs):
        target = getattr(engine, "inner", None)
    if target is None:
        return None, None
    return target, {s.name: np.zeros([1 if d < 0 else d for d in s.shape], s.numpy_dtype) for s in target.inputs}


def run_warmup(target: Engine, feeds: dict[str, np.ndarray], served: Engine) -> dict[str, np.ndarray]:
    """One inference; a failure is one line naming the model (and the handler fix when it applies)."""
    try:
        return target.infer(feeds)
    except Exception as exc:  # noqa: BLE001
        hint = "; give the handler a `warmup_inputs` dict" if target is served and target.backend == "python" else ""
        raise RuntimeUserError(f"the warm-up inference of '{target.name}' failed: {type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}{hint}") from None


def prepare(engine: Engine, max_batch: int, want_batch: bool = True, run: bool = True) -> BatchLayout:
    """Warm the engine up (one inference, so readiness means the first request is fast) and decide
    its batch layout. want_batch=False (a config with max_batch_size 0) skips the probe; run=False
    runs nothing and trusts the signature (start_loading(warmup=False))."""
    declared = _declared(engine)
    handler = bool(getattr(engine, "batch_axis_declared", False))
    target, feeds = warmup_feeds(engine) if run else (None, None)
    if (want_batch and declared is None and not handler and max_batch >= 2 and target is engine
            and feeds is not None):
        one = {n: a[:1] if a.ndim and a.shape[0] > 1 else a for n, a in feeds.items()}
        out1 = run_warmup(engine, one, engine)
        # copies: an engine may hand back views of output buffers that the next call reuses
        out1 = {n: np.array(a, copy=True) for n, a in out1.items()} if isinstance(out1, dict) else out1
        return probe_layout(engine, one, out1)
    if target is not None and feeds is not None:
        run_warmup(target, feeds, engine)
    if not want_batch:
        return unbatched("max_batch_size 0 in the model config")
    if declared is not None:
        return unbatched(declared)
    if not all(len(s.shape) >= 1 and s.shape[0] == -1 for s in engine.outputs):
        return unbatched("an output has no dynamic dim 0, and the model was not probed")
    why = ("declared by the handler" if handler else f"max batch {max_batch}: requests are never merged"
           if max_batch < 2 else "declared by the signature (not probed)")
    return BatchLayout(True, True, {s.name: 0 for s in engine.outputs}, why)


def _declared(engine: Engine) -> str | None:
    """Why the signature alone rules batching out, or None when dim 0 of every input is dynamic."""
    for s in engine.inputs:
        if not s.shape:
            return f"input '{s.name}' is a scalar"
        if s.shape[0] != -1:
            return f"dim 0 of input '{s.name}' is fixed ({s.shape[0]})"
    return None if engine.inputs else "the model has no inputs"


def probe_layout(engine: Engine, one: dict[str, np.ndarray], out1: dict[str, np.ndarray]) -> BatchLayout:
    """Run the batch-1 sample twice as a batch of 2 and read each output's batch axis from the shapes."""
    two = {n: np.concatenate([a, a], axis=0) for n, a in one.items()}
    try:
        out2 = engine.infer(two)
    except Exception as exc:  # noqa: BLE001 - the model cannot take a batch of 2: serve it unbatched
        return unbatched(f"a batch of 2 failed ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})")
    if not isinstance(out1, dict) or not isinstance(out2, dict) or set(out1) != set(out2):
        return unbatched("batch 1 and batch 2 returned different outputs")
    axes: dict[str, int] = {}
    seen: list[str] = []
    for name in sorted(out1):
        a, b = np.asarray(out1[name]), np.asarray(out2[name])
        s1, s2 = list(a.shape), list(b.shape)
        diff = [i for i, (x, y) in enumerate(zip(s1, s2, strict=False)) if x != y]
        if len(s1) != len(s2) or len(diff) != 1 or (s1[diff[0]], s2[diff[0]]) != (1, 2):
            return unbatched(f"output '{name}' does not scale along one axis (batch 1 -> {s1}, batch 2 -> {s2})")
        axis = diff[0]
        for half in (0, 1):
            if not _same(np.take(b, [half], axis=axis), a):
                return unbatched(f"output '{name}' of a batch of two equal samples differs from the single "
                                 f"sample's along dim {axis}: dim 0 of the inputs is not a batch of independent "
                                 "samples")
        axes[name] = axis
        seen.append(f"'{name}' {s1} -> {s2}")
    return BatchLayout(True, True, axes, "probed: batch 1 -> 2 scales " + "; ".join(seen))


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if got.dtype.kind in "fc" and want.dtype.kind in "fc":
        w = want.astype(np.float64)
        finite = np.abs(w[np.isfinite(w)])
        scale = float(finite.max()) if finite.size else 0.0
        return bool(np.allclose(got.astype(np.float64), w, rtol=RTOL, atol=ATOL_SCALE * scale + 1e-6,
                                equal_nan=True))
    return bool(np.array_equal(got, want))
