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
        config.pushes = pushes(config.image, registry, sign=not config.allow_unsigned)
        config.pull_ref, config.registry = config.pick_push(lambda _host: True) or (None, None)
    if svc is not None:
        svc = _verbs(svc).update(svc, config, say)
    else:
        port, drain, interval, certificate = balancer
        options = services.Options(port=port, drain_s=drain, health_interval_s=interval, certificate_id=certificate)
        config.port = None
        svc = services.create(config, replicas or 1, options, say)
    _print_ready(svc, as_json)


def deploy_group(config: Any, registry: str | None, scaling: tuple[int | None, int | None, float, int],
                 balancer: tuple[int | None, int, int, str | None], as_json: bool) -> None:
    """`deploy --min A --max B`: an autoscaled service, its replicas the cloud's own scaling group."""
    from ..deploy import service as services
    from ..deploy import service_group
    from ..deploy.image import pushes

    low, high, target_requests, on_demand_base = scaling
    wanted = service_group.Scaling(low or 0, high or 0, target_requests, bool(config.spot), on_demand_base)
    wanted.check()
    if config.cloud in ("local", "any"):
        raise UserError(f"--min/--max with --cloud {config.cloud}: a scaling group is a cloud's",
                        hint="--cloud aws or aliyun, or --cloud kubernetes --dry-run for an HPA")
    config.pushes = pushes(config.image, registry, sign=not config.allow_unsigned)
    config.pull_ref, config.registry = config.pick_push(lambda _host: True) or (None, None)
    port, drain, interval, certificate = balancer
    options = services.Options(port=port, drain_s=drain, health_interval_s=interval, certificate_id=certificate)
    config.port = None
    svc = service_group.create(config, wanted, options, say)
    _print_ready(svc, as_json)


def _verbs(svc: Any) -> Any:
    """The module with a service's update / rollback / stop / start / logs / rotate_key: group_update.py for a
    scaling group, else service.py."""
    from ..deploy import group_update, service, service_group

    return group_update if service_group.is_group(svc) else service


def _lib(svc: Any) -> Any:
    """The module that runs this service: service_group.py for a scaling group, else service.py."""
    from ..deploy import service, service_group

    return service_group if service_group.is_group(svc) else service


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
    say(f"call it: curl {auth}{svc.endpoint}/v2/models/{_served_name(svc, key)}")
    print(svc.endpoint)


def _served_name(svc: Any, key: str | None) -> str:
    """The model name the service's URL answers to, asked of that URL (the call the line prints goes there):
    the config's model is the project's name, not the served one (deploy/security.py served_models says why).
    Over https only a CA-verified balancer gets the key (a cloud balancer with --certificate)."""
    from ..deploy.security import call_name, served_models

    endpoint = svc.endpoint or ""
    return call_name(served_models(endpoint, key, verify=endpoint.startswith("https://")), svc.config.get("model"))


def _service_json(svc: Any) -> dict[str, Any]:
    from ..deploy import service_group
    from ..deploy.service import replicas

    if service_group.is_group(svc):
        from ..deploy import group_update

        svc, hosts = service_group.refresh(svc), service_group.members(svc)
        found = group_update.cost(svc, hosts)
        cost = None if found is None else {"per_hour": found.per_hour, "on_demand_per_hour": found.on_demand_per_hour,
                                           "spot_hosts": found.spot_hosts, "hosts": found.hosts,
                                           "currency": found.currency, "prices_as_of": found.prices_as_of}
        return dict(svc.as_json(), hosts=hosts, cost=cost)
    return dict(svc.as_json(), members=[r.as_json() for r in replicas(svc)])


# --- deployments ... ------------------------------------------------------------------------------------
def scale_cmd(service: ServiceArg,
              count: Annotated[int | None, typer.Argument(help="How many replicas to run.", min=1, max=64)] = None,
              low: Annotated[int | None, typer.Option("--min", min=0, help="Autoscaled service: fewest replicas.")]
              = None,
              high: Annotated[int | None, typer.Option("--max", min=1, help="Autoscaled service: most replicas.")]
              = None) -> None:
    """Run COUNT replicas (new ones join once healthy; leaving ones drain first), or give an autoscaled
    service new bounds with --min/--max."""
    from ..deploy import service as services
    from ..deploy import service_group

    svc = _service(service)
    if service_group.is_group(svc):
        if count is not None or low is None or high is None:
            raise UserError(f"service {svc.ref} is autoscaled: give its bounds, not a count",
                            hint=f"ngcx deployments scale {svc.ref} --min A --max B")
        service_group.scale(svc, low, high, say)
        return
    if count is None or (low, high) != (None, None):
        raise UserError(f"service {svc.ref} has a fixed count: give COUNT",
                        hint=f"ngcx deployments scale {svc.ref} 3 (an autoscaled one: deploy with --min/--max)")
    svc = services.scale(svc, count, say)
    say(f"service {svc.ref}: {svc.replicas} replica(s) behind {svc.endpoint}")


