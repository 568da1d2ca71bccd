"""Deployments in the SQLite state store: intent before any cloud call, every transition after.

Why its own module: state/db.py owns the database (faults, migrations); this module owns what a
deployment row means. The rule that makes billed instances impossible to lose is here: a record
exists (status `intent`, then `creating` with the RunInstances ClientToken) before the cloud is
asked for anything, and it names the pid of the ngcx doing the work, so the next ngcx can tell an
interrupted deploy from a running one.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from ..core.errors import UserError
from ..state import db as state
from .common import (
    DESTROYED,
    IN_FLIGHT,
    INTENT,
    LIVE,
    REPLACED,
    SVC_BUSY,
    SVC_CREATING,
    SVC_LIVE,
    DeployConfig,
    DeployRecord,
    ServiceRecord,
)

COLUMNS = {"status", "region", "zone", "instance_type", "instance_id", "client_token", "host", "container",
           "endpoint", "model", "detail", "path", "pid", "spec", "phases", "service_id"}


def owner_id() -> str:
    """This state store's id, tagged on every cloud resource it creates: gc deletes only its own."""
    with state.connect() as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'owner'").fetchone()
        if row:
            return str(row[0])
        value = uuid.uuid4().hex[:16]
        conn.execute("INSERT INTO meta (key, value) VALUES ('owner', ?)", (value,))
        return value


def create_intent(config: DeployConfig) -> DeployRecord:
    """Record the intent to deploy (before any cloud call); returns the new record."""
    now = time.time()
    with state.connect() as conn:
        cur = conn.execute(
            "INSERT INTO deployments (target, image_ref, region, zone, status, model, spec, phases, pid,"
            " created_at, updated_at, service_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (config.cloud, config.image, config.region, config.zone, INTENT, config.model,
             json.dumps(config.spec()), "{}", os.getpid(), now, now, config.service_id))
        record_id = int(cur.lastrowid)
    return get(record_id)


def update(record_id: int, **fields: Any) -> DeployRecord:
    """Write a transition (any of COLUMNS) and stamp updated_at; returns the fresh record."""
    _write("deployments", COLUMNS, ("spec", "phases"), record_id, fields)
    return get(record_id)


def _write(table: str, columns: set[str], json_columns: tuple[str, ...], row_id: int, fields: dict[str, Any]) -> None:
    """UPDATE one row of `table` with `fields` (only known `columns`; JSON ones encoded) and stamp updated_at."""
    unknown = set(fields) - columns
    if unknown:
        raise ValueError(f"unknown {table} fields {sorted(unknown)}")
    values = {k: json.dumps(v) if k in json_columns else v for k, v in fields.items()}
    sets = ", ".join(f"{k} = ?" for k in values)
    with state.connect() as conn:
        conn.execute(f"UPDATE {table} SET {sets}, updated_at = ? WHERE id = ?", (*values.values(), time.time(), row_id))


def get(record_id: int) -> DeployRecord:
    with state.connect() as conn:
        row = conn.execute("SELECT * FROM deployments WHERE id = ?", (record_id,)).fetchone()
    if row is None:
        raise UserError(f"no deployment {record_id}", hint="list them with `ngcx deployments ls --all`")
    return DeployRecord.from_row(dict(row))


def parse_id(text: str) -> int:
    """'7' or '#7' -> 7; anything else is one line."""
    raw = text.strip().lstrip("#")
    if not raw.isdigit():
        raise UserError(f"{text!r} is not a deployment id", hint="use the number `ngcx deployments ls` shows")
    return int(raw)


def records(*, cloud: str | None = None, include_gone: bool = False, service: int | None = None) -> list[DeployRecord]:
    """Deployments, newest first; without include_gone only those that may own a host or container;
    with `service` only that service's replicas."""
    sql, args = "SELECT * FROM deployments", []
    where = []
    if cloud:
        where.append("target = ?")
        args.append(cloud)
    if service is not None:
        where.append("service_id = ?")
        args.append(service)
    if not include_gone:
        where.append(f"status IN ({','.join('?' * len(LIVE))})")
        args.extend(LIVE)
    if where:
        sql += " WHERE " + " AND ".join(where)
    with state.connect() as conn:
        rows = conn.execute(sql + " ORDER BY id DESC", args).fetchall()
    return [DeployRecord.from_row(dict(row)) for row in rows]


def owned_instance_ids(cloud: str) -> set[str]:
    """Instance ids that a live record owns (gc leaves these alone)."""
    return {r.instance_id for r in records(cloud=cloud) if r.instance_id}


