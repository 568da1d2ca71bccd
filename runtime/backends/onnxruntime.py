"""ONNX Runtime backend: CUDA EP (+ TensorRT EP when present) on GPUs, CPU EP elsewhere.

optimize() writes two files into the plan: `model.onnx` (the portable, precision-converted
graph: FP32, FP16 via onnxruntime.transformers.float16, or INT8 QDQ via quantize_static) and
`model.opt.onnx` (ORT's ORT_ENABLE_ALL offline optimization of it, saved through
SessionOptions.optimized_model_filepath). The optimized file is specific to the execution
provider and machine it was made on (runtime.md §7), which is why the manifest records them and
plan.load refuses or rebuilds on a mismatch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import TensorSpec
from ..errors import RuntimeUserError

NAME = "onnxruntime"
MODEL_SUFFIXES = (".onnx",)
ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
}
CALIBRATION_METHODS = ("entropy", "percentile", "minmax")


def availability() -> tuple[bool, str]:
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        return False, f"onnxruntime is not installed ({exc})"
    return True, ""


def version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def describe() -> dict[str, Any]:
    import onnxruntime

    return {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}


def providers(gpu: bool, plan_dir: Path | None = None, precision: str = "fp32", device_id: int = 0) -> list:
    """Provider list in priority order (runtime.md §7: TRT first, CUDA next, CPU last); device_id is
    the GPU an instance runs on (serve --instances/--gpus)."""
    import onnxruntime

    avail = set(onnxruntime.get_available_providers())
    chosen: list = []
    if gpu and "TensorrtExecutionProvider" in avail:
        opts: dict[str, Any] = {
            "trt_fp16_enable": precision == "fp16",
            "trt_int8_enable": precision == "int8",
            "device_id": device_id,
        }
        if plan_dir is not None:
            opts.update(
                {
                    "trt_engine_cache_enable": True,
                    "trt_engine_cache_path": str(plan_dir / "trt-cache"),
                    "trt_timing_cache_enable": True,
                    "trt_timing_cache_path": str(plan_dir / "trt-cache"),
                }
            )
        chosen.append(("TensorrtExecutionProvider", opts))
    if gpu and "CUDAExecutionProvider" in avail:
        chosen.append(("CUDAExecutionProvider", {"device_id": device_id}))
    chosen.append("CPUExecutionProvider")
    return chosen


def _check_model(src: Path):
    """Load + check the ONNX file; a broken file is a one-line user error."""
    import onnx

    try:
        model = onnx.load(str(src))
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not a valid ONNX model"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeUserError(
            f"{src}: not a valid ONNX model ({first[:200]}); re-export it "
            "(torch.onnx.export / tf2onnx) and check it with onnx.checker"
        ) from None
    return model


def _to_fp16(model):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # keep_io_types: clients keep sending FP32, the cast happens inside the graph.
    return convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)


class _NpzReader:
    """CalibrationDataReader over a dict of arrays keyed by input name, one sample per call."""

    def __init__(self, data: dict[str, np.ndarray], input_dtypes: dict[str, np.dtype], batch: int = 1):
        self._data, self._dtypes, self._batch = data, input_dtypes, batch
        self._n = min(len(a) for a in data.values())
        self._i = 0

    def get_next(self):
        if self._i >= self._n:
            return None
        j = min(self._i + self._batch, self._n)
        feeds = {
            k: np.ascontiguousarray(v[self._i : j]).astype(self._dtypes[k]) for k, v in self._data.items()
        }
        self._i = j
        return feeds

    def rewind(self) -> None:
        self._i = 0


def saturates_u8s8() -> bool:
    """True on an x86-64 CPU without VNNI, where ORT's U8S8 kernels (VPMADDUBSW) can saturate.

    ONNX Runtime's quantization guide recommends reduce_range (7-bit weights) there. Measured on this
    project's CI machine (AMD EPYC, AVX2, no VNNI): the conv test model's INT8 plan was 21% off FP32
    without it, against the 15% the tests allow, with onnxruntime 1.23 to 1.32 alike.
    """
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return True   # unknown x86 CPU: the safe choice costs at most one bit of weight precision
    return "avx512_vnni" not in flags and "avx_vnni" not in flags


def _quantize_int8(src: Path, dst: Path, calib: dict[str, np.ndarray], method: str, work: Path,
                   reduce_range: bool = False) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
        "minmax": CalibrationMethod.MinMax,
    }
    pre = work / "preprocessed.onnx"
    try:
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    except Exception:  # noqa: BLE001 - pre-processing is an optimization; quantize the original
        pre = src
    import onnxruntime

    sess = onnxruntime.InferenceSession(str(pre), providers=["CPUExecutionProvider"])
    dtypes = {
        i.name: np.dtype(np.float32) if ORT_TYPES.get(i.type) == "FP32" else np.dtype(np.float16)
        for i in sess.get_inputs()
    }
    missing = [n for n in dtypes if n not in calib]
    if missing:
        raise RuntimeUserError(
            f"calibration data lacks input(s) {', '.join(missing)}: the .npz must hold "
            f"one array per model input, keyed by name ({', '.join(dtypes)})"
        )
    # the calibrators print progress on stdout; keep stdout for the command's own (JSON) output
    with contextlib.redirect_stdout(sys.stderr):
        quantize_static(
            str(pre),
            str(dst),
            _NpzReader({k: calib[k] for k in dtypes}, dtypes),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce_range,
            calibrate_method=methods[method],
            extra_options={"CalibTensorRangeSymmetric": False},
        )


def optimize(src: Path, out_dir: Path, opts) -> dict[str, Any]:
    """Convert to the requested precision, run ORT's offline optimizer, return manifest fields."""
    import onnx

    if opts.precision == "bf16":
        raise RuntimeUserError(
            "the onnxruntime backend has no bf16 path: use --precision fp16, or "
            "--backend pytorch / tensorrt for bf16"
        )
    model = _check_model(src)
    portable = out_dir / "model.onnx"
    reduce_range = False
    if opts.precision == "fp16":
        onnx.save(_to_fp16(model), str(portable))
    elif opts.precision == "int8":
        if opts.calibration is None:
            raise RuntimeUserError(
                "--precision int8 needs --calibration-data data.npz (one array per "
                "model input, keyed by input name, samples along axis 0)"
            )
        reduce_range = not opts.gpu and saturates_u8s8()
        _quantize_int8(src, portable, opts.calibration, opts.calibration_method, out_dir, reduce_range)
        (out_dir / "preprocessed.onnx").unlink(missing_ok=True)
    else:
        onnx.save(model, str(portable))
    sess, artifact, notes = _optimize_offline(portable, out_dir, opts)
    if reduce_range:
        notes.append("int8 weights in 7 bits (reduce_range): this CPU has no VNNI, ORT's U8S8 kernels would saturate")
    return {
        "artifact": artifact,
        "portable_model": portable.name,
        "device": "cuda:0" if sess.get_providers()[0] != "CPUExecutionProvider" else "cpu",
        "providers": sess.get_providers(),
        "inputs": [_spec_dict(s) for s in _specs(sess.get_inputs())],
        "outputs": [_spec_dict(s) for s in _specs(sess.get_outputs())],
        "notes": notes,
    }


