"""Runs inside the onnxruntime image (ngcx test -> ngcx-runtime selftest). Plain functions, no pytest.

What a user of this image relies on: the pinned onnxruntime-gpu imports, its CUDA execution
provider can actually be dlopen'ed against the pinned CUDA libraries (not just listed), a model
runs, and ngcx-runtime's load/optimize path works on it. GPU checks skip with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from ngcx_runtime.selftest import pin as _pin, require_gpu, skip



def tiny_model(path: Path) -> Path:
    """x[N,4] -> MatMul(W) + b -> Relu -> y[N,3], fixed weights; a dynamic batch dimension."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    b = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"]),
         helper.make_node("Add", ["mm", "b"], ["pre"]),
         helper.make_node("Relu", ["pre"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def reference(x: np.ndarray) -> np.ndarray:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    return np.maximum(x @ w + np.array([0.1, -0.2, 0.3], dtype=np.float32), 0)


def test_onnxruntime_is_the_pinned_gpu_build():
    import onnxruntime as ort

    assert ort.__version__ == _pin("onnxruntime-gpu"), f"onnxruntime {ort.__version__} is not the pin"
    providers = ort.get_available_providers()
    assert "CUDAExecutionProvider" in providers, f"CPU-only onnxruntime: {providers}"


def test_ort_build_targets_the_image_cuda_major():
    """ORT's own build info names the CUDA it was compiled for; it must match NGCX_CUDA's major."""
    from onnxruntime.capi import build_and_package_info as info

    built = getattr(info, "cuda_version", None)
    if not built:
        skip("this onnxruntime build does not record cuda_version in build_and_package_info")
    assert built.split(".")[0] == os.environ["NGCX_CUDA"].split(".")[0], \
        f"onnxruntime built for CUDA {built}, image is CUDA {os.environ['NGCX_CUDA']}"


def test_cuda_provider_library_links_against_pinned_libs():
    """Every library the CUDA EP links resolves, and the CUDA ones come from the pinned wheels.

    A missing one (libnvrtc.so.12 was) is otherwise only seen on a GPU host, where ORT logs
    "Failed to load libonnxruntime_providers_cuda.so" and silently falls back to the CPU. The
    dynamic linker's own trace (ldd) is used: dlopen'ing the EP outside ORT runs its
    initializers, which crash without ORT's provider host.
    """
    import onnxruntime as ort

    lib = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    proc = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    resolved = dict(re.findall(r"^\s*(\S+) => (.+?) \(0x", proc.stdout, re.M))
    missing = re.findall(r"^\s*(\S+) => not found", proc.stdout, re.M)
    assert not missing, f"the CUDA EP links libraries that are not in the image: {', '.join(missing)}"
    cudnn_major = _pin("nvidia-cudnn").split(".")[0]
    for soname in ("libcudart.so.12", "libcublas.so.12", f"libcudnn.so.{cudnn_major}"):
        assert soname in resolved, f"the CUDA EP does not link {soname}: {sorted(resolved)}"
        assert "/site-packages/nvidia/" in resolved[soname], f"{soname} resolves to {resolved[soname]}"


def test_tiny_model_on_cpu_provider():
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp) / "tiny.onnx")
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-6)


def test_ngcx_runtime_load_and_optimize():
    """ngcx-runtime's own path: load the raw model, optimize to a plan, load the plan; same answers."""
    from ngcx_runtime import plan
    from ngcx_runtime.optimize import optimize

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NGCX_RUNTIME_CACHE"] = str(Path(tmp) / "cache")
        model = tiny_model(Path(tmp) / "tiny.onnx")
        x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
        raw = plan.load(model)
        assert raw.backend == "onnxruntime"
        np.testing.assert_allclose(raw.infer({"x": x})["y"], reference(x), rtol=1e-5, atol=1e-6)
        result = optimize(model, Path(tmp) / "plan", plan.OptimizeOptions(batch_profile=[1, 4]))
        assert (result.plan_dir / "manifest.json").is_file()
        engine = plan.load(result.plan_dir)
        np.testing.assert_allclose(engine.infer({"x": x})["y"], reference(x), rtol=1e-5, atol=1e-6)


def test_fp16_matmul_on_cuda_provider():
    """With a GPU: an FP16 MatMul through the CUDA EP (cuBLAS tensor-core path) matches numpy."""
    require_gpu()
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm16",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT16, [256, 256]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT16, [256, 256])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT16, [256, 256])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    assert sess.get_providers()[0] == "CUDAExecutionProvider", sess.get_providers()
    rng = np.random.default_rng(2)
    a, b = (rng.normal(size=(256, 256)).astype(np.float16) for _ in range(2))
    (c,) = sess.run(None, {"a": a, "b": b})
    np.testing.assert_allclose(c.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-2, atol=0.5)


def test_conv_model_on_cuda_provider():
    """With a GPU: a Conv (cuDNN) through the CUDA EP matches the CPU provider."""
    require_gpu()
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16, 16])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.normal(size=(2, 3, 16, 16)).astype(np.float32)
    gpu = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert gpu.get_providers()[0] == "CUDAExecutionProvider", gpu.get_providers()
    np.testing.assert_allclose(gpu.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-3, atol=1e-3)
