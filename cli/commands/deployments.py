"""`ngcx deployments ls | show | logs | stop | start | destroy | gc | key | rotate-key`: what is deployed,
its lifecycle, and its endpoint key.

Why a module of its own (not in cli/deploy/): these are the commands a user runs the days after a
deploy; each reads the state store and calls the record's target through the router. Every read
command takes --json. Every command first says when a deploy was interrupted (Ctrl-C, kill -9):
an untracked billed instance must be impossible to miss.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from ..core.errors import UserError
from .options import JsonOpt

IdArg = Annotated[str, typer.Argument(help="Deployment id, or a service's s-number (see `ngcx deployments ls`).")]


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Deployed models: list, logs, stop/start (keeps the host's disk), destroy, gc.",
                        no_args_is_help=True)
    group.command("ls")(ls_cmd)
    group.command("show")(show_cmd)
    group.command("logs")(logs_cmd)
    group.command("stop")(stop_cmd)
    group.command("start")(start_cmd)
    group.command("destroy")(destroy_cmd)
    group.command("gc")(gc_cmd)
    group.command("key")(key_cmd)
    group.command("rotate-key")(rotate_key_cmd)
    from .services import register as register_services

    register_services(group)
    app.add_typer(group, name="deployments")


def _record(text: str, verb: str | None = None):
    """The deployment; with `verb`, one that is not a service's replica (those change through their service)."""
    from ..deploy import store

    warn_interrupted()
    record = store.get(store.parse_id(text))
    if verb and record.service_id is not None:
        raise UserError(f"deployment {record.id} is a replica of service s{record.service_id}: {verb} the service",
                        hint=f"`ngcx deployments {verb} s{record.service_id}`, or `ngcx deployments scale "
                             f"s{record.service_id} N`")
    return record


def _is_service(text: str) -> bool:
    from ..deploy import store

    if store.is_service_ref(text):
        warn_interrupted()
        return True
    return False


def warn_interrupted() -> None:
    """Interrupted deployments (deploy.py says how), then interrupted services: reconcile finishes those."""
    from ..deploy.service import interrupted_services
    from .deploy import warn_interrupted as warn

    warn()
    for svc in interrupted_services():
        print(f"ngcx: warning: service {svc.ref} ({svc.cloud}) was interrupted while {svc.status}; "
              f"run `ngcx deployments reconcile {svc.ref}` to finish it", file=sys.stderr)


def ls_cmd(all_: Annotated[bool, typer.Option("--all", help="Include destroyed and replaced ones.")] = False,
           as_json: JsonOpt = False) -> None:
    """List deployments (live ones unless --all)."""
    from ..core.output import emit_json, table
    from ..deploy import store

    warn_interrupted()
    records = store.records(include_gone=all_)
    if as_json:   # deployments only (services: `ngcx deployments show sN --json`), as before services existed
        return emit_json([r.as_json() for r in records])
    rows = [(s.ref, s.cloud, s.status, s.config.get("image", ""), f"{s.replicas} replica(s) · {s.name}",
             s.endpoint or "", _age(s.created_at)) for s in store.services(include_gone=all_)]
    rows += [(r.id, r.cloud, r.status, r.image, " ".join(x for x in (
        f"s{r.service_id}" if r.service_id else None, r.instance_id, r.instance_type, r.zone) if x)
        or (r.container or "")[:12], r.endpoint or "", _age(r.created_at)) for r in records]
    table(None, ("id", "cloud", "status", "image", "where", "endpoint", "age"), rows)


def show_cmd(deployment: IdArg, as_json: JsonOpt = False) -> None:
    """Everything the record holds, with the per-phase seconds of its deploy (a service: its replicas too)."""
    from ..core.output import emit_json
    from ..deploy.common import format_phases

    if _is_service(deployment):
        from .services import show

        return show(deployment, as_json)

    record = _record(deployment)
    if as_json:
        return emit_json(record.as_json())
    for key, value in record.as_json().items():
        if key == "phases":
            value = format_phases(value) if value else ""
        if key == "spec":
            value = {k: v for k, v in value.items() if k != "marks"}
        if value not in (None, "", {}):
            print(f"{key:14} {value}")
    _show_access(record)


def _show_access(record) -> None:
    """How many GPUs serve; where the key and the pinned certificate are, and a curl line that uses both."""
    from ..deploy import keys
    from ..deploy.security import gpus_line, how_to_call

    if gpus_line(record):
        print(f"{'gpus':14} {gpus_line(record)}")

    cert = keys.certificate_path(record.id)
    if record.spec.get("tls_sha256"):
        print(f"{'tls-sha256':14} {record.spec['tls_sha256']}")
    if cert:
        print(f"{'tls-cert':14} {cert}")
    for line in how_to_call(record):
        print(f"{'access':14} {line}")


def logs_cmd(deployment: IdArg,
             tail: Annotated[int, typer.Option("--tail", "-n", help="Last N lines.")] = 50) -> None:
    """The served container's last log lines (through the engine, or Cloud Assistant on ECS)."""
    from ..deploy import target

    if _is_service(deployment):
        from .services import logs

        return logs(deployment, tail)
    record = _record(deployment)
    _live(record, "show logs of")
    print(target(record.cloud).logs(record, tail), end="")


