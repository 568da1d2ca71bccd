"""`ngcx-runtime serve DIR`: a Triton-style model repository (issue 12, item 2) and its bad input (item 8).

What a user notices: stock tritonclient lists the repository, loads, unloads and reloads models,
and infers on two models (and on two versions of one) served from one process, each with its own
batching settings from DIR/<model>/config.json or .yaml; a model is ready only after its load
and a warm-up inference; a broken model directory fails its own load with the reason (400)
while the other models keep serving; every bad repository request is a 4xx.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import models
import numpy as np
import pytest
from keyring import ADMIN, CONTROL

ort = pytest.importorskip("onnxruntime")
httpclient = pytest.importorskip("tritonclient.http")
requests = pytest.importorskip("requests")
parser = pytest.importorskip("prometheus_client.parser")

from tritonclient.utils import InferenceServerException  # noqa: E402

from ngcx_runtime.errors import RuntimeUserError  # noqa: E402
from ngcx_runtime.repository import ModelConfig, VersionPolicy, model_versions, parse_config, read_config  # noqa: E402
from ngcx_runtime.serve import start_repository  # noqa: E402

TIMEOUT = 30
CLI = [sys.executable, "-m", "ngcx_runtime.cli", "serve"]
CONV_CONFIG = {"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [4],
                                                         "max_queue_delay_microseconds": 3_000_000}}
MLP_CONFIG = "max_batch_size: 16\ndynamic_batching:\n  max_queue_delay_microseconds: 1000\nversion_policy:\n  all: {}\n"


def reshape_model(path: Path) -> Path:
    """x [N, 6] -> Reshape to [-1, 4]: loads fine, fails at batch 1 (6 values), i.e. at the warm-up."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 4])],
        [numpy_helper.from_array(np.array([-1, 4], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_repository(root: Path) -> Path:
    """conv (config.json, preferred batch 4), mlp (config.yaml, versions 1 and 2 served), and three
    broken models: not ONNX, no version folder, a warm-up that fails."""
    models.conv_net(root / "conv" / "1" / "model.onnx")
    (root / "conv" / "config.json").write_text(json.dumps(CONV_CONFIG))
    models.mlp(root / "mlp" / "1" / "model.onnx")
    models.mlp(root / "mlp" / "2" / "model.onnx", hidden=16)         # same signature, other numbers
    (root / "mlp" / "config.yaml").write_text(MLP_CONFIG)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"this is not an ONNX file")
    (root / "empty").mkdir()
    reshape_model(root / "coldfail" / "1" / "model.onnx")
    (root / ".hidden").mkdir()
    return root


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def triton(handle) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{handle.port}", connection_timeout=TIMEOUT,
                                            network_timeout=TIMEOUT)


def infer(client, model: str, name: str, x: np.ndarray, version: str = "") -> np.ndarray:
    inp = httpclient.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer(model, [inp], model_version=version)
    return res.as_numpy(res.get_response()["outputs"][0]["name"])


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return make_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture()
def server(repo):
    handle = start_repository(repo, "127.0.0.1", 0, max_queue_delay_ms=1, access=CONTROL)
    assert handle.wait_loaded(TIMEOUT)
    yield handle
    handle.stop()


def test_a_model_loaded_over_http_loads_on_a_thread_that_outlives_the_connection(repo, monkeypatch):
    """A repository load asked over HTTP ran in the connection's thread, which ends with the connection;
    torch keeps a compiled model's CUDA graphs in the loading thread's storage, and that thread's end was
    the SIGSEGV at start of bench/results/gpu/starts/ (runtime/loading.py). plan.load is the real one,
    wrapped to note the thread it runs on."""
    from ngcx_runtime import plan

    loaders: list[threading.Thread] = []
    real_load = plan.load

    def noting_load(*args, **kwargs):
        loaders.append(threading.current_thread())
        return real_load(*args, **kwargs)

    monkeypatch.setattr(plan, "load", noting_load)
    handle = start_repository(repo, "127.0.0.1", 0, models=[], access=CONTROL)
    try:
        assert handle.wait_loaded(TIMEOUT) is False and not loaders, "nothing loads at start with models=[]"
        reply = requests.post(f"{handle.url}/v2/repository/models/mlp/load", json={}, timeout=TIMEOUT,
                              headers={**ADMIN, "Connection": "close"})
        assert reply.status_code == 200, reply.text
        assert len(loaders) == 2 and all(t.name.startswith("ngcx-load") for t in loaders), loaders
        loaders[0].join(timeout=0.5)              # the connection's thread is gone well before this
        assert loaders[0].is_alive(), "the thread that loaded the model ended with the request"
    finally:
        handle.stop()


def states(client) -> dict[str, list]:
    out: dict[str, list] = {}
    for row in client.get_model_repository_index():
        out.setdefault(row["name"], []).append((row.get("version"), row["state"], row.get("reason", "")))
    return out


def test_tritonclient_index_load_unload_and_infer_on_two_models(server, repo):
    client = triton(server)
    assert client.is_server_live() and client.is_server_ready()
    index = states(client)
    assert index["conv"] == [("1", "READY", "")]
    assert index["mlp"] == [("1", "READY", ""), ("2", "READY", "")]
    assert index["broken"][0][1] == "UNAVAILABLE" and "not a valid ONNX model" in index["broken"][0][2]
    assert "no version folder" in index["empty"][0][2]
    assert ".hidden" not in index

    x = models.sample_inputs("conv", 2)["input"]
    conv_ref = reference(repo / "conv" / "1" / "model.onnx", {"input": x})["logits"]
    np.testing.assert_allclose(infer(client, "conv", "input", x), conv_ref, rtol=1e-5, atol=1e-5)
    v = models.sample_inputs("mlp", 3)["x"]
    for version, expected in (("1", "1"), ("2", "2"), ("", "2")):     # no version: the newest
        ref = reference(repo / "mlp" / expected / "model.onnx", {"x": v})["y"]
        np.testing.assert_allclose(infer(client, "mlp", "x", v, version), ref, rtol=1e-5, atol=1e-5)
    assert client.get_model_metadata("mlp")["versions"] == ["1", "2"]

    client.unload_model("conv", headers=ADMIN)
    assert not client.is_model_ready("conv")
    with pytest.raises(InferenceServerException, match="'conv' was unloaded|is not loaded"):
        infer(client, "conv", "input", x)
    assert states(client)["conv"] == [(None, "UNAVAILABLE", "unloaded")]
    np.testing.assert_allclose(infer(client, "mlp", "x", v), reference(repo / "mlp" / "2" / "model.onnx",
                                                                       {"x": v})["y"], rtol=1e-5, atol=1e-5)
    client.load_model("conv", headers=ADMIN)
    assert client.is_model_ready("conv")
    np.testing.assert_allclose(infer(client, "conv", "input", x), conv_ref, rtol=1e-5, atol=1e-5)
    assert server.stats("conv")["success"] == 2, "counters survive unload and reload"

    with pytest.raises(InferenceServerException, match="not a valid ONNX model") as err:
        client.load_model("broken", headers=ADMIN)
    assert err.value.status() == "400"
    assert client.is_server_ready() and client.is_model_ready("mlp") and client.is_model_ready("conv")


def test_each_model_batches_with_its_own_config(server):
    """conv: max_batch_size 8, preferred batch 4 with a 3 s delay: four concurrent requests run at once
    as one batch of 4 instead of waiting; mlp: max_batch_size 16 from YAML."""
    client = triton(server)
    assert client.get_model_config("conv")["max_batch_size"] == 8
    assert client.get_model_config("conv")["dynamic_batching"]["preferred_batch_size"] == [4]
    assert client.get_model_config("mlp", "1")["max_batch_size"] == 16
    before = server.stats("conv")["engine_calls"]
    xs = [models.sample_inputs("conv", 1, seed=i)["input"] for i in range(4)]
    results: list = [None] * 4
    start = time.monotonic()
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, infer(triton(server), "conv", "input",
                                                                                 xs[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    elapsed = time.monotonic() - start
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 10) for r in results), results
    assert elapsed < 2.5, f"a preferred batch runs at once, not after the 3 s delay ({elapsed:.2f} s)"
    s = server.stats("conv")
    assert s["engine_calls"] - before == 1 and s["batch_sizes"].get(4) == 1, s
    with pytest.raises(InferenceServerException, match="exceeds the server's max batch 8"):
        infer(client, "conv", "input", models.sample_inputs("conv", 9)["input"])


def test_ready_only_after_the_warm_up_and_a_load_can_override_the_config(server, repo):
    client = triton(server)
    assert not client.is_model_ready("coldfail")
    reason = states(client)["coldfail"][0][2]
    assert "warm-up inference" in reason, reason
    client.load_model("mlp", config=json.dumps({"max_batch_size": 0, "version_policy": {"specific":
                                                                                     {"versions": [1]}}}),
                      headers=ADMIN)
    assert client.get_model_config("mlp")["max_batch_size"] == 0
    assert [r[0] for r in states(client)["mlp"]] == ["1"]
    with pytest.raises(InferenceServerException, match="no version '2'"):
        infer(client, "mlp", "x", models.sample_inputs("mlp", 1)["x"], "2")
    with pytest.raises(InferenceServerException, match="unknown field"):
        client.load_model("mlp", config=json.dumps({"max_batch": 4}), headers=ADMIN)
    assert client.is_model_ready("mlp"), "a failed reload keeps the model served"


def test_metrics_carry_one_series_per_model_version(server):
    client = triton(server)
    infer(client, "mlp", "x", models.sample_inputs("mlp", 2)["x"], "1")
    infer(client, "conv", "input", models.sample_inputs("conv", 1)["input"])
    text = requests.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    got = {(s.labels["model"], s.labels["version"]): s.value for s in fams["nv_inference_request_success"].samples}
    assert got == {("conv", "1"): 1, ("mlp", "1"): 1, ("mlp", "2"): 0}
    counts = {(s.labels["model"], s.labels["version"]): s.value for s in fams["nv_inference_count"].samples}
    assert counts[("mlp", "1")] == 2


# -- bad input: every repository endpoint, one keep-alive session, then good requests --

LOAD = "/v2/repository/models/{}/load"
BAD = [
    ("unknown-model-load", "POST", LOAD.format("nope"), b"", 404, "no model 'nope' in the repository"),
    ("traversal", "POST", LOAD.format("..%2F..%2Fetc"), b"", 400, "not a plain folder name"),
    ("dot-dot", "POST", LOAD.format("%2E%2E"), b"", 400, "not a plain folder name"),
    ("hidden", "POST", LOAD.format(".hidden"), b"", 400, "not a plain folder name"),
    ("nul", "POST", LOAD.format("a%00b"), b"", 400, "not a plain folder name"),
    ("broken-dir", "POST", LOAD.format("broken"), b"", 400, "not a valid ONNX model"),
    ("no-version", "POST", LOAD.format("empty"), b"", 400, "no version folder"),
    ("malformed-json", "POST", LOAD.format("conv"), b"{", 400, "malformed JSON"),
    ("not-an-object", "POST", LOAD.format("conv"), b"[1]", 400, "must be a JSON object"),
    ("parameters-list", "POST", LOAD.format("conv"), b'{"parameters": []}', 400, "'parameters' must be a JSON object"),
    ("unknown-field", "POST", LOAD.format("conv"), b'{"params": {}}', 400, "unknown field 'params'"),
    ("file-override", "POST", LOAD.format("conv"), b'{"parameters": {"file:1/model.onnx": "AAAA"}}', 400,
     "file overrides"),
    ("unknown-param", "POST", LOAD.format("conv"), b'{"parameters": {"bogus": 1}}', 400, "unknown load parameter"),
    ("config-not-string", "POST", LOAD.format("conv"), b'{"parameters": {"config": 5}}', 400, "must be a JSON string"),
    ("config-not-json", "POST", LOAD.format("conv"), b'{"parameters": {"config": "{"}}', 400, "not valid JSON"),
    ("config-typo", "POST", LOAD.format("conv"), json.dumps({"parameters": {"config": '{"max_batch": 2}'}}).encode(),
     400, "unknown field(s) max_batch"),
    ("config-other-name", "POST", LOAD.format("conv"), json.dumps({"parameters": {"config": '{"name": "x"}'}})
     .encode(), 400, "differs from its folder"),
    ("unload-unknown", "POST", "/v2/repository/models/nope/unload", b"", 404, "no model 'nope'"),
    ("unload-bad-param", "POST", "/v2/repository/models/conv/unload",
     b'{"parameters": {"unload_dependents": "yes"}}', 400, "'unload_dependents' must be a bool"),
    ("index-bad-ready", "POST", "/v2/repository/index", b'{"ready": "yes"}', 400, "'ready' must be a bool"),
    ("index-unknown", "POST", "/v2/repository/index", b'{"x": 1}', 400, "unknown field 'x'"),
    ("index-get", "GET", "/v2/repository/index", b"", 405, "use POST"),
    ("repo-unknown-path", "POST", "/v2/repository/models/conv", b"", 404, "unknown path"),
    ("repo-other-action", "POST", "/v2/repository/models/conv/reload", b"", 404, "unknown path"),
    ("oversized", "POST", LOAD.format("conv"), b" " * 300_000, 413, "exceeds the limit"),
    ("unknown-model", "POST", "/v2/models/nope/infer", b"{}", 404, "unknown model 'nope'; the repository has: "),
    ("unknown-version", "POST", "/v2/models/mlp/versions/7/infer", b"{}", 404, "no version '7'; available: 1, 2"),
    ("not-loaded", "POST", "/v2/models/broken/infer", b"{}", 503, "is not loaded (failed to load"),
    ("extra-path", "POST", "/v2/models/conv/extra/infer", b"{}", 404, "unknown path"),
    ("ready-unknown-version", "GET", "/v2/models/mlp/versions/9/ready", b"", 404, "no version '9'"),
    ("metadata-unloaded", "GET", "/v2/models/coldfail", b"", 503, "warm-up inference"),
]


def test_bad_repository_requests_are_4xx_and_the_server_keeps_serving(repo):
    handle = start_repository(repo, "127.0.0.1", 0, max_body_mb=0.25, access=CONTROL)
    try:
        assert handle.wait_loaded(TIMEOUT)
        session = requests.Session()
        session.headers.update(ADMIN)
        failures = []
        for case, method, path, body, status, fragment in BAD:
            r = session.request(method, f"{handle.url}{path}", data=body, timeout=TIMEOUT)
            try:
                msg = r.json()["error"]
            except (ValueError, KeyError):
                msg = f"<no error: {r.text[:80]!r}>"
            if r.status_code != status or fragment not in msg or "\n" in msg:
                failures.append(f"{case}: got {r.status_code} {msg!r}, want {status} containing {fragment!r}")
        assert not failures, "\n".join(failures)
        client = triton(handle)
        assert client.is_server_ready() and client.is_model_ready("conv") and client.is_model_ready("mlp")
        assert infer(client, "conv", "input", models.sample_inputs("conv", 1)["input"]).shape == (1, 10)
        assert infer(client, "mlp", "x", models.sample_inputs("mlp", 1)["x"]).shape == (1, 10)
        assert not (repo.parent / "etc").exists()
    finally:
        handle.stop()


# -- config files, without sockets --

@pytest.mark.parametrize("doc, fragment", [
    ([1], "is an object (mapping), not a list"),
    ({"max_batch_size": -1}, "max_batch_size must be an integer of at least 0"),
    ({"max_batch_size": True}, "max_batch_size must be an integer"),
    ({"max_batch_size": 0, "dynamic_batching": {}}, "needs max_batch_size above 0"),
    ({"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}}, "exceeds max_batch_size 4"),
    ({"dynamic_batching": {"preferred_batch_size": "4"}}, "preferred_batch_size must be a list of positive integers"),
    ({"dynamic_batching": {"max_queue_delay_microseconds": -5}}, "max_queue_delay_microseconds must be an integer"),
    ({"dynamic_batching": {"priority_levels": 2}}, "unknown dynamic_batching field(s) priority_levels"),
    ({"dynamic_batching": [4]}, "dynamic_batching must be an object"),
    ({"backend": "tensorflow"}, "backend \"tensorflow\" is not one of"),
    ({"platform": "onnxruntime_onnx", "backend": "pytorch"}, "contradicts backend pytorch"),
    ({"version_policy": {"newest": {}}}, "version_policy is one of"),
    ({"version_policy": {"specific": {"versions": []}}}, "version_policy is one of"),
    ({"default_model_filename": "../model.onnx"}, "must be a file name inside the version folder"),
    ({"instance_group": [{"count": 0}]}, "count must be an integer of at least 1"),
    ({"instance_group": {"count": 2}}, "instance_group is a list"),
    ({"instance_group": [{"count": 2, "kind": "KIND_TPU"}]}, "kind \"KIND_TPU\" is not one of"),
    ({"instance_group": [{"count": 1, "kind": "KIND_CPU", "gpus": [0]}]}, "KIND_CPU takes no gpus"),
    ({"instance_group": [{"count": 1, "gpus": ["0"]}]}, "gpus must be a list of GPU indices"),
    ({"instance_group": [{"count": 1, "rate_limiter": {}}]}, "unknown instance_group field(s) rate_limiter"),
    ({"instance_group": [{"count": 65}]}, "asks for 65 instances; at most 64"),
])
def test_a_bad_config_is_one_line_naming_the_field(doc, fragment):
    with pytest.raises(RuntimeUserError) as err:
        parse_config(doc, "m/config.json", expected_name="m")
    text = str(err.value)
    assert fragment in text and text.startswith("m/config.json: ") and "\n" not in text


def test_config_json_and_yaml_mean_the_same(tmp_path):
    json_dir, yaml_dir = tmp_path / "a", tmp_path / "b"
    json_dir.mkdir()
    yaml_dir.mkdir()
    (json_dir / "config.json").write_text(json.dumps({**CONV_CONFIG, "platform": "onnxruntime_onnx",
                                                      "version_policy": {"latest": {"num_versions": 2}}}))
    (yaml_dir / "config.yaml").write_text("max_batch_size: 8\nplatform: onnxruntime_onnx\ndynamic_batching:\n"
                                          "  preferred_batch_size: [4]\n  max_queue_delay_microseconds: 3000000\n"
                                          "version_policy:\n  latest:\n    num_versions: 2\n")
    a, b = read_config(json_dir), read_config(yaml_dir)
    assert (a.max_batch_size, a.preferred_batch_sizes, a.max_queue_delay_ms, a.backend, a.versions) == \
           (8, (4,), 3000.0, "onnxruntime", VersionPolicy(latest=2))
    assert (b.max_batch_size, b.preferred_batch_sizes, b.max_queue_delay_ms, b.backend, b.versions) == \
           (a.max_batch_size, a.preferred_batch_sizes, a.max_queue_delay_ms, a.backend, a.versions)
    (yaml_dir / "config.json").write_text("{}")
    with pytest.raises(RuntimeUserError, match="both config.json and config.yaml; keep one"):
        read_config(yaml_dir)
    (json_dir / "config.json").write_text("max_batch_size: [")
    with pytest.raises(RuntimeUserError, match="config.json: not valid JSON"):
        read_config(json_dir)


def test_versions_follow_the_policy_and_plans_count_as_versions(tmp_path):
    for v in ("1", "2", "10"):
        models.mlp(tmp_path / "m" / v / "model.onnx")
    (tmp_path / "m" / "3").mkdir()
    (tmp_path / "m" / "3" / "manifest.json").write_text("{}")          # an optimized plan folder
    (tmp_path / "m" / "v4").mkdir()                                  # not a version: ignored
    m = tmp_path / "m"
    assert list(model_versions(m, ModelConfig())) == ["10"]
    assert list(model_versions(m, ModelConfig(versions=VersionPolicy(latest=None)))) == ["1", "2", "3", "10"]
    assert model_versions(m, ModelConfig(versions=VersionPolicy(latest=None, specific=(3,))))["3"] == m / "3"
    with pytest.raises(RuntimeUserError, match="selects none of the versions present"):
        model_versions(m, ModelConfig(versions=VersionPolicy(latest=None, specific=(7,))))
    (tmp_path / "n" / "1").mkdir(parents=True)
    with pytest.raises(RuntimeUserError, match=r"no model.onnx or model.pt2 or an optimized plan"):
        model_versions(tmp_path / "n", ModelConfig())


# -- the command line --

def _start(cmd: list[str]) -> tuple[subprocess.Popen, list[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"(http://127\.0\.0\.1:\d+)/v2/models/", line)
        if m:
            return proc, seen, m.group(1)
    proc.kill()
    pytest.fail(f"server did not start: {''.join(seen)}")


def test_cli_serves_a_repository_and_reports_the_broken_model(tmp_path):
    root = tmp_path / "repo"
    models.conv_net(root / "conv" / "1" / "model.onnx")
    models.mlp(root / "mlp" / "1" / "model.onnx")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"junk")
    proc, seen, url = _start([*CLI, str(root), "--port", "0", "--metrics-port", "0"])
    try:
        text = "".join(seen)
        assert "model 'broken' failed to load:" in text and "not a valid ONNX model" in text
        assert "serving 2 model(s) from" in text and "(conv, mlp); failed: broken" in text
        metrics_url = re.search(r"metrics at (http://\S+/metrics)", text).group(1)
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=TIMEOUT)
        assert infer(client, "conv", "input", models.sample_inputs("conv", 1)["input"]).shape == (1, 10)
        assert infer(client, "mlp", "x", models.sample_inputs("mlp", 2)["x"]).shape == (2, 10)
        fams = {f.name: f for f in parser.text_string_to_metric_families(requests.get(metrics_url,
                                                                                     timeout=TIMEOUT).text)}
        assert {s.labels["model"] for s in fams["nv_inference_exec_count"].samples} == {"conv", "mlp"}
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, out
        assert "serve: stopped (2 inference requests served)" in out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("setup, extra, fragment", [
    ("broken-only", [], "no model of "),
    ("empty", [], "neither a plan directory (no manifest.json) nor a model repository"),
    ("good", ["--handler", "h:H"], "--handler apply to one model"),
    ("good", ["--precision", "fp16"], "--precision apply to one model"),
    ("good", ["--load-model", "nope"], "--load-model 'nope': no such model"),
    ("good", ["--metrics-port", "70000"], "--metrics-port 70000 is not a TCP port"),
])
def test_cli_refusals_are_one_line_and_exit_2(tmp_path, setup, extra, fragment):
    root = tmp_path / "repo"
    root.mkdir()
    if setup == "broken-only":
        (root / "broken" / "1").mkdir(parents=True)
        (root / "broken" / "1" / "model.onnx").write_bytes(b"junk")
    elif setup == "good":
        models.mlp(root / "mlp" / "1" / "model.onnx")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([*CLI, str(root), "--port", "0", *extra], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
