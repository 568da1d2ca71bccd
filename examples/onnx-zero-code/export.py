"""Export a small image classifier to ONNX, with its calibration data and a sample input.

Writes (fixed seeds, so every run writes the same bytes):
  model/convnet.onnx   "image" FP32 [N, 3, 32, 32] -> 3x (Conv + bias -> Relu, channels 16/32/64, the last two
                       stride 2) -> GlobalAveragePool -> Gemm -> "logits" FP32 [N, 10]   (git ignores model/)
  calib.npz            256 calibration images keyed by the input's name, "image" [256, 3, 32, 32]: the data
                       `precision: int8` measures activation ranges on (git ignores it)
  samples/image.npy    the example's input [1, 3, 32, 32], drawn from the same distribution as calib.npz

The images are standard-normal noise, i.e. what a real classifier sees after per-channel
normalization; the calibration set and the sample are different draws (calibrating on the test
input would flatter INT8).

    python export.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 7
OPSET = 17
SIZE, CLASSES = 32, 10
LAYERS = ((16, 1), (32, 2), (64, 2))      # (channels, stride)
CALIBRATION_SAMPLES = 256


def convnet(seed: int = SEED) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def weight(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    x, cin = "image", 3
    for i, (cout, stride) in enumerate(LAYERS):
        w = weight(f"conv{i}.weight", rng.normal(0.0, np.sqrt(2.0 / (cin * 9)), (cout, cin, 3, 3)))
        b = weight(f"conv{i}.bias", rng.normal(0.0, 0.05, cout))
        nodes.append(helper.make_node("Conv", [x, w, b], [f"conv{i}"], kernel_shape=[3, 3], pads=[1] * 4,
                                      strides=[stride, stride], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        x, cin = f"relu{i}", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"))
    fc_w = weight("fc.weight", rng.normal(0.0, np.sqrt(2.0 / cin), (CLASSES, cin)))
    fc_b = weight("fc.bias", rng.normal(0.0, 0.05, CLASSES))
    nodes.append(helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], transB=1, name="fc"))
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ngcx-example")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 3, SIZE, SIZE)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent, help="project folder (default: here)")
    args = parser.parse_args()
    (args.out / "model").mkdir(parents=True, exist_ok=True)
    (args.out / "samples").mkdir(parents=True, exist_ok=True)
    onnx.save(convnet(), str(args.out / "model" / "convnet.onnx"))
    np.savez(args.out / "calib.npz", image=images(CALIBRATION_SAMPLES, SEED + 1))
    np.save(args.out / "samples" / "image.npy", images(1, SEED + 2))
    print(f"wrote {args.out / 'model' / 'convnet.onnx'}, {args.out / 'calib.npz'}, {args.out / 'samples/image.npy'}")


if __name__ == "__main__":
    main()