def rollback_cmd(service: ServiceArg) -> None:
    """Roll the service back to the version before its last update (a rolling update: nothing fails meanwhile)."""
    svc = _verbs(_service(service)).rollback(_service(service), say)
    say(f"service {svc.ref} rolled back: {svc.replicas} replica(s) of {svc.config.get('image')} "
        f"({str(svc.config.get('version', ''))[-12:]})")


def reconcile_cmd(service: ServiceArg,
                  unhealthy_after: Annotated[float, typer.Option(
                      "--unhealthy-after", min=0, help="Replace a replica the balancer has called unhealthy this "
                                                       "many seconds (across runs).")] = 60.0) -> None:
    """Make the service what its record says: replace dead or unhealthy replicas, finish an interrupted ngcx's
    work, restore the count and the balancer. Safe to run from cron."""
    from ..deploy import service as services

    svc = _service(service)
    svc = services.reconcile(svc, say, unhealthy_after) if _lib(svc) is services else _lib(svc).reconcile(svc, say)
    say(f"service {svc.ref}: {svc.replicas} replica(s) behind {svc.endpoint}")


def show(text: str, as_json: bool) -> None:
    """`deployments show sN`: the service, its balancer's view of each replica, and how to call it."""
    from ..core.output import emit_json, table
    from ..deploy import service as services

    svc = _service(text)
    if as_json:
        return emit_json(_service_json(svc))
    if _lib(svc) is not services:
        return _show_group(svc)
    for key in ("ref", "cloud", "status", "replicas", "endpoint", "name", "image", "version", "detail"):
        value = svc.as_json().get(key)
        if value not in (None, ""):
            print(f"{key:14} {value}")
    health = services.health(svc)
    table(None, ("replica", "status", "version", "balancer", "where", "endpoint"),
          [(r.id, r.status, str(r.spec.get("version", ""))[-12:], health.get(r.id, ""),
            " ".join(x for x in (r.instance_id, r.zone) if x) or (r.container or "")[:12], r.endpoint or "")
           for r in services.replicas(svc)])


def _show_group(svc: Any) -> None:
    from ..core.output import table
    from ..deploy import group_update, service_group

    svc = service_group.refresh(svc)
    scaling = service_group.scaling_of(svc)
    hosts = service_group.members(svc)
    for key, value in (*((k, svc.as_json().get(k)) for k in ("ref", "cloud", "status", "replicas", "endpoint",
                                                               "name", "image", "version", "detail")),
                       ("scaling", f"{scaling.min_size}..{scaling.max_size} hosts, "
                                   f"{scaling.target_requests:g} requests per host per minute"
                                   + ("; idle, to zero (stopped hosts, woken by a request)" if scaling.to_zero
                                      else "")
                                   + (f"; spot above {scaling.on_demand_base} on-demand host(s)" if scaling.spot
                                      else "")),
                       ("cost", cost.text() if (cost := group_update.cost(svc, hosts)) is not None else "")):
        if value not in (None, ""):
            print(f"{key:14} {value}")
    table(None, ("host", "zone", "state", "health", "market", "balancer"),
          [(m["instance_id"], m["zone"], m["state"], m["health"], m.get("market", ""), m["balancer"]) for m in hosts])


def logs(text: str, tail: int) -> None:
    from ..deploy import group_update, target
    from ..deploy import service as services

    svc = _service(text)
    if _verbs(svc) is group_update:
        for host, out in group_update.logs(svc, tail):
            print(f"==> host {host} <==")
            print(out, end="")
        return
    for record in services.replicas(svc):
        print(f"==> replica {record.id} <==")
        print(target(record.cloud).logs(record, tail), end="")


def stop(text: str) -> None:
    from ..deploy import group_update

    svc = _service(text)
    svc = group_update.stop(svc, say) if _verbs(svc) is group_update else _verbs(svc).stop(svc)
    say(f"service {svc.ref} stopped; its balancer stays; `ngcx deployments start {svc.ref}` serves it again")


def start(text: str) -> None:
    svc = _service(text)
    svc = _verbs(svc).start(svc, say)
    print(svc.endpoint)


def destroy(text: str, yes: bool) -> None:
    from ..deploy import service as services
    from ..deploy.common import DESTROYED

    svc = _service(text)
    if svc.status == DESTROYED:
        raise UserError(f"service {svc.ref} is already destroyed")
    count = len(services.replicas(svc)) if _lib(svc) is services else svc.replicas
    if not yes and not typer.confirm(f"destroy service {svc.ref} ({svc.cloud}, {count} replica(s) and its balancer)?"):
        raise typer.Exit(1)
    _lib(svc).destroy(svc)
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
    svc = _service(text)
    svc = _verbs(svc).rotate_key(svc, grace, say)
    say(f"service {svc.ref} has a new key on all {svc.replicas} replica(s); the old one no longer opens it "
        f"(`ngcx deployments key {svc.ref}` prints the new one)")
