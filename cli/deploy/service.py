"""Services (issue 21): N replicas of one deployment behind the target's own load balancer, rolled,
scaled and repaired without a failed request.

Why its own module over flow.py: a replica is an ordinary deployment (flow.deploy makes it, with its
record, its phases and its clean-up on failure); what a service adds is the order of the steps around
them, which is the same on every target and lives here once:
- intent first: the service row exists before its balancer or any replica, and every replica's row
  names it, so a kill -9 at any step leaves records that `reconcile` (and `gc`) finish from;
- a replica takes traffic only once its own endpoint is ready (flow.wait_ready + security.check) AND
  the balancer's health checks pass (`healthy`), and leaves it only through the balancer's drain
  (deregister, then wait until the balancer has let it go), so no request is ever sent to a replica
  that cannot answer it;
- an update brings up every new-version replica before any old one drains (blue/green inside one
  balancer): a version that never gets healthy is removed again and the old replicas, never touched,
  kept serving throughout; the service's row keeps the config before the update (`rollback`).

Each target supplies `balancer(config)` (a balancer.Balancer in the service's region), `member(record)` (what
the balancer registers for a replica), `service_spec(...)` (its listener and target protocols) and may supply
`check_service` (refuses a service it cannot make, before any row or call) and `service_zones` (where replicas
spread). One key opens the service: it is kept as keys.py's `s<ID>.key` and every replica's host holds its hash.
gc looks for orphaned balancers in each cloud's default region.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from types import ModuleType
from typing import Any

from ..core.errors import UserError
from . import flow, keys, store, target
from .balancer import WEIGHT, BalancerRef
from .common import (
    DESTROYED,
    FAILED,
    IN_FLIGHT,
    READY,
    STOPPED,
    SVC_BUSY,
    SVC_RECONCILING,
    SVC_SCALING,
    SVC_UPDATING,
    DeployConfig,
    DeployRecord,
    NotReady,
    ServiceRecord,
)

Say = Callable[[str], None]
POLL_S = 0.25
UNHEALTHY_AFTER_S = 60.0      # reconcile replaces a replica the balancer has found unhealthy this long
MAX_PARALLEL = 8              # replicas brought up at once (each a deploy of its own)
NOT_STORED = ("key_hashes", "service_id", "replica")   # per replica, or secret-adjacent: never in the row


@dataclass(frozen=True)
class Options:
    """How the balancer listens and checks; kept in the service's config under "balancer"."""

    port: int | None = None          # the balancer's port (local: on 127.0.0.1; None: a free one / 443)
    drain_s: int = 30                # deregistration delay: in-flight requests finish within it
    health_interval_s: int = 5
    healthy_threshold: int = 2
    unhealthy_threshold: int = 2
    certificate_id: str | None = None   # the user's certificate at the balancer (CAS id / ACM ARN)


# --- the records ---------------------------------------------------------------------------------------
def config_row(config: DeployConfig, options: Options) -> dict[str, Any]:
    row = {k: v for k, v in asdict(config).items() if k not in NOT_STORED}
    return dict(row, balancer=asdict(options))


def config_of(row: dict[str, Any]) -> tuple[DeployConfig, Options]:
    names = {f.name for f in fields(DeployConfig)}
    config = DeployConfig(**{k: v for k, v in row.items() if k in names})
    config.pushes = [tuple(p) for p in config.pushes]          # JSON made them lists
    return config, Options(**row.get("balancer", {}))


def replicas(svc: ServiceRecord) -> list[DeployRecord]:
    """The service's live replicas, oldest first."""
    return sorted(store.records(service=svc.id), key=lambda r: r.id)


def key_name(svc: ServiceRecord) -> str:
    return svc.ref


def with_version(config: DeployConfig) -> DeployConfig:
    """What the replicas of this config run, as one word: the pushed digest a cloud host pulls, else the local
    image's id (a rebuild under the same tag is a new version)."""
    if config.pull_ref and "@" in config.pull_ref:
        return replace(config, version=config.pull_ref.split("@", 1)[1])
    from ..core.engine import engine_client, image_or_none

    image = image_or_none(engine_client(), config.image)
    return replace(config, version=image.id if image is not None else config.image)


def _short(version: str | None) -> str:
    return (version or "?").split(":")[-1][:12]


