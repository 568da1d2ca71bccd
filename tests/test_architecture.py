"""Spec of the layout (ARCHITECTURE.md): layers one way, no import cycles, imports that name their files, small modules.

A newcomer reads an import and knows the file; an import-graph tool draws the real graph; a change that
makes the library import a command, a cloud import another, or the runtime import the CLI fails here,
in the suite CI runs, not in a review.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"cli": "ngcx", "runtime": "ngcx_runtime"}    # folder -> import name (pyproject's package-dir)
MAX_LINES = 600
# Modules allowed past MAX_LINES, each with the reason it is one piece.
LONG_MODULES: dict[str, str] = {}


def _sources(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_layer_contracts_hold() -> None:
    """pyproject.toml's [tool.importlinter] contracts: commands -> library -> core, runtime apart, targets apart."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("lint-imports not found next to python: install the test extra (it brings import-linter)")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_module_imports_itself_back() -> None:
    """No cycle through any module, type-only (TYPE_CHECKING) and lazy imports included: each can be read
    bottom-up, and a target's balancer never names its host class through the verbs that import it (issue 46)."""
    import grimp

    graph = grimp.build_graph(*PACKAGES.values(), cache_dir=None, exclude_type_checking_imports=False)
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert cycles == []


@pytest.mark.parametrize("folder", PACKAGES)
def test_imports_inside_a_package_are_relative(folder: str) -> None:
    """`from .deploy import vm`, never `from ngcx.deploy import vm`: the import says where the file is."""
    absolute = []
    for path in _sources(folder):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n.split(".")[0] == PACKAGES[folder] for n in names):   # another package: absolute
                absolute.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert absolute == []


@pytest.mark.parametrize("folder", [*PACKAGES, "bench"])
def test_modules_stay_small(folder: str) -> None:
    """One job per module: past MAX_LINES a module is cut at its seams, or LONG_MODULES says why not."""
    long = {str(p.relative_to(REPO)): n for p in _sources(folder)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert {k: v for k, v in long.items() if k not in LONG_MODULES} == {}


def test_every_package_says_what_it_owns() -> None:
    """Each package of the CLI opens with a docstring: what it owns, in a few lines."""
    silent = [str(p.relative_to(REPO)) for p in (REPO / "cli").rglob("__init__.py")
              if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert silent == []


def test_ruff_is_clean() -> None:
    """The lint the style guide asks for, over everything it covers (pyproject.toml [tool.ruff])."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.fail("ruff not found next to python: install the test extra")
    proc = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
