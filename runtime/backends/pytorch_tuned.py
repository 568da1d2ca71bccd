"""`optimize --tune` on the PyTorch backend: the measured optimizer's plan (issue 50).

Why apart from pytorch.py: that module is the engine every plan runs on; this is the build step
that times the candidates (candidates/tune.py) and records the choice per batch size in the manifest's
"optimizer" section; the Inductor cache inside the plan holds the chosen variants' kernels from the timing.
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import RuntimeUserError


def optimize(ep, opts, specs, engine_cls) -> dict[str, Any]:
    import torch

    from .. import choose
    from ..candidates import tune

    if opts.precision != "fp16":
        raise RuntimeUserError(f"--tune with --precision {opts.precision}: the measured optimizer picks among "
                               "FP16 and faster candidates (FP16 is what it falls back to); use --precision fp16")
    if not torch.cuda.is_available():
        raise RuntimeUserError("--tune times candidates on the GPU the plan is for, and torch sees no GPU here; "
                               "drop --tune to build a plain plan")
    tol = choose.Tolerance(min_top1=opts.min_top1, max_rel_error=opts.max_rel_error)
    try:
        section = tune.tune(ep, specs, "cuda:0", opts.batch_profile, tol, opts.examples, opts.allow_sparsity,
                            opts.candidates, log=lambda line: print(line, file=sys.stderr, flush=True))
    except ValueError as exc:
        raise RuntimeUserError(f"optimize --tune: {exc}") from None
    choices = tune.choices(section, opts.batch_profile)
    # Not warmed again: tuning compiled every chosen variant at every size with the plan's Inductor cache
    # (backends/pytorch.py's _set_inductor_cache), which is what a warm-up would fill; building the engine
    # only wraps the modules (torch.compile is lazy), for the input and output specs.
    engine = engine_cls(ep, opts.name, "fp16", opts.batch_profile, "max-autotune",
                        choices=choices, amax=section.get("calibrated_amax"))
    notes = sorted({n for v in engine._variants.values() for n in v.notes})
    if section["all_fell_back"]:
        notes.append("every candidate failed the tolerance: FP16 kept")
    return {
        "artifact": "model.pt2",
        "device": engine.device,
        "compile": {"mode": "per batch size: see optimizer.choices", "dynamic": False,
                    "channels_last": any(c.channels_last for c in choices.values()),
                    "warmup_seconds": None},
        "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in engine.inputs],
        "outputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in engine.outputs],
        "notes": notes,
        "optimizer": section,
    }
