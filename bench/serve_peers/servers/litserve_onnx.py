"""LitServe's LitAPI over onnxruntime with LitServe's dynamic batching (max_batch_size, batch_timeout), taking the
KServe v2 JSON body at /v2/models/model/infer (LitServe has its own protocol: the route and body are chosen here,
so every server gets the same request). uvicorn's per-request access log is off: ngcx-runtime writes none.

    python litserve_onnx.py MODEL.onnx PORT MAX_BATCH DELAY_MS"""

import sys

import litserve as ls
import numpy as np
import onnxruntime as ort


class OnnxAPI(ls.LitAPI):
    def setup(self, device):
        self.session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name

    def decode_request(self, request):
        tensor = request["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])

    def batch(self, inputs):
        return np.concatenate(inputs)

    def predict(self, x):
        return self.session.run([self.output], {self.input: x})[0]

    def unbatch(self, output):
        return [row[None] for row in output]

    def encode_response(self, y):
        return {"model_name": "model", "outputs": [{"name": self.output, "shape": list(y.shape), "datatype": "FP32",
                                                     "data": y.ravel().tolist()}]}


if __name__ == "__main__":
    batch, delay = int(sys.argv[3]), float(sys.argv[4]) / 1000.0
    api = OnnxAPI(max_batch_size=batch, batch_timeout=delay, api_path="/v2/models/model/infer")
    ls.LitServer(api, accelerator="cpu", workers_per_device=1).run(port=int(sys.argv[2]), generate_client_file=False,
                                                                   access_log=False)
