"""examples.yaml: every mismatch with the model is one problem naming the example and the tensor,
compare() says how far off an output is, and both shipped example projects are consistent.

Why: `ngcx test` sends these examples to a running server. An example that cannot reach the model
(wrong name, datatype, rank, fixed dim) must fail at load with file:line and the fix, not as a 400
in the middle of a test run; a mismatch must read as a diff (max error, first index), not "False".
The example projects' expected outputs are checked against their models here, offline, so a
change of export.py or of the examples cannot ship an example that fails for every user.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ngcx.core.errors import UserError
from ngcx.core.problems import ProblemsFound
from ngcx.project.examples import Expected, compare, load_examples, load_project_examples
from ngcx.project.sniff import handler_attributes, onnx_signature, project_signature
from ngcx.project.spec import load_project

REPO = Path(__file__).parents[2]
SIG_IN = [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 4, 4]},
          {"name": "mask", "datatype": "BOOL", "shape": [-1, 4]}]
SIG_OUT = [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


def write(root: Path, text: str) -> Path:
    file = root / "examples.yaml"
    file.write_text(text)
    return file


def problems(file: Path, inputs=SIG_IN, outputs=SIG_OUT) -> list[tuple[str, str, str]]:
    with pytest.raises(ProblemsFound) as info:
        load_examples(file, inputs, outputs)
    return [(p.where, p.rule, p.line()) for p in info.value.problems]


GOOD = """\
examples:
  - name: ok
    inputs:
      image: {datatype: FP32, shape: [1, 3, 4, 4], npy: x.npy}
      mask: {datatype: BOOL, shape: [1, 4], data: [[true, false, true, true]]}
    outputs:
      logits: {data: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], rtol: 1.0e-3, atol: 1.0e-4}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    np.save(tmp_path / "x.npy", np.arange(48, dtype=np.float64).reshape(1, 3, 4, 4))
    (tmp_path / "cat.png").write_bytes(b"\x89PNG\r\n\x1a\n fake but bytes are bytes")
    return tmp_path


def test_a_valid_file_builds_numpy_inputs_of_the_declared_types(root):
    [ex] = load_examples(write(root, GOOD), SIG_IN, SIG_OUT)
    assert ex.inputs["image"].dtype == np.float32 and ex.inputs["image"].shape == (1, 3, 4, 4)
    assert ex.inputs["mask"].tolist() == [[True, False, True, True]] and ex.datatypes["mask"] == "BOOL"
    assert (ex.outputs["logits"].rtol, ex.outputs["logits"].atol) == (1e-3, 1e-4)
    assert ex.kserve_inputs()[1] == {"name": "mask", "datatype": "BOOL", "shape": [1, 4],
                                     "data": [True, False, True, True]}


