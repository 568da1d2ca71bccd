"""bench/suites/project.py and project_figures.py: the project suite's inputs and figures, without Docker."""

from __future__ import annotations

import bench_samples  # noqa: F401  (puts the repo root on sys.path: bench/ is not installed)
import pytest

from bench.core import Measurement
from bench.suites import build, project, project_figures


def test_project_inputs_are_a_valid_ngcx_yaml_and_a_dockerfile_serving_the_same_model() -> None:
    import yaml

    from ngcx.project.spec import ProjectSpec

    spec = ProjectSpec.model_validate(yaml.safe_load(project.project_yaml("ngcx-bench-abc123-1")))
    assert (spec.name, spec.base, spec.requirements, spec.handler) == \
        ("ngcx-bench-abc123-1", project.REF, "requirements.txt", "handler:Handler")
    assert spec.model is not None and (spec.model.path, spec.model.name) == ("model.onnx", project.MODEL_NAME)
    naive = project.NAIVE_FILE.read_text()
    assert f"FROM {project_figures.BASE_TAG}\n" in naive and "COPY . /app\n" in naive
    assert f'"--name", "{project.MODEL_NAME}"' in naive and '"handler:Handler"' in naive
    assert project.hidden_units(100) * 4 * (project.FEATURES + 1 + project.CLASSES) == pytest.approx(100e6, rel=1e-4)


def test_each_repetition_adds_its_own_package_in_a_line_no_other_run_wrote() -> None:
    from packaging.requirements import Requirement

    assert project.requirements(1) == project.requirements(2) == "six\n"
    a, b = project.requirements(1, "00beef", added=True), project.requirements(2, "00beef", added=True)
    other_run = project.requirements(1, "c0ffee", added=True)
    assert a != b and a != other_run and a.startswith("six\n")
    added = Requirement(a.splitlines()[1])
    assert added.name == project.ADDED[0] and added.specifier.contains("3.10")   # to pip, any release will do
    assert len(set(project.ADDED)) == len(project.ADDED)
    with pytest.raises(ValueError, match="distinct packages"):
        project.requirements(len(project.ADDED) + 1, "00beef", added=True)
    assert [project.round_order(r)[0] for r in (1, 2, 3)] == ["ngcx", "naive", "ngcx"]


NGCX_OUTPUT = """building ngcx-app/p:latest FROM ngcx/onnxruntime:25.08-runtime (sha256:a9242915773d)
rebuilding from layer 'wheels' (the requirements changed)
built ngcx-app/p:latest  sha256:cd1e01d54edc  4.01 GB  in 2.5s (1/7 steps cached)
\u2713        [1/7] base: onnxruntime:25.08 (ngcx/onnxruntime:25.08-runtime) (FROM)
\u2713 cached [2/7] base: onnxruntime:25.08 (ngcx/onnxruntime:25.08-runtime) (RUN)
\u2713        [3/7] wheels: the requirements, into the base's venv under its pins (RUN) 1.7s
\u2713        [4/7] model: model.onnx (its own layer: a code edit never re-sends it) (COPY) 0.1s
\u2713        [5/7] code: handler.py (COPY)
\u2713        [6/7] config (last): ngcx.yaml, environment, labels, ports, command (COPY)
\u2713        [7/7] config (last): ngcx.yaml, environment, labels, ports, command (WORKDIR) 0.2s
"""


PLAIN_OUTPUT = """#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#5 [internal] load build context
#5 transferring context: 100.01MB 1.2s done
#5 DONE 1.3s
#4 [1/3] FROM docker.io/ngcx/onnxruntime:25.08-runtime
#6 [2/3] WORKDIR /app
#6 CACHED
#7 [3/3] COPY . /app
#7 DONE 0.2s
#8 [4/4] RUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca pip install -r requirements.txt
#8 0.952 Collecting six
#8 DONE 0.9s
#9 exporting to image
#9 exporting layers 0.4s done
#9 DONE 0.5s
"""


def test_build_output_is_read_into_step_times_the_notes_cite() -> None:
    assert project_figures.ngcx_steps(NGCX_OUTPUT) == {
        "base RUN": 0.0, "wheels RUN": 1.7, "model COPY": 0.1, "code COPY": 0.0, "config COPY": 0.0,
        "config WORKDIR": 0.2}
    assert project_figures.engine_seconds(NGCX_OUTPUT) == 2.5 and project_figures.engine_seconds("no") is None
    assert not project_figures.wheels_step_cached(NGCX_OUTPUT)
    assert project_figures.wheels_step_cached(NGCX_OUTPUT.replace("\u2713        [3/7]", "\u2713 cached [3/7]"))
    assert project_figures.plain_steps(PLAIN_OUTPUT) == {"context": 1.3, "COPY": 0.2, "RUN": 0.9, "export": 0.5}
    assert project_figures.median_steps([{"RUN": 1.0, "COPY": 0.2}, {"RUN": 3.0}, {"RUN": 2.0, "COPY": 0.4}]) == \
        {"COPY": 0.2, "RUN": 2.0}                          # a cached (absent) step counts 0


