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


def test_the_runtime_suite_lists_each_saved_optimizer_row_with_the_plans_choice_and_its_verdict(tmp_path,
                                                                                                 monkeypatch) -> None:
    """BENCHMARKS.md's GPU optimizer lines: which candidate the plan ran, the ratio's spread, the target's verdict."""
    import json

    from bench.suites import runtime

    row = {"batch": 256, "baseline_img_s": 27829.1, "ngcx_img_s": 42072.6, "target": 1.2, "met": True,
           "speedup": {"median": 1.4957, "min": 1.4383, "max": 1.5118}}
    doc = {"env": {"gpu": "NVIDIA H200"}, "models": {"resnet50": {
        "baseline": "torch.compile(...)", "rows": [row],
        "optimizer": {"choices": {"256": {"candidate": "fp16 cudnn-fused channels-last"}}}}}}
    (tmp_path / "optimizer_resnet50.json").write_text(json.dumps(doc))
    monkeypatch.setattr(runtime, "OPTIMIZER_RESULTS", tmp_path)
    [line] = runtime.optimizer_notes(runtime.optimizer_reference())
    assert "resnet50 batch 256" in line and "ngcx plan (fp16 cudnn-fused channels-last) 42,073 img/s" in line
    assert "= 1.50x (min 1.44, max 1.51), target 1.2x met" in line