def test_a_file_input_is_one_bytes_element_with_the_raw_bytes(root):
    file = write(root, "examples:\n  - name: cat\n    inputs:\n"
                       "      image: {datatype: BYTES, shape: [1], file: cat.png}\n"
                       "    outputs:\n      labels: {data: [tabby]}\n")
    [ex] = load_examples(file, [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
                         [{"name": "labels", "datatype": "BYTES", "shape": [-1]}])
    assert ex.inputs["image"].dtype == object and ex.inputs["image"][0] == (root / "cat.png").read_bytes()
    assert ex.outputs["labels"].exact and ex.outputs["labels"].array.tolist() == [b"tabby"]


def test_examples_that_do_not_match_the_signature_name_example_tensor_and_fix(root):
    file = write(root, """\
examples:
  - name: typo
    inputs:
      imgae: {datatype: FP32, shape: [1, 3, 4, 4], npy: x.npy}
      mask: {datatype: BOOL, shape: [1, 4], data: [true, true, true, true]}
  - name: wrong-type-and-rank
    inputs:
      image: {datatype: FP16, shape: [3, 4, 4], data: [0]}
      mask: {datatype: BOOL, shape: [1, 5], data: [true, true, true, true, true]}
    outputs:
      probs: {data: [1]}
""")
    found = problems(file)
    where = [w for w, _, _ in found]
    rules = [r for _, r, _ in found]
    assert rules == ["examples.unknown-input", "examples.missing-input", "examples.datatype", "examples.shape",
                     "examples.shape", "examples.unknown-output", "examples.count"]
    assert where[:2] == [f"{file}:4", f"{file}:3"] and where[2] == f"{file}:8" and where[5] == f"{file}:11"
    lines = [line for _, _, line in found]
    assert "example 'typo': the model has no input 'imgae'" in lines[0] and "did you mean 'image'?" in lines[0]
    assert "input 'image' is missing" in lines[1] and "add image: {datatype: FP32, shape: [1, 3, 4, 4]" in lines[1]
    assert "input 'image' is FP16 but the model takes FP32" in lines[2]
    assert "rank 3, the model's has rank 4" in lines[3]
    assert "has 5 at dim 1 where the model fixes 4" in lines[4]
    assert "no output 'probs'" in lines[5] and "logits" in lines[5]
    assert "1 values do not fill shape [3, 4, 4]" in lines[6]


@pytest.mark.parametrize(("text", "rule", "line"), [
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], data: [1], npy: x.npy}\n",
     "schema.value_error", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], dat: [1]}\n",
     "schema.unknown-key", 4),
    ("examples:\n  - name: a\n    inputs: {}\n", "schema.too_short", 3),
    ("examples: []\n", "schema.too_short", 1),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], file: cat.png}\n",
     "examples.file-not-bytes", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: BYTES, shape: [1], file: ../../etc/passwd}\n",
     "path.outside", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], npy: nope.npy}\n",
     "path.missing", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [2], data: [1, [2, 3]]}\n",
     "examples.ragged", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], data: [one]}\n",
     "examples.values", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP33, shape: [1], data: [1]}\n",
     "examples.datatype-unknown", 4),
    ("examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], data: [1]}\n"
     "  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], data: [1]}\n",
     "examples.duplicate-name", 5),
])
def test_malformed_examples_are_one_problem_with_file_and_line(root, text, rule, line):
    file = write(root, text)
    with pytest.raises(ProblemsFound) as info:
        load_examples(file)                                         # no signature: only the file's own rules
    first = info.value.problems[0]
    assert (first.rule, first.where) == (rule, f"{file}:{line}")
    assert "\n" not in info.value.line()


def test_bad_yaml_and_missing_files_are_user_errors(root):
    with pytest.raises(UserError, match=r"examples.yaml:\d+:\d+: malformed YAML"):
        load_examples(write(root, "examples:\n  - name: a\n    inputs: [\n"))
    with pytest.raises(UserError, match="duplicate key 'name'"):
        load_examples(write(root, "examples:\n  - name: a\n    name: b\n    inputs: {}\n"))
    with pytest.raises(ProblemsFound, match="must be a mapping"):
        load_examples(write(root, "- just a list\n"))
    with pytest.raises(UserError, match="cannot read"):
        load_examples(root / "absent.yaml")


# ----------------------------------------------------------------------------- compare


def expected(data, rtol=1e-3, atol=1e-4, shape=None) -> Expected:
    arr = np.array(data)
    if arr.dtype.kind in "US":
        arr = np.array([s.encode() for s in arr.reshape(-1)], dtype=object).reshape(arr.shape)
    elif arr.dtype.kind == "f":
        arr = arr.astype(np.float64)
    return Expected(arr, shape, rtol, atol)


def test_compare_passes_within_tolerance_and_reports_the_worst_and_first_miss():
    want = {"y": expected([[1.0, 2.0, 3.0, 0.0]], rtol=1e-3, atol=1e-4)}
    assert compare(want, {"y": np.array([[1.0005, 2.001, 2.998, 5e-5]], dtype=np.float32)}) == []
    [line] = compare(want, {"y": np.array([[1.0, 2.5, 3.0, 0.01]], dtype=np.float32)})
    assert line.startswith("y: 2 of 4 values outside rtol=0.001 atol=0.0001")
    assert "max abs error 0.5" in line and "first at [0, 1]: got 2.5, expected 2" in line
    [line] = compare(want, {"y": np.array([[1.0, np.nan, 3.0, 0.0]])})
    assert "1 of 4" in line and "got nan" in line


