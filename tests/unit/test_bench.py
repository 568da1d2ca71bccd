"""Spec of the bench's own logic (issue 13): the figures it reports and the BENCHMARKS.md it writes.

Why: BENCHMARKS.md is what users read to choose ngcx over hpccm or a hand-written Dockerfile; a
median taken from the wrong values, a ratio turned upside down, or a skipped suite shown as
measured would mislead them silently. No Docker, no peers: the timed commands are tiny Pythons.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a top-level folder of the repo, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import __main__ as entry  # noqa: E402
from bench import report  # noqa: E402
from bench.core import (  # noqa: E402
    Measurement,
    Ratio,
    Stats,
    SuiteResult,
    SuiteSkipped,
    Timed,
    ratio,
    time_interleaved,
    time_once,
)
from bench.suites import SUITES, pending  # noqa: E402

# ----------------------------------------------------------------------------- figures


def test_stats_are_min_median_max_of_every_value() -> None:
    s = Stats.of([0.3, 0.1, 0.2, 0.9])
    assert (s.min, s.median, s.max) == (0.1, 0.25, 0.9)   # even count: the mean of the middle two
    assert s.values == [0.3, 0.1, 0.2, 0.9]                # kept in run order, for the JSON
    assert Stats.of([5.0, 1.0, 2.0]).median == 2.0


def _m(name: str, wall: list[float], cpu: list[float] | None = None, better: str = "lower") -> Measurement:
    return Measurement(name=name, tool="x", unit="s", better=better, wall=Stats.of(wall),
                       cpu=Stats.of(cpu) if cpu else None)


def test_ratio_is_ngcx_over_peer_on_medians() -> None:
    ngcx = _m("ngcx", [0.30, 0.20, 0.90], cpu=[0.1, 0.1, 0.1])
    peer = _m("peer", [0.10, 0.05, 0.11], cpu=[0.05, 0.05, 0.06])
    r = ratio("ngcx / peer", ngcx, peer)
    assert (r.wall, r.cpu) == (3.0, 2.0)                   # 0.30 / 0.10 and 0.1 / 0.05, not min or max
    assert not r.ngcx_wins
    assert ratio("peer / ngcx", peer, ngcx).ngcx_wins
    assert ratio("no cpu", _m("a", [1.0, 1.0, 1.0]), peer).cpu is None


def test_for_throughputs_a_higher_ratio_wins() -> None:
    assert Ratio("int8 / fp32", "int8", "fp32", wall=1.8, better="higher").ngcx_wins
    assert not Ratio("int8 / fp32", "int8", "fp32", wall=0.8, better="higher").ngcx_wins


def test_commands_are_timed_round_robin_after_a_warm_up(tmp_path: Path) -> None:
    """Interleaving is what makes a ratio fair on a loaded machine: a load spike hits both tools."""
    log = tmp_path / "log"

    def cmd(tag: str) -> Timed:
        return Timed(tag, "python", [sys.executable, "-c", f"open({str(log)!r}, 'a').write({tag!r})"])

    ms = time_interleaved([cmd("a"), cmd("b")], repeat=3, warmup=1)
    assert log.read_text() == "ab" + "ab" * 3
    assert [m.name for m in ms] == ["a", "b"]
    assert all(len(m.wall.values) == 3 and len(m.cpu.values) == 3 for m in ms)
    assert all(0 < m.wall.min <= m.wall.median <= m.wall.max for m in ms)


def test_a_failing_command_stops_the_suite_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        time_once([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])


# ----------------------------------------------------------------------------- suites and the entry point


def test_a_suite_that_does_not_apply_is_a_result_with_its_reason(tmp_path: Path) -> None:
    args = entry.parse(["project", "--out", str(tmp_path)])
    result = entry.run_suite("project", args)
    assert (result.status, result.reason) == ("skipped", pending.REASONS["project"])
    assert result.measurements == [] and result.ratios == []
    assert result.command == f".venv/bin/python -m bench project --repeat 3 --out {tmp_path}"
    assert result.machine["cores"] >= 1 and len(result.machine["load_average_after"]) == 3


def test_a_crashing_suite_is_recorded_as_skipped_and_the_others_still_run(tmp_path: Path, monkeypatch) -> None:
    def crash(result: SuiteResult, work: Path, out: Path) -> None:
        result.measurements.append(_m("half-done", [1.0, 1.0, 1.0]))
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


# ----------------------------------------------------------------------------- BENCHMARKS.md


def _doc(suite: str, **kw) -> dict:
    result = SuiteResult(suite=suite, status="ok", command=f".venv/bin/python -m bench {suite} --repeat 3",
                         repeat=3, started="2026-11-22T10:00:00Z", duration_s=12.0,
                         machine={"cores": 2, "load_average_before": [1.0, 1.1, 1.2],
                                  "load_average_after": [1.5, 1.1, 1.2], "git_revision": "abc1234",
                                  "git_dirty": False, "python": "3.11.7"})
    for key, value in kw.items():
        setattr(result, key, value)
    return result.as_dict()


def _write(folder: Path, *docs: dict) -> None:
    for doc in docs:
        (folder / f"{doc['suite']}.json").write_text(json.dumps(doc))


def test_report_shows_ratios_figures_machine_and_command(tmp_path: Path) -> None:
    ngcx = _m("ngcx render", [0.18, 0.17, 0.20], cpu=[0.16, 0.17, 0.18])
    ngcx.command, ngcx.note = ".venv/bin/ngcx render pytorch:24.11", "warm cache"
    peer = _m("hpccm --recipe", [0.07, 0.08, 0.09], cpu=[0.06, 0.07, 0.08])
    peer.command = ".venv/bin/hpccm --recipe r.py"
    fast = _m("ngcx size", [0.5, 0.5, 0.5])
    cli = _doc("cli", measurements=[ngcx, peer], notes=["the gap is start-up"],
               ratios=[ratio("ngcx render / hpccm", ngcx, peer), ratio("size / naive", fast, peer)])
    _write(tmp_path, cli, _doc("build", status="skipped", reason="no Docker engine"))
    (tmp_path / "cli.png").write_bytes(b"\x89PNG")
    out = report.write(tmp_path, tmp_path / "BENCHMARKS.md", ["cli", "build", "push"])
    md = out.read_text()

    assert "| [cli](#cli) | ok | ngcx render / hpccm: 2.25; size / naive: 6.25 | 2026-11-22 |" in md
    assert "| [build](#build) | skipped | no Docker engine | 2026-11-22 |" in md
    assert "| push | not run yet | - | - |" in md
    assert "Command: `.venv/bin/python -m bench cli --repeat 3`" in md
    assert "3 repetitions, 2 cores, load average [1.0, 1.1, 1.2] before, [1.5, 1.1, 1.2] after; git abc1234," in md
    assert "| ngcx render / hpccm | **2.25** | 2.43 | ngcx slower |" in md        # 0.18/0.08, 0.17/0.07
    assert ("| ngcx render | `.venv/bin/ngcx render pytorch:24.11` | 0.170 | **0.180** | 0.200 | 0.170 "
            "| warm cache |") in md
    assert "- the gap is start-up" in md and "![cli](cli.png)" in md
    assert "## build\n\nCommand: `.venv/bin/python -m bench build --repeat 3`\n\n**Skipped**: no Docker engine" in md
    assert md.index("## cli") < md.index("## build") and "## push" not in md


def test_report_says_when_ngcx_wins_and_names_throughputs_as_such(tmp_path: Path) -> None:
    quick, slow = _m("ngcx", [1.0, 1.0, 1.0]), _m("naive", [2.0, 2.0, 2.0])
    hi = Measurement("int8", "ngcx", "inf/s", "higher", Stats.of([3000.0, 3100.0, 3200.0]), command="bench x")
    lo = Measurement("fp32", "ngcx", "inf/s", "higher", Stats.of([1500.0, 1550.0, 1600.0]), command="bench x")
    _write(tmp_path, _doc("build", measurements=[quick, slow], ratios=[ratio("ngcx / naive", quick, slow)]),
           _doc("runtime", measurements=[hi, lo], ratios=[ratio("int8 / fp32", hi, lo)]))
    md = report.write(tmp_path, tmp_path / "B.md", ["build", "runtime"]).read_text()
    assert "| ngcx / naive | **0.50** | - | ngcx as fast or faster |" in md
    assert "| int8 / fp32 | **2.00** | - | throughput ratio |" in md
    assert "Each row from: `bench x`" in md                      # one command measured many ways: said once
    assert "| int8 | 3,000.0 | **3,100.0** | 3,200.0 |  |" in md
