"""access.py: every route of the HTTP and gRPC surfaces is in exactly one of Triton's API categories,
and every door (HTTP, gRPC, the metrics port, shared-memory tensors in an inference) asks the same
Policy.check before it runs a route, so one rule written there holds for all of them.
"""

from __future__ import annotations

import models
import numpy as np
import pytest
from keyring import ADMIN, CONTROL, GRPC_ADMIN

from ngcx_runtime import access
from ngcx_runtime.access import (
    Call,
    Category,
    Policy,
    check_shared_memory,
    grpc_category,
    http_category,
    resolve,
)
from ngcx_runtime.protocol import ProtocolError

M = "m"
HTTP_ROUTES = {
    ("GET", "/v2/health/live"): Category.HEALTH,
    ("GET", "/v2/health/ready"): Category.HEALTH,
    ("GET", f"/v2/models/{M}/ready"): Category.HEALTH,
    ("GET", f"/v2/models/{M}/versions/1/ready"): Category.HEALTH,
    ("HEAD", "/v2/health/ready"): Category.HEALTH,
    ("GET", "/v2"): Category.METADATA,
    ("GET", f"/v2/models/{M}"): Category.METADATA,
    ("GET", f"/v2/models/{M}/versions/1"): Category.METADATA,
    ("GET", f"/v2/models/{M}/config"): Category.METADATA,
    ("POST", f"/v2/models/{M}/infer"): Category.INFERENCE,
    ("POST", f"/v2/models/{M}/versions/2/infer"): Category.INFERENCE,
    ("GET", "/v2/models/stats"): Category.STATISTICS,
    ("GET", f"/v2/models/{M}/stats"): Category.STATISTICS,
    ("GET", "/metrics"): Category.STATISTICS,
    ("POST", "/v2/repository/index"): Category.MODEL_REPOSITORY,
    ("POST", f"/v2/repository/models/{M}/load"): Category.MODEL_REPOSITORY,
    ("POST", f"/v2/repository/models/{M}/unload"): Category.MODEL_REPOSITORY,
    **{(method, f"/v2/{kind}{where}"): Category.SHARED_MEMORY
       for kind in ("systemsharedmemory", "cudasharedmemory")
       for method, where in (("GET", "/status"), ("GET", "/region/r/status"), ("POST", "/region/r/register"),
                             ("POST", "/region/r/unregister"), ("POST", "/unregister"))},
}
NOT_ROUTES = [("GET", "/"), ("GET", "/v1/models"), ("POST", "/v2/health/ready"), ("GET", f"/v2/models/{M}/infer"),
              ("GET", "/v2/repository/index"), ("POST", "/v2/systemsharedmemory/status"), ("PUT", "/metrics"),
              ("GET", f"/v2/models/{M}/nothing"), ("GET", "/v2/models"), ("GET", "/v2/systemsharedmemory/region/r")]


@pytest.mark.parametrize(("method", "path"), list(HTTP_ROUTES))
def test_every_http_route_has_its_category(method, path):
    assert http_category(method, path) is HTTP_ROUTES[(method, path)]
    assert http_category(method, path + "/") is HTTP_ROUTES[(method, path)]


@pytest.mark.parametrize(("method", "path"), NOT_ROUTES)
def test_a_request_no_route_answers_has_no_category(method, path):
    assert http_category(method, path) is None


def test_only_load_and_unload_are_model_control():
    control = {path for (method, path) in HTTP_ROUTES if resolve(method, path).control}
    assert control == {f"/v2/repository/models/{M}/load", f"/v2/repository/models/{M}/unload"}
    assert {"RepositoryModelLoad", "RepositoryModelUnload"} == access.GRPC_CONTROL


def test_every_served_grpc_method_has_one_category_and_the_others_none():
    pytest.importorskip("google.protobuf")
    from ngcx_runtime import grpc_proto
    from ngcx_runtime.grpc_service import Service

    names = [name for name, *_ in grpc_proto.methods()]
    served = {name for name in names if callable(getattr(Service, name, None))}
    assert served == set(access.GRPC_CATEGORIES), "a served RPC without a category, or a category without an RPC"
    for name in names:
        assert (grpc_category(name) is None) == (name not in served), name
    assert grpc_category("ModelInfer") is Category.INFERENCE


def test_the_shared_memory_rule():
    for peer in ("127.0.0.1", "::1", "::1%lo", "", "localhost"):
        check_shared_memory("local", peer)
    with pytest.raises(ProtocolError) as exc:
        check_shared_memory("local", "10.0.0.7")
    assert exc.value.status == 403 and "10.0.0.7" in exc.value.message and "--shared-memory any" in exc.value.message
    check_shared_memory("any", "10.0.0.7")
    with pytest.raises(ProtocolError) as exc:
        check_shared_memory("off", "127.0.0.1")
    assert exc.value.status == 400 and "--shared-memory off" in exc.value.message


