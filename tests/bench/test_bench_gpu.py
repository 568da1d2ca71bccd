"""bench/gpu/: the scripts run on a lent GPU machine start as their usage lines say, from any folder.

Why: they run on a machine with a plain checkout and no install, where a moved file or a wrong import
path is found only after the machine has started (minutes of device time). `--help` needs no GPU.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_samples import ROOT


@pytest.mark.parametrize(("script", "option"), [("resnet50.py", "--concurrency"), ("serving.py", "--seconds")])
def test_a_gpu_script_names_its_own_path_and_answers_help_from_anywhere(script: str, option: str, tmp_path) -> None:
    path = ROOT / "bench" / "gpu" / script
    assert f"python3 bench/gpu/{script} --out" in path.read_text()      # the usage line in its docstring
    done = subprocess.run([sys.executable, str(path), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert option in done.stdout and "--out" in done.stdout
