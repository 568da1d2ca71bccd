"""What the overview, deployment and service pages show, read from the state store and the offers tables.

Why plain dicts: the templates (templates/*.html.j2) render them and the JSON API returns them as they are,
so the page and a script see the same fields. Everything here is a read of the store (deploy/store.py: WAL
readers never block a command's write) or of the shipped offers tables (deploy/offers.py, parsed once).
Health comes from the scrapers (scrape.py), passed in: this module never touches the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..deploy import store
from ..deploy.common import FAILED, IN_FLIGHT, PHASES, READY, STOPPED, DeployRecord, ServiceRecord

Health = Callable[[int], dict[str, Any]]
RECENT_FAILURES = 20          # failed deployments the overview lists (the count covers all of them)


def overview(health: Health, orphans: dict[str, Any], images: list[dict], builds: list[dict]) -> dict[str, Any]:
    """The overview page: live deployments and services, what needs attention first, images and builds."""
    everything = store.records(include_gone=True)
    live = [r for r in everything if r.status in (*IN_FLIGHT, READY, STOPPED)]
    failed = [r for r in everything if r.status == FAILED]
    rows = [deployment_row(r, health(r.id)) for r in live]
    attention = {
        "failed": len(failed),
        "unhealthy": sum(1 for row in rows if row["health"]["state"] == "unhealthy"),
        "interrupted": len(store.interrupted()),
        "orphaned": orphans.get("count"),
        "orphans_checked": orphans.get("checked"),
        "orphans_error": orphans.get("error"),
    }
    return {"deployments": rows, "services": [service_row(s) for s in store.services()],
            "failed": [deployment_row(r, _not_running(r)) for r in failed[:RECENT_FAILURES]],
            "attention": attention, "images": images, "builds": builds,
            "cost_per_hour": _total_cost(rows)}


def deployment_row(record: DeployRecord, health: dict[str, Any]) -> dict[str, Any]:
    """One deployment as the overview lists it: where, what, since when, at what price, how healthy."""
    price, currency, gpu = offer(record.cloud, record.instance_type, bool(record.spec.get("spot")))
    return {"id": record.id, "cloud": record.cloud, "region": record.region or "", "zone": record.zone or "",
            "type": record.instance_type or "", "gpu": gpu, "status": record.status, "image": record.image,
            "endpoint": record.endpoint or "", "uptime_s": _uptime(record), "price": price, "currency": currency,
            "service": f"s{record.service_id}" if record.service_id else "", "model": record.model or "",
            "health": health if record.status == READY else _not_running(record), "detail": record.detail or ""}


def service_row(svc: ServiceRecord) -> dict[str, Any]:
    return {"ref": svc.ref, "id": svc.id, "cloud": svc.cloud, "region": svc.region or "", "name": svc.name,
            "status": svc.status, "replicas": svc.replicas, "endpoint": svc.endpoint or "",
            "image": svc.config.get("image", ""), "group": svc.config.get("group") or {},
            "uptime_s": time.time() - svc.created_at}


def deployment(record_id: int, health: Health) -> dict[str, Any]:
    """The deployment page's facts: the row, the record's fields, and its last deploy's phase timeline."""
    record = store.get(record_id)
    spec = {k: v for k, v in record.spec.items() if k not in ("marks",)}
    return {"row": deployment_row(record, health(record.id)), "record": record.as_json() | {"spec": spec},
            "timeline": timeline(record.phases), "live": record.status in (*IN_FLIGHT, READY, STOPPED),
            "can": actions_for(record)}


def service(service_id: int, health: Health) -> dict[str, Any]:
    svc = store.service(service_id)
    config = {k: v for k, v in svc.config.items() if k != "canary"}
    return {"row": service_row(svc), "config": config, "balancer": svc.balancer, "detail": svc.detail or "",
            "replicas": [deployment_row(r, health(r.id)) for r in store.records(service=service_id)],
            "canary": canary(svc.canary)}


def canary(judged: dict[str, Any]) -> dict[str, Any]:
    """The last canary release (deploy/canary.py keeps it in the row) as the service page shows it: its outcome,
    versions and SLO, and per step the share, verdict, seconds watched and both versions' figures."""
    if not judged:
        return {}
    policy = judged.get("policy") or {}
    steps = [{"percent": s.get("percent"), "outcome": s.get("outcome", ""), "seconds": s.get("seconds") or 0,
              "canary": s.get("canary") or {}, "baseline": s.get("baseline") or {},
              "reasons": "; ".join(s.get("reasons") or [])} for s in judged.get("steps") or []]
    return {"outcome": judged.get("outcome", ""), "image": judged.get("image", ""),
            "version": str(judged.get("version") or "")[-12:], "from": str(judged.get("from_version") or "")[-12:],
            "reason": judged.get("reason", ""), "steps": steps,
            "slo": f"error rate ≤ {100 * float(policy.get('max_error_rate', 0)):g} %, p99 ≤ "
                   f"{float(policy.get('max_p99_ms', 0)):g} ms and ≤ {float(policy.get('p99_factor', 0)):g}x the old "
                   f"version's, {float(policy.get('window_s', 0)):g} s per step"}


def actions_for(record: DeployRecord) -> list[str]:
    """The buttons the page offers: what `ngcx deployments` would accept for this record now."""
    if record.service_id is not None:
        return []      # a replica changes through its service (commands/deployments.py says the same)
    if record.status == READY:
        return ["stop", "destroy"] if record.cloud != "local" or record.container else ["destroy"]
    if record.status == STOPPED:
        return ["start", "destroy"]
    if record.status in IN_FLIGHT:
        return ["destroy"]
    return []


def timeline(phases: dict[str, float]) -> list[dict[str, Any]]:
    """api · boot · pull · start · ready as segments: each phase's seconds and its share of the total."""
    total = sum(phases.get(p, 0.0) for p in PHASES)
    return [{"phase": p, "seconds": phases.get(p, 0.0),
             "share": (phases.get(p, 0.0) / total * 100.0) if total else 0.0} for p in PHASES if p in phases]


def offer(cloud: str, instance_type: str | None, spot: bool) -> tuple[float | None, str, str]:
    """(price per hour, currency, GPU label) from the cloud's offers table; the workstation's own is free."""
    if cloud == "local" or not instance_type:
        return None, "", ""
    from ..core.errors import UserError
    from ..deploy.offers import load_table

    try:
        types, meta = load_table(cloud)
    except UserError:
        return None, "", ""
    for t in types:
        if t.name == instance_type:
            return t.price(spot), meta["currency"], t.gpu_label()
    return None, meta["currency"], ""


def _total_cost(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Running hosts' price per hour, per currency (a stopped host bills only its disk: not counted)."""
    cost: dict[str, float] = {}
    for row in rows:
        if row["price"] is not None and row["status"] == READY:
            cost[row["currency"]] = cost.get(row["currency"], 0.0) + row["price"]
    return cost


def _uptime(record: DeployRecord) -> float | None:
    return time.time() - record.created_at if record.status in (READY, STOPPED) else None


def _not_running(record: DeployRecord) -> dict[str, Any]:
    state = {STOPPED: "stopped", FAILED: "failed"}.get(record.status, "deploying" if record.status in IN_FLIGHT
                                                          else record.status)
    return {"state": state, "reason": record.detail or "", "checked": None}
