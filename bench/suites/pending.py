"""Suites the issue names that this entry point does not measure yet: each skips with its reason.

Why they exist as names now: `python -m bench all` must list every suite of issue 13 with what
happened to it, so a reader sees a gap as a gap, and a later session fills one in by replacing
its entry here with a module of its own (bench/suites/NAME.py with run(result, work, out)).
"""

from __future__ import annotations

from pathlib import Path

from bench.core import SuiteResult, SuiteSkipped

REASONS = {
}


def skipper(name: str):
    """A suite function that skips with the reason for `name`."""

    def run(result: SuiteResult, work: Path, out: Path) -> None:
        raise SuiteSkipped(REASONS[name])

    run.__doc__ = REASONS[name]
    return run
