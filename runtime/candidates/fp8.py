"""FP8 linear layers over torch._scaled_mm (Hopper's and Ada's FP8 tensor cores), written here.

Why not torchao's float8: torchao is not in the images (nor on the lent H200 machine, which has no
network), and what inference needs of it is small: an e4m3 weight with its scale, made once, and
the activation cast to e4m3 with its scale on every call, then one _scaled_mm with FP16 out.

Three ways to scale the activation, each a candidate (candidates/__init__.py):
  rowwise     one scale per row (token), from that row's max |x|: most accurate, a row reduction
              Inductor fuses into the producer (LayerNorm/GELU) kernel. The weight: one scale per
              output channel.
  tensorwise  one scale for the whole activation, from its max |x|: a full reduction first.
  static      one scale per layer measured on the user's examples beforehand (calibrated), so the
              cast fuses into the producer's kernel with no reduction at all; values beyond the
              calibrated range are clamped (the tolerance check catches a range too narrow).
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)     # 448
EPS = 1e-12


class FP8Linear(torch.nn.Module):
    """y = x W^T + b with x and W in e4m3 and the product accumulated by the FP8 tensor cores."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, how: str, act_amax: float | None = None):
        super().__init__()
        w = weight.detach().float()
        self.how, self.out_features = how, weight.shape[0]
        if how == "rowwise":
            w_scale = w.abs().amax(dim=1, keepdim=True).clamp(min=EPS) / E4M3_MAX      # [N, 1]
            self.register_buffer("w_scale", w_scale.t().contiguous())               # [1, N]
        else:
            w_scale = w.abs().amax().clamp(min=EPS) / E4M3_MAX
            self.register_buffer("w_scale", w_scale.reshape(()))
        # [N, K] row-major, handed to _scaled_mm transposed: the column-major B it wants
        self.register_buffer("w8", (w / w_scale.reshape(-1, 1) if how == "rowwise" else w / w_scale)
                             .clamp(-E4M3_MAX, E4M3_MAX).to(E4M3))
        bias = bias.detach().half() if bias is not None else None
        self.register_buffer("bias", bias)
        if how == "static":
            if not act_amax or act_amax <= 0:
                raise ValueError("a static FP8 layer needs the activation's calibrated max |x|")
            self.register_buffer("x_scale", torch.tensor(act_amax / E4M3_MAX, dtype=torch.float32,
                                                          device=weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.how == "rowwise":
            x_scale = x2.abs().amax(dim=1, keepdim=True).float().clamp(min=EPS) / E4M3_MAX
        elif self.how == "tensorwise":
            x_scale = (x2.abs().amax().float().clamp(min=EPS) / E4M3_MAX).reshape(())
        else:
            x_scale = self.x_scale
        x8 = (x2.float() / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        y = scaled_mm(x8, self.w8.t(), x_scale, self.w_scale, self.bias, self.how == "rowwise")
        return y.reshape(*shape[:-1], self.out_features)


def scaled_mm(a, b, a_scale, b_scale, bias, rowwise: bool) -> torch.Tensor:
    """FP16 out. Rowwise scaling took BF16 out only in torch up to 2.7 (probe_rowwise_fp16 finds out
    which this torch does) and no bias, so that path casts and adds after; Inductor fuses both."""
    if rowwise:
        out = torch.float16 if _ROWWISE_FP16[0] else torch.bfloat16
        y = torch._scaled_mm(a, b, scale_a=a_scale, scale_b=b_scale, out_dtype=out, use_fast_accum=True).half()
        return y + bias if bias is not None else y
    return torch._scaled_mm(a, b, scale_a=a_scale, scale_b=b_scale, bias=bias, out_dtype=torch.float16,
                            use_fast_accum=True)


_ROWWISE_FP16 = [True]     # probed once per process (probe_rowwise_fp16)


def probe_rowwise_fp16(device: str) -> bool:
    """Whether this torch's rowwise _scaled_mm writes FP16 directly (one kernel) or needs BF16 and a cast."""
    a = torch.ones(32, 32, device=device).to(E4M3)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(32, 1, device=device), scale_b=torch.ones(1, 32, device=device),
                         out_dtype=torch.float16, use_fast_accum=True)
        _ROWWISE_FP16[0] = True
    except RuntimeError:
        _ROWWISE_FP16[0] = False
    return _ROWWISE_FP16[0]


class AmaxObserver(torch.nn.Module):
    """A linear layer that keeps the largest |input| it has seen (static FP8's calibration pass)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight, self.bias, self.amax = weight, bias, 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.amax = max(self.amax, float(x.detach().abs().amax()))
        return torch.nn.functional.linear(x, self.weight, self.bias)


def calibrate(gm, run) -> dict[str, float]:
    """Max |input| of every FP8-able linear layer of `gm` (a copy is changed) over what `run(module)` feeds it."""
    import copy

    from .graph import swap_linears

    observed = copy.deepcopy(gm)
    observers = swap_linears(observed, lambda key, w, b: AmaxObserver(w, b) if _fits(w) else None)
    run(observed)
    return {key: m.amax for key, m in observers.items() if m.amax > 0}


def convert(gm, how: str, amax: dict[str, float] | None = None) -> int:
    """Swap every linear layer of the graph module FP8 can take for an FP8Linear, in place; returns how many.

    A static layer the examples never reached (no calibrated range) stays FP16.
    """
    from .graph import swap_linears

    def make(key: str, w: torch.Tensor, b: torch.Tensor | None):
        if not _fits(w) or (how == "static" and not (amax or {}).get(key)):
            return None
        return FP8Linear(w, b, how, (amax or {}).get(key))

    return len(swap_linears(gm, make))


def _fits(w: torch.Tensor) -> bool:
    """_scaled_mm wants K and N multiples of 16 (cuBLASLt's FP8 alignment)."""
    return w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0
