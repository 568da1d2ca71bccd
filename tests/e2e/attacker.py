"""Run INSIDE a container on the engine's bridge (not loopback): every API category of a served model,
over HTTP and gRPC, with no key, a wrong key and the right key. Reads {"host", "key", "model"} as JSON
on stdin, prints {"http": {CALL: {who: status}}, "grpc": {...}} as JSON. Standard library and grpcio
only (both are in every ngcx image), so the peer is a plain client, not our own client code.
"""

import json
import sys
import urllib.error
import urllib.request

import grpc

cfg = json.load(sys.stdin)
HOST, MODEL = cfg["host"], cfg["model"]
KEYS = {"none": None, "wrong": "ngcx_" + "A" * 43, "right": cfg["key"]}


def http(method, path, key, body=None):
    req = urllib.request.Request(f"http://{HOST}:8000{path}", data=body, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def infer_body():
    """A valid JSON inference request built from the model's metadata (read with the right key)."""
    req = urllib.request.Request(f"http://{HOST}:8000/v2/models/{MODEL}",
                                 headers={"Authorization": f"Bearer {cfg['key']}"})
    meta = json.load(urllib.request.urlopen(req, timeout=20))
    inputs = []
    for spec in meta["inputs"]:
        shape = [1 if d < 0 else d for d in spec["shape"]]
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": [0] * count})
    return json.dumps({"inputs": inputs}).encode()


BODY = infer_body()
HTTP_CALLS = {
    "health: GET /v2/health/ready": ("GET", "/v2/health/ready", None),
    f"health: GET /v2/models/{MODEL}/ready": ("GET", f"/v2/models/{MODEL}/ready", None),
    "metadata: GET /v2": ("GET", "/v2", None),
    f"metadata: GET /v2/models/{MODEL}": ("GET", f"/v2/models/{MODEL}", None),
    f"inference: POST /v2/models/{MODEL}/infer": ("POST", f"/v2/models/{MODEL}/infer", BODY),
    "shared-memory: GET /v2/systemsharedmemory/status": ("GET", "/v2/systemsharedmemory/status", None),
    "statistics: GET /v2/models/stats": ("GET", "/v2/models/stats", None),
    "statistics: GET /metrics": ("GET", "/metrics", None),
    "model-repository: POST /v2/repository/index": ("POST", "/v2/repository/index", b"{}"),
    f"model-repository: POST /v2/repository/models/{MODEL}/unload": (
        "POST", f"/v2/repository/models/{MODEL}/unload", b"{}"),
    "unknown: GET /v2/nothing-here": ("GET", "/v2/nothing-here", None),
}


def field(number, text):
    """One protobuf string field (wire type 2): enough to name a model in a request."""
    data = text.encode()
    return bytes([number << 3 | 2, len(data)]) + data


GRPC_CALLS = {
    "health: ServerLive": ("ServerLive", b""),
    "health: ModelReady": ("ModelReady", field(1, MODEL)),
    "metadata: ServerMetadata": ("ServerMetadata", b""),
    "metadata: ModelMetadata": ("ModelMetadata", field(1, MODEL)),
    "inference: ModelInfer (no inputs)": ("ModelInfer", field(1, MODEL)),
    "shared-memory: SystemSharedMemoryStatus": ("SystemSharedMemoryStatus", b""),
    "statistics: ModelStatistics": ("ModelStatistics", b""),
    "model-repository: RepositoryIndex": ("RepositoryIndex", b""),
    "model-repository: RepositoryModelUnload": ("RepositoryModelUnload", field(2, MODEL)),
}


def rpc(channel, method, request, key):
    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        call(request, timeout=20, metadata=[("authorization", f"Bearer {key}")] if key else None)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


out = {"http": {name: {who: http(m, p, k, b) for who, k in KEYS.items()} for name, (m, p, b) in HTTP_CALLS.items()}}
with grpc.insecure_channel(f"{HOST}:8001") as channel:
    out["grpc"] = {name: {who: rpc(channel, m, r, k) for who, k in KEYS.items()} for name, (m, r) in GRPC_CALLS.items()}
out["still ready"] = http("GET", f"/v2/models/{MODEL}/ready", None)
print(json.dumps(out))
