"""`ngcx-runtime bench`: every PLASTER field, in-process and through the KServe server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import models
import numpy as np
import pytest

from ngcx_runtime import probe
from ngcx_runtime.optimize import OptimizeOptions, optimize

pytest.importorskip("onnxruntime")


def _bench(*args: str, cache) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ngcx_runtime.cli", "bench", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NGCX_RUNTIME_CACHE": str(cache)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_bench_plan_reports_every_plaster_field(tmp_path, plan_cache):
    src = models.conv_net(tmp_path / "conv.onnx")
    optimize(src, tmp_path / "plan", OptimizeOptions(precision="fp16", batch_profile=[1, 8]))
    r = _bench(
        str(tmp_path / "plan"),
        "--batch",
        "1,8",
        "--concurrency",
        "1,2",
        "--duration",
        "0.3",
        "--serve",
        cache=plan_cache,
    )
    assert (r["backend"], r["precision"], r["device"], r["gpu"]) == ("onnxruntime", "fp16", "cpu", "cpu")
    assert r["sizes"]["model_bytes"] == src.stat().st_size
    assert r["sizes"]["plan_bytes"] > 0
    acc = r["accuracy"]["outputs"]["logits"]
    assert 0 < acc["max_abs_err"] < 1e-2 and 0 < acc["mean_rel_err"] < 1e-2
    assert acc["top1_agreement"] == 1.0
    has_nvml = bool(probe.gpus())
    assert r["energy"] == "nvml energy counter" if has_nvml else r["energy"].startswith("n/a: no NVML")
    modes = {(x["mode"], x["batch"], x["concurrency"]) for x in r["results"]}
    assert modes == {
        ("in-process", 1, 1),
        ("in-process", 8, 1),
        ("http", 1, 1),
        ("http", 1, 2),
        ("http", 8, 1),
        ("http", 8, 2),
    }
    for row in r["results"]:
        lat = row["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"]
        assert row["throughput_inf_s"] > 0 and row["inferences"] == row["requests"] * row["batch"]
        if has_nvml:
            assert row["energy_j_per_inference"] > 0
        else:
            assert row["energy_j_per_inference"] is None
    # the served figures' client is the stdlib one by default, on every machine, tritonclient installed or not
    assert r["http_client"] == "http.client (binary tensor extension)"
    assert {row["client"] for row in r["results"] if row["mode"] == "http"} == {r["http_client"]}


def test_bench_measures_with_the_http_client_asked_for_and_names_it(tmp_path, plan_cache):
    pytest.importorskip("tritonclient.http")
    src = models.conv_net(tmp_path / "conv.onnx")
    r = _bench(str(src), "--batch", "1", "--concurrency", "1", "--duration", "0.2", "--serve",
               "--http-client", "tritonclient", cache=plan_cache)
    assert r["http_client"] == "tritonclient.http (binary tensor extension)"
    assert [row["client"] for row in r["results"] if row["mode"] == "http"] == [r["http_client"]]


def test_bench_uses_calibration_data_for_the_accuracy_delta(tmp_path, plan_cache):
    src = models.mlp(tmp_path / "mlp.onnx")
    data = models.sample_inputs("mlp", 40, seed=9)
    np.savez(tmp_path / "val.npz", **data)
    optimize(
        src,
        tmp_path / "plan",
        OptimizeOptions(precision="int8", batch_profile=[1, 64], calibration=data, calibration_sha256="v"),
    )
    r = _bench(
        str(tmp_path / "plan"),
        "--batch",
        "1",
        "--duration",
        "0.2",
        "--calibration-data",
        str(tmp_path / "val.npz"),
        cache=plan_cache,
    )
    acc = r["accuracy"]
    assert acc["inputs"] == "calibration/validation data" and acc["samples"] == 40
    assert acc["outputs"]["y"]["max_abs_err"] > 0  # int8 is not bit-exact: the delta is real
    assert [x["mode"] for x in r["results"]] == ["in-process"]


def test_bench_raw_model_is_its_own_reference(tmp_path, plan_cache):
    r = _bench(str(models.mlp(tmp_path / "mlp.onnx")), "--batch", "4", "--duration", "0.2", cache=plan_cache)
    assert "skipped" in r["accuracy"] and r["precision"] == "fp32"


def test_bench_bad_duration_is_one_line_exit_2(tmp_path, plan_cache):
    proc = subprocess.run(
        [sys.executable, "-m", "ngcx_runtime.cli", "bench", str(models.mlp(tmp_path / "m.onnx")), "--duration", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--duration" in proc.stderr and "Traceback" not in proc.stderr
