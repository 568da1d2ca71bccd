"""A transformer's GEMMs with their epilogue fused: linear + GELU in one cuBLASLt call, patch embedding as a GEMM.

Why, from the profile of torch.compile's best ViT-B/16 at batch 256 on an H200
(bench/results/gpu/optimizer/optimizer_vit_b16_b256_fp8_h200.json, "profiles"):
  - the MLP's GELU runs as a kernel of its own after the fc1 GEMM (`triton_poi_fused_gelu_view_2`, 11.8 % of
    the time): Inductor calls cuBLAS for the GEMM (an extern kernel) and cannot fuse into it, while cuBLASLt
    itself has a GELU+bias epilogue, which torch exposes as `torch._addmm_activation(bias, x, W^T,
    use_gelu=True)`. Its GELU is the tanh form (the epilogue's), not erf: the tolerance check measures the
    difference on the user's examples like any other candidate's;
  - the 16x16/16 patch embedding runs as a cuDNN convolution (6.9 %) after an NCHW->NHWC transpose (2.8 %),
    though a convolution whose kernel equals its stride over unpadded input is one GEMM over the image's
    patches: a reshape and permute of the input, then nn.Linear's product, which Inductor plans as usual.

Like fused_conv.py it rewrites the exported program's module (graph.py says why a graph rewrite), and the
fused op is a torch.library custom op with a fake, opaque to torch.compile; on a CPU it computes the same
thing from plain torch ops (what the CPU tests compare against).
"""

from __future__ import annotations

import torch

from .graph import add_buffer, attr

aten = torch.ops.aten
LINEAR = (aten.linear.default,)
GELU = (aten.gelu.default,)
CONV = (aten.conv2d.default,)


@torch.library.custom_op("ngcx::linear_gelu", mutates_args=())
def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    if x.is_cuda:
        y = torch._addmm_activation(b, x2, w.t(), use_gelu=True)
    else:
        y = torch.nn.functional.gelu(torch.nn.functional.linear(x2, w, b), approximate="tanh")
    return y.reshape(*x.shape[:-1], w.shape[0])


@linear_gelu.register_fake
def _(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


def convert(gm: torch.fx.GraphModule) -> tuple[int, int]:
    """Fuse each linear + exact GELU, and turn each patch-embedding convolution into a GEMM, in place.
    Returns (linear layers fused with their GELU, convolutions made GEMMs)."""
    gelus = patches = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in LINEAR:
            gelus += _fuse_gelu(gm, node)
        elif node.target in CONV:
            patches += _patch_gemm(gm, node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gelus, patches


def _fuse_gelu(gm: torch.fx.GraphModule, node) -> int:
    users = list(node.users)
    if len(users) != 1 or users[0].target not in GELU:
        return 0
    gelu = users[0]
    if gelu.kwargs.get("approximate", gelu.args[1] if len(gelu.args) > 1 else "none") != "none":
        return 0
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    if attr(gm, w) is None or attr(gm, b) is None:
        return 0                      # cuBLASLt's epilogue takes a bias vector: layers without one stay as they are
    with gm.graph.inserting_before(gelu):
        new = gm.graph.call_function(torch.ops.ngcx.linear_gelu.default, (x, w, b))
    gelu.replace_all_uses_with(new)
    return 1


def _patch_gemm(gm: torch.fx.GraphModule, node) -> int:
    """conv2d(x, W[K, C, kh, kw], b, stride=(kh, kw), padding 0) over an image of whole patches -> one GEMM."""
    a = list(node.args) + [None] * 7
    x, w_node, b_node, stride, padding, dilation, groups = a[:7]
    w = attr(gm, w_node)
    val = getattr(x, "meta", {}).get("val")
    if w is None or w.dim() != 4 or val is None or val.dim() != 4 or (groups or 1) != 1:
        return 0
    k, c, kh, kw = w.shape
    stride = list(stride or [1, 1]) * (2 if stride is not None and len(stride) == 1 else 1)
    if list(stride) != [kh, kw] or any(padding or [0]) or any(d != 1 for d in (dilation or [1])) or kh * kw == 1:
        return 0
    h, wd = int(val.shape[2]), int(val.shape[3])
    if h % kh or wd % kw:
        return 0
    hp, wp = h // kh, wd // kw
    name = add_buffer(gm, "ngcx_patch", w.detach().reshape(k, c * kh * kw).clone())
    g = gm.graph
    with g.inserting_before(node):
        p = g.call_function(aten.reshape.default, (x, [-1, c, hp, kh, wp, kw]))
        p = g.call_function(aten.permute.default, (p, [0, 2, 4, 1, 3, 5]))
        p = g.call_function(aten.reshape.default, (p, [-1, c * kh * kw]))
        y = g.call_function(aten.linear.default, (p, g.get_attr(name), b_node))
        y = g.call_function(aten.reshape.default, (y, [-1, hp, wp, k]))
        y = g.call_function(aten.permute.default, (y, [0, 3, 1, 2]))
    node.replace_all_uses_with(y)
    return 1
