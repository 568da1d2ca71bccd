"""Small ONNX models built with onnx.helper, shared by the runtime and server tests.

Why build them here: the tests must run offline on a CPU-only machine, and tiny real graphs
(conv+bias+relu chains, an MLP) exercise the same optimizer passes (fusion, FP16 conversion,
QDQ insertion) that a real model does, in milliseconds. Weights come from a fixed seed so a
test's reference outputs are reproducible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OPSET = 17


def _init(name: str, arr: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(arr.astype(np.float32), name)


def _save(graph, path: Path | str) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def conv_net(path: Path | str, channels: int = 8, size: int = 16, classes: int = 10) -> Path:
    """A classifier: input [N,3,size,size] -> 3x (Conv+bias -> Relu) -> GlobalAvgPool -> Gemm.

    Input "input" FP32 with a dynamic batch dim; output "logits" [N, classes].
    """
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev, cin = "input", 3
    for i in range(3):
        w = rng.normal(0, np.sqrt(2.0 / (cin * 9)), (channels, cin, 3, 3))
        b = rng.normal(0, 0.1, (channels,))
        inits += [_init(f"conv{i}.w", w), _init(f"conv{i}.b", b)]
        nodes.append(
            helper.make_node("Conv", [prev, f"conv{i}.w", f"conv{i}.b"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}")
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev, cin = f"r{i}", channels
    nodes.append(helper.make_node("GlobalAveragePool", [prev], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], axis=1, name="flatten"))
    inits += [_init("fc.w", rng.normal(0, 0.5, (classes, channels))), _init("fc.b", rng.normal(0, 0.1, (classes,)))]
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1, name="fc"))
    graph = helper.make_graph(
        nodes,
        "conv_net",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    return _save(graph, path)


def mlp(path: Path | str, features: int = 32, hidden: int = 64, classes: int = 10) -> Path:
    """A 2-layer MLP: input "x" [N, features] -> MatMul+Add -> Relu -> MatMul+Add -> "y" [N, classes]."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    inits = [
        _init("w1", rng.normal(0, np.sqrt(2.0 / features), (features, hidden))),
        _init("b1", rng.normal(0, 0.1, (hidden,))),
        _init("w2", rng.normal(0, np.sqrt(1.0 / hidden), (hidden, classes))),
        _init("b2", rng.normal(0, 0.1, (classes,))),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
        helper.make_node("Add", ["h3", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
        inits,
    )
    return _save(graph, path)


def sample_inputs(model: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs for conv_net ("conv") or mlp ("mlp") at a given batch."""
    rng = np.random.default_rng(seed)
    if model == "conv":
        return {"input": rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)}
    return {"x": rng.standard_normal((batch, 32)).astype(np.float32)}