# --- create --------------------------------------------------------------------------------------------
def create(config: DeployConfig, count: int, options: Options, say: Say) -> ServiceRecord:
    """Intent, then the balancer, then `count` replicas in parallel, each ready and healthy in the balancer;
    returns once the balancer's URL answers /v2/health/ready. A failure removes everything it made."""
    if count < 1:
        raise UserError(f"--replicas {count}: a service needs at least one replica")
    module = target(config.cloud)
    if hasattr(module, "check_service"):          # e.g. a cloud's balancer needs --certificate: before any row
        module.check_service(config, options)
    config = with_version(config)
    svc = store.create_service(config.cloud, config.region, count, config_row(config, options))
    key = keys.create(key_name(svc)) if config.auth else None
    try:
        balancer, ref = balancer_up(module, svc)
        say(f"service {svc.ref}: balancer {ref.balancer_id} at {store.service(svc.id).endpoint}")
        _add(module, svc, balancer, ref, config, list(range(count)), key, say)
        wait_answering(store.service(svc.id), config.ready_timeout)
    except BaseException as exc:
        _teardown(module, store.service(svc.id))
        store.update_service(svc.id, status=FAILED, pid=None, detail=flow.reason(exc))
        keys.forget(key_name(svc))
        raise
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def balancer_up(module: ModuleType, svc: ServiceRecord) -> tuple[Any, BalancerRef]:
    """ensure (idempotent: a second call finds what the first made) and keep the ref and URL in the row."""
    config, options = config_of(svc.config)
    spec = module.service_spec(svc.name, _zones(module, config), tags_of(svc), options, config)
    balancer = module.balancer(config)
    ref = balancer.ensure(spec)
    scheme = "https" if spec.protocol == "HTTPS" else "http"
    store.update_service(svc.id, balancer=asdict(ref), endpoint=f"{scheme}://{ref.dns_name}")
    return balancer, ref


def balancer_of(module: ModuleType, svc: ServiceRecord) -> Any:
    """The target's balancer client for this service (its region, its --allow-from)."""
    return module.balancer(config_of(svc.config)[0])


def _zones(module: ModuleType, config: DeployConfig) -> tuple[str, ...]:
    return tuple(module.service_zones(config)) if hasattr(module, "service_zones") else ()


def tags_of(svc: ServiceRecord) -> dict[str, str]:
    return {"ngcx:owner": store.owner_id(), "ngcx:service": str(svc.id)}


def ref_of(svc: ServiceRecord) -> BalancerRef:
    if not svc.balancer:
        raise UserError(f"service {svc.ref} has no balancer recorded",
                        hint=f"`ngcx deployments reconcile {svc.ref}` makes it")
    return BalancerRef(**svc.balancer)


def _add(module: ModuleType, svc: ServiceRecord, balancer: Any, ref: BalancerRef, config: DeployConfig,
         indices: list[int], key: str | None, say: Say) -> list[DeployRecord]:
    """Replicas at `indices`, in parallel; each in the balancer and healthy. The first failure is raised
    after the others finished (the caller removes what came up)."""
    def one(index: int) -> DeployRecord:
        zones = _zones(module, config)
        cfg = replace(config, service_id=svc.id, replica=index, port=None,
                      zone=config.zone or (zones[index % len(zones)] if zones else None))
        record = flow.deploy(cfg, service_key=key)
        _join(module, balancer, ref, record, config.ready_timeout)
        say(f"service {svc.ref}: replica {record.id} ({_short(cfg.version)}) is healthy in the balancer")
        return record

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, max(1, len(indices)))) as pool:
        futures = [pool.submit(one, index) for index in indices]
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def _join(module: ModuleType, balancer: Any, ref: BalancerRef, record: DeployRecord, timeout: float) -> None:
    """Register the replica and wait until the balancer's own checks call it healthy; else it leaves again."""
    instance, port = module.member(record)
    balancer.register(ref, instance, port)
    try:
        _wait_healthy(module, balancer, ref, record, timeout)
    except NotReady:
        balancer.deregister(ref, instance, port)
        raise


def _wait_healthy(module: ModuleType, balancer: Any, ref: BalancerRef, record: DeployRecord, timeout: float) -> None:
    instance, _ = module.member(record)
    deadline = time.monotonic() + max(timeout, 60.0)
    state = "?"
    while time.monotonic() < deadline:
        state = balancer.health(ref).get(instance, "unused")
        if state == "healthy":
            return
        time.sleep(POLL_S)
    raise NotReady(f"replica {record.id} answers its own checks but the balancer still calls it {state} after "
                   f"{max(timeout, 60.0):.0f} s", hint="check the security group / network between balancer and host")


