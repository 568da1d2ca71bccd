"""Image bytes in, top-5 labels out: the pre/post-processing around ResNet-18 (ngcx.yaml: handler).

Clients send the encoded image (PNG or JPEG) as one BYTES element per image; no client needs
numpy, Pillow or ImageNet's normalization constants. The server batches concurrent requests,
so predict() gets N images, decodes and normalizes each, runs the optimized engine once on the
batch, and answers per image:
  labels  BYTES [N]     a JSON list of the 5 most likely labels, best first (compared exactly by `ngcx test`)
  scores  FP32  [N, 5]  their softmax probabilities (compared within a tolerance)
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

SIZE = 224
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)    # ImageNet statistics, as torchvision's
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
TOP = 5


class Classifier:
    inputs = [{"name": "image", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "labels", "datatype": "BYTES", "shape": [-1]},
               {"name": "scores", "datatype": "FP32", "shape": [-1, TOP]}]

    def load(self, context) -> None:
        """The engine is ResNet-18 optimized by ngcx-runtime; labels.txt is copied next to this file."""
        if context.engine is None:
            raise RuntimeError("ngcx.yaml must name the model (model: path: model/resnet18.onnx)")
        self.engine = context.engine
        self.input_name = context.engine.inputs[0].name
        self.labels = (Path(context.app_dir) / "labels.txt").read_text(encoding="utf-8").splitlines()

    def warmup_inputs(self) -> dict[str, np.ndarray]:
        """One gray PNG: the server runs it before it answers ready (BYTES inputs have no default)."""
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (SIZE, SIZE), (128, 128, 128)).save(buf, format="PNG")
        return {"image": np.array([buf.getvalue()], dtype=object)}

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        images = inputs["image"].reshape(-1)
        batch = np.stack([preprocess(bytes(b)) for b in images])
        logits = self.engine.infer({self.input_name: batch})["logits"].astype(np.float64)
        probs = softmax(logits)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
        labels = np.array([json.dumps([self.labels[i] for i in row]).encode() for row in top], dtype=object)
        scores = np.take_along_axis(probs, top, axis=1).astype(np.float32)
        return {"labels": labels, "scores": scores}


def preprocess(data: bytes) -> np.ndarray:
    """Encoded image -> FP32 [3, 224, 224], RGB, scaled to [0, 1] and normalized per channel."""
    from PIL import Image

    from ngcx_runtime.handler import InvalidInput

    try:
        image = Image.open(io.BytesIO(data)).convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:   # not an image, truncated, too large
        # InvalidInput: a 400 to this client only; images batched with it are answered normally.
        raise InvalidInput(f"input 'image' is not a readable PNG or JPEG image ({len(data)} bytes: "
                           f"{type(exc).__name__})") from None
    pixels = np.asarray(image.resize((SIZE, SIZE), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
    return ((pixels - MEAN) / STD).transpose(2, 0, 1)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)
