"""canary: how fast a bad canary leaves a local service by itself (issue 49, part 2), timed as a user sees it.

The service: 2 replicas of examples/onnx-zero-code behind the local haproxy (`--health-interval 1 --drain 5`),
under constant load (tests/e2e/deploy_helpers.Load: LOAD_CLIENTS clients back to back through the balancer).
Each round releases the same model behind a handler whose every 20th call fails (tests/e2e/test_canary_local.py's
FAILING: a little over 5 % of its requests) with `ngcx deploy -f ngcx.bad.yaml --service s1 --canary 10
--canary-window 30`, and measures, from the load's side (its failed-request count read every 10 ms):
- first error -> last error: from the canary's first failed request to its last one, i.e. until the balancer
  gave it no more requests (the judgement, then the old replicas' weight back);
- first error -> rolled back: until the command returned (the canary's replicas drained and removed, the row
  written);
and from the row: how many canary requests the judgement rested on. The old version's own failures are counted
too (its replicas' /metrics): the figure the issue asks to be 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..core import ROOT, Measurement, Stats, SuiteResult, SuiteSkipped

FAST = ("--drain", "5", "--health-interval", "1")
CANARY = ("--canary", "10", "--canary-window", "30")


class ErrorClock:
    """Watches a Load's failed-request list every 10 ms: when the first and the last failure were seen."""

    def __init__(self, load: object) -> None:
        self.load, self.first, self.last = load, 0.0, 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ErrorClock:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def _watch(self) -> None:
        seen = 0
        while not self.stop.wait(0.01):
            now = len(self.load.errors)              # type: ignore[attr-defined]
            if now > seen:
                self.first = self.first or time.monotonic()
                self.last, seen = time.monotonic(), now


def _round(root: Path, env: dict[str, str], url: str, key: str, payload: bytes) -> dict[str, float]:
    from deploy_helpers import Load

    with Load(url, key, payload) as load, ErrorClock(load) as clock:
        load.settle()
        done = subprocess.run([sys.executable, "-m", "ngcx", "deploy", "-f", "ngcx.bad.yaml", "--service", "s1",
                               *CANARY], cwd=root, env=env, capture_output=True, text=True, timeout=900)
        ended = time.monotonic()
        load.settle()
    if done.returncode != 2 or "rolled back" not in done.stderr or not clock.first:
        raise SystemExit(f"the bad canary was not rolled back by itself: {done.stderr[-2000:]}")
    svc = _show(root, env)
    [step] = svc["canary"]["steps"]
    return {"first_to_last": clock.last - clock.first, "first_to_back": ended - clock.first,
            "canary_requests": float(step["canary"]["requests"]), "canary_errors": float(step["canary"]["errors"]),
            "old_failures": float(sum(_failures(m, key) for m in svc["members"])), "load_errors": len(load.errors)}


def _show(root: Path, env: dict[str, str]) -> dict:
    from .deploy_phases import ngcx

    return json.loads(ngcx(root, env, "deployments", "show", "s1", "--json").stdout)


def _failures(member: dict, key: str) -> int:
    import urllib.request

    request = urllib.request.Request(member["endpoint"] + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10) as res:
        text = res.read().decode()
    return int(sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("nv_inference_request_failure{")))


def run(result: SuiteResult, work: Path, out: Path) -> None:
    import os

    if subprocess.run(["/usr/bin/docker", "info"], capture_output=True).returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from test_canary_local import FAILING, body

    from .deploy_phases import ngcx, project_copy

    root = project_copy(work)
    (root / "failing.py").write_text(FAILING)
    spec = (root / "ngcx.yaml").read_text()
    (root / "ngcx.bad.yaml").write_text(spec.replace("name: onnx-zero-code", "name: onnx-zero-code-bad", 1)
                                        + "handler: failing:EveryTwentieth\n")
    ngcx(root, {"NGCX_BASE": "offline"}, "build", "-f", "ngcx.bad.yaml")
    env = {**os.environ, "NGCX_STATE_DIR": str(work / "state-canary"), "NGCX_BASE": "offline"}
    made = ngcx(root, env, "deploy", "--cloud", "local", "--replicas", "2", *FAST)
    url = made.stdout.strip().splitlines()[-1]
    key = ngcx(root, env, "deployments", "key", "s1").stdout.strip()
    try:
        rounds = [_round(root, env, url, key, body(root)) for _ in range(max(result.repeat, 1))]
    finally:
        ngcx(root, env, "deployments", "destroy", "s1", "--yes")
    for key_, name in (("first_to_last", "local: bad canary's first error -> its last (out of the balancer)"),
                       ("first_to_back", "local: bad canary's first error -> rolled back (command done)")):
        result.measurements.append(Measurement(
            name=name, tool="ngcx", unit="s", better="lower", wall=Stats.of([r[key_] for r in rounds]),
            command="ngcx deploy -f ngcx.bad.yaml --service s1 " + " ".join(CANARY)))
    result.extra = {"rounds": rounds, "old_version_failures": sum(r["old_failures"] for r in rounds)}
    result.notes = [f"2-replica local service of examples/onnx-zero-code under {len(rounds)} rounds of constant load; "
                    "the canary is the same INT8 model behind a handler failing every 20th call (~5 % of its "
                    "requests); default SLO (1 % errors, 95 %-confidence early failure). Requests the old version "
                    f"failed across all rounds: {result.extra['old_version_failures']:.0f}."]