def test_project_cache_records_removed_are_this_runs_own() -> None:
    """A rebuild stacks its new model layer on an older cached wheels record; the hand-written COPY . /app
    sits under its RUN; the contexts that hold the model go too; nothing of another build, no small context."""
    wheels = "mount / from exec /bin/bash -o pipefail -c if [ -s /run/secrets/pip_conf ]; then x"
    rec = [
        {"ID": "oldwheels", "Type": "regular", "Description": wheels},
        {"ID": "model", "Type": "regular", "Description": "fileop target", "Parent": "oldwheels"},
        {"ID": "code", "Type": "regular", "Description": "fileop target", "Parent": "model"},
        {"ID": "workdir", "Type": "regular", "Description": "fileop target", "Parent": "base"},
        {"ID": "copyall", "Type": "regular", "Description": "fileop target", "Parent": "workdir"},
        {"ID": "pip", "Type": "regular", "Parent": "copyall",
         "Description": "mount / from exec /bin/sh -c PIP_CERT=/run/secrets/ca pip install -r requirements.txt"},
        {"ID": "ctx", "Type": "source.local", "Description": "local source for context", "Size": 100_000_300},
        {"ID": "smallctx", "Type": "source.local", "Description": "local source for context", "Size": 2_000},
        {"ID": "other", "Type": "regular", "Description": "fileop target", "Parent": "npm"},
        {"ID": "npm", "Type": "regular", "Description": "mount / from exec /bin/sh -c npm ci"},
        {"ID": "base", "Type": "regular", "Description": "from local"},
    ]
    markers = build.run_markers("RUN --mount=type=cache,target=/root/.cache/pip \\\n    if [ -s /run/secrets/pip_conf "
                                "]; then x\nRUN --mount=type=secret,id=ca PIP_CERT=/run/secrets/ca pip install -r r\n")
    got = project_figures.project_records(rec, before={"oldwheels", "base"}, markers=markers,
                                          min_source_bytes=90_000_000)
    assert set(got) == {"model", "code", "workdir", "copyall", "pip", "ctx"}
    assert got.index("code") < got.index("model") and got.index("pip") < got.index("copyall") < got.index("workdir")


def _project_figures(ngcx: dict[str, float], naive: dict[str, float]) -> list[Measurement]:
    times = {case: {"ngcx": [ngcx[case]] * 3, "naive": [naive[case]] * 3} for case in project_figures.CASES}
    return project_figures.figures(times, {"ngcx": [4_010_000_000], "naive": [4_010_001_000]},
                                   {"ngcx": [100_600_000], "naive": [100_601_000]})


def test_project_notes_say_where_ngcx_wins_and_what_its_losses_are_made_of() -> None:
    ms = _project_figures({"cold": 4.3, "code": 0.55, "model": 1.8, "package": 2.7},
                          {"cold": 2.0, "code": 1.2, "model": 1.9, "package": 1.3})
    ratios = {r.name: r.wall for r in project_figures.ratios(ms)}
    assert ratios["rebuild after a code-only edit: ngcx / hand-written"] == pytest.approx(0.458, abs=1e-3)
    assert list(ratios)[:2] == ["rebuild after a code-only edit: ngcx / hand-written",
                                "rebuild after a model change: ngcx / hand-written"]
    steps = {case: {"ngcx": {"wheels RUN": 1.6 if case in ("cold", "package") else 0.0,
                             "base RUN": 0.5 if case == "cold" else 0.0},
                    "naive": {"RUN": 0.7, "COPY": 0.1, "export": 0.4}} for case in project_figures.CASES}
    layers = {"ngcx": [("RUN pip install …", 610_000), ("COPY model/model.onnx /opt/ngcx/model/model.onnx", 100e6)],
              "naive": [("COPY . /app", 100e6), ("RUN pip install …", 610_000)]}
    served = {"model": "mlp", "output_shape": [1, 10], "max_abs_diff": 0.0}
    text = "\n".join(project_figures.notes(ms, steps, {"cold": 0.46, "package": 0.35}, layers, served, 100_000_000))
    assert "Code-only edit: ngcx 0.55 s, hand-written 1.20 s, ngcx 2.2x as fast (ranges apart)" in text
    assert "re-copies the model (0.10 s), re-runs pip install (0.70 s) and exports that layer again (0.40 s)" in text
    assert "ngcx is slower on cold build by 2.30 s (0.46 s in the client before and after the engine build" in text
    assert "; rebuild after adding a package by 1.40 s (0.35 s in the client" in text
    assert "its wheels RUN 1.60 s against the hand-written pip RUN's 0.70 s" in text
    assert "a RUN mkdir the hand-written file has no need of, 0.50 s" in text
    assert "What would close it" in text and "only because of --no-cache" in text
    assert "both images served model 'mlp'" in text and "`COPY . /app` 100.0 MB" in text
    even = _project_figures({"cold": 2.0, "code": 0.5, "model": 1.8, "package": 1.2},
                            {"cold": 2.0, "code": 1.2, "model": 1.9, "package": 1.3})
    calm = "\n".join(project_figures.notes(even, steps, {}, {}, {}, 100_000_000))
    assert "slower" not in calm and "What would close it" not in calm
