"""Convolutions with their epilogue fused by cuDNN: conv + folded BN + (residual add) + ReLU in one kernel.

Why: torch.compile's best ResNet-50 at batch 256 on an H200 spends about 30 % of its time in separate
elementwise passes after the convolutions (`triton_poi_fused_add_convolution_relu_*`, the residual add
and the ReLU: bench/results/gpu/optimizer/optimizer_resnet50_b1_256_static_h200.json, "profiles"):
Inductor runs the convolutions as extern kernels (cuDNN, or cuBLAS for 1x1) and cannot put its own
code into their epilogue. cuDNN can: its "ConvBiasAddAct" fusion computes relu(conv(x) + z + bias) in
one pass over the output, which torch exposes as `torch.cudnn_convolution_add_relu` (and
`torch.cudnn_convolution_relu` without z), run through cuDNN's v8 graph API. Same FP16 arithmetic, so
the tolerance is FP16's.

The rewrite works on the exported program's module (see graph.py for why a graph rewrite): each
aten conv2d whose output goes only to an eval-mode batch norm gets the norm folded into its weight and
bias; if a ReLU follows (directly, or after adding another tensor, the residual) the whole chain becomes
one fused op. A convolution whose folded output is added before the ReLU and whose bias can be carried by
the conv it is added to (ResNet's downsample branch) hands its bias over and runs bias-free, so no pass
is left for it. The ops are registered as torch.library custom ops (`ngcx::conv_relu`,
`ngcx::conv_add_relu`) with a fake (meta) implementation, so torch.compile treats them as opaque kernels
inside its CUDA graphs; on a CPU they compute the same thing from plain torch ops (what the CPU tests
compare against the unrewritten module).
"""

from __future__ import annotations

import contextlib
import operator

import torch

from .graph import add_buffer, attr

aten = torch.ops.aten
CONV = (aten.conv2d.default, aten.convolution.default)
RELU = (aten.relu.default, aten.relu_.default)
ADD = (aten.add.Tensor, aten.add_.Tensor)
BN_EVAL = (aten._native_batch_norm_legit_no_training.default, aten.batch_norm.default)


@torch.library.custom_op("ngcx::conv_relu", mutates_args=())
def conv_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride: list[int], padding: list[int],
              dilation: list[int], groups: int) -> torch.Tensor:
    if x.is_cuda:
        with _benchmarked():
            y = torch.cudnn_convolution_relu(x, w, b, stride, padding, dilation, groups)
    else:
        y = torch.relu(torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups))
    return y.contiguous(memory_format=_format(x))


@torch.library.custom_op("ngcx::conv_add_relu", mutates_args=())
def conv_add_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, z: torch.Tensor, stride: list[int],
                  padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    if x.is_cuda:
        with _benchmarked():
            y = torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, stride, padding, dilation, groups)
    else:
        y = torch.relu(torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups) + z)
    return y.contiguous(memory_format=_format(x))


