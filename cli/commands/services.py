"""The service side of `ngcx deploy` (`--replicas N`, `--service ID`) and of `ngcx deployments`
(`scale`, `rollback`, `reconcile`, and ls/show/logs/stop/start/destroy/key given an s-number).

Why apart from deploy.py and deployments.py: those stay about one deployment; a service's commands
parse, call cli/deploy/service.py once and print, as every command does. Services are named `s<ID>`
so that a service and a deployment are never confused (they are numbered separately).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from ..core.errors import UserError

ServiceArg = Annotated[str, typer.Argument(help="Service id (s1, … as `ngcx deployments ls` shows it).")]


def say(line: str) -> None:
    print(f"ngcx: {line}", file=sys.stderr)


def register(group: typer.Typer) -> None:
    group.command("scale")(scale_cmd)
    group.command("rollback")(rollback_cmd)
    group.command("reconcile")(reconcile_cmd)


def _service(text: str):
    from ..deploy import store

    return store.service(store.parse_service_id(text))


# --- deploy --------------------------------------------------------------------------------------------
def deploy_service(config: Any, registry: str | None, replicas: int | None, service: str | None,
                   balancer: tuple[int | None, int, int, str | None], as_json: bool) -> None:
    """`deploy --replicas N` makes a service; `deploy --service ID` rolls one to this image."""
    from ..deploy import service as services
    from ..deploy.image import pushes

    svc = _service(service) if service is not None else None
    cloud = svc.cloud if svc is not None else config.cloud
    if cloud != "local":
        config.pushes = pushes(config.image, registry)
        config.pull_ref, config.registry = config.pick_push(lambda _host: True) or (None, None)
    if svc is not None:
        svc = services.update(svc, config, say)
    else:
        port, drain, interval, certificate = balancer
        options = services.Options(port=port, drain_s=drain, health_interval_s=interval, certificate_id=certificate)
        config.port = None
        svc = services.create(config, replicas or 1, options, say)
    _print_ready(svc, as_json)


def check_flags(cloud: str, replicas: int | None, service: str | None) -> None:
    """Service flags that cannot go together: one line before anything is read or made."""
    if service is not None and replicas is not None:
        raise UserError("--replicas and --service together", hint="scale with `ngcx deployments scale ID N`")
    if (service is not None or replicas is not None) and cloud == "any":
        raise UserError("a service lives on one cloud; --cloud any picks one per deployment",
                        hint="give --cloud local, aliyun or aws")


def _print_ready(svc: Any, as_json: bool) -> None:
    from ..deploy import keys

    if as_json:
        from ..core.output import emit_json

        return emit_json(_service_json(svc))
    say(f"service {svc.ref} ready: {svc.replicas} replica(s) of {svc.config.get('image')} behind {svc.endpoint}")
    key = keys.get(svc.ref)
    if key and sys.stderr.isatty():
        say(f"key (shown once; `ngcx deployments key {svc.ref}` prints it again): {key}")
    auth = f'-H "Authorization: Bearer $(ngcx deployments key {svc.ref})" ' if key else ""
    say(f"call it: curl {auth}{svc.endpoint}/v2/models/{svc.config.get('model') or 'NAME'}")
    print(svc.endpoint)


def _service_json(svc: Any) -> dict[str, Any]:
    from ..deploy.service import replicas

    return dict(svc.as_json(), members=[r.as_json() for r in replicas(svc)])


# --- deployments ... ------------------------------------------------------------------------------------
def scale_cmd(service: ServiceArg,
              count: Annotated[int, typer.Argument(help="How many replicas to run.", min=1, max=64)]) -> None:
    """Run COUNT replicas: new ones join once healthy in the balancer; leaving ones drain first."""
    from ..deploy import service as services

    svc = services.scale(_service(service), count, say)
    say(f"service {svc.ref}: {svc.replicas} replica(s) behind {svc.endpoint}")


def rollback_cmd(service: ServiceArg) -> None:
    """Roll the service back to the version before its last update (a rolling update: nothing fails meanwhile)."""
    from ..deploy import service as services

    svc = services.rollback(_service(service), say)
    say(f"service {svc.ref} rolled back: {svc.replicas} replica(s) of {svc.config.get('image')} "
        f"({str(svc.config.get('version', ''))[-12:]})")


def reconcile_cmd(service: ServiceArg,
                  unhealthy_after: Annotated[float, typer.Option(
                      "--unhealthy-after", min=0, help="Replace a replica the balancer has called unhealthy this "
                                                       "many seconds (across runs).")] = 60.0) -> None:
    """Make the service what its record says: replace dead or unhealthy replicas, finish an interrupted ngcx's
    work, restore the count and the balancer. Safe to run from cron."""
    from ..deploy import service as services

    svc = services.reconcile(_service(service), say, unhealthy_after)
    say(f"service {svc.ref}: {svc.replicas} replica(s) behind {svc.endpoint}")


def show(text: str, as_json: bool) -> None:
    """`deployments show sN`: the service, its balancer's view of each replica, and how to call it."""
    from ..core.output import emit_json, table
    from ..deploy import service as services

    svc = _service(text)
    if as_json:
        return emit_json(_service_json(svc))
    for key in ("ref", "cloud", "status", "replicas", "endpoint", "name", "image", "version", "detail"):
        value = svc.as_json().get(key)
        if value not in (None, ""):
            print(f"{key:14} {value}")
    health = services.health(svc)
    table(None, ("replica", "status", "version", "balancer", "where", "endpoint"),
          [(r.id, r.status, str(r.spec.get("version", ""))[-12:], health.get(r.id, ""),
            " ".join(x for x in (r.instance_id, r.zone) if x) or (r.container or "")[:12], r.endpoint or "")
           for r in services.replicas(svc)])


def logs(text: str, tail: int) -> None:
    from ..deploy import service as services
    from ..deploy import target

    svc = _service(text)
    for record in services.replicas(svc):
        print(f"==> replica {record.id} <==")
        print(target(record.cloud).logs(record, tail), end="")


def stop(text: str) -> None:
    from ..deploy import service as services

    svc = services.stop(_service(text))
    say(f"service {svc.ref} stopped; its balancer stays; `ngcx deployments start {svc.ref}` serves it again")


def start(text: str) -> None:
    from ..deploy import service as services

    svc = services.start(_service(text), say)
    print(svc.endpoint)


def destroy(text: str, yes: bool) -> None:
    from ..deploy import service as services
    from ..deploy.common import DESTROYED

    svc = _service(text)
    if svc.status == DESTROYED:
        raise UserError(f"service {svc.ref} is already destroyed")
    count = len(services.replicas(svc))
    if not yes and not typer.confirm(f"destroy service {svc.ref} ({svc.cloud}, {count} replica(s) and its balancer)?"):
        raise typer.Exit(1)
    services.destroy(svc)
    say(f"service {svc.ref} destroyed ({count} replica(s), balancer {svc.name})")


def key(text: str) -> None:
    from ..deploy import keys
    from ..deploy.common import SVC_LIVE

    svc = _service(text)
    found = keys.get(svc.ref) if svc.status in SVC_LIVE else None
    if found is None:
        raise UserError(f"service {svc.ref} has no key here",
                        hint="it was made with --no-auth, is destroyed, or is another machine's")
    print(found)


def rotate_key(text: str, grace: float) -> None:
    from ..deploy import service as services

    svc = services.rotate_key(_service(text), grace, say)
    say(f"service {svc.ref} has a new key on all {svc.replicas} replica(s); the old one no longer opens it "
        f"(`ngcx deployments key {svc.ref}` prints the new one)")
