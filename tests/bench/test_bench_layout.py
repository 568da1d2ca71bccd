"""bench/results/ holds results; the code that makes them lives in bench/ (issue 46).

Why a test: results and the programs that wrote them were mixed (bench/results/gpu/starts/*.py, *.sh, *.c; the
hpccm recipes in bench/results/peers/), so a reader could not tell what to run from what was measured, and ruff
and the README's "run the bench again rather than edit them" applied to neither cleanly. The suites' writers
point at bench/ (bench/suites/peers.py RECIPES), and every path a result or README names must exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
CODE = (".py", ".sh", ".c")


def tracked(under: Path) -> list[Path]:
    """The files git tracks under `under`, plus any not ignored that are not yet added."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", str(under)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).exists()]


def test_no_program_sits_under_bench_results() -> None:
    code = [str(p.relative_to(ROOT)) for p in tracked(RESULTS) if p.suffix in CODE]
    assert not code, f"move these to bench/ (results stay in bench/results/): {code}"


def test_the_hpccm_recipes_a_result_names_exist_in_bench() -> None:
    from bench.suites.peers import RECIPES

    named = set()
    for doc in (RESULTS / "cli.json", RESULTS / "build.json", ROOT / "BENCHMARKS.md"):
        named |= set(re.findall(r"bench/[\w/.-]*hpccm-[\w.-]+\.py", doc.read_text()))
    assert named, "no result names an hpccm recipe"
    for path in sorted(named):
        assert (ROOT / path).is_file(), path
        assert (ROOT / path).parent == RECIPES, path
