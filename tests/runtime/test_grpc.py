"""The KServe v2 gRPC service (issue 12, item 5) and its bad input (item 8), through tritonclient.grpc.

What a user notices: tritonclient.grpc, unchanged, talks to `serve --grpc-port` exactly as to
Triton: health, metadata, config, statistics, inference (results equal ONNX Runtime's, merged by
the same dynamic batcher as HTTP and counted in the same /metrics), the repository extension on a
repository of two models, and system shared memory with tritonclient's own utilities. Bad input
gets a gRPC status code with a one-line message and never stops the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest
from concurrency import concurrently
from keyring import CONTROL, GRPC_ADMIN

ort = pytest.importorskip("onnxruntime")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
requests = pytest.importorskip("requests")
prom = pytest.importorskip("prometheus_client.parser")

from tritonclient.utils import InferenceServerException  # noqa: E402

from ngcx_runtime import grpc_proto  # noqa: E402
from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_repository, start_server  # noqa: E402

TIMEOUT = 30
PREFIX = f"/ngcx_grpc_{os.getpid()}_"
REPO = Path(__file__).resolve().parents[2]


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def client_of(handle) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(handle.grpc_target)


def infer_input(name: str, x: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(x.shape), {np.float32: "FP32", np.int64: "INT64"}[x.dtype.type])
    inp.set_data_from_numpy(x)
    return inp


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grpc") / "repo"
    models.conv_net(root / "conv" / "1" / "model.onnx")
    models.mlp(root / "mlp" / "1" / "model.onnx")
    models.mlp(root / "mlp" / "2" / "model.onnx", hidden=16)
    (root / "mlp" / "config.json").write_text('{"max_batch_size": 8, "dynamic_batching": '
                                              '{"max_queue_delay_microseconds": 200000}, '
                                              '"version_policy": {"all": {}}}')
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return root


@pytest.fixture()
def server(repo):
    handle = start_repository(repo, "127.0.0.1", 0, grpc_port=0, models=["conv", "mlp"], max_body_mb=1,
                              access=CONTROL)
    assert handle.wait_loaded(TIMEOUT), handle.load_error
    yield handle
    handle.stop()


# -- the vendored descriptor is the protocol tritonclient speaks --

def _fields(desc) -> dict[str, tuple]:
    def kind(f):
        return f.message_type.full_name if f.message_type else f.enum_type.full_name if f.enum_type else f.type
    return {f.name: (f.number, kind(f), f.is_repeated) for f in desc.fields}


def test_every_message_matches_tritonclients_field_for_field():
    from tritonclient.grpc import model_config_pb2, service_pb2

    pool = grpc_proto._pool()
    theirs = {**service_pb2.DESCRIPTOR.message_types_by_name, **model_config_pb2.DESCRIPTOR.message_types_by_name}
    checked = 0

    def compare(ours, other, path):
        nonlocal checked
        mine, them = _fields(ours), _fields(other)
        for name, field in mine.items():
            assert them.get(name) == field, f"{path}.{name}: ours {field}, tritonclient's {them.get(name)}"
        if path != "inference.ModelConfig" and not path.startswith("inference.Model") or path in (
                "inference.ModelInferRequest", "inference.ModelInferResponse", "inference.ModelMetadataResponse"):
            assert set(mine) == set(them), f"{path}: fields {sorted(set(them) - set(mine))} missing"
        checked += 1
        for nested in ours.nested_types:
            compare(nested, other.nested_types_by_name[nested.name], f"{path}.{nested.name}")

    fdesc = pool.FindFileByName("kserve_grpc.proto")
    for name, desc in fdesc.message_types_by_name.items():
        compare(desc, theirs[name], desc.full_name)
    assert checked > 60
    ours = {m[0]: m[1:] for m in grpc_proto.methods()}
    for method in service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        assert ours[method.name][:2] == (method.input_type.name, method.output_type.name), method.name


def test_the_vendored_descriptor_is_the_proto_files():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (development only) compiles the .proto")
    import base64

    from google.protobuf import descriptor_pb2

    vendored = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(grpc_proto.DESCRIPTOR_B64))
    assert vendored == descriptor_pb2.FileDescriptorProto.FromString(grpc_proto.compile_proto()), \
        "kserve_grpc.proto changed: python -m ngcx_runtime.grpc_proto --regenerate"


# -- tritonclient.grpc against a repository of two models --

def test_tritonclient_grpc_health_metadata_config_and_inference(server, repo):
    client = client_of(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("conv") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("broken")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "ngcx-runtime" and "model_repository" in meta["extensions"]
    assert "system_shared_memory" in meta["extensions"]
    mm = client.get_model_metadata("mlp", as_json=True)
    assert mm["versions"] == ["1", "2"] and mm["platform"] == "onnxruntime_onnx"
    assert mm["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "32"]}]
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["max_batch_size"] == 8 and config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == ["32"]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "200000"
    assert config["instance_group"] == [{"name": "mlp", "kind": "KIND_CPU", "count": 1}]

    x = models.sample_inputs("conv", 3)["input"]
    res = client.infer("conv", [infer_input("input", x)], request_id="abc")
    np.testing.assert_allclose(res.as_numpy("logits"), reference(repo / "conv/1/model.onnx", {"input": x})["logits"],
                               rtol=1e-5, atol=1e-5)
    assert res.get_response().id == "abc" and res.get_response().model_version == "1"
    v = models.sample_inputs("mlp", 2)["x"]
    for version in ("1", "2"):
        got = client.infer("mlp", [infer_input("x", v)], model_version=version,
                           outputs=[grpcclient.InferRequestedOutput("y")]).as_numpy("y")
        want = reference(repo / f"mlp/{version}/model.onnx", {"x": v})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert client.infer("mlp", [infer_input("x", v)]).get_response().model_version == "2"   # newest by default
    stats = client.get_inference_statistics("conv", as_json=True)["model_stats"][0]
    assert stats["inference_count"] == "3" and stats["inference_stats"]["success"]["count"] == "1"


def test_concurrent_grpc_requests_share_the_batcher_and_the_metrics(server, repo):
    n = 6
    xs = [models.sample_inputs("mlp", 1, seed=40 + i)["x"] for i in range(n)]
    before = server.stats("mlp", "2")
    out = concurrently(lambda i: client_of(server).infer("mlp", [infer_input("x", xs[i])]).as_numpy("y"), n, TIMEOUT)
    for x, y in zip(xs, out, strict=True):
        assert isinstance(y, np.ndarray), y
        np.testing.assert_allclose(y, reference(repo / "mlp/2/model.onnx", {"x": x})["y"], rtol=1e-5, atol=1e-5)
    after = server.stats("mlp", "2")
    assert after["success"] - before["success"] == n
    assert after["engine_calls"] - before["engine_calls"] < n, "gRPC requests were not merged"
    # an HTTP request lands in the same counters
    doc = {"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": xs[0].ravel().tolist()}]}
    assert requests.post(f"{server.url}/v2/models/mlp/infer", json=doc, timeout=TIMEOUT).status_code == 200
    text = requests.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    success = {(s.labels["model"], s.labels["version"]): s.value for f in prom.text_string_to_metric_families(text)
               if f.name == "nv_inference_request_success" for s in f.samples}
    assert success[("mlp", "2")] == after["success"] + 1


def test_repository_index_load_and_unload_over_grpc(server, repo):
    client = client_of(server)
    index = {(m["name"], m.get("version", "")): m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index[("conv", "1")]["state"] == "READY" and index[("broken", "")]["state"] == "UNAVAILABLE"
    client.unload_model("conv", headers=GRPC_ADMIN)
    assert not client.is_model_ready("conv")
    with pytest.raises(InferenceServerException, match="was unloaded|not loaded") as err:
        client.infer("conv", [infer_input("input", models.sample_inputs("conv", 1)["input"])])
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    client.load_model("conv", headers=GRPC_ADMIN)
    assert client.is_model_ready("conv")
    client.load_model("mlp", config='{"max_batch_size": 4, "dynamic_batching": {}}', headers=GRPC_ADMIN)
    assert client.get_model_config("mlp", as_json=True)["config"]["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="failed to load 'broken'") as err:
        client.load_model("broken", headers=GRPC_ADMIN)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_model_ready("mlp") and client.is_model_ready("conv"), "the others keep serving"


# -- system shared memory through gRPC --

class Regions:
    def __init__(self):
        self.handles = []

    def make(self, tag: str, size: int):
        handle = shm.create_shared_memory_region(tag, PREFIX + tag, size)
        self.handles.append(handle)
        return handle

    def close(self):
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture()
def regions():
    made = Regions()
    yield made
    made.close()


def test_system_shared_memory_both_ways_over_grpc(server, repo, regions):
    client = client_of(server)
    x = models.sample_inputs("conv", 2)["input"]
    rin, rout = regions.make("in", x.nbytes), regions.make("out", 2 * 10 * 4)
    shm.set_shared_memory_region(rin, [x])
    client.register_system_shared_memory("in", PREFIX + "in", x.nbytes)
    client.register_system_shared_memory("out", PREFIX + "out", 2 * 10 * 4)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status["in"] == {"name": "in", "key": PREFIX + "in", "byte_size": str(x.nbytes)}
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_shared_memory("in", x.nbytes)
    out = grpcclient.InferRequestedOutput("logits")
    out.set_shared_memory("out", 2 * 10 * 4)
    res = client.infer("conv", [inp], outputs=[out])
    meta = res.get_output("logits")
    assert meta.parameters["shared_memory_region"].string_param == "out"
    got = shm.get_contents_as_numpy(rout, np.float32, list(meta.shape))
    np.testing.assert_allclose(got, reference(repo / "conv/1/model.onnx", {"input": x})["logits"],
                               rtol=1e-5, atol=1e-5)
    client.unregister_system_shared_memory("in")
    assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) == {"out"}
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


# -- bad input: status codes, one-line messages, and the server keeps serving --

def _raw_request(model: str, shape: list[int], datatype: str = "FP32", raw: list[bytes] | None = None,
                 params: dict | None = None, version: str = "", contents: dict | None = None):
    request = grpc_proto.message("ModelInferRequest")(model_name=model, model_version=version)
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    for key, value in (params or {}).items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    if contents:
        for field, values in contents.items():
            getattr(tensor.contents, field).extend(values)
    request.raw_input_contents.extend(raw if raw is not None else [])
    return request


def test_bad_grpc_requests_get_status_codes_and_the_server_keeps_serving(server, regions):
    import grpc

    regions.make("small", 64)
    regions.make("big", 256)
    client = client_of(server)
    client.register_system_shared_memory("small", PREFIX + "small", 64)
    client.register_system_shared_memory("big", PREFIX + "big", 256)
    channel = grpc.insecure_channel(server.grpc_target)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=grpc_proto.message("ModelInferResponse").FromString)
    good = np.zeros((1, 32), np.float32).tobytes()
    cases = [
        ("unknown model", _raw_request("nope", [1, 32], raw=[good]), "NOT_FOUND", "unknown model 'nope'"),
        ("unknown version", _raw_request("mlp", [1, 32], raw=[good], version="9"), "NOT_FOUND", "no version '9'"),
        ("not loaded", _raw_request("broken", [1, 32], raw=[good]), "UNAVAILABLE", "is not loaded"),
        ("wrong shape", _raw_request("mlp", [1, 31], raw=[good]), "INVALID_ARGUMENT", "does not match the model's"),
        ("wrong datatype", _raw_request("mlp", [1, 32], "INT64", raw=[good]), "INVALID_ARGUMENT",
         "does not match the model's FP32"),
        ("short raw", _raw_request("mlp", [1, 32], raw=[good[:-4]]), "INVALID_ARGUMENT", "binary_data_size 124"),
        ("two raws", _raw_request("mlp", [1, 32], raw=[good, good]), "INVALID_ARGUMENT", "raw_input_contents has 2"),
        ("no data", _raw_request("mlp", [1, 32]), "INVALID_ARGUMENT", "has neither 'data'"),
        ("fp16 contents", _raw_request("mlp", [1, 32], "FP16", contents={"fp32_contents": [0.0]}),
         "INVALID_ARGUMENT", "no typed contents field"),
        ("contents count", _raw_request("mlp", [1, 32], contents={"fp32_contents": [0.0] * 5}), "INVALID_ARGUMENT",
         "'data' has 5 elements"),
        ("over max batch", _raw_request("mlp", [9, 32], raw=[good * 9]), "INVALID_ARGUMENT", "exceeds the server's"),
        ("region missing", _raw_request("mlp", [1, 32], params={"shared_memory_region": "nope",
                                                                "shared_memory_byte_size": 128}),
         "INVALID_ARGUMENT", "no shared memory region 'nope'"),
        ("region too small", _raw_request("mlp", [1, 32], params={"shared_memory_region": "small",
                                                                  "shared_memory_byte_size": 128}),
         "INVALID_ARGUMENT", "lie past its end (64 bytes"),
        ("offset past end", _raw_request("mlp", [1, 32], params={"shared_memory_region": "big",
                                                                 "shared_memory_byte_size": 128,
                                                                 "shared_memory_offset": 192}),
         "INVALID_ARGUMENT", "bytes 192..320 of shared memory region 'big' lie past its end"),
        ("over the limit", _raw_request("mlp", [8, 32], raw=[b"\0" * (2 << 20)]), "RESOURCE_EXHAUSTED", "larger than"),
    ]
    failures = []
    for case, request, code, fragment in cases:
        try:
            infer(request, timeout=TIMEOUT)
            failures.append(f"{case}: succeeded")
        except grpc.RpcError as exc:
            if exc.code().name != code or fragment not in (exc.details() or "") or "\n" in exc.details():
                failures.append(f"{case}: got {exc.code().name} {exc.details()!r}, want {code} with {fragment!r}")
    assert not failures, "\n".join(failures)
    # registration errors
    for call, code, fragment in [
        (lambda: client.register_system_shared_memory("r", PREFIX + "missing", 64), "INVALID_ARGUMENT",
         "no shared memory object"),
        (lambda: client.register_system_shared_memory("r", PREFIX + "small", 1 << 20), "INVALID_ARGUMENT",
         "which has only 64 bytes"),
        (lambda: client.register_system_shared_memory("r", PREFIX + "small", 32, offset=48), "INVALID_ARGUMENT",
         "which has only 64 bytes"),
        (lambda: client.unregister_system_shared_memory("nope"), "INVALID_ARGUMENT", "no shared memory region"),
        (lambda: client.get_system_shared_memory_status("nope"), "NOT_FOUND", "no shared memory region"),
        (lambda: client.register_cuda_shared_memory("g", b"AAAA", 0, 64), "INVALID_ARGUMENT",
         "CUDA shared memory is not available"),
        (lambda: client.get_model_metadata("nope"), "NOT_FOUND", "unknown model"),
        (lambda: client.load_model("nope", headers=GRPC_ADMIN), "NOT_FOUND", "no model 'nope'"),
        (lambda: client.load_model("mlp", config="{", headers=GRPC_ADMIN), "INVALID_ARGUMENT", "not valid JSON"),
        (lambda: client.load_model("mlp"), "UNAUTHENTICATED", "needs the admin key"),
    ]:
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == f"StatusCode.{code}" and fragment in err.value.message(), err.value
    x = models.sample_inputs("mlp", 1)["x"]
    assert client.infer("mlp", [infer_input("x", x)]).as_numpy("y").shape == (1, 10), "still serving"
    assert client.is_server_live()


def test_a_single_model_server_answers_grpc_and_stops_cleanly(tmp_path):
    path = models.mlp(tmp_path / "mlp.onnx")
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", grpc_port=0,
                          access=CONTROL)
    client = client_of(handle)
    x = models.sample_inputs("mlp", 2)["x"]
    np.testing.assert_allclose(client.infer("mlp", [infer_input("x", x)]).as_numpy("y"),
                               reference(path, {"x": x})["y"], rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="loading and unloading need a model repository"):
        client.load_model("mlp", headers=GRPC_ADMIN)
    port = handle.grpc_port
    handle.stop()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the gRPC port is closed after stop()"


def test_cli_grpc_port_in_use_is_one_line_and_exit_2(tmp_path):
    path = models.mlp(tmp_path / "mlp.onnx")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "ngcx_runtime.serve", str(path), "--port", "0",
                               "--grpc-port", str(port)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{port} for gRPC" in err[0] and "--grpc-port" in err[0], proc.stderr
