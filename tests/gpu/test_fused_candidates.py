"""The epilogue-fusing candidates (issue 50): the graph rewrites keep the model's answers, fuse what they say, and
leave alone what they cannot prove safe.

- fused_conv.py: conv + eval BN (+ residual add) + ReLU -> one cuDNN op; a downsample's bias rides on the conv it
  is added to. On a CPU the ops compute the same thing from plain torch ops, so the rewrite itself is checked
  wherever torch is installed; on a GPU the cuDNN kernels are checked against FP32 too.
- epilogue.py: linear + exact GELU -> cuBLASLt's GELU epilogue (tanh form), patch convolution -> one GEMM.

Needs torch (the lent GPU machine has it; CI's environment does not: these skip there with that reason).
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

pytestmark = pytest.mark.gpu

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch (not in CI's environment; runs on the lent GPU machine)")


def _ops(gm) -> Counter:
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _resnet_like(torch):
    """A stem, an identity bottleneck and a strided one with a downsample branch (torchvision's shape, in-place
    ReLUs and `out += identity` as there), BN statistics made non-trivial so folding them matters."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int):
            super().__init__()
            cout = mid * 4
            self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.down = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            out = self.relu(self.b1(self.c1(x)))
            out = self.relu(self.b2(self.c2(out)))
            out = self.b3(self.c3(out))
            out += identity
            return self.relu(out)

    net = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                        nn.MaxPool2d(3, 2, 1), Bottleneck(64, 16, 1), Bottleneck(64, 32, 2),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    gen = torch.Generator().manual_seed(1)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
    return net.eval()


def _export(torch, net, shape):
    return torch.export.export(net, (torch.randn(2, *shape),),
                               dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))


def _fused_fp32(torch, ep, device: str = "cpu"):
    """The rewritten module in FP32 (folding in FP32 too), eager: the rewrite alone, no precision change."""
    import copy

    from ngcx_runtime.candidates import fused_conv

    gm = copy.deepcopy(ep.module()).to(device)
    return gm, fused_conv.convert(gm)


@needs_torch
def test_every_conv_bn_relu_chain_of_a_resnet_becomes_one_op_with_the_same_answers():
    import torch

    torch.manual_seed(0)
    net = _resnet_like(torch)
    ep = _export(torch, net, (3, 64, 64))
    gm, fused = _fused_fp32(torch, ep)
    ops = _ops(gm)
    # stem + 3 per bottleneck; the add+ReLU ends one conv of each block; the downsample runs bias-free, plain
    assert fused == 7 and ops["ngcx.conv_relu.default"] == 5 and ops["ngcx.conv_add_relu.default"] == 2, ops
    assert ops["aten.convolution.default"] == 1 and not any(
        k.startswith("aten.") and ("batch_norm" in k or "relu" in k or "add" in k) for k in ops), ops
    down = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.convolution.default)
    assert down.args[2] is None                                     # its bias went into the add's conv
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        ref, out = net(x), gm(x)
        cl = gm.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4), (out - ref).abs().max()
    assert torch.allclose(cl, ref, rtol=1e-4, atol=1e-4), (cl - ref).abs().max()


@needs_torch
def test_a_chain_whose_values_are_read_elsewhere_is_left_unfused():
    import torch

    nn = torch.nn

    class Tapped(nn.Module):
        """A BN output read twice, and a residual sum read twice (by the ReLU and after it): each value the fused op
        would hide is needed elsewhere, so both chains stay (with BN still folded)."""

        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

        def forward(self, x):
            y = self.b1(self.c1(x))
            a = torch.relu(y) + y                           # y has two readers: no fusion
            t = a * 1.0
            t += self.b2(self.c2(a))                        # the in-place sum is read by the ReLU and again
            return torch.relu(t) + t

    net = Tapped().eval()
    ep = _export(torch, net, (8, 16, 16))
    gm, fused = _fused_fp32(torch, ep)
    assert fused == 0, _ops(gm)
    assert _ops(gm)["aten.convolution.default"] == 2        # BN still folded into both convolutions
    x = torch.randn(3, 8, 16, 16)
    with torch.no_grad():
        assert torch.allclose(gm(x), net(x), rtol=1e-4, atol=1e-4)


def _tiny_vit(torch):
    """test_optimizer_gpu's two encoder blocks (width 256, erf GELU in the MLP) behind a patch embedding, plus one
    MLP with the tanh GELU already, which is not the rewrite's to touch."""
    from test_optimizer_gpu import _encoder

    nn, F = torch.nn, torch.nn.functional

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 256, 8, 8)
            self.blocks = _encoder(torch).blocks
            self.tanh_mlp = nn.Linear(256, 256)
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            x = self.blocks(self.patch(x).flatten(2).transpose(1, 2))
            x = x + F.gelu(self.tanh_mlp(x), approximate="tanh")
            return self.head(x.mean(1))

    return ViT().eval()


@needs_torch
def test_linear_gelu_pairs_and_the_patch_convolution_are_rewritten_within_fp16_distance():
    import copy

    import torch

    from ngcx_runtime.candidates import epilogue

    torch.manual_seed(0)
    net = _tiny_vit(torch)
    ep = _export(torch, net, (3, 32, 32))
    gm = copy.deepcopy(ep.module())
    assert epilogue.convert(gm) == (2, 1)
    ops = _ops(gm)
    assert ops["ngcx.linear_gelu.default"] == 2 and "aten.conv2d.default" not in ops, ops
    assert ops["aten.gelu.default"] == 1                      # the tanh one was not an erf GELU: untouched
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        ref, out = net(x), gm(x)
    # the fused GELU is the tanh form: within ~1e-3 of erf's, well inside FP16's own error
    assert torch.allclose(out, ref, rtol=0, atol=2e-3 * ref.abs().max()), (out - ref).abs().max()


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs torch with a CUDA GPU (no GPU here; runs on the lent GPU)")
def test_the_cudnn_and_cublaslt_kernels_agree_with_fp32_on_the_gpu():
    import torch
    import torch._inductor.config

    from ngcx_runtime.candidates import ALL
    from ngcx_runtime.candidates.variant import build

    torch.manual_seed(0)
    short = torch._inductor.config.patch(max_autotune_gemm_backends="ATEN", max_autotune_conv_backends="ATEN")
    for net, shape, name in ((_resnet_like(torch), (3, 64, 64), "fp16 cudnn-fused channels-last"),
                             (_tiny_vit(torch), (3, 32, 32), "fp16 gemm-epilogue max-autotune")):
        ep = _export(torch, net, shape)
        x = torch.randn(16, *shape)
        with torch.no_grad():
            ref = net(x).cuda()
        for compiled in (False, True):
            v = build(ep, ALL[name], "cuda", compiled=compiled)
            with torch.inference_mode(), short:             # cuBLAS/cuDNN only: the compile stays short
                out = v(v.layout(x.cuda().half())).float()
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            assert err < 0.02 and (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.9, (name, compiled, err)