def test_the_policy_asks_the_rules_by_category_and_control():
    with pytest.raises(ProtocolError) as exc:
        Policy("local").check(Call(Category.MODEL_REPOSITORY, "10.0.0.7", control=True))
    assert exc.value.status == 403 and "--model-control-mode" in exc.value.message       # off by default
    policy = Policy("local", CONTROL)
    policy.check(Call(Category.INFERENCE, "10.0.0.7"))
    policy.check(Call(Category.MODEL_REPOSITORY, "10.0.0.7", GRPC_ADMIN, control=True))
    with pytest.raises(ProtocolError):
        policy.check(Call(Category.SHARED_MEMORY, "10.0.0.7"))
    policy.control_refusal = "one of several processes"
    policy.check(Call(Category.MODEL_REPOSITORY, "127.0.0.1"))              # the index is not control
    with pytest.raises(ProtocolError) as exc:
        policy.check(Call(Category.MODEL_REPOSITORY, "127.0.0.1", GRPC_ADMIN, control=True))
    assert exc.value.status == 400 and exc.value.message == "one of several processes"
    with pytest.raises(ValueError):
        Policy("everyone")
    assert Call(None, "", {"authorization": "Bearer x"}).header("Authorization") == "Bearer x"


# -- one place: a rule in Policy.check holds for every door --

@pytest.fixture()
def refusing(monkeypatch):
    """Policy.check refusing shared memory (403) and recording every call it is asked about."""
    seen: list[tuple[Category | None, str]] = []

    def check(self, call: Call) -> None:
        seen.append((call.category, call.peer))
        if call.category is Category.SHARED_MEMORY:
            raise ProtocolError("refused by the test policy", 403)

    monkeypatch.setattr(Policy, "check", check)
    return seen


def test_http_grpc_metrics_and_inference_tensors_ask_the_same_policy(tmp_path, refusing):
    requests = pytest.importorskip("requests")
    pytest.importorskip("onnxruntime")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    engine = load(models.mlp(tmp_path / "mlp.onnx"), backend="onnxruntime")
    with start_server(engine, port=0, name="mlp", grpc_port=0, metrics_port=0) as handle:
        r = requests.get(f"{handle.url}/v2/systemsharedmemory/status", timeout=10)
        assert r.status_code == 403 and r.json() == {"error": "refused by the test policy"}
        r = requests.post(f"{handle.url}/v2/cudasharedmemory/region/r/register", json={}, timeout=10)
        assert r.status_code == 403
        # an inference tensor that names a region is a shared-memory call too
        doc = {"inputs": [{"name": engine.inputs[0].name, "shape": [1, 32], "datatype": "FP32",
                           "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 128}}]}
        r = requests.post(f"{handle.url}/v2/models/mlp/infer", json=doc, timeout=10)
        assert r.status_code == 403, r.text
        x = np.zeros((1, 32), np.float32)
        body = {"inputs": [{"name": engine.inputs[0].name, "shape": [1, 32], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}
        assert requests.post(f"{handle.url}/v2/models/mlp/infer", json=body, timeout=10).status_code == 200
        assert requests.get(handle.metrics_url, timeout=10).status_code == 200
        client = grpcclient.InferenceServerClient(handle.grpc_target)
        with pytest.raises(InferenceServerException) as exc:
            client.get_system_shared_memory_status()
        assert "refused by the test policy" in str(exc.value) and "PERMISSION_DENIED" in str(exc.value.status())
        assert client.is_server_live()
        client.close()
    categories = [c for c, _ in refusing]
    for expected in (Category.SHARED_MEMORY, Category.INFERENCE, Category.STATISTICS, Category.HEALTH):
        assert expected in categories, categories
    assert categories.count(Category.SHARED_MEMORY) == 4       # 2 HTTP routes, 1 tensor, 1 gRPC
    assert all(peer in ("127.0.0.1", "::1") for _, peer in refusing), refusing


def test_model_control_is_refused_by_the_policy_before_the_request_is_parsed_over_http_and_grpc(tmp_path):
    """serve --mps's processes refuse load / unload, before the body or the parameters are parsed (a
    refused call is not read: access.py); without the admin key the refusal is the 401."""
    requests = pytest.importorskip("requests")
    pytest.importorskip("onnxruntime")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    engine = load(models.mlp(tmp_path / "mlp.onnx"), backend="onnxruntime")
    with start_server(engine, port=0, name="mlp", grpc_port=0, access=CONTROL) as handle:
        handle._app.policy.control_refusal = "refused: one of several processes"
        base = f"{handle.url}/v2/repository"
        r = requests.post(f"{base}/models/mlp/load", data=b"{", timeout=10)
        assert r.status_code == 401 and "admin key" in r.json()["error"]
        r = requests.post(f"{base}/models/mlp/load", data=b"{", headers=ADMIN, timeout=10)
        assert r.status_code == 400 and r.json()["error"] == "refused: one of several processes"
        for action in ("load", "unload"):
            r = requests.post(f"{base}/models/mlp/{action}", json={}, headers=ADMIN, timeout=10)
            assert r.status_code == 400 and r.json()["error"] == "refused: one of several processes"
        assert requests.post(f"{base}/index", json={}, timeout=10).status_code == 200
        client = grpcclient.InferenceServerClient(handle.grpc_target)
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("mlp", config="not json")
        assert "UNAUTHENTICATED" in str(exc.value.status())
        with pytest.raises(InferenceServerException) as exc:
            client.load_model("mlp", config="not json", headers=GRPC_ADMIN)
        assert "refused: one of several processes" in str(exc.value)
        for call in (lambda: client.load_model("mlp", headers=GRPC_ADMIN),
                     lambda: client.unload_model("mlp", headers=GRPC_ADMIN)):
            with pytest.raises(InferenceServerException) as exc:
                call()
            assert "refused: one of several processes" in str(exc.value)
        assert len(client.get_model_repository_index().models) == 1
        client.close()
