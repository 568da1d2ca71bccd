"""bench/__main__.py: `python -m bench`'s arguments, and a skipped or crashing suite recorded as such.

Why: a suite that cannot run here, or breaks, must show in BENCHMARKS.md with its reason, never as
measured, and must not hide the other suites' results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_samples import measurement, suite_doc, write_docs

from bench import __main__ as entry
from bench import report
from bench.core import SuiteResult, SuiteSkipped
from bench.suites import SUITES


def test_a_suite_that_does_not_apply_is_a_result_with_its_reason(tmp_path: Path, monkeypatch) -> None:
    def no_engine(result: SuiteResult, work: Path, out: Path) -> None:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")

    monkeypatch.setattr(entry, "SUITES", {"later": no_engine})
    args = entry.parse(["later", "--out", str(tmp_path)])
    result = entry.run_suite("later", args)
    assert (result.status, result.reason) == ("skipped", "needs the Docker engine (scripts/setup.sh)")
    assert result.measurements == [] and result.ratios == []
    assert result.command == f".venv/bin/python -m bench later --repeat 3 --out {tmp_path}"
    assert result.machine["cores"] >= 1 and len(result.machine["load_average_after"]) == 3


def test_a_crashing_suite_is_recorded_as_skipped_and_the_others_still_run(tmp_path: Path, monkeypatch) -> None:
    def crash(result: SuiteResult, work: Path, out: Path) -> None:
        result.measurements.append(measurement("half-done", [1.0, 1.0, 1.0]))
        raise ValueError("disk full")

    def skip(result: SuiteResult, work: Path, out: Path) -> None:
        raise SuiteSkipped("no Docker engine here")

    monkeypatch.setattr(entry, "SUITES", {"crash": crash, "skip": skip})
    assert entry.main(["all", "--out", str(tmp_path)]) == 0
    crashed = json.loads((tmp_path / "crash.json").read_text())
    assert crashed["status"] == "skipped" and crashed["reason"] == "failed: ValueError: disk full"
    assert crashed["measurements"] == []                    # no half-measured figures in the report
    assert json.loads((tmp_path / "skip.json").read_text())["reason"] == "no Docker engine here"
    md = (tmp_path / "BENCHMARKS.md").read_text()
    assert "**Skipped**: failed: ValueError: disk full" in md and "**Skipped**: no Docker engine here" in md
    assert not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize(("argv", "message"), [
    (["cli", "--repeat", "2"], "--repeat must be at least 3"),
    (["cli", "nosuch"], "unknown suite(s) nosuch"),
])
def test_bad_arguments_are_refused(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        entry.parse(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_all_means_every_suite_of_the_issue_once() -> None:
    assert entry.parse(["all"]).suites == list(SUITES)
    assert entry.parse(["cli", "cli", "runtime"]).suites == ["cli", "runtime"]
    assert set(SUITES) >= {"cli", "build", "project", "push", "deploy", "runtime"}


def test_quick_is_one_repetition_and_says_so(tmp_path: Path, capsys) -> None:
    args = entry.parse(["build", "--quick", "--out", str(tmp_path)])
    assert args.repeat == 1 and entry.command_line("build", args).endswith(f"build --quick --out {tmp_path}")
    with pytest.raises(SystemExit):
        entry.parse(["build", "--quick", "--repeat", "5"])
    assert "--quick means one repetition" in capsys.readouterr().err
    write_docs(tmp_path, suite_doc("build", repeat=1, measurements=[measurement("x", [1.0])]))
    assert "Quick run: one repetition" in report.write(tmp_path, tmp_path / "B.md", ["build"]).read_text()
