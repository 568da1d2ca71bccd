"""Spec of the test helpers' layout: small modules (one API family or one job each), no two importing each other.

The same rules tests/test_architecture.py holds cli/ to, for the emulators (tests/emulators/) and the shared test
support (tests/support*.py): past MAX_LINES a module is cut at its seams (aws_ec2.py into the instances, images,
SSM and ECR families; aliyun_ecs.py into instances, network, images, Cloud Assistant), and an import circle,
a lazy or type-only import included, means two modules are one job split wrong.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
EMULATORS = TESTS / "emulators"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted([*EMULATORS.glob("*.py"), *TESTS.glob("support*.py")])


def _imports(source: str) -> set[str]:
    """The emulator modules a module's source imports anywhere: at the top, inside a function, under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level == 1:
                found |= {name} if name else {alias.name for alias in node.names}
            elif name.startswith("emulators."):
                found.add(name.split(".")[1])
            elif name == "emulators":
                found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("emulators.")}
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle met by a depth-first walk (each as the modules along it, its first one repeated)."""
    circles: list[list[str]] = []
    done: set[str] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt in path:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                walk(path + [nxt])
        done.add(path[-1])

    for start in sorted(graph):
        if start not in done:
            walk([start])
    return circles


def test_emulator_and_support_modules_stay_small() -> None:
    """One API family or one job per module: past MAX_LINES it is cut at its seams."""
    long = {str(p.relative_to(TESTS)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_two_emulator_modules_import_each_other() -> None:
    """No import circle among tests/emulators/, lazy and type-only imports included."""
    graph = {p.stem: _imports(p.read_text(encoding="utf-8")) for p in EMULATORS.glob("*.py")}
    graph = {name: {d for d in deps if d in graph and d != name} for name, deps in graph.items()}
    assert _circles(graph) == []


def test_the_circle_check_sees_lazy_and_type_only_imports() -> None:
    """The check above can fail: a function-level or TYPE_CHECKING import counts, and a circle is named."""
    lazy = "def f():\n    from .aws_ec2 import Ec2Emulator\nif TYPE_CHECKING:\n    from emulators.hosts_api import X\n"
    assert _imports(lazy) == {"aws_ec2", "hosts_api"}
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
