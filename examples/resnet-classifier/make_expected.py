"""Draw samples/cat.png and write examples.yaml with what the handler answers for it.

Why a script: the expected top-5 labels and scores of random weights can only come from running
the model, so they are computed here, on the host, with the same handler code and ONNX Runtime on
the CPU, and committed. `ngcx test` then checks that the built image answers the same. The top-5
must not hinge on rounding: the script refuses when two neighbouring logits are closer than
MIN_GAP (an ONNX Runtime version or a CPU's SIMD path moves FP32 logits by ~1e-5 relative).

    python export.py && python make_expected.py     # needs pillow, onnxruntime (and numpy)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
# Logits are ~4 in scale. ORT builds and CPUs move them by ~1e-4; a GPU's TF32 convolutions (ORT's CUDA
# EP default on Ampere and newer) by up to ~1e-2. Neighbouring top-6 logits must be further apart
# than that for the labels to compare exactly, and the scores get a 2% relative tolerance.
MIN_GAP = 0.1
SCORE_RTOL, SCORE_ATOL = 2e-2, 1e-4


def draw_cat(path: Path) -> None:
    """A flat-colour cartoon cat, 200x160 (so the handler really resizes), a few KB as PNG."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (200, 160), (198, 226, 240))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 120, 200, 160], fill=(120, 170, 90))                      # grass
    d.ellipse([55, 70, 145, 150], fill=(230, 140, 60))                         # body
    d.polygon([(62, 42), (72, 8), (92, 34)], fill=(230, 140, 60))              # ears
    d.polygon([(108, 34), (128, 8), (138, 42)], fill=(230, 140, 60))
    d.ellipse([60, 25, 140, 95], fill=(240, 155, 70))                          # head
    for x in (80, 112):                                                        # eyes
        d.ellipse([x - 8, 48, x + 8, 62], fill=(250, 250, 210))
        d.ellipse([x - 3, 49, x + 3, 61], fill=(20, 20, 20))
    d.polygon([(96, 68), (104, 68), (100, 74)], fill=(200, 80, 90))            # nose
    for dy in (70, 76):                                                        # whiskers
        d.line([(60, dy), (92, 72)], fill=(60, 40, 30), width=1)
        d.line([(108, 72), (140, dy)], fill=(60, 40, 30), width=1)
    for x in range(70, 140, 14):                                               # stripes
        d.line([(x, 100), (x + 6, 140)], fill=(190, 100, 40), width=4)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG", optimize=True)


class OrtEngine:
    """The slice of the ngcx engine contract the handler uses, over an ONNX Runtime CPU session."""

    def __init__(self, model: Path) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        self.inputs = [SimpleNamespace(name=i.name) for i in self.session.get_inputs()]

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, feeds), strict=True))


def main() -> int:
    sys.path.insert(0, str(HERE))
    from export import SEED
    from handler import Classifier, preprocess

    sample = HERE / "samples" / "cat.png"
    if not sample.exists():
        draw_cat(sample)
    engine = OrtEngine(HERE / "model" / "resnet18.onnx")
    handler = Classifier()
    handler.load(SimpleNamespace(engine=engine, model_path=None, app_dir=HERE))
    raw = sample.read_bytes()
    logits = engine.infer({"input": preprocess(raw)[None]})["logits"][0]
    top6 = np.sort(logits)[::-1][:6]
    gap = float(np.min(-np.diff(top6)))
    if gap < MIN_GAP:
        print(f"the top-5 hinges on a logit gap of {gap:.2e} < {MIN_GAP}: change the sample", file=sys.stderr)
        return 1
    out = handler.predict({"image": np.array([raw], dtype=object)})
    labels = json.loads(out["labels"][0])
    scores = [float(f"{s:.6g}") for s in out["scores"][0]]
    (HERE / "examples.yaml").write_text(f"""\
# Written by make_expected.py: what the handler answers for samples/cat.png, computed on the host with
# ONNX Runtime (CPU) and the same handler.py. The weights are random (export.py, seed {SEED}), so the labels
# are arbitrary but fixed; the smallest gap between neighbouring top-6 logits is {gap:.3f}, far above what
# an ONNX Runtime build, a CPU (~1e-4) or a GPU's TF32 (~1e-2) changes, so the top-5 must match exactly.
examples:
  - name: cat
    inputs:
      image: {{datatype: BYTES, shape: [1], file: samples/cat.png}}
    outputs:
      labels: {{data: [{json.dumps(json.dumps(labels))}]}}
      # softmax probabilities of those labels; 2% covers TF32 on GPUs (FP32 on CPUs differs by ~1e-5)
      scores: {{data: [{scores}], rtol: {SCORE_RTOL:.1e}, atol: {SCORE_ATOL:.1e}}}
""", encoding="utf-8")
    print(f"samples/cat.png ({len(raw)} bytes): {labels}, min top-6 gap {gap:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