def wait_answering(svc: ServiceRecord, timeout: float) -> None:
    """The service's URL answers /v2/health/ready (through the balancer's listener)."""
    from ..project.client import Client

    client = Client(svc.endpoint or "", timeout=5.0, verify=True)   # https: the user's certificate, CA-checked
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if client.ready():
                return
            time.sleep(POLL_S)
    finally:
        client.close()
    raise NotReady(f"service {svc.ref}'s balancer at {svc.endpoint} did not answer in {timeout:.0f} s")


# --- leaving ---------------------------------------------------------------------------------------------
def _retire(module: ModuleType, svc: ServiceRecord, balancer: Any, ref: BalancerRef | None, record: DeployRecord,
            why: str, keep_warm: bool = False) -> None:
    """Drain the replica out of the balancer (its deregistration delay honoured), then delete its host or
    container, or stop it into the warm pool (a later deploy of any image starts it instead of a new one)."""
    if ref is not None:
        _drain(module, balancer, ref, record, svc)
    if keep_warm and module.CAPABILITIES.stop_start_host and record.status == READY:
        flow.stop(record)
        store.update(record.id, service_id=None, detail=f"{why}; stopped into the warm pool")
    elif record.instance_id or record.container:
        module.terminate(record)
        store.update(record.id, detail=why)
    else:
        store.mark_destroyed(record.id, why)


def _drain(module: ModuleType, balancer: Any, ref: BalancerRef, record: DeployRecord, svc: ServiceRecord) -> None:
    instance, port = module.member(record)
    if not instance:
        return
    balancer.deregister(ref, instance, port)
    drain_s = config_of(svc.config)[1].drain_s
    deadline = time.monotonic() + drain_s + 30.0
    while time.monotonic() < deadline and balancer.health(ref).get(instance) in ("draining", "healthy", "initial"):
        time.sleep(POLL_S)


def _teardown(module: ModuleType, svc: ServiceRecord) -> None:
    """Every replica and the balancer, whatever state they are in (failed create, destroy)."""
    balancer = balancer_of(module, svc)
    ref = BalancerRef(**svc.balancer) if svc.balancer else None
    for record in replicas(svc):
        try:
            if ref is not None:
                instance, port = module.member(record)
                if instance:
                    balancer.deregister(ref, instance, port)
        except UserError:
            pass                                      # a balancer already gone: nothing to drain from
        _terminate(module, record, f"service {svc.ref} removed")
    if ref is not None:
        balancer.delete(ref)


def _terminate(module: ModuleType, record: DeployRecord, why: str) -> None:
    """The replica's host or container, also one an interrupted ngcx made before its record heard of it (the
    local target finds it by name; a cloud's by its ClientToken, as gc does)."""
    if record.instance_id or record.container or record.cloud == "local":
        module.terminate(record)
        store.update(record.id, detail=why)
    else:
        store.mark_destroyed(record.id, why)


def destroy(svc: ServiceRecord) -> None:
    """Replicas, balancer, key; the row says destroyed. Safe to run again after an interrupted destroy."""
    module = target(svc.cloud)
    _teardown(module, svc)
    keys.forget(key_name(svc))
    store.update_service(svc.id, status=DESTROYED, pid=None)


