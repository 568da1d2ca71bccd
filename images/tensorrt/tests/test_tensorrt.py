"""Runs inside the tensorrt image (ngcx test -> ngcx-runtime selftest). Plain functions, no pytest.

The tensorrt image is render-only on machines without NVIDIA's pip index (registry.yaml says
why), so these run wherever it can be built: the pinned TensorRT imports and loads libnvinfer
from its wheel; with a GPU, a tiny network builds into an engine and gives the right answer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from ngcx_runtime.selftest import pin as _pin, require_gpu

def test_tensorrt_is_the_pin():
    import tensorrt as trt

    assert trt.__version__ == _pin("tensorrt"), f"tensorrt {trt.__version__} vs pin {_pin('tensorrt')}"
    maps = Path("/proc/self/maps").read_text()
    assert "libnvinfer.so" in maps, "importing tensorrt did not load libnvinfer"


def test_tiny_engine_builds_and_runs_on_gpu():
    """With a GPU: y = relu(x) as a TensorRT network -> serialized engine -> deserialized -> run."""
    require_gpu()
    import tensorrt as trt
    from cuda.bindings import runtime as cudart

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("x", trt.float32, (4, 8))
    relu = network.add_activation(x, trt.ActivationType.RELU)
    network.mark_output(relu.get_output(0))
    relu.get_output(0).name = "y"
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 24)
    blob = builder.build_serialized_network(network, config)
    assert blob is not None and blob.nbytes > 0, "TensorRT could not build the engine"
    engine = trt.Runtime(logger).deserialize_cuda_engine(blob)
    context = engine.create_execution_context()

    host_x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    host_y = np.empty_like(host_x)
    nbytes = host_x.nbytes
    err, d_x = cudart.cudaMalloc(nbytes)
    assert err == cudart.cudaError_t.cudaSuccess, err
    err, d_y = cudart.cudaMalloc(nbytes)
    assert err == cudart.cudaError_t.cudaSuccess, err
    try:
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cudart.cudaMemcpy(d_x, host_x.ctypes.data, nbytes, h2d)
        context.set_tensor_address("x", int(d_x))
        context.set_tensor_address("y", int(d_y))
        assert context.execute_async_v3(0), "execute_async_v3 failed"
        cudart.cudaDeviceSynchronize()
        cudart.cudaMemcpy(host_y.ctypes.data, d_y, nbytes, d2h)
    finally:
        cudart.cudaFree(d_x)
        cudart.cudaFree(d_y)
    np.testing.assert_allclose(host_y, np.maximum(host_x, 0), rtol=1e-6)
