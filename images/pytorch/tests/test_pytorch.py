"""Runs inside the pytorch image (ngcx test -> ngcx-runtime selftest). Plain functions, no pytest.

What a user of this image relies on: the pinned torch/torchvision import, torch was built for the
image's CUDA and loads the pinned cuDNN and NCCL (torch's own view, not a label), a model runs
forward and backward, torchvision's compiled ops match torch, and ngcx-runtime serves a
torch.export program. Tensor cores, cuDNN convs and NCCL all-reduce need a GPU and skip without.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
from ngcx_runtime.selftest import CONSTRAINTS, pin as _pin, pins, require_gpu, same_version as _same




def small_net():
    """conv -> relu -> pool -> linear: the shapes a classifier has, fixed seed."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 10))


def test_torch_and_torchvision_are_the_pins():
    import torch
    import torchvision

    assert _same(torch.__version__, _pin("torch")), f"torch {torch.__version__} vs pin {_pin('torch')}"
    vision = pins().get("torchvision")
    assert vision, f"{CONSTRAINTS} pins no torchvision"
    assert _same(torchvision.__version__, vision), f"torchvision {torchvision.__version__} vs pin {vision}"


def test_torch_cuda_requirements_installed_exactly():
    """Every nvidia-* wheel torch's Requires-Dist pins is installed at that exact version.

    Requires-Dist comes as `name==v` or, in older wheels' metadata, `name (==v)`."""
    import re
    from importlib.metadata import distribution, version

    wanted = [m.groups() for req in distribution("torch").requires or []
              if (m := re.match(r"(nvidia-[\w-]+)\s*\(?==\s*([\w.]+)", req))]
    assert wanted, "torch declares no nvidia-* CUDA wheels (a CPU-only torch?)"
    wrong = [f"{name} {version(name)} (wants {want})" for name, want in wanted if version(name) != want]
    assert not wrong, "CUDA wheels differ from what torch asks for: " + ", ".join(wrong)


def test_torch_built_for_image_cuda():
    import torch

    assert torch.version.cuda == os.environ["NGCX_CUDA"], \
        f"torch built for CUDA {torch.version.cuda}, image is CUDA {os.environ['NGCX_CUDA']}"


def test_torch_loads_pinned_cudnn():
    """torch.backends.cudnn.version() asks the loaded libcudnn (90100 = 9.1.0; 8907 = 8.9.7)."""
    import torch

    v = torch.backends.cudnn.version()
    assert v, "torch found no cuDNN"
    scale = 10000 if v >= 90000 else 1000  # cuDNN 9 encodes MAJOR*10000, cuDNN 8 MAJOR*1000
    major, rest = divmod(v, scale)
    found = f"{major}.{rest // 100}.{rest % 100}"
    pin = _pin("nvidia-cudnn")
    assert _same(found, pin), f"torch loaded cuDNN {found}, image pins {pin}"
    path = [line for line in Path("/proc/self/maps").read_text().splitlines() if "libcudnn.so" in line]
    assert path and "site-packages/nvidia/" in path[0], f"cuDNN not from the pinned wheel: {path[:1]}"


def test_torch_loads_pinned_nccl():
    import torch

    found = ".".join(str(x) for x in torch.cuda.nccl.version())
    pin = _pin("nvidia-nccl")
    assert _same(found, pin), f"torch loaded NCCL {found}, image pins {pin}"


def test_cpu_forward_backward_conv_linear():
    """Forward matches the functional composition of the same weights; one SGD step lowers the loss."""
    import torch
    import torch.nn.functional as F

    net = small_net()
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = net(x)
    conv, lin = net[0], net[4]
    features = F.relu(F.conv2d(x, conv.weight, conv.bias, padding=1)).mean((2, 3))
    expect = F.linear(features, lin.weight, lin.bias)
    torch.testing.assert_close(y, expect, rtol=1e-5, atol=1e-5)
    target = torch.tensor([1, 2, 3, 4])
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    before = F.cross_entropy(net(x), target)
    before.backward()
    opt.step()
    after = F.cross_entropy(net(x), target)
    assert after.item() < before.item(), f"loss did not drop: {before.item()} -> {after.item()}"


def test_torchvision_compiled_ops_match_torch():
    """torchvision.ops.nms is C++ compiled against one torch ABI: a mismatched pair fails here."""
    import torch
    from torchvision.ops import nms

    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7])
    assert nms(boxes, scores, 0.5).tolist() == [0, 2]


def test_ngcx_runtime_loads_torch_export_program():
    """ngcx-runtime's pytorch backend: a torch.export .pt2 loads and gives the eager answers."""
    import torch
    from ngcx_runtime import plan

    net = small_net().eval()
    x = torch.randn(2, 3, 16, 16)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(net, (x,), dynamic_shapes=({0: batch},))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NGCX_RUNTIME_CACHE"] = str(Path(tmp) / "cache")
        path = Path(tmp) / "net.pt2"
        torch.export.save(ep, str(path))
        engine = plan.load(path)
        assert engine.backend == "pytorch"
        feeds = {engine.inputs[0].name: x.numpy()}
        out = engine.infer(feeds)[engine.outputs[0].name]
    with torch.no_grad():
        np.testing.assert_allclose(out, net(x).numpy(), rtol=1e-4, atol=1e-5)


def test_fp16_and_bf16_matmul_on_tensor_cores():
    """With a GPU: half/bfloat16 GEMMs (cuBLAS tensor-core path) agree with an fp32 reference."""
    require_gpu()
    import torch

    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    ref = a @ b
    for dtype in (torch.float16, torch.bfloat16):
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            continue
        got = (a.to(dtype) @ b.to(dtype)).float()
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel < 1e-2, f"{dtype} matmul relative error {rel}"


def test_cudnn_conv_on_gpu():
    """With a GPU: a conv through cuDNN matches the CPU result."""
    require_gpu()
    import torch

    assert torch.backends.cudnn.is_available()
    net = small_net()
    x = torch.randn(4, 3, 32, 32)
    cpu = net(x)
    with torch.backends.cudnn.flags(enabled=True):
        gpu = net.cuda()(x.cuda()).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-3, atol=1e-3)


ALL_REDUCE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    t = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    expect = world * (world + 1) / 2
    assert torch.allclose(t, torch.full_like(t, expect)), (t[0].item(), expect)
    dist.destroy_process_group()
""")


def test_nccl_all_reduce_across_visible_gpus():
    """With a GPU: one process per GPU (torchrun), NCCL all-reduce of rank+1 sums to n(n+1)/2."""
    n = require_gpu()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "all_reduce.py"
        script.write_text(ALL_REDUCE)
        env = {**os.environ, "NCCL_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={n}", str(script)],
                              capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, f"all-reduce over {n} GPU(s) failed: {proc.stderr[-800:]}"
