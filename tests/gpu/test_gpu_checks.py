"""pytest entry for the GPU proofs: runs tests/gpu/gpu_checks.py where a GPU is, skips elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ngcx_runtime import probe

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not probe.gpus(), reason="no NVIDIA GPU visible (NVML/libcuda found no device)")
def test_gpu_checks_pass_on_this_gpu(tmp_path):
    script = Path(__file__).with_name("gpu_checks.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=script.parents[2],
    )
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert "failed" not in summary.values(), proc.stdout[-3000:]
    assert summary["probe"] == "passed" and summary["matmul"] == "passed"
