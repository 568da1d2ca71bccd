"""bench/core.py: the figures every suite reports (min / median / max, ngcx / peer ratios) and how it times them.

Why: BENCHMARKS.md is what users read to choose ngcx over hpccm or a hand-written Dockerfile; a
median taken from the wrong values or a ratio turned upside down would mislead them silently.
No Docker, no peers: the timed commands are tiny Pythons.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bench_samples import measurement

from bench.core import Ratio, Stats, Timed, ratio, time_interleaved, time_once


def test_stats_are_min_median_max_of_every_value() -> None:
    s = Stats.of([0.3, 0.1, 0.2, 0.9])
    assert (s.min, s.median, s.max) == (0.1, 0.25, 0.9)   # even count: the mean of the middle two
    assert s.values == [0.3, 0.1, 0.2, 0.9]                # kept in run order, for the JSON
    assert Stats.of([5.0, 1.0, 2.0]).median == 2.0


def test_ratio_is_ngcx_over_peer_on_medians() -> None:
    ngcx = measurement("ngcx", [0.30, 0.20, 0.90], cpu=[0.1, 0.1, 0.1])
    peer = measurement("peer", [0.10, 0.05, 0.11], cpu=[0.05, 0.05, 0.06])
    r = ratio("ngcx / peer", ngcx, peer)
    assert (r.wall, r.cpu) == (3.0, 2.0)                   # 0.30 / 0.10 and 0.1 / 0.05, not min or max
    assert not r.ngcx_wins
    assert ratio("peer / ngcx", peer, ngcx).ngcx_wins
    assert ratio("no cpu", measurement("a", [1.0, 1.0, 1.0]), peer).cpu is None


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
