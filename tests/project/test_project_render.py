"""A project's Dockerfile, its layer report and its pip failures, as text (no Docker).

Why: the layer order IS the rebuild time a user sees (a code edit must not re-send the model or
re-run pip), the default command is the runtime's contract, and a pin conflict must reach the user
as one line naming the requirement and the pin. All of that is decided before Docker is involved.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ngcx.core.errors import UserError
from ngcx.project import build as pbuild
from ngcx.project import context as pcontext
from ngcx.project import pip_errors, render
from ngcx.project.spec import load_project

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402

BASE_ID = "sha256:" + "ab" * 32


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    models.mlp(tmp_path / "model.onnx")
    (tmp_path / "handler.py").write_text("class Handler:\n    pass\n")
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    (tmp_path / "calib.npz").write_bytes(b"PK")
    return tmp_path


def load(root: Path, extra: str = "") -> object:
    (root / "ngcx.yaml").write_text(
        "name: demo\nbase: onnxruntime:25.08\nsystem_packages: [libgl1]\npython_packages: [six]\n"
        "model:\n  path: model.onnx\n  precision: int8\n  calibration: calib.npz\n  batch: [1, 8, 32]\n"
        "  max_queue_delay_ms: 2.5\nhandler: handler:Handler\nfiles: [labels.txt]\n"
        'env:\n  GREETING: say "hi" to $USER\nports: [9000]\n' + extra)
    return load_project(root / "ngcx.yaml")


def dockerfile(project, **kw) -> str:
    args = {"base_tag": "ngcx/onnxruntime:25.08-runtime", "base_id": BASE_ID, "has_requirements": True,
            "locked": False, "code_files": ["handler.py", "labels.txt"], "lock_sha": "1" * 64,
            "model_sha": "2" * 64, **kw}
    return render.render(render.make_plan(project, **args))


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions (first word + first argument), continuation lines folded away."""
    out, continued = [], False
    for line in text.splitlines():
        if continued or not line.strip() or line.startswith("#"):
            continued = continued and line.rstrip().endswith("\\")
            continue
        continued = line.rstrip().endswith("\\")
        words = line.split()
        out.append(" ".join(words[:2]) if words[0] in ("COPY", "FROM", "WORKDIR") else words[0])
    return out


def test_layers_come_in_cache_order_with_the_model_alone_before_the_code(project_dir):
    text = dockerfile(load(project_dir))
    assert instructions(text) == [
        "ARG", "FROM ${BASE_IMAGE}", "SHELL", "ARG", "ARG", "RUN",      # base (+ folders for app, model, plans)
        "RUN",                                                           # system packages (apt)
        "RUN",                                                           # wheels
        "COPY model/model.onnx", "COPY calibration/",                    # model: its own layer
        "COPY app/",                                                     # code
        "COPY ngcx.yaml", "WORKDIR /opt/ngcx/app", "ENV", "LABEL", "VOLUME", "EXPOSE", "ENTRYPOINT", "CMD",
    ]
    layers = render.step_layers(text)
    assert list(layers.values()) == ["base", "base", "system packages", "wheels", "model", "model", "code",
                                     "config", "config"]
    assert "ARG BASE_IMAGE=ngcx/onnxruntime:25.08-runtime" in text and BASE_ID in text


def test_wheels_install_under_the_pins_and_the_base_frozen_set_then_check(project_dir):
    text = dockerfile(load(project_dir))
    wheels = text[text.index("# ---- wheels"):text.index("# ---- model")]
    assert "--constraint /etc/ngcx/constraints.txt" in wheels
    assert "frozen > /etc/ngcx/base-frozen.txt" in wheels and "--constraint /etc/ngcx/base-frozen.txt" in wheels
    assert "--mount=type=secret,id=ca" in wheels and "--mount=type=secret,id=pip_conf" in wheels
    assert "pip check" in wheels and "frozen | LC_ALL=C comm -23 /etc/ngcx/base-frozen.txt" in wheels
    assert "--mount=type=bind,source=requirements.txt" in wheels      # the list never becomes a layer of its own
    apt = text[text.index("# ---- system packages"):text.index("# ---- wheels")]
    assert "--mount=type=cache,target=/var/cache/apt" in apt and "libgl1" in apt


