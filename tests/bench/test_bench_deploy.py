"""bench/suites/deploy.py and deploy_phases.py: the local note, and the phases script run alone."""

from __future__ import annotations

import subprocess
import sys

from bench_samples import ROOT, measurement

from bench.core import Measurement


def test_the_deploy_note_says_when_ngcx_local_is_slower_and_whether_that_is_noise() -> None:
    from bench.suites.deploy import local_note

    def by(ours: list[float], theirs: list[float]) -> dict[str, Measurement]:
        return {n: measurement(n, v) for n, v in (("ngcx deploy: local (total)", ours),
                                                  ("docker run -d -p + poll ready (by hand)", theirs))}

    assert "ranges overlap" in local_note(by([0.95, 1.04, 1.7], [0.99, 1.01, 1.3]))[0]
    assert "ranges apart" in local_note(by([2.0, 2.1, 2.2], [1.0, 1.01, 1.1]))[0]
    assert local_note(by([0.9, 0.95, 1.0], [1.0, 1.01, 1.1])) == [
        "Local: ngcx deploy 0.95 s, docker run by hand 1.01 s: ngcx as fast."]
    assert local_note({}) == []


def test_the_phases_script_runs_alone_as_its_usage_line_says() -> None:
    """`python -m bench.suites.deploy_phases` from the repo root: its own import path (tests/, tests/e2e)."""
    from bench.suites import deploy_phases

    assert "python -m bench.suites.deploy_phases [--repeat 3]" in deploy_phases.__doc__
    done = subprocess.run([sys.executable, "-m", "bench.suites.deploy_phases", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--repeat" in done.stdout and "per phase" in done.stdout
