"""KServe's ModelServer with a kserve.Model over onnxruntime (KServe docs, "Custom Python Model"), KServe v2 REST.

    python kserve_onnx.py MODEL.onnx PORT
KServe's own batching is a sidecar of its InferenceService (the agent), not in the ModelServer: none here.
Its per-request logs (uvicorn.access, and kserve.trace's latency lines) are off: ngcx-runtime writes none."""

import logging
import sys
import uuid

import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxModel(Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.load()

    def load(self) -> bool:
        self.session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32, copy=False)
        y = self.session.run([self.output], {self.input: x})[0]
        out = InferOutput(name=self.output, shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id or str(uuid.uuid4()))


if __name__ == "__main__":
    server = ModelServer(http_port=int(sys.argv[2]), grpc_port=int(sys.argv[2]) + 1, workers=1,
                         enable_latency_logging=False)
    for name in ("uvicorn.access", "kserve.trace"):                  # after ModelServer configured logging
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([OnnxModel("model", sys.argv[1])])
