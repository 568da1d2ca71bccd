"""2:4 structured sparsity on the linear layers (sparse tensor cores, sm >= 8.0), only when the user allows it.

Why only then: it keeps the 2 largest of every 4 weights along the input axis and zeroes the rest,
which changes the model; a model not trained for it usually fails the tolerance, and the plan says
so. The product runs through torch's semi-structured sparse tensors (cuSPARSELt or CUTLASS).
"""

from __future__ import annotations

import torch


def prune_2_4(w: torch.Tensor) -> torch.Tensor:
    """The 2 largest |w| of every 4 consecutive input weights kept, the other 2 zeroed."""
    groups = w.reshape(-1, 4)
    keep = groups.abs().topk(2, dim=1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, keep, True)
    return (groups * mask).reshape(w.shape)


class SparseLinear(torch.nn.Module):
    """y = x W^T + b with W pruned 2:4 and stored semi-structured (compressed values + metadata)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        from torch.sparse import to_sparse_semi_structured

        self.weight = torch.nn.Parameter(to_sparse_semi_structured(prune_2_4(weight.detach().half())),
                                         requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().half(), requires_grad=False)
        self.out_features = weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.nn.functional.linear(x.reshape(-1, shape[-1]), self.weight, self.bias)
        return y.reshape(*shape[:-1], self.out_features)


def convert(gm) -> int:
    """Swap every linear layer whose shape the sparse kernels take (dims multiples of 64) in place."""
    from .graph import swap_linears

    def make(_key: str, w: torch.Tensor, b: torch.Tensor | None):
        if w.dim() != 2 or w.shape[0] % 64 or w.shape[1] % 64:
            return None
        return SparseLinear(w, b)

    return len(swap_linears(gm, make))
