"""The `ngcx-runtime` entry point and the engines that cannot run on this machine."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ngcx_runtime import backends
from ngcx_runtime.errors import RuntimeUserError


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ngcx_runtime.cli", *args], capture_output=True, text=True, timeout=60)


# What a user of every image can type; written out here (not read from cli.COMMANDS) so a deleted
# command module fails this test instead of silently shrinking the list.
RUNTIME_COMMANDS = {"info", "optimize", "serve", "bench", "selftest"}


def test_help_lists_every_runtime_command():
    out = _run("--help").stdout
    commands = out.split("COMMAND\n", 1)[1].split("\noptions:", 1)[0]
    listed = {line.split()[0] for line in commands.splitlines() if line.startswith("    ") and line.split()}
    assert listed == RUNTIME_COMMANDS


def test_a_missing_command_module_is_an_error_not_a_silent_gap(monkeypatch):
    from ngcx_runtime import cli

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "no_such_command"))
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()


def test_the_version_is_the_packages_own_everywhere():
    """Images install the distribution `ngcx-runtime`, not `ngcx`: manifests and /v2 once said 0+unknown."""
    import ngcx
    import ngcx_runtime
    from ngcx.render.dockerfile import runtime_package_files
    from ngcx_runtime.plan import runtime_version

    assert ngcx_runtime.__version__ != "0+unknown"
    assert runtime_version() == ngcx.__version__ == ngcx_runtime.__version__
    assert f'version = "{ngcx_runtime.__version__}"' in runtime_package_files()["pyproject.toml"].decode()
    from importlib.metadata import version

    assert version("ngcx") == ngcx_runtime.__version__       # pyproject reads the same attribute


def test_runtime_cli_imports_only_numpy_at_startup():
    code = (
        "import sys; import ngcx_runtime.cli as c; c.build_parser(); "
        "print(sorted(m for m in ('onnxruntime', 'onnx', 'torch', 'tensorrt') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_no_command_prints_help_and_exits_2():
    proc = _run()
    assert proc.returncode == 2 and "usage" in proc.stdout


def test_unknown_model_type_is_one_line_exit_2(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    proc = _run("optimize", str(f), "-o", str(tmp_path / "p"))
    assert proc.returncode == 2 and "unsupported model type .bin" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_plan_is_one_line_exit_2(tmp_path):
    proc = _run("bench", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "no such model or plan directory" in proc.stderr


def test_tensorrt_backend_reports_why_it_is_unusable():
    ok, reason = backends.get("tensorrt").availability()
    if ok:
        pytest.skip("TensorRT is usable here; the refusal path does not apply")
    assert reason in (
        "tensorrt is not installed",
        "tensorrt needs an NVIDIA GPU and none is visible",
    ) or reason.startswith("cuda-python")


def test_choosing_an_unusable_backend_is_a_user_error(tmp_path):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import models

    pytest.importorskip("onnx")
    src = models.mlp(tmp_path / "m.onnx")
    if backends.get("tensorrt").availability()[0]:
        pytest.skip("TensorRT is usable here")
    with pytest.raises(RuntimeUserError, match="backend tensorrt is not usable here"):
        backends.choose(src, "tensorrt")


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is None,
    reason="tensorrt is not installed (TensorRT cannot be installed on this project's machines); "
    "the tensorrt backend is written against the documented 10.x/11.x API, unverified",
)
def test_tensorrt_fp16_plan_builds_and_matches(tmp_path):
    import models
    import numpy as np

    from ngcx_runtime import plan
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    src = models.conv_net(tmp_path / "c.onnx")
    res = optimize(src, tmp_path / "p", OptimizeOptions(precision="fp16", batch_profile=[1, 8]), backend="tensorrt")
    feeds = models.sample_inputs("conv", 4)
    got = plan.load(res.plan_dir).infer(feeds)["logits"]
    ref = plan.load(src, backend="onnxruntime").infer(feeds)["logits"]
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2
    assert (res.plan_dir / "timing.cache").is_file()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed on this machine; the pytorch backend ran on the lent GPU "
    "(bench/gpu/resnet50.py, results in bench/results/gpu/resnet50/)",
)
def test_pytorch_plan_from_torch_export(tmp_path):
    import numpy as np
    import torch

    from ngcx_runtime import plan
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    ep = torch.export.export(net, (torch.randn(2, 8),), dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    res = optimize(tmp_path / "m.pt2", tmp_path / "p", OptimizeOptions(precision="fp32", batch_profile=[1, 8]))
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    got = next(
        iter(
            plan.load(res.plan_dir)
            .infer({"x": x} if "x" in str(res.manifest["inputs"]) else {res.manifest["inputs"][0]["name"]: x})
            .values()
        )
    )
    want = net(torch.from_numpy(x)).detach().numpy()
    assert np.abs(got - want).max() < 1e-4