def test_compare_is_exact_for_bytes_and_integers_and_checks_presence_and_shape():
    labels = {"labels": expected(["tabby", "tiger"])}
    assert compare(labels, {"labels": np.array([b"tabby", b"tiger"], dtype=object)}) == []
    assert compare(labels, {"labels": np.array(["tabby", "tiger"], dtype=object)}) == []     # str is sent as UTF-8
    [line] = compare(labels, {"labels": np.array([b"tabby", b"lynx"], dtype=object)})
    assert line == "labels: 1 of 2 values differ; first at [1]: got b'lynx', expected b'tiger'"
    [line] = compare({"n": expected([3, 4])}, {"n": np.array([3, 5], dtype=np.int64)})
    assert "first at [1]: got 5, expected 4" in line
    assert compare({"n": expected([3, 4])}, {}) == ["n: missing from the response (got no outputs)"]
    [line] = compare({"y": expected([[1.0, 2.0]], shape=(1, 2))}, {"y": np.array([1.0, 2.0])})
    assert line == "y: shape [2], expected [1, 2]"
    assert compare({"y": expected([1.0, 2.0])}, {"y": np.array([[1.0, 2.0]])}) == []        # flat: values only
    [line] = compare({"y": expected([1.0, 2.0])}, {"y": np.array([1.0, 2.0, 3.0])})
    assert "3 values, expected 2" in line


def test_expected_outputs_keep_a_nested_list_shape(root):
    file = write(root, "examples:\n  - name: a\n    inputs:\n      image: {datatype: FP32, shape: [1], data: [1]}\n"
                       "    outputs:\n      y: {data: [[1.5, 2]]}\n      z: {data: [1, 2], shape: [2, 1]}\n")
    [ex] = load_examples(file)
    assert ex.outputs["y"].shape == (1, 2) and ex.outputs["z"].shape == (2, 1) and ex.outputs["z"].exact
    assert (ex.outputs["y"].rtol, ex.outputs["y"].atol) == (1e-4, 1e-5)                      # float defaults


# ----------------------------------------------------------------------------- the shipped example projects


def project_copy(name: str, tmp_path: Path) -> Path:
    """The example folder as a user checks it out (no generated model), then its export.py run into it."""
    src = REPO / "examples" / name
    dst = tmp_path / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model", "calib.npz", "__pycache__"))
    return dst


