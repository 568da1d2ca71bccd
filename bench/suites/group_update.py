"""group_update: an autoscaled spot service's rolling update and a spot reclaim, and what spot saves (issue 49).

Usage: `.venv/bin/python -m bench group_update --repeat 3` from the repository root (tests/ and tests/e2e go on
the import path: their emulators and load client are what it drives). NGCX_BENCH_GROUP_CLOUDS picks the emulated
clouds (default `aws`).

Per round, one service on the emulated cloud, set up as the autoscale suite's (autoscale.py: moto +
tests/emulators/aws_autoscaling.py and aws_refresh.py; hosts are containers with their own dockerd booting the
group's user-data from the baked image; the ALB's data plane a real haproxy with the bench's certificate):
- made: `ngcx deploy --min 3 --max 3 --spot --on-demand-base 1` (1 on-demand host, 2 spot);
- the rolling update: `ngcx deploy --service sN -- <the image's command, another queue delay>` timed to its
  end (the group's instance refresh: 3 new hosts healthy in the balancer, then the 3 old ones drained), under
  LOAD_CLIENTS paced clients through the balancer; its failed requests counted;
- a reclaim: the emulator's EC2 takes a spot host back (rebalance recommendation and two-minute notice in its
  IMDS; the group, CapacityRebalance on, launches a replacement and drains the reclaimed host); the failed
  requests from the reclaim until the replacement serves;
- destroy.
Cost per hour (no emulator: the offers table): a 3-replica service of the type the group launched, 2 spot above
a 1-host on-demand floor, against all 3 on demand.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Stats, SuiteResult, SuiteSkipped
from .autoscale import STEP_MAX_S, _hosts, _until, group_cloud

LOAD_CLIENTS = 2
RATE = 4.0
NOTES = [
    "One autoscaled service per round on the emulated cloud: --min 3 --max 3 --spot --on-demand-base 1. The update "
    "is the group's instance refresh (MinHealthyPercentage 100, MaxHealthyPercentage 200: the 3 new hosts boot and "
    "are healthy in the balancer before the 3 old ones drain), so its time is mostly 3 hosts booting at once on this "
    "2-core machine (real dockerd, pull, model load) plus the 30 s deregistration delay at x0.1.",
    f"Load: {LOAD_CLIENTS} clients at {RATE:g} paced inference requests/s each through the balancer's HTTPS, during "
    "the update and from the reclaim until its replacement serves. Failed requests are counted, not hidden.",
    "Cost: the offers table's list prices (aws/offers.yaml: on-demand us-east-1 as of prices_as_of, the spot figure "
    "a typical one; spot prices move per zone and hour).",
]


def run(result: SuiteResult, work: Path, out: Path) -> None:
    if subprocess.run(["/usr/bin/docker", "info"], capture_output=True).returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
    from .deploy_phases import project_copy

    root = project_copy(work)
    result.notes, result.extra = list(NOTES), {}
    for cloud in [c for c in os.environ.get("NGCX_BENCH_GROUP_CLOUDS", "aws").split(",") if c]:
        rounds = _rounds(root, work, max(result.repeat, 1), cloud)
        for key, name, unit, command in (
                ("update", f"{cloud}: rolling update of 3 hosts (instance refresh) to its end", "s",
                 "ngcx deploy --service sN -- CMD"),
                ("update_failed", f"{cloud}: requests failed during the rolling update", "requests",
                 f"{LOAD_CLIENTS} clients x {RATE:g}/s"),
                ("reclaim_failed", f"{cloud}: requests failed across a spot reclaim", "requests",
                 "emulated EC2 reclaim"),
                ("replaced", f"{cloud}: a reclaimed spot host -> its replacement healthy", "s", "capacity rebalance")):
            result.measurements.append(Measurement(name=name, tool="ngcx", unit=unit, better="lower",
                                                   wall=Stats.of([r[key] for r in rounds]), command=command))
        result.extra[cloud] = {"rounds": rounds, "cost": _cost(cloud, rounds)}
        cost = result.extra[cloud]["cost"]
        result.notes.append(f"{cloud}: a 3-replica service of {cost['type']}: {cost['spot']:.3f} {cost['currency']}/h "
                            f"with 2 spot above a 1-host on-demand floor, {cost['on_demand']:.3f} all on demand "
                            f"({cost['saved']:.0%} saved).")


def _cost(cloud: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    from ngcx.deploy.offers import planned_markets, service_cost

    itype = str(rounds[0]["type"])
    floor = service_cost(cloud, itype, planned_markets(3, True, 1))
    if floor is None or floor.per_hour is None or floor.on_demand_per_hour is None:
        raise SystemExit(f"{cloud}: {itype} has no price in the offers table")
    return {"type": itype, "spot": floor.per_hour, "on_demand": floor.on_demand_per_hour, "saved": floor.saving,
            "currency": floor.currency}


def _rounds(root: Path, work: Path, repeat: int, cloud: str) -> list[dict[str, Any]]:
    with group_cloud(root, work, cloud, "group-update") as (env, scaling, base, ca, region):
        scaling.refresh.launch_timeout_s = STEP_MAX_S
        return [_round(root, env, scaling, base, ca, region, n + 1) for n in range(repeat)]


def _round(root: Path, env: dict[str, str], scaling: Any, base: tuple[str, ...], ca: Path, region: str,
           number: int) -> dict[str, Any]:
    from deploy_helpers import Load
    from e2e.test_service_clouds import CHANGED, _image_command, payload

    from .deploy_phases import ngcx

    ref = f"s{number}"
    ngcx(root, env, *base, "--min", "3", "--max", "3", "--spot", "--on-demand-base", "1", "--target-requests",
         "100000")
    svc = json.loads(ngcx(root, env, "deployments", "show", ref, "--json").stdout)
    key = ngcx(root, env, "deployments", "key", ref).stdout.strip()
    body, _ = payload(root)
    context = ssl.create_default_context(cafile=str(ca))
    _until(lambda: _serving(env, number, 3, set()))
    old = {h["instance_id"] for h in _hosts(env, number)}
    with Load(svc["endpoint"], key, body, context, clients=LOAD_CLIENTS, rate=RATE) as update:
        update.settle(5)
        started = time.monotonic()
        ngcx(root, env, *base, "--service", ref, "--", *_image_command(None), *CHANGED)
        update_s = time.monotonic() - started
        _until(lambda: _serving(env, number, 3, old))
    spot = next(h["instance_id"] for h in _hosts(env, number) if h.get("market") == "spot")
    with Load(svc["endpoint"], key, body, context, clients=LOAD_CLIENTS, rate=RATE) as reclaim:
        reclaim.settle(5)
        started = time.monotonic()
        scaling.refresh.reclaim(region, spot)
        replaced = _until(lambda: _serving(env, number, 3, {spot})) - started
        reclaim.settle(5)
    ngcx(root, env, "deployments", "destroy", ref, "--yes")
    return {"update": update_s, "update_failed": float(len(update.errors)), "reclaim_failed": float(len(
        reclaim.errors)), "replaced": replaced, "requests": float(update.total() + reclaim.total()),
            "type": (svc["config"]["group"].get("types") or ["?"])[0]}


def _serving(env: dict[str, str], number: int, count: int, but: set[str]) -> bool:
    found = [h for h in _hosts(env, number) if h["state"] == "in-service" and h["balancer"] == "healthy"]
    return len(found) == count and not {h["instance_id"] for h in found} & but