# --- update, rollback ------------------------------------------------------------------------------------
def update(svc: ServiceRecord, new: DeployConfig, say: Say) -> ServiceRecord:
    """New-version replicas first, each ready and healthy in the balancer; then the old ones drain. A new
    version that never gets healthy is removed again: the old replicas never stopped serving."""
    require(svc, READY, "update")
    module = target(svc.cloud)
    old_config, options = config_of(svc.config)
    new = with_version(replace(new, cloud=svc.cloud, region=old_config.region, auth=old_config.auth,
                               tls=old_config.tls))
    if new.version == old_config.version and new.cmd == old_config.cmd:
        say(f"service {svc.ref} already runs {_short(new.version)}; nothing to roll")
        return svc
    olds, before = replicas(svc), svc
    svc = store.update_service(svc.id, status=SVC_UPDATING, pid=os.getpid(), config=config_row(new, options),
                               previous=svc.config, detail=f"rolling {_short(old_config.version)} -> "
                                                           f"{_short(new.version)}")
    balancer, ref = balancer_of(module, svc), ref_of(svc)
    try:
        _add(module, svc, balancer, ref, new, list(range(svc.replicas)), keys.get(key_name(svc)), say)
    except BaseException as exc:
        _undo(module, svc, balancer, ref, olds)
        back = store.update_service(svc.id, status=READY, pid=None, config=before.config, previous=before.previous,
                                    detail=f"update to {_short(new.version)} rolled back: {flow.reason(exc)}")
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"service {svc.ref}: version {_short(new.version)} never became healthy, so it was rolled "
                        f"back; {len(olds)} replica(s) of {_short(old_config.version)} kept serving: "
                        f"{flow.reason(exc)}", hint=f"see `ngcx deployments show {back.ref}`") from None
    for record in olds:
        _retire(module, svc, balancer, ref, store.get(record.id), f"rolled out by service {svc.ref}", keep_warm=True)
        say(f"service {svc.ref}: replica {record.id} ({_short(old_config.version)}) drained and retired")
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def _undo(module: ModuleType, svc: ServiceRecord, balancer: Any, ref: BalancerRef, keep: list[DeployRecord]) -> None:
    """Remove the replicas an update made (they are the live ones not in `keep`)."""
    kept = {r.id for r in keep}
    for record in replicas(svc):
        if record.id not in kept:
            _retire(module, svc, balancer, ref, record, f"update of service {svc.ref} rolled back")


def rollback(svc: ServiceRecord, say: Say) -> ServiceRecord:
    """Back to the config before the last update (itself a rolling update, so nothing fails meanwhile)."""
    if not svc.previous:
        raise UserError(f"service {svc.ref} was never updated: there is nothing to roll back to")
    config, _ = config_of(svc.previous)
    return update(svc, config, say)


# --- scale -------------------------------------------------------------------------------------------------
def scale(svc: ServiceRecord, count: int, say: Say) -> ServiceRecord:
    """Up: new replicas join (warm hosts first, as every deploy); down: the newest leave through the drain."""
    require(svc, READY, "scale")
    if count < 1:
        raise UserError(f"cannot scale service {svc.ref} to {count}", hint="destroy it instead, or scale to 1 or more")
    module = target(svc.cloud)
    config, _ = config_of(svc.config)
    current = replicas(svc)
    svc = store.update_service(svc.id, status=SVC_SCALING, pid=os.getpid(), replicas=count)
    balancer, ref = balancer_of(module, svc), ref_of(svc)
    try:
        if count > len(current):
            used = {r.spec.get("replica") for r in current}
            free = [i for i in range(count * 2) if i not in used][: count - len(current)]
            _add(module, svc, balancer, ref, config, free, keys.get(key_name(svc)), say)
        for record in _victims(current, len(current) - count):
            _retire(module, svc, balancer, ref, record, f"scaled in by service {svc.ref}")
            say(f"service {svc.ref}: replica {record.id} drained and removed")
    except BaseException as exc:
        store.update_service(svc.id, status=READY, pid=None, detail=f"scale to {count} stopped: {flow.reason(exc)}")
        raise
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def _victims(current: list[DeployRecord], n: int) -> list[DeployRecord]:
    """The `n` replicas to let go: those not ready first, then the newest (the oldest have the warmest caches)."""
    return sorted(current, key=lambda r: (r.status == READY, -r.id))[:max(0, n)]


def require(svc: ServiceRecord, status: str, verb: str) -> None:
    if store.service_interrupted(svc):
        raise UserError(f"service {svc.ref} was interrupted while {svc.status}",
                        hint=f"run `ngcx deployments reconcile {svc.ref}` first")
    if svc.status != status:
        raise UserError(f"cannot {verb} service {svc.ref}: it is {svc.status}")


# --- stop, start ---------------------------------------------------------------------------------------------
def stop(svc: ServiceRecord) -> ServiceRecord:
    """Every replica leaves the balancer (drained) and stops; the balancer stays, answering 503."""
    require(svc, READY, "stop")
    module = target(svc.cloud)
    balancer, ref = balancer_of(module, svc), ref_of(svc)
    for record in replicas(svc):
        _drain(module, balancer, ref, record, svc)
        flow.stop(record)
    return store.update_service(svc.id, status=STOPPED, pid=None)


