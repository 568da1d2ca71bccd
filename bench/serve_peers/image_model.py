"""The image-sized model of `python -m bench serve-peers` (issue 50 item 5): a ResNet-sized request and answer
(input [N,3,224,224] FP32, output [N,1000] logits), with little compute behind them.

Why not ResNet-18 itself: on this benchmark's 2-core CPU machine onnxruntime spends 20 ms per image in a
ResNet-18-shaped graph (11.7 M random weights made with onnx.helper; median of 10 runs), the same under every
server and as long as ngcx's whole JSON parse, which would hide what this point measures: a
3x224x224 tensor crossing the server as JSON (about 3 MB of text) or binary (602 KB). On a GPU, where ResNet-18
takes about a millisecond, the serving path is what is left. So the graph keeps ResNet's stem shape (a strided
conv to 56x56, as ResNet's conv1 + max pool) and head (global average pool, 1000-way Gemm) and drops the stages
between them. Weights come from a fixed seed, as tests/runtime/models.py's do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..core import ROOT

SHAPE = (3, 224, 224)
CLASSES = 1000


def image_net(path: Path | str, channels: int = 16) -> Path:
    """input [N,3,224,224] -> Conv 4x4 stride 4 (+bias) -> Relu -> GlobalAveragePool -> Gemm -> logits [N,1000].
    Saved as tests/runtime/models.py saves its models (the same opset, IR version and check)."""
    from onnx import TensorProto, helper

    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from models import _init, _save

    rng = np.random.default_rng(2)
    inits = [_init("stem.w", rng.normal(0, np.sqrt(2.0 / (3 * 16)), (channels, 3, 4, 4))),
             _init("stem.b", rng.normal(0, 0.1, (channels,))),
             _init("fc.w", rng.normal(0, 0.5, (CLASSES, channels))), _init("fc.b", rng.normal(0, 0.1, (CLASSES,)))]
    nodes = [helper.make_node("Conv", ["input", "stem.w", "stem.b"], ["c"], strides=[4, 4], name="stem"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["gap"], name="gap"),
             helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"),
             helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "image_net",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *SHAPE])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])], inits)
    return _save(graph, path)


def sample(batch: int = 1, seed: int = 0) -> np.ndarray:
    """A deterministic image batch, standard-normal as a normalized image's pixels are."""
    return np.random.default_rng(seed).standard_normal((batch, *SHAPE)).astype(np.float32)