def interrupted(cloud: str | None = None) -> list[DeployRecord]:
    """In-flight records whose ngcx process is gone: a Ctrl-C or kill -9 left them half-way."""
    return [r for r in records(cloud=cloud) if r.status in IN_FLIGHT and not alive(r.pid)]


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_host(old: DeployRecord, new_id: int) -> bool:
    """Hand `old`'s host to deployment `new_id` if `old` is still in the status it was read in; False when
    another deploy took it first.

    Why one conditional UPDATE: a service's replicas deploy in parallel (service.py `_add`) and each looks
    for a stopped host of the warm pool; read-then-write let two of them start and swap the same host, one
    replica's container replacing the other's. The new record names the instance in the same transaction,
    so a live record owns the host throughout (gc never takes it for an orphan while the deploy runs; one
    interrupted after this point leaves it to gc, as one interrupted during the swap always did)."""
    with state.connect() as conn:
        taken = conn.execute("UPDATE deployments SET status = ?, pid = NULL, detail = ?, updated_at = ? "
                             "WHERE id = ? AND status = ?",
                             (REPLACED, f"host handed to deployment {new_id}", time.time(), old.id, old.status))
        if taken.rowcount != 1:
            return False
        conn.execute("UPDATE deployments SET instance_id = ?, instance_type = ?, zone = ?, updated_at = ? "
                     "WHERE id = ?", (old.instance_id, old.instance_type, old.zone, time.time(), new_id))
    return True


def release_host(old: DeployRecord, new_id: int, detail: str) -> None:
    """Undo `claim_host`: `old` keeps its host (and says `detail`), deployment `new_id` names none."""
    with state.connect() as conn:
        conn.execute("UPDATE deployments SET status = ?, detail = ?, updated_at = ? WHERE id = ?",
                     (old.status, detail, time.time(), old.id))
        conn.execute("UPDATE deployments SET instance_id = NULL, instance_type = NULL, zone = NULL, updated_at = ? "
                     "WHERE id = ?", (time.time(), new_id))


def mark_destroyed(record_id: int, detail: str | None = None) -> DeployRecord:
    fields: dict[str, Any] = {"status": DESTROYED, "pid": None}
    if detail:
        fields["detail"] = detail
    return update(record_id, **fields)


# --- services (service.py) -------------------------------------------------------------------------
SERVICE_COLUMNS = {"status", "region", "replicas", "endpoint", "balancer", "config", "previous", "detail", "pid"}
JSON_COLUMNS = ("balancer", "config", "previous")


def create_service(cloud: str, region: str | None, replicas: int, config: dict[str, Any]) -> ServiceRecord:
    """The service's row, before its balancer or any replica exists. Its name, ngcx-svc-<owner>-<id>, names its
    balancer: the owner part keeps two state stores on one engine or cloud account from meeting on a name."""
    now, owner = time.time(), owner_id()
    with state.connect() as conn:
        cur = conn.execute(
            "INSERT INTO services (target, region, name, status, replicas, config, pid, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?)",
            (cloud, region, "", SVC_CREATING, replicas, json.dumps(config), os.getpid(), now, now))
        service_id = int(cur.lastrowid)
        conn.execute("UPDATE services SET name = ? WHERE id = ?", (f"ngcx-svc-{owner[:8]}-{service_id}",
                                                                   service_id))
    return service(service_id)


def update_service(service_id: int, **fields: Any) -> ServiceRecord:
    _write("services", SERVICE_COLUMNS, JSON_COLUMNS, service_id, fields)
    return service(service_id)


def service(service_id: int) -> ServiceRecord:
    with state.connect() as conn:
        row = conn.execute("SELECT * FROM services WHERE id = ?", (service_id,)).fetchone()
    if row is None:
        raise UserError(f"no service s{service_id}", hint="list them with `ngcx deployments ls --all`")
    return ServiceRecord.from_row(dict(row))


def services(*, cloud: str | None = None, include_gone: bool = False) -> list[ServiceRecord]:
    """Services, newest first; without include_gone only those that may own a balancer or replicas."""
    sql, args, where = "SELECT * FROM services", [], []
    if cloud:
        where.append("target = ?")
        args.append(cloud)
    if not include_gone:
        where.append(f"status IN ({','.join('?' * len(SVC_LIVE))})")
        args.extend(SVC_LIVE)
    if where:
        sql += " WHERE " + " AND ".join(where)
    with state.connect() as conn:
        rows = conn.execute(sql + " ORDER BY id DESC", args).fetchall()
    return [ServiceRecord.from_row(dict(row)) for row in rows]


def is_service_ref(text: str) -> bool:
    """'s3' names service 3; a bare number names a deployment."""
    raw = text.strip()
    return raw[:1] in ("s", "S") and raw[1:].isdigit()


def parse_service_id(text: str) -> int:
    """'s3', 'S3', '3' or '#3' -> 3 (the commands that act only on services take either)."""
    raw = text.strip().lstrip("#")
    raw = raw[1:] if raw[:1] in ("s", "S") else raw
    if not raw.isdigit():
        raise UserError(f"{text!r} is not a service id", hint="use the s-number `ngcx deployments ls` shows, e.g. s1")
    return int(raw)


def service_interrupted(record: ServiceRecord) -> bool:
    """A service an ngcx was working on (creating, updating, …) when it died: `reconcile` finishes it."""
    return record.status in SVC_BUSY and not alive(record.pid)