def start(svc: ServiceRecord, say: Say) -> ServiceRecord:
    require(svc, STOPPED, "start")
    module = target(svc.cloud)
    config, _ = config_of(svc.config)
    balancer, ref = balancer_of(module, svc), ref_of(svc)
    for record in replicas(svc):
        record = flow.start(record, config.ready_timeout)
        _join(module, balancer, ref, record, config.ready_timeout)
        say(f"service {svc.ref}: replica {record.id} is back in the balancer")
    return store.update_service(svc.id, status=READY, pid=None)


# --- reconcile ---------------------------------------------------------------------------------------------
def reconcile(svc: ServiceRecord, say: Say, unhealthy_after: float = UNHEALTHY_AFTER_S) -> ServiceRecord:
    """Make the service what its row says, whatever happened (safe from cron; a second run finds nothing to do):
    finish what an interrupted ngcx left (half-made replicas, an unfinished update), make the balancer if it
    is missing, register replicas it lacks, replace replicas whose host is gone or stopped or that the
    balancer has called unhealthy for `unhealthy_after` s, and bring the count back to `replicas`. A canary
    whose ngcx died is rolled back on the way (_canary_interrupted)."""
    if svc.status == DESTROYED:
        raise UserError(f"service {svc.ref} is destroyed")
    if svc.status == STOPPED:
        say(f"service {svc.ref} is stopped; `ngcx deployments start {svc.ref}` serves it again")
        return svc
    if svc.status not in (READY, FAILED) and not store.service_interrupted(svc):
        raise UserError(f"service {svc.ref} is {svc.status} by ngcx pid {svc.pid}", hint="wait for it to finish")
    module = target(svc.cloud)
    config, _ = config_of(svc.config)
    svc = store.update_service(svc.id, status=SVC_RECONCILING, pid=os.getpid())
    try:
        _finish_interrupted(module, svc)
        balancer, ref = balancer_up(module, svc)
        svc = store.service(svc.id)
        canary = _canary_interrupted(svc)
        if canary:
            _weigh(module, balancer, ref, svc, config)
        bad = _broken(module, svc, balancer, ref, config, unhealthy_after, say)
        good = [r for r in replicas(svc) if r.id not in {b.id for b in bad}]
        missing = svc.replicas - len(good)
        if missing > 0:
            used = {r.spec.get("replica") for r in good}
            free = [i for i in range(svc.replicas * 2) if i not in used][:missing]
            say(f"service {svc.ref}: bringing up {missing} replica(s)")
            _add(module, svc, balancer, ref, config, free, keys.get(key_name(svc)), say)
        states = balancer.health(ref)
        for record in good:    # registered but not yet checked (an interrupted ngcx's): in before any other leaves
            if states.get(module.member(record)[0]) == "initial":
                _wait_healthy(module, balancer, ref, record, config.ready_timeout)
        for record in bad:
            _retire(module, svc, balancer, ref, record, f"replaced by service {svc.ref}'s reconcile")
            say(f"service {svc.ref}: replica {record.id} removed")
        for record in _victims(good, len(good) - svc.replicas):
            _retire(module, svc, balancer, ref, record, f"scaled in by service {svc.ref}'s reconcile")
        if canary:
            _weigh(module, balancer, ref, store.service(svc.id), config)
            _canary_ended(svc, say)
    except BaseException as exc:
        store.update_service(svc.id, status=READY, pid=None, detail=f"reconcile stopped: {flow.reason(exc)}")
        raise
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def _canary_interrupted(svc: ServiceRecord) -> bool:
    """The row says a canary is running (canary.py keeps its report under config["canary"]) but no ngcx runs it:
    a kill -9 or a lost machine mid-canary. Its weights are still split (on AWS a second target group has a share
    of the listener: aws/elb_weights.py), so they are evened out around the replacement of its replicas."""
    return (svc.config.get("canary") or {}).get("outcome") == "running"


def _weigh(module: ModuleType, balancer: Any, ref: BalancerRef, svc: ServiceRecord, config: DeployConfig) -> None:
    """Replicas of the row's version at full weight, any other (an interrupted canary's) at 0: no new request
    reaches a replica about to be replaced. Once they are gone, every member has one weight again, which folds
    AWS's weighted group back into the service's (elb_weights.Weights._collapse)."""
    members = [(*module.member(r), WEIGHT if r.spec.get("version") == config.version else 0) for r in replicas(svc)]
    balancer.set_weights(ref, [m for m in members if m[0]])


