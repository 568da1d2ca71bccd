"""Property-based fuzzing of the `ngcx.yaml` and `examples.yaml` loaders: whatever a user writes, a
completed project or one clear problem per mistake.

Why (issue 8): ngcx.yaml is the file every project user edits by hand, and every `ngcx build`,
`test`, `run` and `lock` reads it first. For mutations of a valid project (values of the wrong type,
deleted keys, numbers where text goes, paths out of the folder, requirements that are not PEP 508,
duplicate keys, deep nesting, alias bombs, non-UTF-8 bytes, `!!python` tags):

  - load_project ends in a Project or ProblemsFound / UserError (exit 2): never another exception;
  - every problem renders as one printable line naming file[:line] and the field;
  - each input is read in bounded time (hypothesis deadline);
  - YAML never constructs Python objects (the marker file a payload would create never appears).
The same holds for examples.yaml (load_examples), which `ngcx test` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ngcx.core.errors import UserError
from ngcx.core.problems import ProblemsFound
from ngcx.project.examples import load_examples
from ngcx.project.spec import load_project

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402

VALID = {
    "name": "demo", "base": "onnxruntime:25.08", "python_packages": ["six==1.16.0"],
    "model": {"path": "model.onnx", "precision": "fp16", "batch": [1, 8], "max_queue_delay_ms": 2.0},
    "handler": "handler:Handler", "files": ["handler.py"], "env": {"THREADS": "4"}, "ports": [8000],
    "examples": "examples.yaml",
}
EXAMPLES = {"examples": [{"name": "one", "inputs": {"x": {"datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}},
                          "outputs": {"y": {"data": [0.0] * 10, "rtol": 0.1, "atol": 0.1}}}]}
FUZZ = settings(max_examples=200, deadline=5000, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), st.text(max_size=40),
    st.just(25.10), st.just("../outside.onnx"), st.just("/etc/passwd"), st.just("torch==1.0"),
    st.just("not a requirement ==="), st.lists(st.integers(-3, 70), max_size=4), st.dictionaries(
        st.text(max_size=8), st.text(max_size=8), max_size=3))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz-project")
    models.mlp(folder / "model.onnx")
    (folder / "handler.py").write_text("class Handler:\n    pass\n")
    return folder


def load(root: Path, text: str | bytes) -> None:
    """What every project command does first: a Project, or one-line problems with a where."""
    file = root / "ngcx.yaml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    try:
        load_project(file)
    except ProblemsFound as exc:
        assert exc.exit_code == 2 and exc.problems
        for p in exc.problems:
            line = p.line()
            assert line.isprintable() and p.where.startswith(str(file)) and p.rule, line
    except UserError as exc:
        assert exc.exit_code == 2 and "\n" not in exc.line(), exc.line()


def mutate(doc: dict, path: tuple, value: Any) -> dict:
    """doc with the value at path (a key path into the valid project) replaced or deleted."""
    out = yaml.safe_load(yaml.safe_dump(doc))
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


_DELETE = object()
PATHS = [("name",), ("base",), ("variant",), ("python_packages",), ("model",), ("model", "path"),
         ("model", "precision"), ("model", "batch"), ("model", "calibration"), ("model", "max_queue_delay_ms"),
         ("handler",), ("files",), ("env",), ("ports",), ("command",), ("examples",), ("requirements",),
         ("unknown_key",), ("system_packages",)]


@FUZZ
@given(path=st.sampled_from(PATHS), value=st.one_of(ODD_VALUES, st.just(_DELETE)))
@example(path=("base",), value=25.10)
@example(path=("model", "path"), value="../outside.onnx")
def test_any_mutated_project_is_a_project_or_one_line_problems(root, path, value):
    load(root, yaml.safe_dump(mutate(VALID, path, value), allow_unicode=True))


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list("abc:-[]{}&*!|>'\"\n #0.1\t")), max_size=200))
def test_any_yaml_text_is_a_project_or_one_line_problems(root, text):
    load(root, text)


@FUZZ
@given(cut=st.integers(0, 400), junk=st.binary(max_size=20))
def test_spliced_bytes_are_a_project_or_one_line_problems(root, cut, junk):
    text = yaml.safe_dump(VALID).encode()
    load(root, text[:cut] + junk + text[cut:])


@pytest.mark.parametrize("text", [
    "name: " + "[" * 100_000,
    "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)),
    "name: demo\nname: again\nbase: onnxruntime:25.08\n",
    "name: 1" + "0" * 5000 + "\nbase: onnxruntime:25.08\n",
], ids=["deep", "alias-bomb", "duplicate-key", "huge-int"])
def test_hostile_files_are_one_line(root, text):
    load(root, text)


def test_yaml_code_never_runs(root, tmp_path):
    marker = tmp_path / "ran"
    for tag in ("!!python/object/apply:os.system", "!!python/object/new:os.system"):
        load(root, f"name: {tag} ['touch {marker}']\nbase: onnxruntime:25.08\n")
    assert not marker.exists()


@FUZZ
@given(path=st.sampled_from([("examples",), ("examples", 0, "name"), ("examples", 0, "inputs"),
                             ("examples", 0, "inputs", "x", "shape"), ("examples", 0, "inputs", "x", "data"),
                             ("examples", 0, "inputs", "x", "datatype"), ("examples", 0, "outputs", "y", "rtol"),
                             ("examples", 0, "outputs", "y", "data"), ("examples", 0, "inputs", "x", "file")]),
       value=st.one_of(ODD_VALUES, st.just(_DELETE)))
def test_any_mutated_examples_file_is_examples_or_one_line_problems(root, path, value):
    doc = mutate(EXAMPLES, path, value)
    file = root / "examples.yaml"
    file.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8", errors="surrogatepass")
    signature = ([{"name": "x", "datatype": "FP32", "shape": [-1, 32]}],
                 [{"name": "y", "datatype": "FP32", "shape": [-1, 10]}])
    try:
        load_examples(file, *signature)
    except ProblemsFound as exc:
        assert all(p.line().isprintable() for p in exc.problems)
    except UserError as exc:
        assert "\n" not in exc.line(), exc.line()
