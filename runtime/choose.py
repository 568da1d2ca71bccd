"""The measured optimizer's decisions, in plain Python and numpy: the tolerance check, the choice per batch
and the record a plan keeps of both (`ngcx-runtime info PLAN` prints it).

Why apart from the candidates (runtime/candidates/): those need torch and a GPU to build and time; what
is decided from their figures needs neither, so it is tested on any CPU (tests/runtime/test_optimize_candidates.py)
and a plan's record reads the same wherever it is printed.

The rule (issue 50): every candidate is timed on the GPU the plan is for and checked against the FP32
reference on the user's examples; the fastest one within the tolerance is kept, per batch size. A
batch where no candidate passes keeps plain FP16 and the record says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FALLBACK = "fp16"   # what a batch keeps when every candidate fails the tolerance (the plan's precision)


@dataclass(frozen=True)
class Tolerance:
    """How far a candidate may drift from the FP32 reference on the user's examples.

    min_top1: share of samples whose arg-max over the last axis agrees with the reference's (top-1
    agreement).
    max_rel_error: max |candidate - reference| over max |reference|, over every output element.
    The defaults are the bar tests/runtime/test_runtime_optimize.py holds ONNX Runtime's INT8 plans to
    (top-1 >= 0.9, error <= 0.15): a quantized plan's, which FP8 is. A random-weight ViT-B/16 on an
    H200 already flips 1 of 64 arg-maxes in plain FP16 (0.984, bench/results/gpu/optimizer/), so a
    bar of 0.99 would refuse FP16 itself there.
    """

    min_top1: float = 0.9
    max_rel_error: float = 0.15

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_top1 <= 1.0:
            raise ValueError(f"top-1 agreement {self.min_top1}: give a share between 0 and 1")
        if not self.max_rel_error > 0.0:
            raise ValueError(f"max relative error {self.max_rel_error}: give a positive number")


@dataclass
class Error:
    """A candidate's outputs against the reference's: what the tolerance is checked on."""

    top1: float
    max_rel_error: float

    def within(self, tol: Tolerance) -> bool:
        return self.top1 >= tol.min_top1 and self.max_rel_error <= tol.max_rel_error

    def why_not(self, tol: Tolerance) -> str | None:
        """Why these figures fail the tolerance, or None when they pass."""
        faults = []
        if self.top1 < tol.min_top1:
            faults.append(f"top-1 agreement {self.top1:.4f} < {tol.min_top1}")
        if not self.max_rel_error <= tol.max_rel_error:          # NaN fails too
            faults.append(f"max relative error {self.max_rel_error:.4g} > {tol.max_rel_error}")
        return "; ".join(faults) or None


def compare(reference: np.ndarray, output: np.ndarray) -> Error:
    """Top-1 agreement over the last axis and max relative error of `output` against `reference`.

    A non-finite output (an FP8 overflow, a NaN) is an infinite error, never a pass: NaN compares
    false with everything, so a plain `<=` would let it through.
    """
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(output, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference's {ref.shape}")
    if not np.isfinite(out).all():
        return Error(top1=0.0, max_rel_error=float("inf"))
    scale = float(np.abs(ref).max()) or 1.0
    rel = float(np.abs(out - ref).max()) / scale
    if ref.ndim == 0 or ref.shape[-1] < 2:
        top1 = 1.0 if rel == 0.0 else float(np.mean(np.sign(out) == np.sign(ref)))
    else:
        top1 = float(np.mean(ref.argmax(-1) == out.argmax(-1)))
    return Error(top1=round(top1, 6), max_rel_error=rel)


@dataclass
class Trial:
    """One candidate at one batch size: its time on the GPU (or why it has none) and its error."""

    candidate: str
    batch: int
    ms: list[float] = field(default_factory=list)      # per-iteration times, CUDA events, after warm-up
    error: Error | None = None
    failure: str | None = None                         # it could not be built, run or timed: why

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.ms)) if self.ms else None

    def verdict(self, tol: Tolerance) -> str | None:
        """Why this trial cannot be chosen, or None when it can."""
        if self.failure:
            return self.failure
        if not self.ms:
            return "not timed"
        if self.error is None:
            return "not checked against the reference"
        return self.error.why_not(tol)


@dataclass
class Choice:
    """What one batch size runs with, and why."""

    batch: int
    candidate: str
    reason: str
    median_ms: float | None
    fallback: bool = False


def choose(trials: list[Trial], tol: Tolerance, batch: int) -> Choice:
    """The fastest trial at `batch` that passes the tolerance; none passing -> FP16, said so."""
    mine = [t for t in trials if t.batch == batch]
    passing = [t for t in mine if t.verdict(tol) is None]
    if not passing:
        return Choice(batch, FALLBACK, f"no candidate within tolerance at batch {batch} "
                      f"({len(mine)} tried); keeps plain {FALLBACK.upper()}", None, fallback=True)
    best = min(passing, key=lambda t: (t.median_ms, t.candidate))
    others = sorted((t for t in passing if t is not best), key=lambda t: t.median_ms)
    if others:
        nxt = others[0]
        why = (f"fastest within tolerance: {best.median_ms:.3f} ms, {nxt.median_ms / best.median_ms:.2f}x "
               f"over the next ({nxt.candidate}, {nxt.median_ms:.3f} ms)")
    else:
        why = f"the only candidate within tolerance: {best.median_ms:.3f} ms"
    return Choice(batch, best.candidate, why, best.median_ms)


def record(trials: list[Trial], tol: Tolerance, batches: list[int], examples: dict[str, Any],
           skipped: dict[str, str]) -> dict[str, Any]:
    """The plan's "optimizer" section: the tolerance, every trial's figures, the choice per batch.

    `examples` says what the error was measured on (source, count, sha256); `skipped` names the
    candidates not tried on this GPU and why (e.g. FP8 below compute capability 8.9).
    """
    choices = [choose(trials, tol, b) for b in batches]
    return {
        "tolerance": asdict(tol),
        "examples": examples,
        "choices": {str(c.batch): asdict(c) for c in choices},
        "all_fell_back": all(c.fallback for c in choices),
        "trials": [_trial_row(t, tol) for t in trials],
        "skipped": skipped,
    }


def _trial_row(t: Trial, tol: Tolerance) -> dict[str, Any]:
    ms = sorted(t.ms)
    return {
        "candidate": t.candidate,
        "batch": t.batch,
        "median_ms": round(t.median_ms, 4) if ms else None,
        "min_ms": round(ms[0], 4) if ms else None,
        "max_ms": round(ms[-1], 4) if ms else None,
        "iterations": len(ms),
        "top1": t.error.top1 if t.error else None,
        "max_rel_error": _finite(t.error.max_rel_error) if t.error else None,
        "passed": t.verdict(tol) is None,
        "why_not": t.verdict(tol),
    }


def _finite(x: float) -> float | str:
    """JSON has no Infinity: an infinite error is written as the string "inf"."""
    return round(x, 6) if np.isfinite(x) else "inf"


def chosen(section: dict[str, Any], batch: int) -> str:
    """The candidate a plan's optimizer section picked for `batch` (the next larger bucket's; FP16 without one)."""
    choices = (section or {}).get("choices") or {}
    sizes = sorted(int(b) for b in choices)
    bucket = next((b for b in sizes if b >= batch), sizes[-1] if sizes else None)
    return choices[str(bucket)]["candidate"] if bucket is not None else FALLBACK


def check_section(section: Any) -> str | None:
    """What is wrong with a manifest's optimizer section (a file anyone may edit), or None.

    The loader reads choices[batch]["candidate"] and the calibrated ranges without further checks.
    """
    from .candidates import ALL

    if not isinstance(section, dict):
        return "is not an object"
    choices = section.get("choices")
    if not isinstance(choices, dict) or not choices:
        return "has no choices"
    for batch, c in choices.items():
        if not str(batch).isdigit() or not isinstance(c, dict) or not isinstance(c.get("candidate"), str):
            return f"choice {str(batch)[:20]!r} is not a batch size with a candidate"
        if c["candidate"] not in ALL and c["candidate"] != FALLBACK:
            return f"choice for batch {batch} names an unknown candidate {c['candidate'][:60]!r}"
    amax = section.get("calibrated_amax")
    if amax is not None and not (isinstance(amax, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in amax.values())):
        return "calibrated_amax is not a map of positive numbers"
    return None


def render(section: dict[str, Any]) -> list[str]:
    """`ngcx-runtime info PLAN`'s view of the optimizer section: choices first, then every trial."""
    tol = section.get("tolerance") or {}
    ex = section.get("examples") or {}
    lines = [f"optimizer: tolerance top-1 >= {tol.get('min_top1')}, max relative error <= "
             f"{tol.get('max_rel_error')} against FP32 on {ex.get('count', '?')} example(s) "
             f"({ex.get('source', '?')})"]
    if section.get("all_fell_back"):
        lines.append(f"  every candidate failed the tolerance: the plan keeps plain {FALLBACK.upper()}")
    for b, c in sorted((section.get("choices") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"  batch {b:>4}: {c['candidate']:<34} {c['reason']}")
    lines.append(f"  {'candidate':<34} {'batch':>5} {'median ms':>10} {'top-1':>7} {'max rel err':>11}  verdict")
    for t in section.get("trials") or []:
        med = f"{t['median_ms']:.3f}" if t.get("median_ms") is not None else "-"
        top1 = f"{t['top1']:.4f}" if t.get("top1") is not None else "-"
        err = t.get("max_rel_error")
        err_s = f"{err:.3g}" if isinstance(err, (int, float)) else (err or "-")
        verdict = "pass" if t.get("passed") else f"fail: {t.get('why_not')}"
        lines.append(f"  {t['candidate']:<34} {t['batch']:>5} {med:>10} {top1:>7} {err_s:>11}  {verdict[:120]}")
    for name, why in (section.get("skipped") or {}).items():
        lines.append(f"  not tried: {name}: {why}")
    return lines
