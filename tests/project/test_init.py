"""`ngcx init`: what a user gets from a model file, and what it refuses (no Docker needed).

Why these cases: init is the first thing a user runs, so the files it writes must load as they
are (ngcx.yaml through load_project, examples.yaml against the model's real signature), the
handler stub must follow the contract the server calls, and every refusal (a file in the way,
a file that is not a model, a base that cannot read the model) must be one line, exit 2, with
nothing written (issue 9).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ngcx.project.examples import load_examples
from ngcx.project.sniff import onnx_signature
from ngcx.project.spec import load_project

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402


def ngcx(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    """A real ONNX classifier outside the project folder: input [N,3,16,16] FP32 -> logits [N,10]."""
    return models.conv_net(tmp_path / "exports" / "conv.onnx")


def test_init_writes_a_project_that_loads_and_whose_examples_fit_the_model(tmp_path, conv):
    proc = ngcx("init", "My Classifier", "--model", str(conv), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "My Classifier"
    assert (root / "model" / "conv.onnx").read_bytes() == conv.read_bytes()     # copied into the build context
    project = load_project(root / "ngcx.yaml")
    assert (project.name, project.release.ref, project.model_format) == ("my-classifier", "onnxruntime:25.08", "onnx")
    assert project.spec.model.batch == [1, 8]                                   # dim 0 is dynamic everywhere
    sig = onnx_signature(project.model)
    assert sig.inputs == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert sig.outputs == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    [example] = load_examples(project.examples, sig.inputs, sig.outputs)
    assert example.inputs["input"].shape == (1, 3, 16, 16) and not example.inputs["input"].any()
    assert example.outputs == {}                                                # left for the user
    assert "logits" in (root / "examples.yaml").read_text()                     # ... with the output named
    assert not (root / "handler.py").exists()
    assert "wrote ngcx.yaml" in proc.stdout


def test_a_model_inside_the_folder_is_referenced_not_copied(tmp_path):
    models.mlp(tmp_path / "mlp.onnx")
    proc = ngcx("init", "--model", "mlp.onnx", "--name", "tabular", "--base", "onnxruntime:25.08", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    project = load_project(tmp_path / "ngcx.yaml")
    assert project.spec.model.path == "mlp.onnx" and not (tmp_path / "model").exists()
    [example] = load_examples(project.examples, *_sig(project.model))
    assert example.inputs["x"].shape == (1, 32)                                 # small: written inline
    assert "data: [0, 0" in (tmp_path / "examples.yaml").read_text()


def _sig(model: Path) -> tuple[list, list]:
    sig = onnx_signature(model)
    return sig.inputs, sig.outputs


def test_init_refuses_to_overwrite_without_force(tmp_path, conv):
    root = tmp_path / "proj"
    assert ngcx("init", str(root), "--model", str(conv), cwd=tmp_path).returncode == 0
    (root / "ngcx.yaml").write_text((root / "ngcx.yaml").read_text() + "# my edit\n")
    before = snapshot(root)
    proc = ngcx("init", str(root), "--model", str(conv), "--handler", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "already exist" in proc.stderr and "--force" in proc.stderr
    assert snapshot(root) == before                                              # not even handler.py
    proc = ngcx("init", str(root), "--model", str(conv), "--handler", "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "# my edit" not in (root / "ngcx.yaml").read_text() and (root / "handler.py").is_file()


@pytest.mark.parametrize("content", [b"not a model at all\n", b"\x08\x07garbage that starts like protobuf",
                                     b"PK\x03\x04 a broken zip"])
def test_a_file_that_is_not_a_model_is_one_line_and_writes_nothing(tmp_path, content):
    fake = tmp_path / "model.onnx"
    fake.write_bytes(content)
    proc = ngcx("init", "proj", "--model", str(fake), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not an ONNX, .pt2 or SavedModel model" in proc.stderr
    assert not (tmp_path / "proj").exists()


def test_a_missing_model_and_a_wrong_base_are_one_line(tmp_path, conv):
    proc = ngcx("init", "proj", "--model", "nowhere.onnx", cwd=tmp_path)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = ngcx("init", "proj", "--model", str(conv), "--base", "onnxrutime:25.08", cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean onnxruntime" in proc.stderr
    proc = ngcx("init", "proj", "--model", str(conv), "--base", "cuda:24.05", cwd=tmp_path)
    assert proc.returncode == 2 and "cuda has no framework that reads an ONNX model" in proc.stderr
    assert "onnxruntime:25.08" in proc.stderr                                   # the fix
    proc = ngcx("init", "proj", "--model", str(conv), "--name", "Bad Name", cwd=tmp_path)
    assert proc.returncode == 2 and "not a valid image name" in proc.stderr
    assert not (tmp_path / "proj").exists()


def test_a_pt2_model_without_an_engine_says_what_is_needed(tmp_path):
    """.pt2 signatures are read inside the base image; with no engine, one line and nothing written."""
    pt2 = tmp_path / "model.pt2"
    with zipfile.ZipFile(pt2, "w") as zf:
        zf.writestr("model/archive_format", "pt2")
    proc = ngcx("init", "proj", "--model", str(pt2), cwd=tmp_path,
                env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "Docker Engine not reachable" in proc.stderr
    assert not (tmp_path / "proj").exists()


def test_the_handler_stub_follows_the_contract_and_passes_requests_through(tmp_path, conv, monkeypatch):
    from ngcx_runtime import plan

    root = tmp_path / "proj"
    assert ngcx("init", str(root), "--model", str(conv), "--handler", cwd=tmp_path).returncode == 0
    project = load_project(root / "ngcx.yaml")
    assert project.spec.handler == "handler:Handler"
    spec = importlib.util.spec_from_file_location("generated_handler", root / "handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module.Handler
    assert callable(cls.load) and callable(cls.predict)
    assert cls.inputs == onnx_signature(project.model).inputs and cls.outputs == onnx_signature(project.model).outputs
    monkeypatch.setenv("NGCX_RUNTIME_CACHE", str(tmp_path / "plans"))
    engine = plan.load(project.model)
    handler = cls()
    handler.load(type("Context", (), {"engine": engine, "model_path": project.model, "app_dir": root})())
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(handler.predict({"input": x})["logits"], engine.infer({"input": x})["logits"])
    [example] = load_examples(project.examples, cls.inputs, cls.outputs)    # examples fit the handler too
    assert set(example.inputs) == {"input"}
