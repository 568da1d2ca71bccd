"""TensorRT backend, written against the documented TensorRT 10 and 11 Python APIs (runtime.md §1-2).

NOT verified on a machine: TensorRT cannot be installed where ngcx is developed and tested, and
the lent GPU has none either. Tests that need it skip with that reason.

Version split (runtime.md §1): TensorRT 10.x builds weakly typed networks with precision flags
(BuilderFlag.FP16 / BF16, INT8 + IInt8EntropyCalibrator2 fed from --calibration-data). TensorRT 11
is always strongly typed and removed those flags and calibrators: there FP16/BF16 must come from
the ONNX itself (ModelOpt AutoCast) and INT8 from Q/DQ nodes (ModelOpt PTQ, or this runtime's
onnxruntime int8 path which writes QDQ). We refuse weak-typing requests on 11 with that fix.
Device memory goes through cuda-python (cuda.bindings.runtime), as NVIDIA's 10.13+ samples do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..engine import TensorSpec
from ..errors import RuntimeUserError

NAME = "tensorrt"
MODEL_SUFFIXES = (".onnx",)
WORKSPACE_BYTES = 4 << 30


def availability() -> tuple[bool, str]:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False, "tensorrt is not installed"
    from .. import probe

    if not probe.gpus():
        return False, "tensorrt needs an NVIDIA GPU and none is visible"
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError:
        return False, "cuda-python (cuda.bindings) is not installed; TensorRT I/O buffers need it"
    return True, ""


def version() -> str:
    import tensorrt

    return tensorrt.__version__


def describe() -> dict[str, Any]:
    return {"version": version()}


def _major() -> int:
    return int(version().split(".")[0])


def _cuda(call_result):
    """cuda.bindings returns (err, *values); raise on error, return the values."""
    err, *vals = call_result
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return vals[0] if len(vals) == 1 else vals


def _np_dtype(trt, dt) -> np.dtype:
    if dt == trt.DataType.BF16:
        raise RuntimeUserError("bf16 engine I/O cannot be served as numpy; keep the ONNX inputs FP32/FP16")
    return np.dtype(trt.nptype(dt))


class _EntropyCalibrator:
    """Builds an IInt8EntropyCalibrator2 (TRT 10 only) over the .npz calibration arrays."""

    @staticmethod
    def make(trt, data: dict[str, np.ndarray], names: list[str], batch: int, cache_path: Path):
        from cuda.bindings import runtime as cudart

        class Calib(trt.IInt8EntropyCalibrator2):
            def __init__(self):
                trt.IInt8EntropyCalibrator2.__init__(self)
                self.n = min(len(data[k]) for k in names)
                self.i = 0
                self.ptrs = {
                    k: _cuda(cudart.cudaMalloc(int(np.prod(data[k][:batch].shape)) * 4)) for k in names
                }

            def get_batch_size(self):
                return batch

            def get_batch(self, names_):
                if self.i + batch > self.n:
                    return None
                for k in names_:
                    arr = np.ascontiguousarray(data[k][self.i : self.i + batch], dtype=np.float32)
                    _cuda(
                        cudart.cudaMemcpy(
                            self.ptrs[k],
                            arr.ctypes.data,
                            arr.nbytes,
                            cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                        )
                    )
                self.i += batch
                return [int(self.ptrs[k]) for k in names_]

            def read_calibration_cache(self):
                return cache_path.read_bytes() if cache_path.exists() else None

            def write_calibration_cache(self, cache):
                cache_path.write_bytes(bytes(cache))

        return Calib()


def optimize(src: Path, out_dir: Path, opts) -> dict[str, Any]:
    import tensorrt as trt

    major = _major()
    if major >= 11 and opts.precision in ("fp16", "bf16", "int8"):
        raise RuntimeUserError(
            f"TensorRT {version()} is strongly typed only: --precision {opts.precision} via builder flags "
            "was removed in 11; convert the ONNX first (FP16/BF16: python -m modelopt.onnx.autocast; INT8: "
            "ngcx-runtime optimize --backend onnxruntime --precision int8 writes a Q/DQ model) and build "
            "that with --precision fp32, or pin tensorrt-cu12==10.16.1.11"
        )
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(src)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeUserError(f"{src}: TensorRT's ONNX parser failed: {errors.splitlines()[0][:300]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if opts.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif opts.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    profile = builder.create_optimization_profile()
    bmin, bmax = opts.batch_profile[0], opts.batch_profile[-1]
    bopt = opts.batch_profile[len(opts.batch_profile) // 2]
    for i in range(network.num_inputs):
        t = network.get_input(i)
        dims = list(t.shape)
        if dims and dims[0] == -1:
            rest = dims[1:]
            if any(d == -1 for d in rest):
                raise RuntimeUserError(
                    f"input {t.name} has dynamic non-batch dims {dims}; export fixed sizes"
                )
            profile.set_shape(t.name, (bmin, *rest), (bopt, *rest), (bmax, *rest))
    config.add_optimization_profile(profile)
    if opts.precision == "int8":
        if opts.calibration is None:
            raise RuntimeUserError("--precision int8 needs --calibration-data data.npz keyed by input name")
        config.set_flag(trt.BuilderFlag.INT8)
        names = [network.get_input(i).name for i in range(network.num_inputs)]
        config.int8_calibrator = _EntropyCalibrator.make(
            trt, opts.calibration, names, 1, out_dir / "calib.cache"
        )
        config.set_calibration_profile(profile)
    timing = Path(out_dir).parent / "trt-timing.cache"  # shared across builds on this host
    cache = config.create_timing_cache(timing.read_bytes() if timing.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeUserError(f"{src}: TensorRT build failed (see the log above)")
    (out_dir / "model.plan").write_bytes(bytes(plan))
    serialized = bytes(config.get_timing_cache().serialize())
    (out_dir / "timing.cache").write_bytes(serialized)
    timing.write_bytes(serialized)
    eng = _deserialize(out_dir / "model.plan")
    ins, outs = _io_specs(trt, eng)
    return {
        "artifact": "model.plan",
        "device": "cuda:0",
        "typing": "strong" if major >= 11 else "weak",
        "inputs": [_d(s) for s in ins],
        "outputs": [_d(s) for s in outs],
        "notes": ["timing cache persisted as timing.cache beside the plan"],
    }


def _d(s: TensorSpec) -> dict:
    return {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}


def _deserialize(path: Path):
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise RuntimeUserError(
            f"{path}: TensorRT could not deserialize the plan (built by another TensorRT "
            "version or GPU?); rebuild it with ngcx-runtime optimize"
        )
    return engine


def _io_specs(trt, engine) -> tuple[list[TensorSpec], list[TensorSpec]]:
    from ..engine import NUMPY_TO_KSERVE

    ins, outs = [], []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        spec = TensorSpec(
            name,
            NUMPY_TO_KSERVE[_np_dtype(trt, engine.get_tensor_dtype(name))],
            tuple(engine.get_tensor_shape(name)),
        )
        (ins if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outs).append(spec)
    return ins, outs


class TrtEngine:
    """A deserialized plan with one execution context and a non-default stream."""

    backend = NAME
    device = "cuda:0"

    def __init__(self, engine, name: str, precision: str, max_batch: int):
        import tensorrt as trt
        from cuda.bindings import runtime as cudart

        self._trt, self._cudart, self._engine = trt, cudart, engine
        self.name, self.precision, self.max_batch = name, precision, max_batch
        self.inputs, self.outputs = _io_specs(trt, engine)
        self._ctx = engine.create_execution_context()
        self._stream = _cuda(cudart.cudaStreamCreate())

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart, ctx = self._cudart, self._ctx
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        allocs, results = [], {}
        try:
            for s in self.inputs:
                arr = np.ascontiguousarray(feeds[s.name], dtype=s.numpy_dtype)
                ctx.set_input_shape(s.name, arr.shape)
                ptr = _cuda(cudart.cudaMalloc(arr.nbytes))
                allocs.append(ptr)
                _cuda(cudart.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, self._stream))
                ctx.set_tensor_address(s.name, int(ptr))
            host = {}
            for s in self.outputs:
                shape = tuple(ctx.get_tensor_shape(s.name))
                host[s.name] = np.empty(shape, s.numpy_dtype)
                ptr = _cuda(cudart.cudaMalloc(max(host[s.name].nbytes, 1)))
                allocs.append(ptr)
                ctx.set_tensor_address(s.name, int(ptr))
            if not ctx.execute_async_v3(int(self._stream)):
                raise RuntimeError("TensorRT execute_async_v3 failed")
            for s, ptr in zip(self.outputs, allocs[len(self.inputs) :], strict=True):
                arr = host[s.name]
                _cuda(cudart.cudaMemcpyAsync(arr.ctypes.data, ptr, arr.nbytes, d2h, self._stream))
            _cuda(cudart.cudaStreamSynchronize(self._stream))
            results = host
        finally:
            for ptr in allocs:
                cudart.cudaFree(ptr)
        return results


def _only_gpu0(device: int | str | None) -> None:
    """TensorRT engines here run on GPU 0 (the plan's build GPU); other placements are refused."""
    if device not in (None, 0):
        raise RuntimeUserError(f"the tensorrt backend runs instances on GPU 0 only, not on {device!r}; drop --gpus "
                               "(or the instance_group's gpus/kind), or serve an ONNX Runtime / PyTorch plan")


def load(plan_dir: Path, manifest: dict, gpu: bool, device: int | str | None = None) -> TrtEngine:
    _only_gpu0(device)
    engine = _deserialize(plan_dir / manifest["artifact"])
    return TrtEngine(
        engine, manifest["name"], manifest["precision"], max(manifest.get("batch_profile") or [0])
    )


def load_model(src: Path, gpu: bool, name: str, device: int | str | None = None):
    raise RuntimeUserError(
        f"{src}: the tensorrt backend needs a built plan; run ngcx-runtime optimize "
        f"{src} -o PLAN_DIR --backend tensorrt first"
    )
