"""MLServer custom runtime over onnxruntime (MLServer has no ONNX runtime of its own: docs, "Custom Inference
Runtimes"); adaptive batching comes from model-settings.json (max_batch_size, max_batch_time)."""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        self.session = ort.InferenceSession(self.settings.parameters.uri, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        y = self.session.run([self.output], {self.input: x})[0]
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output, y)])