@contextlib.contextmanager
def _benchmarked():
    """cuDNN times its fused engines for each new shape (once; then cached) instead of taking the heuristic's
    first: the ops read torch.backends.cudnn.benchmark at the call. Scoped here, so the process's own setting
    (and any other model's convolutions) stays as it was. Inside a CUDA-graph replay no Python runs at all."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def _format(x: torch.Tensor) -> torch.memory_format:
    """The output's layout, from the input's alone: what the fake says is what the op returns (Inductor plans
    its buffers from the fake's strides, so the two must agree)."""
    nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if nhwc else torch.contiguous_format


def _out_like(x, w, stride, padding, dilation):
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    oh = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return x.new_empty((n, k, oh, ow)).contiguous(memory_format=_format(x))


@conv_relu.register_fake
def _(x, w, b, stride, padding, dilation, groups):
    return _out_like(x, w, stride, padding, dilation)


@conv_add_relu.register_fake
def _(x, w, b, z, stride, padding, dilation, groups):
    return _out_like(x, w, stride, padding, dilation)


def _conv_args(node) -> tuple | None:
    """(x, w node, b node, stride, padding, dilation, groups) of a plain 2-D convolution, else None."""
    a = list(node.args) + [None] * 9
    if node.target == aten.conv2d.default:
        x, w, b = a[0], a[1], a[2]
        stride, padding, dilation, groups = a[3] or [1, 1], a[4] or [0, 0], a[5] or [1, 1], a[6] or 1
    else:
        x, w, b, stride, padding, dilation, transposed, _out_pad, groups = a[:9]
        if transposed:
            return None
    if isinstance(padding, str) or len(stride) != 2:
        return None
    two = lambda v: [int(v[0]), int(v[-1])]      # noqa: E731 - conv2d accepts one int for both axes
    return x, w, b, two(stride), two(padding), two(dilation), int(groups)


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _bn_of(conv) -> tuple | None:
    """(bn output node, weight, bias, mean, var, eps) when the conv's one user is an eval-mode batch norm."""
    bn = _only_user(conv)
    if bn is None or bn.op != "call_function" or bn.target not in BN_EVAL:
        return None
    if bn.target == aten.batch_norm.default:
        _x, w, b, mean, var, training, _mom, eps = bn.args[:8]
        if training:
            return None
        out = bn
    else:
        _x, w, b, mean, var, _mom, eps = bn.args[:7]
        out = _only_user(bn)
        if out is None or out.target is not operator.getitem or out.args[1] != 0:
            return None
    return out, w, b, mean, var, float(eps)


def _fold(gm, w_node, b_node, bn) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The conv's weight and bias with the batch norm folded in, computed in FP32, stored in the weight's dtype."""
    _out, g, beta, mean, var, eps = bn
    w, b = attr(gm, w_node), attr(gm, b_node) if b_node is not None else None
    tensors = [attr(gm, n) for n in (g, beta, mean, var)]
    if w is None or (b_node is not None and b is None) or any(t is None for t in tensors):
        return None
    g, beta, mean, var = (t.detach().float() for t in tensors)
    scale = g / torch.sqrt(var + eps)
    bias = (b.detach().float() if b is not None else torch.zeros_like(mean)) - mean
    return ((w.detach().float() * scale.reshape(-1, 1, 1, 1)).to(w.dtype),
            (beta + bias * scale).to(w.dtype))


class _Folded:
    """One conv with its BN folded: where it is in the graph and what it will be replaced by."""

    def __init__(self, conv, out, weight, bias):
        self.conv, self.out, self.weight, self.bias = conv, out, weight, bias


def convert(gm: torch.fx.GraphModule) -> int:
    """Fold every eval-mode batch norm into its convolution and fuse the ReLU (and residual add) after it, in
    place. Returns how many convolutions now run as one fused cuDNN op."""
    folded: dict[torch.fx.Node, _Folded] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in CONV:
            continue
        args = _conv_args(node)
        bn = _bn_of(node) if args else None
        made = _fold(gm, args[1], args[2], bn) if bn else None
        if made:
            folded[bn[0]] = _Folded(node, bn[0], *made)
    done: set[torch.fx.Node] = set()       # BN outputs now inside a fused op, and the ReLUs that ended them
    for out, f in folded.items():
        user = _only_user(out)
        relu = _only_user(user) if user is not None and user.target in ADD else None
        if user is not None and user.target in RELU:
            _replace(gm, f, user)
            done.add(user)
        elif relu is not None and relu.target in RELU and relu not in done and len(user.args) == 2 and \
                (user.args[0] is out or user.target != aten.add_.Tensor):     # add_ may write only to our tensor
            z = user.args[1] if user.args[0] is out else user.args[0]
            other = folded.get(z)
            if other is not None and _only_user(z) is user:       # its bias rides on ours: no pass of its own
                f.bias, other.bias = f.bias + other.bias, None
            _replace(gm, f, relu, z)
            done.add(relu)
        else:
            continue
        done.add(out)
    for out, f in folded.items():
        if out not in done:
            _replace(gm, f, out, plain=True)
    _drop_unused(gm, folded)
    gm.recompile()
    return sum(1 for out in folded if out in done)


def _replace(gm, f: _Folded, last, z=None, plain: bool = False) -> None:
    """`last` (the ReLU, or the BN output for plain) becomes one op over the folded weight and bias."""
    x, _w, _b, stride, padding, dilation, groups = _conv_args(f.conv)   # read now: x may have been replaced
    with gm.graph.inserting_before(last):
        w = gm.graph.get_attr(add_buffer(gm, "ngcx_fused_w", f.weight))
        b = None if f.bias is None else gm.graph.get_attr(add_buffer(gm, "ngcx_fused_b", f.bias))
        if plain:
            new = gm.graph.call_function(aten.convolution.default,
                                         (x, w, b, stride, padding, dilation, False, [0, 0], groups))
        elif z is None:
            new = gm.graph.call_function(torch.ops.ngcx.conv_relu.default, (x, w, b, stride, padding, dilation,
                                                                            groups))
        else:
            new = gm.graph.call_function(torch.ops.ngcx.conv_add_relu.default,
                                         (x, w, b, z, stride, padding, dilation, groups))
    last.replace_all_uses_with(new)


def _drop_unused(gm: torch.fx.GraphModule, folded: dict) -> None:
    """Erase the replaced chains (conv, BN, add, ReLU). eliminate_dead_code alone keeps them: export's training
    IR writes ResNet's ReLU and residual add in place (aten.relu_, aten.add_), which FX counts as side effects.
    What they wrote is the chain's own BN output (convert() checks an add_ writes nowhere else), so once the
    fused op has taken their users they are dead; every other node of the model is left as it was."""
    chain: set[torch.fx.Node] = set()
    for out, f in folded.items():
        chain.update({f.conv, *f.conv.users, out})        # conv, BN (and its getitem)
        node = _only_user(out)
        if node is not None and node.target in ADD:
            chain.add(node)
            node = _only_user(node)
        if node is not None and node.target in RELU:
            chain.add(node)
    for node in reversed(list(gm.graph.nodes)):
        if node in chain and not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
