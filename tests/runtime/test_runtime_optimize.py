"""`ngcx-runtime optimize` and `ngcx_runtime.plan.load` on ONNX Runtime (CPU EP) with real models.

Tolerances against the FP32 source on 64 seeded samples (max |error| relative to max |reference|):
fp32 <= 1e-5 absolute; fp16 <= 1e-2 (observed ~3e-4); int8 <= 0.15 (observed 0.02 conv, 0.07 MLP)
with top-1 agreement >= 0.9 (observed 1.0 / 0.98).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest

from ngcx_runtime import plan
from ngcx_runtime.errors import RuntimeUserError
from ngcx_runtime.optimize import OptimizeOptions, optimize

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

BUILDERS = {"conv": models.conv_net, "mlp": models.mlp}


def _out(engine, feeds) -> np.ndarray:
    return next(iter(engine.infer(feeds).values()))


def _opts(kind: str, precision: str, method: str = "entropy") -> OptimizeOptions:
    calib = models.sample_inputs(kind, 128, seed=1) if precision == "int8" else None
    return OptimizeOptions(
        precision=precision,
        batch_profile=[1, 8, 64],
        calibration=calib,
        calibration_sha256=f"seed1-{kind}" if calib else None,
        calibration_method=method,
    )


@pytest.mark.parametrize("kind", ["conv", "mlp"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_optimized_plan_matches_fp32_within_tolerance(tmp_path, kind, precision):
    src = BUILDERS[kind](tmp_path / f"{kind}.onnx")
    feeds = models.sample_inputs(kind, 64, seed=5)
    ref = _out(plan.load(src), feeds)
    res = optimize(src, tmp_path / "plan", _opts(kind, precision))
    got = _out(plan.load(res.plan_dir), feeds)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    if precision == "fp32":
        assert np.abs(got - ref).max() <= 1e-5
    elif precision == "fp16":
        assert rel <= 1e-2
    else:
        assert rel <= 0.15
        assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9


def test_manifest_records_what_the_plan_is_tied_to(tmp_path):
    src = models.conv_net(tmp_path / "conv.onnx")
    res = optimize(src, tmp_path / "plan", _opts("conv", "fp16"))
    m = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    import onnxruntime

    assert m["backend"] == "onnxruntime" and m["backend_version"] == onnxruntime.__version__
    assert m["precision"] == "fp16" and m["batch_profile"] == [1, 8, 64]
    assert m["gpu"] == "cpu" and m["compute_capability"] is None
    assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert m["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert m["source"]["sha256"] == plan.sha256_file(src) and m["source"]["path"] == str(src.resolve())
    assert m["ngcx_runtime_version"]
    assert (tmp_path / "plan" / m["artifact"]).is_file()
    # FP16 really converted the weights: the portable model holds float16 initializers
    model = onnx.load(str(tmp_path / "plan" / "model.onnx"))
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    assert res.manifest == m


def test_int8_calibration_rewrites_the_graph_with_qdq_and_int8_weights(tmp_path):
    src = models.conv_net(tmp_path / "conv.onnx")
    optimize(src, tmp_path / "plan", _opts("conv", "int8"))
    model = onnx.load(str(tmp_path / "plan" / "model.onnx"))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    int8_weights = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert any(name.startswith("conv0.w") for name in int8_weights), int8_weights
    source_ops = {n.op_type for n in onnx.load(str(src)).graph.node}
    assert "QuantizeLinear" not in source_ops


def test_calibration_method_changes_the_scales(tmp_path):
    src = models.mlp(tmp_path / "mlp.onnx")

    def x_scale(method: str) -> float:
        res = optimize(src, tmp_path / method, _opts("mlp", "int8", method))
        model = onnx.load(str(res.plan_dir / "model.onnx"))
        init = {i.name: i for i in model.graph.initializer}
        return float(onnx.numpy_helper.to_array(init["x_scale"]))

    assert x_scale("minmax") != x_scale("percentile")


def test_second_optimize_is_a_cache_hit_and_changed_inputs_are_not(tmp_path):
    src = models.mlp(tmp_path / "mlp.onnx")
    first = optimize(src, tmp_path / "a", _opts("mlp", "int8"))
    second = optimize(src, tmp_path / "b", _opts("mlp", "int8"))
    assert not first.cache_hit and second.cache_hit
    assert second.manifest["cache_key"] == first.manifest["cache_key"]
    assert (tmp_path / "b" / "model.onnx").read_bytes() == (tmp_path / "a" / "model.onnx").read_bytes()
    other_calib = _opts("mlp", "int8")
    other_calib.calibration_sha256 = "different-data"
    assert not optimize(src, tmp_path / "c", other_calib).cache_hit
    assert not optimize(src, tmp_path / "d", _opts("mlp", "fp16")).cache_hit
    batch = _opts("mlp", "int8")
    batch.batch_profile = [1, 4]
    assert not optimize(src, tmp_path / "e", batch).cache_hit


def _edit_manifest(plan_dir: Path, **changes) -> None:
    path = plan_dir / "manifest.json"
    m = json.loads(path.read_text())
    m.update(changes)
    path.write_text(json.dumps(m))


def test_plan_for_another_gpu_is_refused_without_its_source(tmp_path):
    src = models.conv_net(tmp_path / "conv.onnx")
    optimize(src, tmp_path / "plan", _opts("conv", "fp16"))
    _edit_manifest(
        tmp_path / "plan",
        target={"kind": "gpu", "name": "Tesla T4", "compute_capability": "7.5"},
    )
    src.unlink()
    with pytest.raises(RuntimeUserError, match=r"built for Tesla T4 \(sm 7.5\), this host has"):
        plan.load(tmp_path / "plan")


def test_plan_for_another_gpu_is_rebuilt_when_the_source_is_at_hand(tmp_path, capsys):
    src = models.conv_net(tmp_path / "conv.onnx")
    optimize(src, tmp_path / "plan", _opts("conv", "fp16"))
    _edit_manifest(
        tmp_path / "plan",
        target={"kind": "gpu", "name": "NVIDIA A2", "compute_capability": "8.6"},
    )
    engine = plan.load(tmp_path / "plan")
    assert "rebuilding from" in capsys.readouterr().err
    assert engine.precision == "fp16"
    assert _out(engine, models.sample_inputs("conv", 2)).shape == (2, 10)
    with pytest.raises(RuntimeUserError, match="cannot run here"):
        plan.load(tmp_path / "plan", rebuild=False)


def test_plan_from_another_engine_version_is_refused(tmp_path):
    src = models.mlp(tmp_path / "mlp.onnx")
    optimize(src, tmp_path / "plan", _opts("mlp", "fp32"))
    _edit_manifest(tmp_path / "plan", backend_version="1.17.0")
    with pytest.raises(RuntimeUserError, match="built with onnxruntime 1.17.0"):
        plan.load(tmp_path / "plan", rebuild=False)


def test_raw_onnx_loads_as_an_fp32_engine(tmp_path):
    engine = plan.load(models.mlp(tmp_path / "mlp.onnx"))
    assert (engine.backend, engine.device, engine.precision, engine.max_batch) == (
        "onnxruntime",
        "cpu",
        "fp32",
        0,
    )
    assert engine.infer(models.sample_inputs("mlp", 3))["y"].shape == (3, 10)


def _cli(*args: str, env_cache: Path) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "NGCX_RUNTIME_CACHE": str(env_cache)}
    return subprocess.run(
        [sys.executable, "-m", "ngcx_runtime.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    "content,expect",
    [
        (b"not a protobuf at all", "not a valid ONNX model"),
        (b"", "not a valid ONNX model"),
    ],
)
def test_bad_model_file_is_one_line_exit_2_and_nothing_written(tmp_path, plan_cache, content, expect):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(content)
    proc = _cli("optimize", str(bad), "-o", str(tmp_path / "plan"), env_cache=plan_cache)
    assert proc.returncode == 2
    assert expect in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "plan").exists()
    assert not any(p.name.endswith("manifest.json") for p in plan_cache.rglob("*"))


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--precision", "bf16"], "no bf16 path"),
        (["--precision", "int8"], "needs --calibration-data"),
        (["--batch", "0,8"], "positive batch sizes"),
        (["--backend", "pytorch"], "cannot read"),
    ],
)
def test_bad_options_are_one_line_exit_2(tmp_path, plan_cache, args, expect):
    src = models.mlp(tmp_path / "mlp.onnx")
    proc = _cli("optimize", str(src), "-o", str(tmp_path / "plan"), *args, env_cache=plan_cache)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists()


def test_cli_optimize_with_npz_calibration_then_cache_hit(tmp_path, plan_cache):
    src = models.conv_net(tmp_path / "conv.onnx")
    np.savez(tmp_path / "calib.npz", **models.sample_inputs("conv", 32, seed=3))
    args = [
        "optimize",
        str(src),
        "-o",
        str(tmp_path / "plan"),
        "--precision",
        "int8",
        "--calibration-data",
        str(tmp_path / "calib.npz"),
        "--json",
    ]
    first = json.loads(_cli(*args, env_cache=plan_cache).stdout)
    second = json.loads(_cli(*args, env_cache=plan_cache).stdout)
    assert (first["cache_hit"], second["cache_hit"]) == (False, True)
    assert first["manifest"]["calibration"]["sha256"] == plan.sha256_file(tmp_path / "calib.npz")
    bad = tmp_path / "wrong.npz"
    np.savez(bad, not_an_input=np.zeros((4, 3, 16, 16), np.float32))
    proc = _cli(
        "optimize",
        str(src),
        "-o",
        str(tmp_path / "p2"),
        "--precision",
        "int8",
        "--calibration-data",
        str(bad),
        env_cache=plan_cache,
    )
    assert proc.returncode == 2 and "calibration data lacks input(s) input" in proc.stderr


def test_cache_hit_keeps_the_requested_model_name(tmp_path):
    src = models.mlp(tmp_path / "mlp.onnx")
    optimize(src, tmp_path / "a", OptimizeOptions(name="first"))
    hit = optimize(src, tmp_path / "b", OptimizeOptions(name="second"))
    assert hit.cache_hit and hit.manifest["name"] == "second"
    assert plan.load(tmp_path / "b").name == "second" and plan.load(tmp_path / "a").name == "first"
