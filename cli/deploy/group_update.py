"""The service verbs of an autoscaled service (issue 49): rolling update, rollback, stop/start, logs, key rotation.

Why apart from service_group.py: that module makes, scales and repairs the group; these verbs change what its
hosts run, and share one step — a rolling update of the whole group through the cloud's own instance refresh
(vm_groups.ServiceGroups.roll: AWS StartInstanceRefresh with MinHealthyPercentage 100 and MaxHealthyPercentage
200, ESS's refresh), which launches each batch of new hosts and waits for them to be healthy in the balancer
before the old ones leave through the deregistration delay and the terminating hook (the same drain as a
scale-in). So no request meets a host that cannot answer it, and the cloud does the work while ngcx only
watches: an ngcx killed mid-way leaves a refresh that finishes anyway, and the row (status updating, the
refresh's id) lets `reconcile` / the next verb pick it up.
- update: the row gets the new config first (the old one kept as `previous`), then the refresh; a refresh that
  fails (a version whose hosts never get healthy) or times out is cancelled and the group is moved back to the
  old config (the old hosts were never touched: the refresh replaces them only after their replacements are
  healthy), and the row says so.
- rollback: an update to `previous`.
- stop: the group to 0..0 hosts. Its hosts are terminated (the GPU and the disk no longer billed), except for a
  service made with --min 0, whose warm pool (ReuseOnScaleIn) takes them stopped as on any scale-in: its disks
  with the image's layers kept for a fast start (only the disk billed). Why not always a warm pool: a stopped
  service may stay stopped for weeks, and a pool of stopped GPU hosts bills each disk for nothing. The wake
  alarm of a --min 0 service is removed (a request to a stopped service must not start a host), the bounds stay
  in the row. start: back to the recorded bounds (and the wake alarm), waiting for the first hosts.
- logs: every host's container log through the cloud's command channel (SSM / Cloud Assistant).
- rotate-key: a new key; a refresh whose hosts accept the old and the new key's hashes; the new key becomes the
  key; after the grace a second refresh with the new key's hash alone. The launch template / scaling
  configuration holds only hashes (a host launched later by the policy accepts what the others do).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from types import ModuleType
from typing import Any

from ..core.errors import UserError
from . import flow, keys, store, target
from .common import READY, STOPPED, SVC_UPDATING, DeployConfig, NotReady, ServiceRecord
from .service import Say, config_of, config_row, ref_of, require, tags_of, wait_answering, with_version
from .service_group import BOOT_S, POLL_S, _ensure, _group_ref, _groups, _keyed, _wait_serving, scaling_of

DONE = ("done", "failed", "cancelled")


def _short(version: str | None) -> str:
    return (version or "?").split(":")[-1][:12]


def _the_group(module: ModuleType, svc: ServiceRecord, config: DeployConfig) -> tuple[Any, dict[str, str]]:
    """(the target's scaling groups, this service's group ref); a row without a group is one line."""
    ref = _group_ref(svc)
    if ref is None:
        raise UserError(f"service {svc.ref} has no scaling group", hint=f"`ngcx deployments reconcile {svc.ref}`")
    return _groups(module, config), ref


# --- the rolling update --------------------------------------------------------------------------------------
def roll(module: ModuleType, svc: ServiceRecord, config: DeployConfig, say: Say, what: str) -> None:
    """One instance refresh of the group to `config` (its key hashes already set), watched to its end; a
    failed or timed-out one is cancelled and raised as NotReady (the old hosts kept serving)."""
    groups, ref = _the_group(module, svc, config)
    _, options = config_of(svc.config)
    scaling = scaling_of(svc)
    sizes = groups.size(ref) or (scaling.min_size, scaling.max_size, scaling.first)
    refresh_id = groups.roll(ref, svc.name, ref_of(svc), sizes, tags_of(svc), options.drain_s, svc.id,
                             scaling.market)
    row = store.service(svc.id).config
    store.update_service(svc.id, config=dict(row, group=dict(row["group"], refresh=refresh_id)))
    say(f"service {svc.ref}: {what}: instance refresh {refresh_id} of {sizes[2]} host(s), each new host healthy "
        "in the balancer before an old one drains")
    deadline, seen = time.monotonic() + config.ready_timeout + BOOT_S, -1
    while time.monotonic() < deadline:
        state = groups.refresh_state(ref, refresh_id)
        if state.percent != seen:
            say(f"service {svc.ref}: {what}: {state.percent} % of the hosts replaced")
            seen = state.percent
        if state.status == "done":
            return
        if state.status in ("failed", "cancelled"):
            why = state.reason or "no reason given"
            raise NotReady(f"service {svc.ref}: the instance refresh {state.status}: {why}",
                           hint=f"see the hosts with `ngcx deployments show {svc.ref}`")
        time.sleep(POLL_S)
    groups.cancel_refresh(ref, refresh_id)
    raise NotReady(f"service {svc.ref}: the instance refresh was not done after {config.ready_timeout + BOOT_S:.0f} s; "
                   "cancelled (hosts already replaced stay)", hint=f"see `ngcx deployments show {svc.ref}`")


def update(svc: ServiceRecord, new: DeployConfig, say: Say) -> ServiceRecord:
    """`ngcx deploy NEW --service sN` on a group service: every host replaced by one of NEW, none failing."""
    require(svc, READY, "update")
    module = target(svc.cloud)
    old, options = config_of(svc.config)
    new = with_version(replace(new, cloud=svc.cloud, region=old.region, auth=old.auth, tls=old.tls,
                               spot=old.spot, ready_timeout=new.ready_timeout))
    if new.version == old.version and new.cmd == old.cmd:
        say(f"service {svc.ref} already runs {_short(new.version)}; nothing to roll")
        return svc
    before = svc
    row = dict(config_row(new, options), group={k: v for k, v in svc.config["group"].items() if k != "refresh"})
    svc = store.update_service(svc.id, status=SVC_UPDATING, pid=os.getpid(), config=row, previous=svc.config,
                               detail=f"rolling {_short(old.version)} -> {_short(new.version)}")
    try:
        roll(module, svc, _keyed(svc, new), say, f"{_short(old.version)} -> {_short(new.version)}")
    except BaseException as exc:
        store.update_service(svc.id, config=before.config)
        try:
            _ensure(module, store.service(svc.id), say)            # the group back on the old template
        finally:
            store.update_service(svc.id, status=READY, pid=None, previous=before.previous,
                                 detail=f"update to {_short(new.version)} rolled back: {flow.reason(exc)}")
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserError(f"service {svc.ref}: version {_short(new.version)} did not replace the hosts, so the group "
                        f"is back on {_short(old.version)} (its hosts kept serving): {flow.reason(exc)}",
                        hint=f"see `ngcx deployments show {svc.ref}`") from None
    svc = _ensure(module, store.service(svc.id), say)                # the row's ref on the new version
    return store.update_service(svc.id, status=READY, pid=None, detail=None)


def rollback(svc: ServiceRecord, say: Say) -> ServiceRecord:
    """Back to the config before the last update, itself a rolling update."""
    if not svc.previous:
        raise UserError(f"service {svc.ref} was never updated: there is nothing to roll back to")
    config, _ = config_of(svc.previous)
    return update(svc, config, say)


# --- stop, start ----------------------------------------------------------------------------------------------
def stop(svc: ServiceRecord, say: Say) -> ServiceRecord:
    """No host serves or bills a GPU: the group at 0..0 (see the module docstring for where the hosts go)."""
    require(svc, READY, "stop")
    module = target(svc.cloud)
    scaling = scaling_of(svc)
    groups, ref = _the_group(module, svc, config_of(svc.config)[0])
    if scaling.to_zero:                                 # no wake-up while stopped; the pool stays: hosts park there
        groups.wake(ref, ref_of(svc), False)
    groups.resize(ref, 0, 0, 0)
    say(f"service {svc.ref}: its hosts drain and "
        + ("stop in the warm pool (disks kept)" if scaling.to_zero else "terminate (nothing billed but the balancer)"))
    return store.update_service(svc.id, status=STOPPED, pid=None, replicas=0)


def start(svc: ServiceRecord, say: Say) -> ServiceRecord:
    """The recorded bounds again; returns once the first hosts are healthy and the URL answers."""
    require(svc, STOPPED, "start")
    module = target(svc.cloud)
    config, _ = config_of(svc.config)
    scaling = scaling_of(svc)
    groups, ref = _the_group(module, svc, config)
    groups.resize(ref, scaling.min_size, scaling.max_size, scaling.first)
    if scaling.to_zero:
        groups.idle(ref, ref_of(svc), True)
    _wait_serving(module, svc, scaling.first, config.ready_timeout + BOOT_S, say)
    wait_answering(svc, config.ready_timeout)
    return store.update_service(svc.id, status=READY, pid=None, replicas=scaling.first)


# --- logs, key ----------------------------------------------------------------------------------------------
def logs(svc: ServiceRecord, tail: int) -> list[tuple[str, str]]:
    """(host id, its last `tail` log lines) for every host the group has now."""
    module = target(svc.cloud)
    groups, ref = _groups(module, config_of(svc.config)[0]), _group_ref(svc)
    if ref is None:
        return []
    return [(m.instance_id, groups.logs(m.instance_id, tail)) for m in groups.members(ref)
            if m.state in ("in-service", "pending")]


def rotate_key(svc: ServiceRecord, grace: float, say: Say) -> ServiceRecord:
    """A new key on every host of the group without a failed request (see the module docstring)."""
    require(svc, READY, "rotate the key of")
    old = keys.get(svc.ref)
    if old is None:
        raise UserError(f"service {svc.ref} has no key (deployed with --no-auth)",
                        hint="deploy again without --no-auth")
    module = target(svc.cloud)
    config, _ = config_of(svc.config)
    new = keys.pending(svc.ref) or keys.begin_rotation(svc.ref)
    svc = store.update_service(svc.id, status=SVC_UPDATING, pid=os.getpid(), detail="rotating its key")
    try:
        roll(module, svc, replace(config, key_hashes=(keys.digest(old), keys.digest(new))), say, "new key")
        keys.finish_rotation(svc.ref)
        if grace > 0:
            say(f"the new key is in place; the old one is accepted for {grace:.0f} s more while clients switch")
            time.sleep(grace)
        roll(module, store.service(svc.id), replace(config, key_hashes=(keys.digest(new),)), say, "old key dropped")
    finally:
        svc = store.update_service(svc.id, status=READY, pid=None, detail=None)
    return svc


# --- cost -------------------------------------------------------------------------------------------------------
def cost(svc: ServiceRecord, hosts: list[dict[str, str]]) -> Any:
    """offers.ServiceCost of the group's hosts now (each on its market), else of what its bounds buy; None when
    the row names no instance type (a group made before issue 49) or the table has no such type."""
    from .offers import planned_markets, service_cost

    types = svc.config.get("group", {}).get("types") or []
    if not types:
        return None
    scaling = scaling_of(svc)
    live = [h.get("market", "on-demand") for h in hosts if h.get("state") in ("in-service", "pending")]
    markets = live or planned_markets(0 if svc.status == STOPPED else max(svc.replicas, scaling.first),
                                      scaling.spot, scaling.on_demand_base)
    return service_cost(svc.cloud, types[0], markets)
