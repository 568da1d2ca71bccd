"""The measured optimizer's candidates: which ones can pay off for a model on a GPU (plain data, no torch).

One module per family builds its candidate in torch: variant.py (torch.compile modes, CUDA graphs,
channels-last, freezing), fused_conv.py (convolutions with their epilogue fused by cuDNN), fp8.py
(FP8 linear layers over torch._scaled_mm), sparse.py (2:4 structured sparsity). tune.py builds,
times and checks each on the GPU; choose.py (one level up) decides.

Why a catalog in plain data: what is tried on which GPU is a decision a user reads in the plan
(`info PLAN` lists what was not tried and why) and a test checks on any CPU, without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_MIN_CC = (8, 9)   # FP8 tensor cores: Ada (sm 8.9) and Hopper (9.0) onwards; torch._scaled_mm refuses below


@dataclass(frozen=True)
class Candidate:
    """One way to run the model: everything tune.py and the plan's loader need to rebuild it."""

    name: str
    family: str                      # "compile", "fp8", "sparse"
    mode: str = "max-autotune"       # torch.compile mode
    channels_last: bool = False      # NHWC activations and weights (convolutions' tensor-core layout)
    freezing: bool = False           # Inductor freezing: weights as constants, conv+BN folded
    fp8: str | None = None           # "rowwise" | "tensorwise" (dynamic) | "static" (calibrated per tensor)
    sparse: bool = False             # 2:4 structured sparsity on the linear layers' weights
    fused_conv: bool = False         # conv + BN + (residual add) + ReLU as one cuDNN op each (fused_conv.py)
    gemm_epilogue: bool = False      # linear + GELU as one cuBLASLt call, patch convolution as a GEMM (epilogue.py)


# The catalog, in the order they are tried. Names are what a plan records: never rename one.
COMPILE = [
    Candidate("fp16 max-autotune", "compile"),
    Candidate("fp16 max-autotune no-cudagraphs", "compile", mode="max-autotune-no-cudagraphs"),
]
CONV = [
    Candidate("fp16 max-autotune channels-last", "compile", channels_last=True),
    Candidate("fp16 max-autotune channels-last frozen", "compile", channels_last=True, freezing=True),
    Candidate("fp16 cudnn-fused channels-last", "compile", channels_last=True, fused_conv=True),
]
FP8 = [
    Candidate("fp8 rowwise max-autotune", "fp8", fp8="rowwise"),
    Candidate("fp8 tensorwise max-autotune", "fp8", fp8="tensorwise"),
    Candidate("fp8 static max-autotune", "fp8", fp8="static"),
]
EPILOGUE = [Candidate("fp16 gemm-epilogue max-autotune", "compile", gemm_epilogue=True)]
SPARSE = [Candidate("fp16 2:4-sparse max-autotune", "sparse", sparse=True)]
ALL = {c.name: c for c in COMPILE + CONV + EPILOGUE + FP8 + SPARSE}


@dataclass(frozen=True)
class ModelTraits:
    """What the candidates' applicability depends on, read off the model once (tune.py's traits())."""

    convolutions: int          # Conv2d layers
    linears: int               # nn.Linear layers whose shapes FP8 and 2:4 can take (dims multiple of 16)
    image_input: bool          # a 4-D float input (NCHW): channels-last applies


def applicable(traits: ModelTraits, compute_capability: str | None, allow_sparsity: bool,
               only: list[str] | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates worth timing for this model on this GPU, and the others with why not.

    Convolutional models get the NHWC layouts; models with linear layers get FP8 on sm >= 8.9; 2:4
    sparsity only when the user allows it (it changes the weights: half of them become zero).
    """
    cc = _cc(compute_capability)
    chosen: list[Candidate] = list(COMPILE)
    skipped: dict[str, str] = {}
    for c in CONV:
        if traits.convolutions > traits.linears and traits.image_input:
            chosen.append(c)
        else:
            skipped[c.name] = (f"not a convolutional model ({traits.convolutions} convolutions, {traits.linears} "
                               "linear layers): NHWC layouts pay off for convolutions")
    for c in EPILOGUE:
        if not traits.linears:
            skipped[c.name] = "the model has no linear layer whose GEMM could take an epilogue"
        elif traits.convolutions > traits.linears:
            skipped[c.name] = (f"a convolutional model ({traits.convolutions} convolutions, {traits.linears} "
                               "linear layers): its convolutions get the cuDNN-fused candidate instead")
        else:
            chosen.append(c)
    for c in FP8:
        if not traits.linears:
            skipped[c.name] = "the model has no linear layer FP8 can take (dims a multiple of 16)"
        elif traits.convolutions > traits.linears:
            skipped[c.name] = (f"a convolutional model ({traits.convolutions} convolutions, {traits.linears} "
                               "linear layers): FP8 here covers linear layers only")
        elif cc is None or cc < FP8_MIN_CC:
            skipped[c.name] = f"needs FP8 tensor cores (sm >= 8.9); this GPU is sm {compute_capability or 'none'}"
        else:
            chosen.append(c)
    for c in SPARSE:
        if not allow_sparsity:
            skipped[c.name] = "2:4 sparsity zeroes half the weights: only with --allow-sparsity"
        elif not traits.linears:
            skipped[c.name] = "the model has no linear layer 2:4 sparsity can take"
        elif cc is None or cc < (8, 0):
            skipped[c.name] = f"needs sparse tensor cores (sm >= 8.0); this GPU is sm {compute_capability or 'none'}"
        else:
            chosen.append(c)
    if only:
        unknown = [n for n in only if n not in ALL]
        if unknown:
            raise ValueError(f"unknown candidate(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
        for c in chosen:
            if c.name not in only:
                skipped[c.name] = "left out by --candidates"
        chosen = [c for c in chosen if c.name in only]
    return chosen, skipped


def _cc(text: str | None) -> tuple[int, int] | None:
    """"9.0" -> (9, 0); None or anything else -> None."""
    try:
        major, minor = (int(x) for x in str(text).split("."))
    except ValueError:
        return None
    return major, minor