def stop_cmd(deployment: IdArg) -> None:
    """Stop it: on a cloud the host stops (no GPU billing, disk and pulled layers kept); locally the container."""
    from ..deploy.common import READY, STARTING
    from ..deploy.flow import stop

    if _is_service(deployment):
        from .services import stop as stop_service

        return stop_service(deployment)
    record = _record(deployment, "stop")
    if record.status not in (READY, STARTING):
        raise UserError(f"deployment {record.id} is {record.status}, not running", hint="nothing to stop")
    stop(record)
    print(f"ngcx: deployment {record.id} stopped; `ngcx deploy` of the same spec reuses it, "
          f"`ngcx deployments start {record.id}` serves it again", file=sys.stderr)


def start_cmd(deployment: IdArg,
              ready_timeout: Annotated[float, typer.Option("--ready-timeout")] = 900.0) -> None:
    """Start a stopped deployment again and wait until it serves; prints the URL."""
    from ..deploy.common import STOPPED, format_phases
    from ..deploy.flow import start

    if _is_service(deployment):
        from .services import start as start_service

        return start_service(deployment)
    record = _record(deployment, "start")
    if record.status != STOPPED:
        raise UserError(f"deployment {record.id} is {record.status}, not stopped", hint="nothing to start")
    record = start(record, ready_timeout)
    print(f"ngcx: deployment {record.id} ready: {format_phases(record.phases)}", file=sys.stderr)
    print(record.endpoint)


def destroy_cmd(deployment: IdArg,
                yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False) -> None:
    """Delete the host (cloud) or container (local) and close the record."""
    from ..deploy import store, target
    from ..deploy.common import DESTROYED

    if _is_service(deployment):
        from .services import destroy

        return destroy(deployment, yes)
    record = _record(deployment, "destroy")
    if record.status == DESTROYED:
        raise UserError(f"deployment {record.id} is already destroyed")
    what = f"instance {record.instance_id}" if record.instance_id else f"container {(record.container or '?')[:12]}"
    if not yes and not typer.confirm(f"destroy deployment {record.id} ({record.cloud}, {what})?"):
        raise typer.Exit(1)
    if record.instance_id or record.container:
        target(record.cloud).terminate(record)
    else:
        store.mark_destroyed(record.id, "nothing was created")
    from ..deploy import keys

    keys.forget(record.id)
    print(f"ngcx: deployment {record.id} destroyed ({what})", file=sys.stderr)


def key_cmd(deployment: IdArg) -> None:
    """Print the deployment's endpoint key (for `curl -H "Authorization: Bearer $(ngcx deployments key ID)"`)."""
    from ..deploy.security import key_of

    if _is_service(deployment):
        from .services import key

        return key(deployment)
    if deployment.startswith("k8s-"):            # a --cloud kubernetes service's key (cli/deploy/kubernetes/)
        from ..deploy import keys

        found = keys.get(deployment) if "/" not in deployment else None
        if found is None:
            raise UserError(f"no key {deployment!r} here", hint="`ngcx deploy --cloud kubernetes` makes it")
        return print(found)
    print(key_of(_record(deployment)))


def rotate_key_cmd(deployment: IdArg,
                   grace: Annotated[float, typer.Option(
                       "--grace", min=0, max=3600,
                       help="Seconds the old key stays accepted once the new one works, for clients to switch.")]
                   = 30.0) -> None:
    """Replace the endpoint key without downtime: both work until the new one is in place and the grace is over."""
    from ..deploy.security import rotate

    if _is_service(deployment):
        from .services import rotate_key

        return rotate_key(deployment, grace)
    record = _record(deployment, "rotate-key")
    rotate(record, grace, lambda line: print(f"ngcx: {line}", file=sys.stderr))
    print(f"ngcx: deployment {record.id} has a new key; the old one no longer opens it "
          f"(`ngcx deployments key {record.id}` prints the new one)", file=sys.stderr)


def gc_cmd(yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
           as_json: JsonOpt = False) -> None:
    """Find hosts and containers with ngcx's tags that no record owns (an interrupted deploy), offer to delete."""
    from ..core.output import emit_json
    from ..deploy import gc

    gc.close_interrupted()
    found = gc.find()
    if as_json:
        return emit_json(found)
    if not found:
        print("ngcx: no orphaned hosts or containers", file=sys.stderr)
        return
    for item in found:
        print(f"{item['cloud']:7} {item['id']:24} {item.get('status', '')} {item.get('type', item.get('name', ''))}")
    if not yes and not typer.confirm(f"delete these {len(found)}?"):
        raise typer.Exit(1)
    for item in found:
        gc.delete(item)
    print(f"ngcx: deleted {len(found)}", file=sys.stderr)


def _live(record, verb: str) -> None:
    from ..deploy.common import LIVE

    if record.status not in LIVE:
        raise UserError(f"cannot {verb} deployment {record.id}: it is {record.status}")


def _age(since: float) -> str:
    seconds = max(0, int(time.time() - since))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