def export(script: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_onnx_zero_code_examples_fit_the_model_and_its_fp32_reference(tmp_path):
    import onnxruntime

    root = project_copy("onnx-zero-code", tmp_path)
    committed = (root / "samples" / "image.npy").read_bytes()
    export(root / "export.py", "--out", str(root))
    assert (root / "samples" / "image.npy").read_bytes() == committed        # export.py is deterministic
    session = None
    for file, precision in (("ngcx.yaml", "int8"), ("ngcx.fp16.yaml", "fp16")):
        project = load_project(root / file)
        assert project.spec.handler is None and project.spec.model.precision == precision
        sig = onnx_signature(project.model)
        assert project_signature(project) == sig
        [ex] = load_examples(project.examples, sig.inputs, sig.outputs)
        session = session or onnxruntime.InferenceSession(str(project.model), providers=["CPUExecutionProvider"])
        got = {"logits": session.run(None, ex.inputs)[0]}
        assert compare(ex.outputs, got) == []                                # the FP32 reference is right
        atol = ex.outputs["logits"].atol
        assert compare(ex.outputs, {"logits": got["logits"] + 2 * atol}) != []   # and the tolerance bites
    assert project.spec.name != load_project(root / "ngcx.yaml").spec.name      # two images side by side
    calib = np.load(root / "calib.npz")
    assert set(calib.files) == {i["name"] for i in sig.inputs} and calib["image"].shape[1:] == (3, 32, 32)


def load_handler(root: Path):
    spec = importlib.util.spec_from_file_location("resnet_example_handler", root / "handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_resnet_classifier_examples_fit_the_handler_and_the_model_fits_the_handler(tmp_path):
    root = project_copy("resnet-classifier", tmp_path)
    export(root / "export.py", "--out", str(root / "model" / "resnet18.onnx"))
    project = load_project(root / "ngcx.yaml")
    assert project.spec.handler == "handler:Classifier" and project.spec.files == ["labels.txt"]
    sig = onnx_signature(project.model)
    assert sig.inputs == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert sig.outputs == [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]
    handler = load_handler(root)
    declared = project_signature(project)                                     # read without importing it
    assert (declared.inputs, declared.outputs) == (handler.Classifier.inputs, handler.Classifier.outputs)
    [ex] = load_project_examples(project)
    assert ex.inputs["image"][0] == (root / "samples" / "cat.png").read_bytes()
    labels = (root / "labels.txt").read_text().splitlines()
    assert len(labels) == 1000 == len(set(labels))
    import json

    assert all(label in labels for label in json.loads(ex.outputs["labels"].array[0]))


def test_resnet_classifier_handler_answers_the_committed_top5(tmp_path):
    """The full handler path (Pillow decode -> ResNet-18 on ngcx-runtime's engine -> top-5 JSON)."""
    pytest.importorskip("PIL", reason="Pillow is not installed on this host (the image installs it)")
    from types import SimpleNamespace

    from ngcx_runtime import plan

    root = project_copy("resnet-classifier", tmp_path)
    export(root / "export.py", "--out", str(root / "model" / "resnet18.onnx"))
    project = load_project(root / "ngcx.yaml")
    handler = load_handler(root).Classifier()
    handler.load(SimpleNamespace(engine=plan.load(project.model), model_path=project.model, app_dir=root))
    [ex] = load_examples(project.examples, handler.inputs, handler.outputs)
    assert compare(ex.outputs, handler.predict(ex.inputs)) == []
    assert handler.predict(handler.warmup_inputs())["labels"].shape == (1,)


def test_the_signature_known_before_building_comes_from_the_handler_source_or_the_model(tmp_path):
    """Handler tensors are read with ast (its imports need not exist on the host); without them the
    model's signature applies (the contract); computed at run time, it is unknown (None)."""
    source = tmp_path / "h.py"
    source.write_text("import pillow_that_is_not_here\nTOP = 5\nclass A:\n    inputs = [{'name': 'image', "
                      "'datatype': 'BYTES', 'shape': [-1]}]\n    outputs = [{'name': 'p', 'datatype': 'FP32', "
                      "'shape': [-1, TOP]}]\nclass B:\n    def predict(self, inputs): ...\n"
                      "class C:\n    inputs = make()\n    outputs = []\n")
    assert handler_attributes(source, "A") == {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
                                               "outputs": [{"name": "p", "datatype": "FP32", "shape": [-1, 5]}]}
    assert handler_attributes(source, "B") == {} and handler_attributes(source, "C") is None
    models_dir = Path(__file__).parents[1] / "runtime"
    sys.path.insert(0, str(models_dir))
    import models

    models.mlp(tmp_path / "m.onnx")
    (tmp_path / "ngcx.yaml").write_text("name: t\nbase: onnxruntime:25.08\nmodel: {path: m.onnx}\n"
                                        "handler: h:B\nexamples: ex.yaml\n")
    (tmp_path / "ex.yaml").write_text("examples:\n  - name: a\n    inputs:\n"
                                      "      x: {datatype: FP32, shape: [1, 31], data: [0]}\n")
    project = load_project(tmp_path / "ngcx.yaml")
    assert project_signature(project) == onnx_signature(tmp_path / "m.onnx")       # B declares nothing
    with pytest.raises(ProblemsFound, match="has 31 at dim 1 where the model fixes 32"):
        load_project_examples(project)