def test_default_command_is_explicit_flags_from_the_spec(project_dir):
    text = dockerfile(load(project_dir))
    assert ('CMD ["ngcx-runtime", "serve", "/opt/ngcx/model/model.onnx", "--host", "0.0.0.0", "--port", "9000", '
            '"--name", "demo", "--handler", "handler:Handler", "--precision", "int8", "--batch-profile", "1,8,32", '
            '"--calibration-data", "/opt/ngcx/app/calib.npz", "--max-queue-delay-ms", "2.5"]') in text
    assert "ENTRYPOINT []" in text and "EXPOSE 9000" in text
    assert 'VOLUME ["/var/cache/ngcx/plans"]' in text and "NGCX_RUNTIME_CACHE=\"/var/cache/ngcx/plans\"" in text


def test_a_command_in_ngcx_yaml_replaces_the_default(project_dir):
    text = dockerfile(load(project_dir, "command: [python, -m, http.server]\n"))
    assert 'CMD ["python", "-m", "http.server"]' in text


def test_env_and_labels_are_quoted_so_dollar_and_quotes_stay_literal(project_dir):
    text = dockerfile(load(project_dir))
    assert 'GREETING="say \\"hi\\" to \\$USER"' in text
    for key, value in (("ai.ngcx.project.name", "demo"), ("ai.ngcx.project.base", "onnxruntime:25.08"),
                       ("ai.ngcx.project.base-id", BASE_ID), ("ai.ngcx.project.lock-sha256", "1" * 64),
                       ("ai.ngcx.project.model-sha256", "2" * 64)):
        assert f'{key}="{value}"' in text


def test_a_line_break_in_an_env_value_is_one_line_for_the_user():
    with pytest.raises(UserError, match="env X holds a line break"):
        render.quote("a\nb", "env X")


def test_no_model_no_requirements_no_code_leaves_those_layers_out(tmp_path):
    (tmp_path / "ngcx.yaml").write_text("name: tool\nbase: onnxruntime:25.08\ncommand: [ngcx-runtime, info]\n")
    project = load_project(tmp_path / "ngcx.yaml")
    text = dockerfile(project, has_requirements=False, code_files=[], model_sha=None)
    assert "# ---- wheels" not in text and "# ---- model" not in text and "COPY app/" not in text
    assert "ai.ngcx.project.model-sha256" not in text
    assert set(render.step_layers(text).values()) == {"base", "config"}


# ----------------------------------------------------------------------------- which layer changed


def inputs(**changes) -> dict:
    layers = {"base": {"layers": "b"}, "system packages": {"packages": []}, "wheels": {"requirements": "r"},
              "model": {"model": "m", "calibration": None}, "code": {"handler.py": "h", "labels.txt": "l"},
              "config": {"ngcx.yaml": "y"}}
    for key, value in changes.items():
        layers[key.replace("_", " ")] = value
    return layers


PRESENT = ["base", "wheels", "model", "code", "config"]


def test_a_code_edit_names_the_file_and_the_cached_layers():
    first, why = pcontext.changed_layer(inputs(), inputs(code={"handler.py": "h2", "labels.txt": "l"}), False)
    assert (first, why) == ("code", "handler.py changed")
    assert pcontext.report_line(first, why, PRESENT) == \
        "rebuilding from layer 'code' (handler.py changed); wheels, model: cached"


def test_a_model_change_rebuilds_from_the_model_and_keeps_the_wheels():
    first, why = pcontext.changed_layer(inputs(), inputs(model={"model": "m2", "calibration": None}), False)
    assert pcontext.report_line(first, why, PRESENT) == \
        "rebuilding from layer 'model' (the model changed); wheels: cached"