def _optimize_offline(portable: Path, out_dir: Path, opts):
    """Run ORT_ENABLE_ALL once and save the result (skipped when the TRT EP compiles nodes)."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # the NCHWc 'hardware specific' warning is why the manifest exists
    provs = providers(opts.gpu, out_dir, opts.precision)
    notes: list[str] = []
    uses_trt = any(isinstance(p, tuple) and p[0] == "TensorrtExecutionProvider" for p in provs)
    artifact = portable.name
    if uses_trt:
        notes.append(
            "TensorRT EP compiles subgraphs into engines (trt-cache/); ORT cannot save "
            "compiled nodes, so the portable model.onnx is the artifact"
        )
    else:
        so.optimized_model_filepath = str(out_dir / "model.opt.onnx")
        artifact = "model.opt.onnx"
    try:
        sess = onnxruntime.InferenceSession(str(portable), so, providers=provs)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeUserError(
            f"ONNX Runtime could not load {portable.name} at {opts.precision}: "
            f"{str(exc).splitlines()[0][:300]}"
        ) from None
    return sess, artifact, notes


def _specs(args) -> list[TensorSpec]:
    specs = []
    for a in args:
        shape = tuple(d if isinstance(d, int) else -1 for d in a.shape)
        dtype = ORT_TYPES.get(a.type)
        if dtype is None:
            raise RuntimeUserError(f"tensor {a.name} has type {a.type}, which ngcx-runtime does not serve")
        specs.append(TensorSpec(a.name, dtype, shape))
    return specs


def _spec_dict(s: TensorSpec) -> dict:
    return {"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}


class OrtEngine:
    """An onnxruntime.InferenceSession behind the Engine protocol."""

    backend = NAME

    def __init__(self, sess, name: str, precision: str, max_batch: int):
        self._sess = sess
        self.name = name
        self.precision = precision
        self.max_batch = max_batch
        self.providers = sess.get_providers()
        self.device = "cpu" if self.providers[0] == "CPUExecutionProvider" else f"cuda:{_device_id(sess)}"
        self.inputs = _specs(sess.get_inputs())
        self.outputs = _specs(sess.get_outputs())
        self._out_names = [o.name for o in self.outputs]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cast = {
            s.name: np.ascontiguousarray(feeds[s.name], dtype=s.numpy_dtype)
            for s in self.inputs
            if s.name in feeds
        }
        missing = [s.name for s in self.inputs if s.name not in feeds]
        if missing:
            raise RuntimeUserError(f"missing input(s) {', '.join(missing)} for model {self.name}")
        results = self._sess.run(self._out_names, cast)
        return dict(zip(self._out_names, results, strict=True))


def _device_id(sess) -> int:
    for name, opts in sess.get_provider_options().items():
        if name != "CPUExecutionProvider" and str(opts.get("device_id", "0")).isdigit():
            return int(opts.get("device_id", "0"))
    return 0


def _gpu_and_id(gpu: bool, device: int | str | None) -> tuple[bool, int]:
    """(use the GPU, which one) for an instance placed on `device` (None: the default, "cpu": the CPU)."""
    if device == "cpu":
        return False, 0
    return gpu, device if isinstance(device, int) else 0


def omp_threads() -> int:
    """OMP_NUM_THREADS if it is a positive integer, else 0 (ONNX Runtime's default: one per core).

    Why ONNX Runtime reads it too: its CPU build has its own thread pool and ignores the variable, so
    `serve --processes N` (runtime/mps.py gives each child cores / N through it) would otherwise run
    N pools of one thread per core each, on the same cores."""
    text = os.environ.get("OMP_NUM_THREADS", "")
    return int(text) if text.isdigit() and int(text) > 0 else 0


def _session(path: Path, gpu: bool, plan_dir: Path | None, precision: str, level: str,
             device: int | str | None = None):
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
    so.intra_op_num_threads = omp_threads()
    use_gpu, device_id = _gpu_and_id(gpu, device)
    try:
        return onnxruntime.InferenceSession(str(path), so,
                                            providers=providers(use_gpu, plan_dir, precision, device_id))
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeUserError(
            f"{path}: ONNX Runtime cannot load it ({first[:300]}); check the file "
            "with onnx.checker or re-export the model"
        ) from None


def load(plan_dir: Path, manifest: dict, gpu: bool, device: int | str | None = None) -> OrtEngine:
    """Load a plan: the offline-optimized model needs no second optimization pass."""
    artifact = plan_dir / manifest["artifact"]
    level = "ORT_DISABLE_ALL" if artifact.name == "model.opt.onnx" else "ORT_ENABLE_ALL"
    sess = _session(artifact, gpu, plan_dir, manifest["precision"], level, device)
    return OrtEngine(sess, manifest["name"], manifest["precision"], max(manifest.get("batch_profile") or [0]))


def load_model(src: Path, gpu: bool, name: str, device: int | str | None = None) -> OrtEngine:
    """Load a raw .onnx with ORT's default online optimization."""
    _check_model(src)
    return OrtEngine(_session(src, gpu, None, "fp32", "ORT_ENABLE_ALL", device), name, "fp32", 0)
