"""Ray Serve deployment over onnxruntime with @serve.batch (Ray Serve docs, "Dynamic Request Batching"), taking
the KServe v2 JSON body at /v2/models/model/infer. Ray Serve's per-request access log is off (LoggingConfig
enable_access_log): ngcx-runtime writes none.

    python rayserve_onnx.py MODEL.onnx PORT MAX_BATCH DELAY_MS"""

import sys
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request

MAX_BATCH, DELAY_S = int(sys.argv[3]), float(sys.argv[4]) / 1000.0


@serve.deployment(logging_config={"enable_access_log": False})
class Onnx:
    def __init__(self, path: str) -> None:
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=DELAY_S)
    async def run(self, xs: list) -> list:
        y = self.session.run([self.output], {self.input: np.concatenate(xs)})[0]
        return [row[None] for row in y]

    async def __call__(self, request: Request) -> dict:
        tensor = (await request.json())["inputs"][0]
        y = await self.run(np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"]))
        return {"model_name": "model", "outputs": [{"name": self.output, "shape": list(y.shape), "datatype": "FP32",
                                                     "data": y.ravel().tolist()}]}


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])},
                logging_config={"enable_access_log": False})
    serve.run(Onnx.bind(sys.argv[1]), route_prefix="/v2/models/model/infer")
    print("ray serve: ready", flush=True)
    while True:
        time.sleep(3600)
