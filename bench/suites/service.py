"""service: a 3-replica service on this workstation (issue 21), timed as a user runs it.

Figures, each over `repeat` rounds in one state store (one service made per round):
- `ngcx deploy --cloud local --replicas 3`: from the command to the balancer answering (the command returns
  only then: service.py `wait_answering`); the reference is one lone `ngcx deploy --cloud local` of the same
  project in the same round (what one replica costs), so the ratio says what the other two and the balancer add;
- a rolling update of the 3 replicas (`ngcx deploy -f ngcx.fp16.yaml --service sN`: the project's FP16 build
  replaces its INT8 one): 3 new replicas up and healthy, then 3 old ones drained and removed;
- a dead replica replaced: its container killed, then `ngcx deployments reconcile` until a new one is healthy
  and the dead one removed.
Every service runs with `--health-interval 1 --drain 5` (a verdict after two checks: ~2 s; a drain bounded by
5 s); what the figures vary with is mostly the replica's own start (model load, warm-up) and this machine's load.

Then the same on each emulated cloud named in NGCX_BENCH_SERVICE_CLOUDS (default `aws`; `aws,aliyun` for both,
empty for none): bench/suites/service_clouds.py says what is real there and what is emulated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ..core import ROOT, Measurement, Stats, SuiteResult, SuiteSkipped, ratio

FAST = ("--drain", "5", "--health-interval", "1")


def timed(root: Path, env: dict[str, str], *args: str) -> float:
    """Seconds of one ngcx command (it exits 0 or the suite stops with its error)."""
    from .deploy_phases import ngcx

    t0 = time.monotonic()
    ngcx(root, env, *args)
    return time.monotonic() - t0


def _round(root: Path, env: dict[str, str]) -> dict[str, float]:
    """One of each figure, in a fresh service (made INT8, rolled to FP16, repaired, destroyed)."""
    import json

    import docker

    from .deploy_phases import ngcx

    lone_s = timed(root, env, "deploy", "--cloud", "local")
    lone = json.loads(ngcx(root, env, "deployments", "ls", "--json").stdout)[0]
    ngcx(root, env, "deployments", "destroy", str(lone["id"]), "--yes")
    create_s = timed(root, env, "deploy", "--cloud", "local", "--replicas", "3", *FAST)
    ref = json.loads(ngcx(root, env, "deployments", "ls", "--all", "--json").stdout)[0]["service_id"]
    update_s = timed(root, env, "deploy", "-f", "ngcx.fp16.yaml", "--service", f"s{ref}")
    members = json.loads(ngcx(root, env, "deployments", "show", f"s{ref}", "--json").stdout)["members"]
    if len(members) != 3 or any("fp16" not in m["image"] for m in members):
        raise SystemExit(f"the rolling update did not leave 3 FP16 replicas: {members}")
    docker.from_env().containers.get(members[0]["container"]).kill()
    replace_s = timed(root, env, "deployments", "reconcile", f"s{ref}")
    ngcx(root, env, "deployments", "destroy", f"s{ref}", "--yes")
    return {"lone": lone_s, "create": create_s, "update": update_s, "replace": replace_s}


def run(result: SuiteResult, work: Path, out: Path) -> None:
    if subprocess.run(["/usr/bin/docker", "info"], capture_output=True).returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    from .deploy_phases import ngcx, project_copy

    root = project_copy(work)
    ngcx(root, {"NGCX_BASE": "offline"}, "build", "-f", "ngcx.fp16.yaml")
    env = {"NGCX_STATE_DIR": str(work / "state-service"), "NGCX_BASE": "offline"}
    rounds = [_round(root, env) for _ in range(max(result.repeat, 1))]
    figures = {
        "lone": ("local: ngcx deploy (one container, the reference)", "ngcx deploy --cloud local"),
        "create": ("local: deploy --replicas 3 -> balancer answering", "ngcx deploy --cloud local --replicas 3 "
                   + " ".join(FAST)),
        "update": ("local: rolling update of 3 replicas", "ngcx deploy -f ngcx.fp16.yaml --service sN"),
        "replace": ("local: dead replica replaced (docker kill + reconcile)", "ngcx deployments reconcile sN"),
    }
    by = _measure(result, rounds, figures)
    result.ratios.append(ratio("3-replica service / one deployment", by["create"], by["lone"]))
    result.extra = {"local": rounds}
    result.notes = ["Local service (haproxy in a container in front of 3 local replicas of examples/onnx-zero-code), "
                    "health checks every 1 s, drain 5 s. The ratio says what two more replicas (made in parallel) "
                    "and the balancer add to one deploy."]
    for cloud in [c for c in os.environ.get("NGCX_BENCH_SERVICE_CLOUDS", "aws").split(",") if c]:
        from . import service_clouds

        found = service_clouds.rounds(root, work, max(result.repeat, 1), cloud)
        base = f"ngcx deploy --cloud {cloud} --gpu {service_clouds.GPU[cloud]} --certificate ID --registry-login token"
        _measure(result, found, {
            "made_baked": (f"{cloud}: deploy --replicas 3 -> balancer answering (fresh hosts, baked image)",
                           f"{base} --replicas 3"),
            "made_warm": (f"{cloud}: deploy --replicas 3 -> balancer answering (stopped hosts of the warm pool)",
                          f"{base} --replicas 3"),
            "update": (f"{cloud}: rolling update of 3 replicas", f"{base} --service sN -- CMD"),
            "replace": (f"{cloud}: a stopped host's replica replaced", "ngcx deployments reconcile sN"),
        })
        result.extra[cloud] = found
        result.notes.append(f"{cloud}: {service_clouds.__doc__.split(chr(10))[0]} (bench/suites/service_clouds.py: "
                            f"emulated API delays and balancer clock x{service_clouds.TIME_SCALE}; boots, pulls, "
                            "container starts and model loads are real).")


def _measure(result: SuiteResult, rounds: list[dict[str, float]], figures: dict[str, tuple[str, str]]
             ) -> dict[str, Measurement]:
    by = {}
    for key, (name, command) in figures.items():
        by[key] = Measurement(name=name, tool="ngcx", unit="s", better="lower",
                              wall=Stats.of([r[key] for r in rounds]), command=command)
        result.measurements.append(by[key])
    return by
