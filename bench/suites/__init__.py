"""The suites of `python -m bench`, in the order `all` runs them (issue 13's list).

A suite is a function run(result: SuiteResult, work: Path, out: Path) that fills `result`
(measurements, ratios, notes, extra) or raises SuiteSkipped with the reason it does not apply.
`security` (issue 20) measures what bearer keys and TLS cost the runtime; `service` (issue 21) times a
3-replica local service: made, rolled, repaired; `autoscale` (issue 22) an autoscaled service on the
emulated AWS under a load step; `signals` (issue 22) which scaling signal (requests per target, or the runtime's
in-flight / queue time as a custom metric) breaches its cloud alarm first after a load step on the real runtime;
`dashboard` (issue 23) the overview's first paint, bytes and update latency with 200 deployments and 500 images;
`sbom` (issue 48) `ngcx sbom` on the catalog images built here against the bare dpkg-query + pip list;
`canary` (issue 49) the time from a bad canary's first error to its rollback on a local service;
`group_update` (issue 49) an autoscaled spot service's rolling update and a spot reclaim, and what spot saves;
`trust` (issue 48) sign + attest against the push, verify at deploy, and the build with hash-checked wheels
against the commit before them.
The other modules here are helpers of the suite they are named after: peers.py (the hpccm recipes
of cli and build), project_figures.py, push_figures.py / push_compress.py / push_registry.py /
push_pull.py, and deploy_phases.py (the deploy measurement, also runnable alone).
"""

from __future__ import annotations

from . import (
    autoscale,
    build,
    canary,
    cli,
    dashboard,
    deploy,
    group_update,
    project,
    push,
    runtime,
    sbom,
    security,
    serve_peers,
    service,
    signals,
    trust,
)

SUITES = {
    "cli": cli.run,
    "build": build.run,
    "project": project.run,
    "push": push.run,
    "deploy": deploy.run,
    "runtime": runtime.run,
    "security": security.run,
    "service": service.run,
    "autoscale": autoscale.run,
    "signals": signals.run,
    "dashboard": dashboard.run,
    "serve-peers": serve_peers.run,
    "sbom": sbom.run,
    "trust": trust.run,
    "canary": canary.run,
    "group_update": group_update.run,
}
