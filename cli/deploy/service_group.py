"""Services whose replicas are the cloud's own scaling group (issue 22): `ngcx deploy … --min A --max B`.

Why the cloud's scaling engine and not ngcx's: the group keeps its size and follows its policy while the
user's laptop is closed; ngcx describes it once (a launch template from the baked host image, the group
over the service's zones, attached to the part-1 balancer's target group, a target-tracking policy) and
then only reads it. What differs from a fixed service (service.py) follows from that:
- the replicas are the group's instances, not deployment rows: the cloud starts and ends them, so ngcx
  would only ever be behind; `show` reads them from the group and the balancer;
- every host boots self-sufficient from its user-data: the image pulled with the instance role (a registry
  token would have expired by the time a host launches), the service key's SHA-256 (never the key), its
  own TLS key pair behind the balancer's HTTPS listener;
- scale-in drains: the balancer's deregistration delay (`--drain`), then a terminating lifecycle hook, both
  the cloud's; `reconcile` ends a hook's wait early once the balancer has let the host go.

The signal is requests per replica at the balancer — AWS's ALBRequestCountPerTarget (per minute, the unit
of --target-requests), ESS's QPS per ALB backend server (per second: the target / 60). The cloud publishes it
with no agent on the host, and for a GPU replica a request is the unit of work (one inference, batched by the
runtime). Measured against the alternative the issue names (`python -m bench signals`, BENCHMARKS.md#signals:
the real runtime under a 1 -> 8 client step, each cloud's alarm rule applied to the sampled series): requests
and the runtime's in-flight count rise in the same half-second sample (in-flight is throughput x latency), and
at the same one-minute period their alarms fire alike (168 s vs 158 s, medians); queue time rises late (the
batcher merges waiting requests) and is a saturation signal. Only a 10 s high-resolution custom metric is faster
(26 s), and that exists on AWS only (ESS alarm tasks take no period under 60 s) and needs a publisher with
PutMetricData rights on every host and custom-metric fees: not built; requests per target is the default.

Intent first, as everywhere: the service row (with the group's sizes) exists before the balancer, the
balancer before the group; the group's name is the service's (ngcx-svc-<owner>-<id>) and carries the
service's tags, so `reconcile` finds and finishes it and `gc` deletes one no row names.
Scale to zero (--min 0, issue 22 item 2): idle, the policy scales the group in to no host, and a host that
scales in is stopped, not terminated (AWS: a warm pool in the Stopped state with ReuseOnScaleIn; ESS: the
recycle scaling policy, StopCharging): the GPU is no longer billed, the disk with the image's layers stays. A
request that comes while no host serves gets the balancer's own 503 — neither ALB can hold a request for
the minute a host needs, nor add a Retry-After header to its own error page — and that 503 is the signal: an
alarm on the balancer's 503 count (CloudWatch / an ESS alarm task) runs a +1 step rule, the cloud starts a
stopped host, and the next requests are served. Clients retry on 503 (WAKE_NOTE says so at deploy). A deploy
at --min 0 still waits for one host to serve, so the service is known to work before it first sleeps.

A target offers `scaling_group(config)` (aws/ and aliyun/ verbs.py: vm_groups.ServiceGroups over EC2 Auto Scaling /
ESS) with check / ensure / roll / members / size / resize / idle / release / delete / tagged. Rolling updates,
rollback, stop/start, logs and key rotation of a group service: group_update.py (issue 49).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from types import ModuleType
from typing import Any

from ..core.errors import UserError
from . import flow, keys, store, target
from .common import (
    DESTROYED,
    FAILED,
    READY,
    SVC_BUSY,
    SVC_RECONCILING,
    SVC_SCALING,
    DeployConfig,
    NotReady,
    ServiceRecord,
)
from .service import (
    Options,
    Say,
    balancer_of,
    balancer_up,
    config_of,
    config_row,
    ref_of,
    require,
    tags_of,
    wait_answering,
    with_version,
)

POLL_S = 1.0
BOOT_S = 600.0                 # on top of --ready-timeout: a group host boots before its container starts
TARGET_REQUESTS = 600.0        # requests per replica per minute the policy keeps (10/s), --target-requests
WAKE_NOTE = ("idle, it scales to zero stopped hosts; a request then gets the balancer's 503 and wakes one "
             "(clients retry on 503: the wake takes the balancer's metric minute, the alarm and a host's start)")


@dataclass(frozen=True)
class Scaling:
    """The group's bounds and its policy's target; kept in the service's config under "group"."""

    min_size: int
    max_size: int
    target_requests: float = TARGET_REQUESTS
    spot: bool = False              # hosts above the floor bought as spot (--spot)
    on_demand_base: int = 0         # --on-demand-base: this many hosts always on demand

    @property
    def market(self) -> tuple[bool, int]:
        return self.spot, self.on_demand_base

    @property
    def to_zero(self) -> bool:
        """--min 0: idle hosts stop (their disk stays), a request wakes one (`idle` in vm_groups.py)."""
        return self.min_size == 0

    @property
    def first(self) -> int:
        """Hosts a deploy waits for: --min, and one at --min 0 (a service is shown to answer before it sleeps)."""
        return max(1, self.min_size)

    def check(self) -> None:
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1:
            raise UserError(f"--min {self.min_size} --max {self.max_size}: need 0 <= min <= max and max >= 1")
        if self.on_demand_base and not self.spot:
            raise UserError(f"--on-demand-base {self.on_demand_base} without --spot: every host is on demand already",
                            hint="add --spot (hosts above the floor are spot), or drop --on-demand-base")
        if not 0 <= self.on_demand_base <= self.max_size:
            raise UserError(f"--on-demand-base {self.on_demand_base}: needs 0..--max ({self.max_size})")
        if self.target_requests <= 0:
            raise UserError(f"--target-requests {self.target_requests:g}: needs a positive number of requests "
                            "per replica per minute")


