"""Property-based fuzzing of the catalog loader: whatever registry.yaml holds, one line or ok.

Why (issue 8): the catalog is the file users edit most, by hand, and `ngcx catalog check` is
what they run on it. A traceback there (RecursionError on deep nesting, ValueError on a
5000-digit number, TypeError on a list used as a key - all found this way) tells them nothing.
So, for mutations of the real registry.yaml (values of the wrong type, deleted and renamed keys,
unquoted 25.10 tags, duplicate keys, tabs, non-UTF-8 bytes, alias bombs, deep nesting):

  - `ngcx catalog check FILE` and load_catalog (behind ls/show/render) end in ok or a UserError /
    exit 2 - never another exception, never a traceback;
  - each input is read in bounded time (hypothesis deadline) and bounded memory (alias bombs are
    refused before anything walks their expansion: tracemalloc peak);
  - YAML never constructs Python objects: `!!python/...` payloads are errors, and a marker file
    they would create never appears.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ngcx.catalog import load_catalog
from ngcx.catalog.model import problems_of
from ngcx.commands.catalog import _check
from ngcx.core import paths
from ngcx.core.errors import UserError

SHIPPED_TEXT = paths.registry_file().read_text(encoding="utf-8")
SHIPPED = yaml.safe_load(SHIPPED_TEXT)
# deadline: a slow input (exponential blow-up) takes far longer than 5 s; a busy 2-core CI box once
# took 2.7 s for a 50 ms example, so 2 s flaked.
IN_PROCESS = settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole module: hypothesis reruns a test body, a function fixture would not."""
    return tmp_path_factory.mktemp("fuzz-catalog")


