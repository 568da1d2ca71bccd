"""Batching decided from evidence (issue 12, item 6): real ONNX models whose dim 0 is not what it seems.

What a user notices: a recurrent model whose input is batch-major but whose output is time-major
([time, batch, C]) used to be merged on dim 0 and answer every merged request with a 500. Now the
server measures each output's batch axis at load (batch 1 vs batch 2), merges concurrent requests
and splits the outputs on the right axis; a model whose dim 0 is really time is served unbatched;
a layout the probe cannot see ([batch * time, C]) is caught on the first merged batch and its
requests are answered one by one. Every request gets 200 and ONNX Runtime's own numbers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
requests = pytest.importorskip("requests")

from ngcx_runtime.layout import prepare  # noqa: E402
from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

TIMEOUT = 30
FEATURES, HIDDEN, CLASSES = 4, 5, 3


def _save(graph, path: Path) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _lstm_weights(rng: np.random.Generator):
    from onnx import numpy_helper

    w = rng.normal(0, 0.6, (1, 4 * HIDDEN, FEATURES)).astype(np.float32)
    r = rng.normal(0, 0.6, (1, 4 * HIDDEN, HIDDEN)).astype(np.float32)
    b = rng.normal(0, 0.5, (1, 8 * HIDDEN)).astype(np.float32)
    return [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
            numpy_helper.from_array(np.array([0], np.int64), "axis0")]


def lstm_time_major_output(path: Path) -> Path:
    """x [batch, time, F] (batch-major) -> Transpose -> ONNX LSTM -> y [time, batch, C] (time-major)
    and last [batch, H] (the final hidden state): two outputs, two different batch axes, every dim 0
    dynamic with different symbolic names, as an exported seq2seq encoder has."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    proj = numpy_helper.from_array(rng.normal(0, 0.5, (HIDDEN, CLASSES)).astype(np.float32), "P")
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["xt", "W", "R", "B"], ["Y", "Y_h"], hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["Y", "axis1"], ["seq"]),               # [T, B, H]
        helper.make_node("MatMul", ["seq", "P"], ["y"]),                    # [T, B, C]
        helper.make_node("Squeeze", ["Y_h", "axis0"], ["last"]),            # [B, H]
    ]
    graph = helper.make_graph(
        nodes, "lstm_tm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["time", "batch", CLASSES]),
         helper.make_tensor_value_info("last", TensorProto.FLOAT, ["batch", HIDDEN])],
        [*_lstm_weights(rng), proj])
    return _save(graph, path)


def lstm_time_major_input(path: Path) -> Path:
    """x [time, batch, F] straight into an ONNX LSTM -> y [time, batch, H]: dim 0 is dynamic but is time."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=HIDDEN),
             helper.make_node("Squeeze", ["Y", "axis1"], ["y"])]
    graph = helper.make_graph(
        nodes, "lstm_ti",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "B", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "B", HIDDEN])],
        _lstm_weights(rng))
    return _save(graph, path)


def flattened(path: Path) -> Path:
    """x [batch, time, F] -> Reshape [batch*time, F] -> MatMul -> y [batch*time, C]: at time 1 the
    probe sees a batch axis 0; merged requests of time 3 do not split on it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array([-1, FEATURES], np.int64), "shape"),
             numpy_helper.from_array(rng.normal(0, 1, (FEATURES, CLASSES)).astype(np.float32), "M")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "M"], ["y"])]
    graph = helper.make_graph(
        nodes, "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])], inits)
    return _save(graph, path)


def batch_sum(path: Path) -> Path:
    """x [N, F] -> ReduceSum over the batch -> y [1, F]: the output does not scale with the batch."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], "bsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    return _save(graph, path)


def reference(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"x": x}), strict=True))


def infer(url: str, name: str, x: np.ndarray) -> requests.Response:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return requests.post(f"{url}/v2/models/{name}/infer", json=body, timeout=TIMEOUT)


def outputs_of(r: requests.Response) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}


def concurrently(fn, args: list) -> list:
    results: list = [None] * len(args)

    def run(i: int) -> None:
        try:
            results[i] = fn(*args[i])
        except Exception as exc:  # noqa: BLE001 - reported by the asserting test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results


def check_all_correct(path: Path, xs: list[np.ndarray], responses: list) -> None:
    for x, r in zip(xs, responses, strict=True):
        assert not isinstance(r, Exception), r
        assert r.status_code == 200, r.text
        got, want = outputs_of(r), reference(path, x)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("layout")


def test_the_probe_finds_each_outputs_batch_axis(models_dir):
    engine = load(lstm_time_major_output(models_dir / "lstm_tm.onnx"), backend="onnxruntime")
    assert [s.shape[0] for s in engine.outputs] == [-1, -1], "every output's dim 0 looks dynamic"
    layout = prepare(engine, max_batch=16)
    assert layout.batched and layout.merge
    assert layout.output_axes == {"y": 1, "last": 0}, layout
    assert "'y' [1, 1, 3] -> [1, 2, 3]" in layout.evidence


@pytest.mark.parametrize("builder, why", [
    (lstm_time_major_input, "differs from the single sample's along dim 0"),
    (batch_sum, "does not scale along one axis (batch 1 -> [1, 4], batch 2 -> [1, 4])"),
])
def test_a_dim_0_that_is_not_a_batch_is_served_unbatched(models_dir, builder, why):
    engine = load(builder(models_dir / f"{builder.__name__}.onnx"), backend="onnxruntime")
    layout = prepare(engine, max_batch=16)
    assert not layout.batched and not layout.merge
    assert why in layout.evidence


def test_time_major_outputs_are_merged_and_split_on_their_axis(models_dir):
    """The issue's failure: concurrent requests to a batch-major-in, time-major-out model. All 200,
    ONNX Runtime's numbers, and fewer engine calls than requests (the merge really happened)."""
    path = lstm_time_major_output(models_dir / "lstm_tm.onnx")
    logs: list[str] = []
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="lstm", max_batch=16,
                          max_queue_delay_ms=300, log=logs.append)
    try:
        meta = requests.get(f"{handle.url}/v2/models/lstm", timeout=TIMEOUT).json()
        assert meta["batching"]["output_batch_axes"] == {"y": 1, "last": 0}
        assert any("output dims last:0, y:1" in line for line in logs), logs
        config = requests.get(f"{handle.url}/v2/models/lstm/config", timeout=TIMEOUT).json()
        assert config["max_batch_size"] == 16
        assert {o["name"]: o["dims"] for o in config["output"]} == {"y": [-1, 3], "last": [5]}
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1 + i % 2, 6, FEATURES)).astype(np.float32) for i in range(8)]
        check_all_correct(path, xs, concurrently(lambda x: infer(handle.url, "lstm", x), [(x,) for x in xs]))
        s = handle.stats()
        assert s["success"] == 8 and s["failed"] == 0
        assert s["engine_calls"] < 8 and s["batched_requests"] >= 2, s
    finally:
        handle.stop()


