"""What a plan on disk records and is checked against: the manifest's name and format, the
options a plan is built with (OptimizeOptions), the target it is tied to (host_target,
cpu_target), the runtime version and the source model's hash.

Why apart from plan.py: optimize.py writes plans with these and plan.py loads them, and a plan
that meets another GPU is rebuilt by plan.load through optimize; with these here both import
them from below, and neither imports the other back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # only an annotation: the CLI imports this module for sha256_file without numpy
    import numpy as np

MANIFEST = "manifest.json"
PLAN_FORMAT = 1
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass
class OptimizeOptions:
    """Everything that changes the artifact (and therefore the cache key)."""

    precision: str = "fp32"
    batch_profile: list[int] = field(default_factory=lambda: [1, 8, 64])
    calibration: dict[str, np.ndarray] | None = None
    calibration_sha256: str | None = None
    calibration_method: str = "entropy"
    gpu: bool = False
    name: str = "model"
    # The measured optimizer (optimize --tune, PyTorch backend on a GPU: candidates/, choose.py)
    tune: bool = False
    examples: dict[str, np.ndarray] | None = None     # the user's examples: the error is measured on them
    examples_sha256: str | None = None
    allow_sparsity: bool = False
    min_top1: float = 0.9                              # choose.Tolerance's defaults
    max_rel_error: float = 0.15
    candidates: list[str] | None = None               # only these (default: every one that can pay off here)

    def tuning_key(self) -> dict | None:
        """What of the tuning changes the plan (part of the cache key); None when not tuning."""
        if not self.tune:
            return None
        return {"examples": self.examples_sha256, "allow_sparsity": self.allow_sparsity, "min_top1": self.min_top1,
                "max_rel_error": self.max_rel_error, "candidates": sorted(self.candidates or [])}


def runtime_version() -> str:
    """ngcx-runtime's version, part of every manifest: the package's own, never distribution
    metadata (images install the distribution `ngcx-runtime`, a dev checkout `ngcx`)."""
    from . import __version__

    return __version__


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def host_target() -> dict[str, Any]:
    """What a plan built here is tied to: the first GPU's name + compute capability, or "cpu"."""
    from . import probe

    gpus = probe.gpus()
    if not gpus:
        return {"kind": "cpu", "name": "cpu", "compute_capability": None}
    g = gpus[0]
    return {"kind": "gpu", "name": g["name"], "compute_capability": g["compute_capability"]}


def cpu_target() -> dict[str, Any]:
    """Target of a CPU plan: ORT's offline-optimized graphs carry CPU-specific (NCHWc) layouts."""
    import platform

    return {"kind": "cpu", "name": "cpu", "compute_capability": None, "machine": platform.machine()}


def model_name(path: Path) -> str:
    """A model's default name from its file name: letters, digits, '-' and '_' ('model' when empty)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in path.stem) or "model"