def is_group(svc: ServiceRecord) -> bool:
    return bool(svc.config.get("group"))


def scaling_of(svc: ServiceRecord) -> Scaling:
    row = svc.config["group"]
    return Scaling(row["min_size"], row["max_size"], row["target_requests"], bool(row.get("spot")),
                   int(row.get("on_demand_base") or 0))


def _groups(module: ModuleType, config: DeployConfig | None) -> Any:
    """The target's scaling-group verbs (vm_groups.ServiceGroups on the VM clouds)."""
    if not hasattr(module, "scaling_group"):
        raise UserError("--min/--max: this target has no scaling groups", hint="use --replicas N")
    return module.scaling_group(config)


def _keyed(svc: ServiceRecord, config: DeployConfig) -> DeployConfig:
    """The config with the service key's hash (the row never keeps it): every host of the group accepts it.
    A key missing here (an ngcx killed between the row and the key) was never given to any host: a new one is
    made, never a group of hosts without a key."""
    if not config.auth:
        return config
    key = keys.get(svc.ref) or keys.create(svc.ref)
    return replace(config, key_hashes=(keys.digest(key),))


# --- create ------------------------------------------------------------------------------------------------
def create(config: DeployConfig, scaling: Scaling, options: Options, say: Say) -> ServiceRecord:
    """Row, key, balancer, group (its template, hook and policy); returns once `min` hosts are healthy in the
    balancer and its URL answers. A failure removes the group and the balancer it made."""
    scaling.check()
    module = target(config.cloud)
    groups = _groups(module, config)
    groups.check()
    if hasattr(module, "check_service"):
        module.check_service(config, options)
    config = with_version(config)
    row = dict(config_row(config, options), group=asdict(scaling))
    svc = store.create_service(config.cloud, config.region, scaling.first, row)
    if config.auth:
        keys.create(svc.ref)
    try:
        svc = _ensure(module, svc, say)
        _wait_serving(module, svc, scaling.first, config.ready_timeout + BOOT_S, say)
        wait_answering(store.service(svc.id), config.ready_timeout)
    except BaseException as exc:
        _teardown(module, store.service(svc.id))
        store.update_service(svc.id, status=FAILED, pid=None, detail=flow.reason(exc))
        keys.forget(svc.ref)
        raise
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def _ensure(module: ModuleType, svc: ServiceRecord, say: Say) -> ServiceRecord:
    """Balancer, then the group (both idempotent: found by name and tags first); the group's ref in the row."""
    balancer, ref = balancer_up(module, svc)
    svc = store.service(svc.id)
    config, options = config_of(svc.config)
    scaling = scaling_of(svc)
    groups = _groups(module, _keyed(svc, config))
    group = groups.ensure(svc.name, ref, (scaling.min_size, scaling.max_size, scaling.first),
                          scaling.target_requests, tags_of(svc), options.drain_s, svc.id, scaling.market)
    if scaling.to_zero:
        groups.idle(group, ref, True)
    say(f"service {svc.ref}: scaling group {group['name']} ({scaling.min_size}..{scaling.max_size} hosts, "
        f"{scaling.target_requests:g} requests per host per minute"
        + (f"; spot above {scaling.on_demand_base} on-demand host(s)" if scaling.spot else "")
        + f") behind {svc.endpoint}"
        + (f"; {WAKE_NOTE}" if scaling.to_zero else ""))
    return store.update_service(svc.id, config=dict(svc.config, group=dict(svc.config["group"], ref=group,
                                                                          types=list(groups.types))))