def check_file(file: Path) -> tuple[int, str]:
    """Run what `ngcx catalog check FILE` runs, in process: (exit code, stdout). Other exceptions escape."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            _check(file, json_out=False)
            code = 0
        except typer.Exit as exc:
            code = exc.exit_code
        except UserError as exc:
            assert "\n" not in exc.line(), exc.line()
            code = exc.exit_code
    return code, out.getvalue()


def load_file(file: Path) -> None:
    """load_catalog, as ls/show/render use it: a Catalog or a one-line UserError."""
    try:
        load_catalog(file)
    except UserError as exc:
        assert exc.exit_code == 2 and "\n" not in exc.line(), exc.line()


def problems_in(text: str) -> list[str]:
    """Every problem `catalog check` would print: each must be one printable line."""
    try:
        problems = [p.line() for p in problems_of(text, "registry.yaml")[1]]
    except UserError as exc:
        problems = [exc.line()]
    assert all(p.isprintable() for p in problems), problems
    return problems


def assert_bad_input_is_handled(file: Path) -> int:
    code, out = check_file(file)
    assert code in (0, 2), out
    load_file(file)
    with contextlib.suppress(UnicodeDecodeError):
        assert bool(problems_in(file.read_text(encoding="utf-8"))) == (code == 2)
    return code


# ----------------------------------------------------------------------------- mutations

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**30, max_value=10**60),
    st.floats(allow_nan=True), st.sampled_from([25.10, 3.1, 12.4, "25.10", "", " ", "\t", "~", "null", "no"]),
    st.text(max_size=30),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.floats()),
                                                 inner, max_size=4)), max_leaves=12)


def _walk(data: Any, draw: st.DrawFn) -> tuple[Any, Any]:
    """A random (container, key) inside the catalog tree."""
    parent, key = data, None
    for _ in range(draw(st.integers(min_value=1, max_value=7))):
        node = parent if key is None else parent[key]
        if isinstance(node, dict) and node:
            parent, key = node, draw(st.sampled_from(sorted(node, key=str)))
        elif isinstance(node, list) and node:
            parent, key = node, draw(st.integers(min_value=0, max_value=len(node) - 1))
        else:
            break
    return parent, key


@st.composite
def mutated_catalogs(draw: st.DrawFn) -> str:
    """The shipped catalog with 1-3 structural edits, dumped back to YAML."""
    data = copy.deepcopy(SHIPPED)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        parent, key = _walk(data, draw)
        if key is None:
            continue
        op = draw(st.sampled_from(["replace", "delete", "rename", "float-key"]))
        if op == "replace":
            parent[key] = draw(VALUES)
        elif op == "delete":
            del parent[key]
        elif isinstance(parent, dict) and op == "rename":
            parent[draw(st.text(max_size=12))] = parent.pop(key)
        elif isinstance(parent, dict):  # a release tag as YAML reads an unquoted 25.10
            parent[draw(st.floats(allow_nan=False))] = parent.pop(key)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


SNIPPETS = st.sampled_from([
    "\t", "  ", "- ", ": ", "&a ", "*a", "*nope", "<<: *a\n", "!!python/object/apply:os.system ['true']",
    "!!binary ???", "!!int x", "!!float y", "? [a]\n: 1\n", "{", "[", "]", "}", "'", '"', "\\", "#", "%YAML 1.1\n",
    "---\n", "...\n", "1" * 5000, "2001-13-45", "0x", "0b2", "1:2:3:4:5", "\x00", "\ufeff", "\u2028", "\x85",
    "[" * 200, "{a: " * 100, ALIAS_BOMB,
])


@st.composite
def edited_texts(draw: st.DrawFn) -> str:
    """The shipped text with snippets inserted, lines duplicated (duplicate keys) or cut."""
    lines = SHIPPED_TEXT.splitlines(keepends=True)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        op = draw(st.sampled_from(["insert", "duplicate", "delete", "tabs", "text"]))
        if op == "insert":
            col = draw(st.integers(min_value=0, max_value=len(lines[at])))
            lines[at] = lines[at][:col] + draw(SNIPPETS) + lines[at][col:]
        elif op == "duplicate":
            lines.insert(at, lines[at])
        elif op == "delete":
            del lines[at]
        elif op == "tabs":
            lines[at] = lines[at].replace("  ", "\t")
        else:
            lines[at] = draw(st.text(max_size=40)) + "\n"
    return "".join(lines)


# ----------------------------------------------------------------------------- properties


@IN_PROCESS
@given(text=mutated_catalogs())
@example(text=SHIPPED_TEXT.replace('"25.08":', "25.10:", 1))
@example(text=SHIPPED_TEXT.replace("images:", "images: " + "[" * 100_000, 1))
def test_mutated_catalog_is_ok_or_one_line(workdir: Path, text: str) -> None:
    file = workdir / "registry.yaml"
    file.write_text(text, encoding="utf-8")
    assert_bad_input_is_handled(file)


@IN_PROCESS
@given(text=edited_texts())
@example(text="a: " + "[" * 100_000)  # was a RecursionError traceback
@example(text="a: " + "1" * 5000 + "\n")  # was ValueError: exceeds the limit (4300 digits)
@example(text="a: 2001-13-45\n")  # was ValueError: month must be in 1..12
@example(text="? [a, b]\n: 1\n")  # was TypeError: unhashable type: 'list'
@example(text=ALIAS_BOMB)
def test_edited_catalog_text_is_ok_or_one_line(workdir: Path, text: str) -> None:
    file = workdir / "registry.yaml"
    file.write_text(text, encoding="utf-8", errors="surrogatepass")
    assert_bad_input_is_handled(file)


@settings(max_examples=100, deadline=5000)
@given(raw=st.binary(max_size=200), at=st.integers(min_value=0, max_value=len(SHIPPED_TEXT)))
@example(raw=b"\xff\xfe", at=10)  # was UnicodeDecodeError traceback in catalog check
def test_bytes_spliced_into_the_catalog_are_ok_or_one_line(workdir: Path, raw: bytes, at: int) -> None:
    data = SHIPPED_TEXT.encode()
    file = workdir / "registry.yaml"
    file.write_bytes(data[:at] + raw + data[at:])
    assert_bad_input_is_handled(file)


@pytest.mark.parametrize(("old", "new", "problem"), [
    ('"24.05":', '"2\u0664.05":', "release tag '2\u0664.05' is not YY.MM"),
    ('"24.05":', '"24.05\\n":', "release tag '24.05\\n' is not YY.MM"),
    ('"24.05":', '"24.05\\n\\tfake: line":', "cuda:24.05\\n\\tfake: line: release tag"),
], ids=["arabic-indic-digit", "trailing-newline", "newline-in-where"])
def test_release_tags_are_ascii_yy_mm_on_one_line(old: str, new: str, problem: str) -> None:
    """Found by the fuzzers: \\d took '\u0664', '$' took a final newline, and the newline split the report."""
    assert SHIPPED_TEXT.count(old) == 1
    problems = problems_in(SHIPPED_TEXT.replace(old, new))
    assert any(problem in p for p in problems), problems


TRT_2508_CCS = ('index_urls: ["https://pypi.nvidia.com"]\n        '
                'compute_capabilities: ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]')


@pytest.mark.parametrize(("old", "new", "problem"), [
    ('full_driver: "555.42.02"', 'full_driver: $"555.42.02"',
     "rules.cuda_minors.12.5.full_driver: '$\"555.42.02\"' is not a driver version like 570.26"),
    ('min_driver: "525.60.13"', 'min_driver: "525.60.13x"',
     "rules.cuda_majors.12.min_driver: '525.60.13x' is not a driver version like 570.26"),
    ('versions: "<2.27.7"', 'versions: "<=>2.27.7"',
     "rules.nccl.0.versions: '<=>2.27.7' is not a version range like >=3.9,<3.14"),
    ('cuda_majors: ["12"]\n        python: ">=3.8"', 'cuda_majors: ["12"]\n        python: ">\t=3.8"',
     "rules.frameworks.tensorrt-cu12.10.16.1.11.python: '>\\t=3.8' is not a version range like >=3.9,<3.14"),
    ('install: "tensorflow[and-cuda]=={version}"\n        requires: {cudart: "12.3.101"',
     'install: "tensorflow[and-cuda]=={ver}"\n        requires: {cudart: "12.3.101"',
     "rules.frameworks.tensorflow.2.16.2.install: 'tensorflow[and-cuda]=={ver}' may use only {version} as a "
     "placeholder"),
    (TRT_2508_CCS, TRT_2508_CCS.replace('"8.0"', '"8..0"'),
     "tensorrt:25.08: compute capability '8..0' is not MAJOR.MINOR (e.g. 8.6)"),
], ids=["full-driver", "min-driver", "bad-range", "range-with-tab", "install-placeholder", "cc-of-a-framework"])
def test_rule_values_are_checked_before_they_are_used(old: str, new: str, problem: str) -> None:
    """Found by the fuzzers: a '$' before full_driver's quote passed every rule, then complete()
    raised ValueError from int('$"555'); a tab in a version range raised InvalidSpecifier from the
    checker; an install template's unknown {field} was a KeyError; '8..0' in a framework release's
    compute_capabilities was a ValueError in the framework rule - all tracebacks from `catalog check`."""
    assert SHIPPED_TEXT.count(old) == 1
    problems = problems_in(SHIPPED_TEXT.replace(old, new))
    assert f"registry.yaml: {problem}" in problems or problem in problems, problems


def test_shipped_catalog_is_the_fuzzers_baseline(workdir: Path) -> None:
    """The mutations start from a catalog that checks ok, so a 2 comes from the mutation."""
    file = workdir / "registry.yaml"
    file.write_text(SHIPPED_TEXT, encoding="utf-8")
    assert check_file(file)[0] == 0


# ----------------------------------------------------------------------------- memory, time, code execution


@pytest.mark.parametrize("text", [
    ALIAS_BOMB,
    "images: " + "[" * 100_000,
    "x: &x " + "[" * 60 + "]" * 60 + "\n" + "y: [" + ", ".join(["*x"] * 20_000) + "]\n",
    "a: " + "1" * 100_000 + "\n",
], ids=["billion-laughs", "deep-nesting", "wide-alias-fanout", "huge-int"])
def test_hostile_catalog_is_refused_in_bounded_memory_and_time(workdir: Path, text: str) -> None:
    file = workdir / "registry.yaml"
    file.write_text(text, encoding="utf-8")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code, out = check_file(file)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 2 and len(out.splitlines()) == 1 and "malformed YAML" in out, out
    assert peak < 64 << 20, f"peak {peak >> 20} MiB"
    assert time.perf_counter() - start < 10


def test_oversized_catalog_is_refused_before_parsing(workdir: Path) -> None:
    file = workdir / "registry.yaml"
    file.write_text("# padding\n" * 200_000, encoding="utf-8")
    code, out = check_file(file)
    assert code == 2 and "is too large for a YAML file here" in out


PAYLOADS = [
    "a: !!python/object/apply:os.system ['touch {marker}']\n",
    "a: !!python/object/apply:builtins.open ['{marker}', 'w']\n",
    "a: !!python/object/new:builtins.open ['{marker}', 'w']\n",
    "!!python/object/apply:subprocess.check_call [['touch', '{marker}']]\n",
    "a: !!python/name:os.system\n",
    "images: !!python/object/apply:builtins.exec ['open(\"{marker}\", \"w\")']\n",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_python_tags_are_never_executed(workdir: Path, payload: str) -> None:
    marker = workdir / "PWNED"
    file = workdir / "registry.yaml"
    file.write_text(payload.format(marker=marker), encoding="utf-8")
    code, out = check_file(file)
    assert code == 2 and "could not determine a constructor" in out, out
    load_file(file)
    assert not marker.exists()


# ----------------------------------------------------------------------------- the real CLI


def ngcx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "NGCX_DATA_DIR"})


def assert_cli_handles(file: Path) -> None:
    """Exit 0 or 2, no traceback; a refusal by ls is exactly one `ngcx: error:` line."""
    proc = ngcx("catalog", "check", str(file))
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
    proc = ngcx("catalog", "ls", "--catalog", str(file), "--json")
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 2:
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("ngcx: error: "), proc.stderr


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=edited_texts())
@example(text="a: " + "[" * 100_000)
def test_cli_on_edited_catalogs(workdir: Path, text: str) -> None:
    file = workdir / "cli-registry.yaml"
    file.write_text(text, encoding="utf-8", errors="surrogatepass")
    assert_cli_handles(file)


def test_cli_never_runs_yaml_payloads(workdir: Path) -> None:
    marker = workdir / "PWNED"
    for payload in PAYLOADS[:2]:
        file = workdir / "cli-payload.yaml"
        file.write_text(payload.format(marker=marker), encoding="utf-8")
        assert_cli_handles(file)
    assert not marker.exists()
