"""`ngcx.yaml` as users write it: every mistake is one problem with file:line, the fix, and a rule id.

Why these cases: they are the mistakes app-projects.md reports from cog / BentoML / Truss users
(a pin silently replaced, 25.10 read as a number, a file that is not a model, a typo in a key),
and the schema users' editors validate against must be the one the CLI enforces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ngcx.core.problems import ProblemsFound
from ngcx.project import find_project_file
from ngcx.project.spec import json_schema, load_project, schema_file, sniff_format

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402


@pytest.fixture
def project(tmp_path: Path) -> Path:
    models.mlp(tmp_path / "model.onnx")
    (tmp_path / "handler.py").write_text("class Handler:\n    pass\n")
    return tmp_path


def write(root: Path, text: str) -> Path:
    file = root / "ngcx.yaml"
    file.write_text(text)
    return file


def problems(file: Path) -> list[tuple[str, str, str]]:
    """(where, field, rule) of every problem load_project reports."""
    with pytest.raises(ProblemsFound) as info:
        load_project(file)
    return [(p.where, p.field, p.rule) for p in info.value.problems]


def test_a_valid_project_completes_against_the_catalog(project):
    file = write(project, "name: demo\nbase: onnxruntime:25.08\nmodel:\n  path: model.onnx\n  batch: [1, 8]\n"
                          "env:\n  THREADS: 4\n  DEBUG: true\nhandler: handler:Handler\n")
    p = load_project(file)
    assert (p.release.ref, p.model_format, p.model_name, p.image_tag) == (
        "onnxruntime:25.08", "onnx", "demo", "ngcx-app/demo:latest")
    assert p.spec.env == {"THREADS": "4", "DEBUG": "true"}
    assert find_project_file(project) == file


def test_unknown_key_and_number_release_point_at_their_lines(project):
    file = write(project, "name: demo\nbase: onnxruntime:25.08\nmodel:\n  path: model.onnx\n  precison: fp16\n"
                          "examples: 25.10\n")
    assert problems(file) == [(f"{file}:5", "model.precison", "schema.unknown-key"),
                              (f"{file}:6", "examples", "schema.number-not-string")]


def test_unknown_base_names_the_closest_release(project):
    file = write(project, "name: demo\nbase: onnxruntim:25.08\nmodel: {path: model.onnx}\n")
    with pytest.raises(ProblemsFound) as info:
        load_project(file)
    assert "did you mean onnxruntime" in info.value.line() and f"{file}:2" in info.value.line()


def test_a_requirement_that_would_replace_a_pin_is_refused_before_any_build(project):
    (project / "requirements.txt").write_text("# mine\npillow>=10\nTorch==2.1.0  # old\n")
    file = write(project, "name: demo\nbase: pytorch:24.11\nrequirements: requirements.txt\n"
                          "python_packages: ['nvidia-cudnn-cu12>=9.5']\nmodel: {path: model.onnx}\n")
    with pytest.raises(ProblemsFound) as info:
        load_project(file)
    lines = [p.line() for p in info.value.problems]
    assert [p.rule for p in info.value.problems] == ["packages.breaks-pin"] * 2
    assert "'nvidia-cudnn-cu12>=9.5' would replace nvidia-cudnn-cu12==9.1.0.70" in lines[0]
    assert lines[1].startswith(f"{project / 'requirements.txt'}:3: requirements: requirement 'Torch==2.1.0' "
                               "would replace torch==2.5.1, pinned by pytorch:24.11")


def test_a_file_that_is_not_a_model_and_missing_paths(project):
    (project / "notes.onnx").write_text("hello")
    file = write(project, "name: Demo!\nbase: onnxruntime:25.08\nmodel: {path: notes.onnx, precision: int8}\n"
                          "files: [src/]\nhandler: nothere:X\nports: [0]\n")
    rules = {rule for _, _, rule in problems(file)}
    assert rules == {"name.invalid", "model.not-a-model", "model.int8-needs-calibration", "path.missing",
                     "handler.missing", "ports.range"}


def test_a_path_outside_the_project_folder_is_refused(project, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "m.onnx"
    models.mlp(outside)
    file = write(project, f"name: demo\nbase: onnxruntime:25.08\nmodel: {{path: {outside}}}\n")
    assert [rule for _, _, rule in problems(file)] == ["path.outside"]


def test_sniffing_reads_content_not_names(project, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes((project / "model.onnx").read_bytes())
    saved = tmp_path / "sm"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"\x08\x01")
    assert (sniff_format(renamed), sniff_format(saved), sniff_format(project / "handler.py")) == (
        "onnx", "savedmodel", None)


def test_the_published_json_schema_is_the_one_enforced():
    """Regenerate with: .venv/bin/python -c 'from ngcx.project.spec import *; import json;
    schema_file().write_text(json.dumps(json_schema(), indent=2) + "\\n")'"""
    assert json.loads(schema_file().read_text()) == json_schema()


def test_code_in_yaml_is_never_run(project, tmp_path):
    marker = tmp_path / "pwned"
    file = write(project, f"name: !!python/object/apply:os.system ['touch {marker}']\nbase: onnxruntime:25.08\n")
    with pytest.raises(Exception) as info:  # noqa: PT011 - any refusal, as long as nothing ran
        load_project(file)
    assert not marker.exists()
    assert "python/object" in str(info.value)
