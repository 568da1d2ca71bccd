"""Bearer keys and model control through real servers on loopback: every category, every door, every key.

What a deployer notices: with keys configured, every endpoint but health answers 401 (gRPC
UNAUTHENTICATED) to a request without the key or with a wrong one, over the stdlib transport,
uvicorn, gRPC and the metrics port alike; a normal key opens everything but load / unload (403),
the admin key everything; no answer names a key or its hash; an unknown path without a key is the
same 401 (routes cannot be probed); a key rotated through the keys file fails no request.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import models
import numpy as np
import pytest
import rawhttp
from keyring import ADMIN_KEY, KEYS, USER_KEY

from ngcx_runtime.access import AccessConfig
from ngcx_runtime.keys import sha256_hex

requests = pytest.importorskip("requests")
pytest.importorskip("onnxruntime")

from ngcx_runtime.serve import start_repository  # noqa: E402

TIMEOUT = 30
WRONG_KEY = "not-the-key-5555555555"
KEY_STATES = {"none": None, "wrong": WRONG_KEY, "key": USER_KEY, "admin": ADMIN_KEY}
SECRETS = [USER_KEY, ADMIN_KEY, WRONG_KEY] + [sha256_hex(k) for k in (USER_KEY, ADMIN_KEY, WRONG_KEY)]
INFER = {"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}]}
OPEN = (200, 200, 200, 200)
GUARDED = (401, 401, 200, 200)
CONTROL = (401, 401, 403, 200)
# (what, method, path, JSON body or None, statuses for no key, a wrong key, the key, the admin key)
HTTP = [
    ("health live", "GET", "/v2/health/live", None, OPEN),
    ("health ready", "GET", "/v2/health/ready", None, OPEN),
    ("model ready", "GET", "/v2/models/mlp/ready", None, OPEN),
    ("model version ready", "GET", "/v2/models/mlp/versions/1/ready", None, OPEN),
    ("server metadata", "GET", "/v2", None, GUARDED),
    ("model metadata", "GET", "/v2/models/mlp", None, GUARDED),
    ("model config", "GET", "/v2/models/mlp/config", None, GUARDED),
    ("inference", "POST", "/v2/models/mlp/infer", INFER, GUARDED),
    ("system shm status", "GET", "/v2/systemsharedmemory/status", None, GUARDED),
    ("cuda shm status", "GET", "/v2/cudasharedmemory/status", None, GUARDED),
    ("system shm unregister", "POST", "/v2/systemsharedmemory/unregister", {}, GUARDED),
    ("statistics", "GET", "/v2/models/stats", None, GUARDED),
    ("model statistics", "GET", "/v2/models/mlp/stats", None, GUARDED),
    ("metrics", "GET", "/metrics", None, GUARDED),
    ("repository index", "POST", "/v2/repository/index", {}, GUARDED),
    ("unload", "POST", "/v2/repository/models/mlp/unload", {}, CONTROL),
    ("load", "POST", "/v2/repository/models/mlp/load", {}, CONTROL),
]


def headers_for(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def assert_names_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"an answer names a key or its hash: {text[:200]}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("auth") / "repo"
    models.mlp(root / "mlp" / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module", params=["stdlib", "uvicorn"])
def server(request, repo):
    if request.param == "uvicorn":
        pytest.importorskip("uvicorn")
    handle = start_repository(repo, "127.0.0.1", 0, grpc_port=0, metrics_port=0, access=KEYS,
                              transport=request.param)
    assert handle.wait_loaded(TIMEOUT), handle.load_error
    handle.transport = request.param
    yield handle
    handle.stop()


def test_every_http_category_with_no_a_wrong_the_and_the_admin_key(server):
    failures = []
    for state, key in KEY_STATES.items():
        session = requests.Session()                     # keep-alive: a refusal keeps the connection usable
        session.headers.update(headers_for(key))
        for what, method, path, body, want in HTTP:
            expected = want[list(KEY_STATES).index(state)]
            r = session.request(method, f"{server.url}{path}", json=body, timeout=TIMEOUT)
            if r.status_code != expected:
                failures.append(f"{what} with {state}: {r.status_code} {r.text[:160]}, want {expected}")
            if r.status_code in (401, 403):
                assert_names_no_secret(r.text + json.dumps(dict(r.headers)))
                assert set(r.json()) == {"error"}
            if r.status_code == 401:
                assert r.headers["WWW-Authenticate"].startswith('Bearer realm="ngcx-runtime"'), r.headers
                assert ("invalid_token" in r.headers["WWW-Authenticate"]) == (key is not None)
        session.close()
    assert not failures, "\n".join(failures)
    assert server.wait_loaded(TIMEOUT) and server._app.table.lookup("mlp", None).ready, "loaded again by the admin"


def test_the_401_and_403_lines(server):
    r = requests.get(f"{server.url}/v2/models/mlp", timeout=TIMEOUT)
    assert r.json() == {"error": "this endpoint needs a bearer key: send Authorization: Bearer <key>"}
    r = requests.get(f"{server.url}/v2/models/mlp", headers=headers_for(WRONG_KEY), timeout=TIMEOUT)
    assert "not accepted" in r.json()["error"]
    r = requests.get(f"{server.url}/v2/models/mlp", headers={"Authorization": "Basic dXNlcjpwYXNz"}, timeout=TIMEOUT)
    assert r.status_code == 401 and "is not 'Bearer <key>'" in r.json()["error"]
    r = requests.post(f"{server.url}/v2/repository/models/mlp/load", headers=headers_for(USER_KEY), timeout=TIMEOUT)
    assert r.status_code == 403 and r.json()["error"] == "loading and unloading models needs the admin key; this " \
                                                         "key is not one"
    r = requests.post(f"{server.url}/v2/repository/models/mlp/load", timeout=TIMEOUT)
    assert r.status_code == 401 and "needs the admin key" in r.json()["error"]


def test_unknown_paths_and_methods_get_the_401_before_the_404_and_405(server):
    user = headers_for(USER_KEY)
    for method, path, with_key in [("GET", "/", 404), ("GET", "/admin", 404), ("GET", "/v2/models/nope", 404),
                                   ("GET", "/v2/models/mlp/nothing", 404), ("POST", "/v2/health/ready", 405),
                                   ("GET", "/v2/repository/index", 405), ("DELETE", "/v2/models/mlp", 405)]:
        r = requests.request(method, f"{server.url}{path}", timeout=TIMEOUT)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        r = requests.request(method, f"{server.url}{path}", headers=user, timeout=TIMEOUT)
        assert r.status_code == with_key, (method, path, r.status_code, r.text)
    # a path that resolves to health answers without a key, found or not (as Triton's readiness does)
    assert requests.get(f"{server.url}/v2/models/nope/ready", timeout=TIMEOUT).status_code == 404
    assert requests.head(f"{server.url}/v2/health/ready", timeout=TIMEOUT).status_code == 200


def test_a_refused_call_is_not_invited_to_upload_its_body(server):
    """`Expect: 100-continue` without a key: the 401, no 100 (uvicorn sends it only once the app reads)."""
    head = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as s:
        s.sendall(head)
        ex = rawhttp.read_responses(s, idle=2.0, expect=1)
    assert [r.status for r in ex.responses] == [401]
    keyed = head.replace(b"\r\n\r\n", f"\r\nAuthorization: Bearer {USER_KEY}\r\n\r\n".encode())
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT) as s:
        s.sendall(keyed)
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")


def test_the_metrics_port_asks_the_same_policy(server):
    base = server.metrics_url.rsplit("/", 1)[0]
    for state, key in KEY_STATES.items():
        r = requests.get(f"{base}/metrics", headers=headers_for(key), timeout=TIMEOUT)
        assert r.status_code == GUARDED[list(KEY_STATES).index(state)], (state, r.status_code)
        if r.status_code == 401:
            assert r.headers["WWW-Authenticate"].startswith("Bearer ") and "bearer key" in r.json()["error"]
            assert_names_no_secret(r.text)
        else:
            assert "nv_inference_request_success" in r.text
    assert requests.get(f"{base}/other", timeout=TIMEOUT).status_code == 401
    assert requests.post(f"{base}/metrics", timeout=TIMEOUT).status_code == 401
    assert requests.get(f"{base}/other", headers=headers_for(USER_KEY), timeout=TIMEOUT).status_code == 404
    assert requests.post(f"{base}/metrics", headers=headers_for(USER_KEY), timeout=TIMEOUT).status_code == 405


# -- gRPC --

def _grpc_calls(client, x):
    from tritonclient import grpc as grpcclient

    def infer(headers):
        inp = grpcclient.InferInput("x", [1, 32], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("mlp", [inp], headers=headers)

    return [  # (what, call(headers), statuses for no key, a wrong key, the key, the admin key)
        ("ServerLive", lambda h: client.is_server_live(headers=h), OPEN),
        ("ServerReady", lambda h: client.is_server_ready(headers=h), OPEN),
        ("ModelReady", lambda h: client.is_model_ready("mlp", headers=h), OPEN),
        ("ServerMetadata", lambda h: client.get_server_metadata(headers=h), GUARDED),
        ("ModelMetadata", lambda h: client.get_model_metadata("mlp", headers=h), GUARDED),
        ("ModelConfig", lambda h: client.get_model_config("mlp", headers=h), GUARDED),
        ("ModelInfer", infer, GUARDED),
        ("SystemSharedMemoryStatus", lambda h: client.get_system_shared_memory_status(headers=h), GUARDED),
        ("ModelStatistics", lambda h: client.get_inference_statistics(headers=h), GUARDED),
        ("RepositoryIndex", lambda h: client.get_model_repository_index(headers=h), GUARDED),
        ("RepositoryModelUnload", lambda h: client.unload_model("mlp", headers=h), CONTROL),
        ("RepositoryModelLoad", lambda h: client.load_model("mlp", headers=h), CONTROL),
    ]


GRPC_STATUS = {"StatusCode.UNAUTHENTICATED": 401, "StatusCode.PERMISSION_DENIED": 403}


def test_every_grpc_category_with_no_a_wrong_the_and_the_admin_key(server):
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    if server.transport == "uvicorn":
        pytest.skip("gRPC is the same service whichever HTTP transport runs beside it: checked once")
    client = grpcclient.InferenceServerClient(server.grpc_target)
    x = np.full((1, 32), 0.25, np.float32)
    failures = []
    for state, key in KEY_STATES.items():
        metadata = {} if key is None else {"authorization": f"Bearer {key}"}
        for what, fn, want in _grpc_calls(client, x):
            expected = want[list(KEY_STATES).index(state)]
            try:
                fn(metadata)
                got, text = 200, ""
            except InferenceServerException as exc:
                got, text = GRPC_STATUS.get(str(exc.status()), str(exc.status())), exc.message()
            if got != expected:
                failures.append(f"{what} with {state}: {got} {text[:160]}, want {expected}")
            assert_names_no_secret(text)
    client.close()
    assert not failures, "\n".join(failures)


# -- rotation: the keys file rewritten under a running client --

@pytest.mark.parametrize("writer", ["rename", "in-place"])
def test_a_key_rotates_through_the_keys_file_without_a_failed_request(tmp_path, repo, writer):
    old, new = "rotation-old-key-111111", "rotation-new-key-222222"
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{sha256_hex(old)}\n")
    logged: list[str] = []
    handle = start_repository(repo, "127.0.0.1", 0, access=AccessConfig(auth_keys_file=keys_file),
                              log=logged.append)

    def write(text: str) -> None:
        if writer == "rename":                   # a new file renamed over the old one: atomic
            tmp = keys_file.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, keys_file)
        else:                                    # the same file truncated and written (a bind-mounted file)
            with open(keys_file, "w") as f:
                f.write(text)

    current = {"key": old}
    statuses: list[tuple[str, int]] = []
    stop = threading.Event()

    def client() -> None:
        session = requests.Session()
        deadline = time.monotonic() + 30
        while not stop.is_set() and len(statuses) < 20_000 and time.monotonic() < deadline:
            key = current["key"]
            r = session.post(f"{handle.url}/v2/models/mlp/infer", json=INFER, headers=headers_for(key),
                             timeout=TIMEOUT)
            statuses.append((key, r.status_code))

    def accepted(key: str) -> bool:
        return requests.get(f"{handle.url}/v2/models/mlp", headers=headers_for(key), timeout=TIMEOUT).ok

    def wait_until(predicate, limit: float = 10.0) -> None:
        """Bounded: the reload takes ~0.5 s (keys.py); the limit only keeps a broken reload from hanging the
        test, it is not a timing claim (a loaded CI box took 1.3 s once)."""
        start = time.monotonic()
        while not predicate():
            assert time.monotonic() - start < limit, "the keys file change was not picked up"
            time.sleep(0.02)

    try:
        assert handle.wait_loaded(TIMEOUT)
        assert accepted(old) and not accepted(new)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        time.sleep(0.3)
        write(f"# rotating\n{sha256_hex(old)}\n{sha256_hex(new)}\n")            # 1. add the new hash
        wait_until(lambda: accepted(new))                                       # 2. wait until it is taken
        current["key"] = new                                                    # 3. clients switch
        time.sleep(0.3)
        write(f"{sha256_hex(new)}\n")                                           # 4. drop the old hash
        wait_until(lambda: not accepted(old))
        time.sleep(0.3)
        stop.set()
        thread.join(TIMEOUT)
    finally:
        stop.set()
        handle.stop()
    used = {key for key, _ in statuses}
    failed = [s for s in statuses if s[1] != 200]
    assert used == {old, new} and len(statuses) > 20 and not failed, (len(statuses), failed[:5])
    assert any("re-read: 2 key(s)" in line for line in logged), logged
    assert all(sha256_hex(old) not in line and sha256_hex(new) not in line for line in logged)
