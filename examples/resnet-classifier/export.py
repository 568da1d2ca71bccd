"""Export a ResNet-18 to ONNX (model/resnet18.onnx), with random weights from a fixed seed.

Why random weights: the example must build and test offline, with nothing downloaded and no
46 MB file in git. The architecture is the real one (He et al. 2015, torchvision's resnet18):
conv 7x7/2 + BN + ReLU, max pool 3x3/2, four stages of two BasicBlocks (64, 128, 256, 512
channels; 1x1 conv + BN on the shortcut where the shape changes), global average pool, and a
fully connected layer to 1000 classes. So the optimizer, the server and the handler see the same
graph (and the same cost) as a trained ResNet-18; only the labels it picks are meaningless.
Swap in trained weights with torch.onnx.export(torchvision.models.resnet18(weights=...), ...):
the input ("input", FP32 [N, 3, 224, 224]) and output ("logits", FP32 [N, 1000]) stay the same.

    python export.py [--out model/resnet18.onnx]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 3             # of the seeds 0-23, the one whose top-5 for samples/cat.png is least fragile
OPSET = 17
CLASSES = 1000
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))   # (channels, stride of the first block)


class Graph:
    """Nodes and initializers of the graph being built, with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        """Conv (He init, no bias) -> BatchNormalization (eval mode) [-> Relu]."""
        w = self.rng.normal(0.0, np.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k))
        pad = k // 2
        self.nodes.append(helper.make_node("Conv", [x, self.weight(f"{name}.weight", w)], [f"{name}.conv"],
                                           kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, name=name))
        bn = [self.weight(f"{name}.bn.{p}", v) for p, v in (
            ("scale", self.rng.uniform(0.5, 1.0, cout)), ("bias", self.rng.normal(0.0, 0.1, cout)),
            ("mean", self.rng.normal(0.0, 0.1, cout)), ("var", self.rng.uniform(0.5, 1.5, cout)))]
        self.nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [f"{name}.bn"],
                                           epsilon=1e-5, name=f"{name}.bn"))
        if not relu:
            return f"{name}.bn"
        self.nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    def basic_block(self, x: str, name: str, cin: int, cout: int, stride: int) -> str:
        """Two 3x3 conv-BN, the shortcut added before the last ReLU."""
        y = self.conv_bn(x, f"{name}.conv1", cin, cout, 3, stride, relu=True)
        y = self.conv_bn(y, f"{name}.conv2", cout, cout, 3, 1, relu=False)
        shortcut = x if stride == 1 and cin == cout else self.conv_bn(x, f"{name}.downsample", cin, cout, 1, stride,
                                                                      relu=False)
        self.nodes.append(helper.make_node("Add", [y, shortcut], [f"{name}.add"], name=f"{name}.add"))
        self.nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}.relu"))
        return f"{name}.out"


def resnet18(seed: int = SEED) -> onnx.ModelProto:
    g = Graph(seed)
    x = g.conv_bn("input", "conv1", 3, 64, 7, 2, relu=True)
    g.nodes.append(helper.make_node("MaxPool", [x], ["maxpool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
                                    name="maxpool"))
    x, cin = "maxpool", 64
    for i, (cout, stride) in enumerate(STAGES, 1):
        x = g.basic_block(x, f"layer{i}.0", cin, cout, stride)
        x = g.basic_block(x, f"layer{i}.1", cout, cout, 1)
        cin = cout
    g.nodes.append(helper.make_node("GlobalAveragePool", [x], ["avgpool"], name="avgpool"))
    g.nodes.append(helper.make_node("Flatten", ["avgpool"], ["flatten"], axis=1, name="flatten"))
    fc_w = g.weight("fc.weight", g.rng.normal(0.0, np.sqrt(1.0 / 512), (CLASSES, 512)))
    fc_b = g.weight("fc.bias", g.rng.normal(0.0, 0.01, CLASSES))
    g.nodes.append(helper.make_node("Gemm", ["flatten", fc_w, fc_b], ["logits"], transB=1, name="fc"))
    graph = helper.make_graph(
        g.nodes, "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ngcx-example")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "model" / "resnet18.onnx")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(resnet18(), str(args.out))
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