def _wait_serving(module: ModuleType, svc: ServiceRecord, count: int, timeout: float, say: Say) -> None:
    """Until `count` of the group's hosts are healthy in the balancer (each boots, pulls, starts, passes the
    balancer's own checks); a host whose container failed shows as unhealthy until the timeout says so."""
    deadline, seen = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        healthy = sum(1 for state in _health(module, svc).values() if state == "healthy")
        if healthy != seen:
            say(f"service {svc.ref}: {healthy} of {count} host(s) healthy in the balancer")
            seen = healthy
        if healthy >= count:
            return
        time.sleep(POLL_S)
    raise NotReady(f"service {svc.ref}: {max(seen, 0)} of {count} host(s) of its scaling group healthy after "
                   f"{timeout:.0f} s", hint=f"see the hosts with `ngcx deployments show {svc.ref}`")


def _health(module: ModuleType, svc: ServiceRecord) -> dict[str, str]:
    return balancer_of(module, svc).health(ref_of(svc)) if svc.balancer else {}


def _group_ref(svc: ServiceRecord) -> dict[str, str] | None:
    return svc.config.get("group", {}).get("ref")


# --- read ----------------------------------------------------------------------------------------------------
def members(svc: ServiceRecord) -> list[dict[str, str]]:
    """The group's hosts as the group and the balancer see them (`show`); empty when it cannot be asked."""
    ref = _group_ref(svc)
    if ref is None or svc.status == DESTROYED:
        return []
    module = target(svc.cloud)
    try:
        health = _health(module, svc)
        found = _groups(module, config_of(svc.config)[0]).members(ref)
    except UserError:
        return []
    return [dict(asdict(m), balancer=health.get(m.instance_id, "unused")) for m in found]


def refresh(svc: ServiceRecord) -> ServiceRecord:
    """The row's replica count as the group's desired capacity now (its policy moves it)."""
    ref = _group_ref(svc)
    if ref is None or svc.status != READY:
        return svc
    try:
        sizes = _groups(target(svc.cloud), config_of(svc.config)[0]).size(ref)
    except UserError:
        return svc
    return store.update_service(svc.id, replicas=sizes[2]) if sizes and sizes[2] != svc.replicas else svc