def test_the_earliest_change_wins_and_first_and_unchanged_builds_say_so():
    new = inputs(wheels={"requirements": "r2"}, code={"handler.py": "h2"})
    assert pcontext.changed_layer(inputs(), new, True) == ("wheels", "ngcx.lock changed")
    assert pcontext.changed_layer(inputs(), new, False) == ("wheels", "the requirements changed")
    assert pcontext.changed_layer(None, inputs(), False)[0] == "base"
    unchanged = pcontext.changed_layer(inputs(), inputs(), False)
    assert pcontext.report_line(*unchanged, PRESENT).startswith("all layers cached")
    assert pcontext.changed_layer(inputs(), inputs(code={"handler.py": "h", "labels.txt": "l", "new.py": "n"}),
                                False) == ("code", "new.py changed")


# ----------------------------------------------------------------------------- pip's conflicts -> one line

TRANSITIVE = """\
ERROR: Cannot install -r /tmp/ngcx-requirements.txt (line 2) because these package versions have conflicting \
dependencies.

The conflict is caused by:
    onnxconverter-common 1.14.0 depends on protobuf==3.20.2
    The user requested (constraint) protobuf==7.36.2

To fix this you could try to:
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""
DIRECT = """\
ERROR: Cannot install numpy==1.26.4 because these package versions have conflicting dependencies.
The conflict is caused by:
    The user requested numpy==1.26.4
    The user requested (constraint) numpy==2.4.6
"""


def test_a_transitive_conflict_names_the_requirement_and_the_pin():
    err = pip_errors.pip_problem(TRANSITIVE.splitlines(), "onnxruntime:25.08", "six\nonnxconverter-common==1.14.0\n")
    assert err is not None and "\n" not in err.line()
    assert err.message.startswith("requirement 'onnxconverter-common==1.14.0' needs protobuf==3.20.2, "
                                  "but the base onnxruntime:25.08 pins protobuf==7.36.2")


def test_a_direct_conflict_and_a_missing_package_are_one_line_each():
    err = pip_errors.pip_problem(DIRECT.splitlines(), "onnxruntime:25.08")
    assert err is not None and err.message == \
        "requirement 'numpy==1.26.4' would replace numpy==2.4.6, pinned by the base onnxruntime:25.08"
    err = pip_errors.pip_problem(["ERROR: No matching distribution found for nosuch-pkg"], "onnxruntime:25.08")
    assert err is not None and "'nosuch-pkg': no matching distribution" in err.message
    assert pip_errors.pip_problem(["error: subprocess-exited-with-error", "gcc: not found"], "x") is None


# ----------------------------------------------------------------------------- disk and context


def test_a_model_larger_than_the_disk_is_refused_before_copying(tmp_path):
    model = tmp_path / "big.onnx"
    with pytest.raises(UserError, match="does not fit on the Docker data root /var/lib/docker"):
        pbuild.check_model_space(model, 10 << 30, None, 12 << 30, False, tmp_path, "/var/lib/docker")
    with pytest.raises(UserError, match="does not fit in the build context"):
        pbuild.check_model_space(model, 10 << 30, 1 << 30, None, True, tmp_path, None)
    pbuild.check_model_space(model, 10 << 30, 1 << 30, 40 << 30, False, tmp_path, "/var/lib/docker")  # hard-linked


def test_the_context_rewrites_only_what_changed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("a = 1\n")
    (src / "b.py").write_text("b = 1\n")
    ctx = tmp_path / "ctx"
    pcontext.sync_context(ctx, {"app/a.py": src / "a.py", "app/b.py": src / "b.py", "Dockerfile": b"FROM x\n"}, set())
    before = {p: (ctx / p).stat().st_ino for p in ("app/a.py", "app/b.py", "Dockerfile")}
    (src / "b.py").write_text("b = 2\n")
    pcontext.sync_context(ctx, {"app/a.py": src / "a.py", "app/b.py": src / "b.py", "Dockerfile": b"FROM x\n"}, set())
    assert (ctx / "app/a.py").stat().st_ino == before["app/a.py"]
    assert (ctx / "Dockerfile").stat().st_ino == before["Dockerfile"]
    assert (ctx / "app/b.py").read_text() == "b = 2\n"
    pcontext.sync_context(ctx, {"Dockerfile": b"FROM y\n"}, set())
    assert sorted(p.relative_to(ctx).as_posix() for p in ctx.rglob("*")) == ["Dockerfile"]