def test_requests_of_different_lengths_are_merged_only_with_their_own_length(models_dir):
    path = lstm_time_major_output(models_dir / "lstm_tm.onnx")
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="lstm", max_batch=16,
                          max_queue_delay_ms=300)
    try:
        rng = np.random.default_rng(1)
        times = [3, 7, 3, 7, 3, 7]
        xs = [rng.standard_normal((1, t, FEATURES)).astype(np.float32) for t in times]
        check_all_correct(path, xs, concurrently(lambda x: infer(handle.url, "lstm", x), [(x,) for x in xs]))
        calls = handle.stats()["engine_calls"]
        assert 2 <= calls < len(xs), calls       # one call per length at best, never a mixed one
    finally:
        handle.stop()


def test_a_time_major_input_is_never_merged(models_dir):
    path = lstm_time_major_input(models_dir / "lstm_ti.onnx")
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="rnn", max_batch=16,
                          max_queue_delay_ms=300)
    try:
        config = requests.get(f"{handle.url}/v2/models/rnn/config", timeout=TIMEOUT).json()
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
        rng = np.random.default_rng(2)
        xs = [rng.standard_normal((5, 2, FEATURES)).astype(np.float32) for _ in range(6)]
        check_all_correct(path, xs, concurrently(lambda x: infer(handle.url, "rnn", x), [(x,) for x in xs]))
        s = handle.stats()
        assert s["engine_calls"] == 6 and s["batched_requests"] == 0, s
    finally:
        handle.stop()


def test_a_merged_batch_that_does_not_split_is_answered_one_by_one_and_merging_stops(models_dir):
    """[batch * time, C]: the probe (time 1) cannot tell it from a batch axis; the first merged batch
    of time-3 requests does not split. Its requests run again alone: all 200, never a 500."""
    path = flattened(models_dir / "flat.onnx")
    logs: list[str] = []
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="flat", max_batch=16,
                          max_queue_delay_ms=300, log=logs.append)
    try:
        rng = np.random.default_rng(3)
        xs = [rng.standard_normal((1, 3, FEATURES)).astype(np.float32) for _ in range(6)]
        check_all_correct(path, xs, concurrently(lambda x: infer(handle.url, "flat", x), [(x,) for x in xs]))
        assert any("did not split" in line for line in logs), logs
        meta = requests.get(f"{handle.url}/v2/models/flat", timeout=TIMEOUT).json()
        assert meta["batching"]["merge"] is False and "did not split" in meta["batching"]["evidence"]
        before = handle.stats()["engine_calls"]
        more = [rng.standard_normal((1, 3, FEATURES)).astype(np.float32) for _ in range(4)]
        check_all_correct(path, more, concurrently(lambda x: infer(handle.url, "flat", x), [(x,) for x in more]))
        assert handle.stats()["engine_calls"] - before == 4, "merging stays off"
        assert handle.stats()["failed"] == 0
    finally:
        handle.stop()