# --- scale, reconcile --------------------------------------------------------------------------------------
def scale(svc: ServiceRecord, low: int, high: int, say: Say) -> ServiceRecord:
    """New bounds; the desired count is kept inside them (the policy moves it from there). Hosts that leave
    drain through the balancer and the lifecycle hook, the cloud's doing."""
    require(svc, READY, "scale")
    scaling = replace(scaling_of(svc), min_size=low, max_size=high)
    scaling.check()
    module = target(svc.cloud)
    groups = _groups(module, config_of(svc.config)[0])
    ref = _group_ref(svc)
    sizes = groups.size(ref) if ref else None
    if ref is None or sizes is None:
        raise UserError(f"service {svc.ref} has no scaling group", hint=f"`ngcx deployments reconcile {svc.ref}`")
    desired = min(max(sizes[2], low), high)
    svc = store.update_service(svc.id, status=SVC_SCALING, pid=os.getpid())
    try:
        if scaling.to_zero != scaling_of(svc).to_zero:
            groups.idle(ref, ref_of(svc), scaling.to_zero)
        groups.resize(ref, low, high, desired)
    finally:
        svc = store.update_service(svc.id, status=READY, pid=None, replicas=desired,
                                   config=dict(svc.config, group=dict(svc.config["group"], min_size=low,
                                                                       max_size=high)))
    say(f"service {svc.ref}: {low}..{high} hosts, {desired} now"
        + (f" ({sizes[2] - desired} draining out)" if desired < sizes[2] else "")
        + (f"; {WAKE_NOTE}" if scaling.to_zero else ""))
    return svc


def reconcile(svc: ServiceRecord, say: Say) -> ServiceRecord:
    """The balancer and the group as the row says (made again when missing); hosts the group is letting go
    whose drain is over are released from the lifecycle hook's wait at once. Safe from cron."""
    if svc.status == DESTROYED:
        raise UserError(f"service {svc.ref} is destroyed")
    if svc.status not in (READY, FAILED) and not store.service_interrupted(svc):
        raise UserError(f"service {svc.ref} is {svc.status} by ngcx pid {svc.pid}", hint="wait for it to finish")
    module = target(svc.cloud)
    svc = store.update_service(svc.id, status=SVC_RECONCILING, pid=os.getpid())
    try:
        svc = _ensure(module, svc, say)
        health = _health(module, svc)
        groups = _groups(module, config_of(svc.config)[0])
        for member in groups.members(_group_ref(svc)):
            if member.state == "leaving" and health.get(member.instance_id) not in ("draining", "healthy"):
                groups.release(_group_ref(svc), member.instance_id)
                say(f"service {svc.ref}: host {member.instance_id} drained; released from the lifecycle wait")
    except BaseException as exc:
        store.update_service(svc.id, status=READY, pid=None, detail=f"reconcile stopped: {flow.reason(exc)}")
        raise
    return refresh(store.update_service(svc.id, status=READY, pid=None, detail=None))


# --- destroy, gc ---------------------------------------------------------------------------------------------
def destroy(svc: ServiceRecord) -> None:
    """Group (its hosts terminate), template, balancer, key; safe to run again."""
    _teardown(target(svc.cloud), svc)
    keys.forget(svc.ref)
    store.update_service(svc.id, status=DESTROYED, pid=None)


def _teardown(module: ModuleType, svc: ServiceRecord) -> None:
    groups = _groups(module, config_of(svc.config)[0])
    ref = _group_ref(svc)
    for found in ([ref] if ref else groups.tagged(tags_of(svc))):   # one a killed ngcx made before its row knew
        groups.delete(found)
    if svc.balancer:
        balancer_of(module, svc).delete(ref_of(svc))


def orphan_groups(cloud: str) -> list[dict[str, str]]:
    """Scaling groups carrying this store's owner tag that no live service names (a kill -9 before its row
    knew). No call at all while no service of this store ever had a group on `cloud`."""
    if not any(is_group(s) for s in store.services(cloud=cloud, include_gone=True)):
        return []
    live = store.services(cloud=cloud)
    if any(s.status in SVC_BUSY and store.alive(s.pid) for s in live):
        return []
    owned = {s.name for s in live if is_group(s)}
    found = _groups(target(cloud), None).tagged({"ngcx:owner": store.owner_id()})
    return [dict(ref, id=ref["name"], status="scaling group") for ref in found if ref["name"] not in owned]


def delete_orphan_group(cloud: str, item: dict[str, str]) -> None:
    _groups(target(cloud), None).delete({k: item[k] for k in ("name", "template_id", "version")})