def _canary_ended(svc: ServiceRecord, say: Say) -> None:
    """The interrupted canary's report says how it ended: rolled back (its replicas replaced by the row's version)."""
    row = store.service(svc.id).config
    why = "interrupted: the ngcx that ran it stopped before judging it; reconcile put the old version back"
    store.update_service(svc.id, config=dict(row, canary=dict(row["canary"], outcome="rolled back", reason=why,
                                                               ended_at=time.time())))
    say(f"service {svc.ref}: the interrupted canary is rolled back; {_short(config_of(row)[0].version)} serves all "
        "requests")


def _finish_interrupted(module: ModuleType, svc: ServiceRecord) -> None:
    """Replicas an interrupted ngcx left half-made: removed (the count is made good afterwards)."""
    for record in replicas(svc):
        if record.status in IN_FLIGHT and not store.alive(record.pid):
            _terminate(module, record, f"interrupted while {record.status}; removed by reconcile")
            store.update(record.id, status=FAILED, pid=None)


def _broken(module: ModuleType, svc: ServiceRecord, balancer: Any, ref: BalancerRef, config: DeployConfig,
            unhealthy_after: float, say: Say) -> list[DeployRecord]:
    """Replicas to replace: host gone or stopped, another version than the row's (an unfinished update), or
    unhealthy in the balancer for too long; a healthy replica missing from the balancer is registered again."""
    health = balancer.health(ref)
    bad = []
    for record in replicas(svc):
        instance, port = module.member(record)
        host = module.query(record).state
        state = health.get(instance)
        if host in ("gone", "stopped") or record.status != READY:
            say(f"service {svc.ref}: replica {record.id}'s host is {host}; replacing it")
            bad.append(record)
        elif record.spec.get("version") != config.version:
            say(f"service {svc.ref}: replica {record.id} runs {_short(record.spec.get('version'))}, "
                f"not {_short(config.version)}; replacing it")
            bad.append(record)
        elif state is None or state in ("unused", "draining"):
            balancer.register(ref, instance, port)
        elif state == "unhealthy":
            since = record.spec.get("unhealthy_since") or time.time()
            store.update(record.id, spec=dict(record.spec, unhealthy_since=since))
            if time.time() - since >= unhealthy_after:
                say(f"service {svc.ref}: replica {record.id} unhealthy for {time.time() - since:.0f} s; replacing it")
                bad.append(record)
        elif record.spec.get("unhealthy_since"):
            store.update(record.id, spec={k: v for k, v in record.spec.items() if k != "unhealthy_since"})
    return bad


def interrupted_services() -> list[ServiceRecord]:
    return [s for s in store.services() if store.service_interrupted(s)]


def orphan_balancers(cloud: str) -> list[dict[str, str]]:
    """Balancers carrying this store's owner tag that no live service owns (a kill -9 before its row knew)."""
    module = target(cloud)
    if not hasattr(module, "balancer"):
        return []
    live = store.services(cloud=cloud)
    if any(s.status in SVC_BUSY and store.alive(s.pid) for s in live):
        return []       # an ngcx at work may have made a balancer its row does not name yet: not an orphan
    owned = {BalancerRef(**s.balancer).balancer_id for s in live if s.balancer}
    found = module.balancer().tagged({"ngcx:owner": store.owner_id()})
    return [dict(asdict(ref), id=ref.balancer_id, status="balancer", name=ref.dns_name)
            for ref in found if ref.balancer_id not in owned]


def delete_orphan_balancer(cloud: str, item: dict[str, str]) -> None:
    target(cloud).balancer().delete(BalancerRef(**{k: item[k] for k in ("balancer_id", "group_id", "listener_id",
                                                                         "dns_name")}))



def rotate_key(svc: ServiceRecord, grace: float, say: Say) -> ServiceRecord:
    """The service's key, replaced on every replica without a failed request (security.rotate_key)."""
    from .security import rotate_key as rotate

    require(svc, READY, "rotate the key of")
    rotate(key_name(svc), f"service {svc.ref}", replicas(svc), grace, say)
    return svc


def health(svc: ServiceRecord) -> dict[int, str]:
    """Replica id -> the balancer's view of it (`show`); empty when the balancer cannot be asked."""
    if not svc.balancer:
        return {}
    module = target(svc.cloud)
    try:
        states = balancer_of(module, svc).health(ref_of(svc))
    except UserError:
        return {}
    return {r.id: states.get(module.member(r)[0], "unused") for r in replicas(svc)}
