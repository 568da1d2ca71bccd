"""The suites of `python -m bench`, in the order `all` runs them (issue 13's list).

A suite is a function run(result: SuiteResult, work: Path, out: Path) that fills `result`
(measurements, ratios, notes, extra) or raises SuiteSkipped with the reason it does not apply.
"""

from __future__ import annotations

from bench.suites import build, cli, deploy, project, push, runtime

SUITES = {
    "cli": cli.run,
    "build": build.run,
    "project": project.run,
    "push": push.run,
    "deploy": deploy.run,
    "runtime": runtime.run,
}
