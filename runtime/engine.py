"""The contract between backends, `optimize`, `serve` and `bench`.

Why one small interface: the server and the benchmark must not care whether a plan runs on
TensorRT, ONNX Runtime or PyTorch; each backend turns a model or plan into an Engine, and
everything downstream speaks only numpy arrays keyed by tensor name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

# KServe v2 datatype <-> numpy dtype (runtime.md §8). BF16 travels as FP32 in numpy.
KSERVE_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
NUMPY_TO_KSERVE: dict[np.dtype, str] = {v: k for k, v in KSERVE_TO_NUMPY.items()}
# BYTES (strings, encoded images) travel as numpy object arrays of `bytes`. Kept out of the numeric
# tables above: backends cast with them, and no tensor library takes object arrays.
BYTES = "BYTES"
BYTES_DTYPE = np.dtype(object)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: name, KServe datatype ("FP32"...), shape with -1 for dynamic dims."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        return BYTES_DTYPE if self.datatype == BYTES else KSERVE_TO_NUMPY[self.datatype]


@runtime_checkable
class Engine(Protocol):
    """A loaded, ready-to-run model. infer() takes and returns host numpy arrays.

    Batch is the first dimension of every input and output. max_batch is the largest batch
    the engine accepts in one call (the optimization profile's max, or 0 = unbounded).
    infer() must be safe to call from one thread at a time; the server serializes calls.

    Optional: infer_async(feeds) -> Callable[[], dict[str, np.ndarray]] launches one batch and
    returns a function that waits for its outputs. An engine that has it lets the server's
    batcher stage batch N+1 while batch N computes (the PyTorch engine on a GPU does; see
    backends/pytorch.py). Calls to infer_async come from one thread; the returned functions are
    called in launch order from another.

    The server does not take "batch is dim 0" on trust for outputs: at load it runs batch 1 and
    batch 2 once and reads each output's batch axis from the shapes (layout.py). An engine with
    `batch_axis_declared = True` (handlers) is believed instead.
    """

    name: str
    backend: str            # "tensorrt" | "onnxruntime" | "pytorch"
    device: str             # "cuda:0" | "cpu"
    precision: str          # "fp32" | "fp16" | "bf16" | "int8"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch: int

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
