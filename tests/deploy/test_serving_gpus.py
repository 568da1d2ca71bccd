"""The deploy's ready line and `deployments show` say how many GPUs serve (issue 50, part 3).

What a user notices: after `ngcx deploy` on a 4-GPU instance the output says "4 GPUs serve (all 4 of the
g5.12xlarge)", read from the server itself (each served model's instance_group), and says so plainly when the
model serves on the CPU. The server below is a real ngcx-runtime server on this CPU-only machine (its instances
run on the CPU); the lines for GPU counts are checked on records, with the offers tables' real GPU counts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from ngcx.deploy.common import DeployRecord
from ngcx.deploy.security import gpus_line, serving_gpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # models.py, beside the serving tests
import models  # noqa: E402


def _record(cloud: str, itype: str | None, gpus: int | None) -> DeployRecord:
    spec = {} if gpus is None else {"serving_gpus": gpus}
    return DeployRecord(id=7, cloud=cloud, image="img", status="ready", created_at=time.time(),
                        updated_at=time.time(), instance_type=itype, spec=spec)


def test_a_model_served_on_the_cpu_counts_no_gpu(tmp_path):
    pytest.importorskip("onnxruntime")
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    engine = load(models.mlp(tmp_path / "mlp.onnx"), backend="onnxruntime")
    handle = start_server([engine, load(tmp_path / "mlp.onnx", backend="onnxruntime")], "127.0.0.1", 0, name="mlp")
    try:
        assert serving_gpus(handle.url, None, None, ["mlp"]) == 0
        assert serving_gpus(handle.url, None, None, ["nope"]) is None, "a model the server lacks says nothing"
    finally:
        handle.stop()


def test_an_unreachable_endpoint_never_fails_the_deploy():
    assert serving_gpus("http://127.0.0.1:9", None, None, ["mlp"]) is None


def test_the_line_names_the_gpus_serving_against_the_instance_types_count():
    assert gpus_line(_record("aws", "g5.12xlarge", 4)) == "4 GPUs serve (all 4 of the g5.12xlarge)"
    assert gpus_line(_record("aws", "g5.12xlarge", 1)) == "1 GPU serves (the g5.12xlarge has 4)"
    assert gpus_line(_record("aws", "g4dn.xlarge", 1)) == "1 GPU serves"
    assert gpus_line(_record("local", None, 2)) == "2 GPUs serve"
    assert gpus_line(_record("aws", "g5.12xlarge", 0)) == "serving on the CPU (the g5.12xlarge has 4 GPUs)"
    assert gpus_line(_record("aws", "g5.12xlarge", None)) is None
