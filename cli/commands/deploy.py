"""`ngcx deploy [IMAGE[:RELEASE]] --cloud local|aliyun [...] [-- CMD]`: the CLI face of cli/deploy/.

Why apart from flow.py: this module turns flags into a DeployConfig (every user mistake is one line
here, before the state store or a cloud hears of it) and prints; flow.py does the work.
Only typer and the standard library at import time (`ngcx --help` stays fast).
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.errors import UserError
from .options import CatalogOpt, JsonOpt, ProjectFileOpt, RegistryLogin, RegistryLoginOpt, VariantOpt


class Cloud(StrEnum):
    local = "local"
    aliyun = "aliyun"
    aws = "aws"
    any = "any"       # every cloud with credentials, best candidate first, failing over on capacity
    kubernetes = "kubernetes"   # manifests written to -o DIR with --dry-run (cli/deploy/kubernetes/)


class Workload(StrEnum):
    cnn = "cnn"
    rnn = "rnn"
    transformer = "transformer"


class GpuMode(StrEnum):
    require = "require"   # the host must give the container a GPU (default on clouds)
    auto = "auto"         # a GPU when the host has one, else the CPU (default locally)
    off = "off"


def register(app: typer.Typer) -> None:
    app.command("deploy", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(deploy_cmd)


def deploy_cmd(
    ctx: typer.Context,
    ref: Annotated[str | None, typer.Argument(
        help="IMAGE[:RELEASE] or a local image tag; omit it in a project folder (ngcx.yaml).")] = None,
    cloud: Annotated[Cloud, typer.Option("--cloud", case_sensitive=False, help="Where to serve it.")] = Cloud.local,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU model: T4, A10, V100, A100, L20, … (clouds).")] = None,
    workload: Annotated[Workload, typer.Option("--workload", case_sensitive=False,
                                               help="Ranks GPUs: cnn by tensor FLOP/s; rnn/transformer by memory "
                                                    "bandwidth and capacity.")] = Workload.cnn,
    region: Annotated[str | None, typer.Option("--region", help="Cloud region (default: the profile's).")] = None,
    zone: Annotated[str | None, typer.Option("--zone", help="Only this zone.")] = None,
    max_price: Annotated[float | None, typer.Option("--max-price", help="Highest hourly price (table's currency).")]
    = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot instances (ranked by spot price).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the ranked candidates and why; change nothing.")]
    = False,
    gpu_mode: Annotated[GpuMode | None, typer.Option(
        "--gpu-mode", case_sensitive=False,
        help="require: fail without a usable GPU (clouds' default); auto: CPU when none (local default); off.")] = None,
    registry: Annotated[str | None, typer.Option(
        "--registry", help="Push here first (HOST[:PORT]/NS or acr://REGION/NS); default: the image's last push.")]
    = None,
    port: Annotated[int | None, typer.Option("--port", help="Local: host port on 127.0.0.1 (default: free).")] = None,
    allow_from: Annotated[str, typer.Option("--allow-from", help="Cloud: CIDR allowed to reach port 8000.")]
    = "0.0.0.0/0",
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="Seconds to wait for /v2/health/ready.")]
    = 900.0,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="No endpoint key: anyone who reaches the port may call every API (on a cloud, only with "
                          "an --allow-from narrower than 0.0.0.0/0).")] = False,
    registry_login: RegistryLoginOpt = RegistryLogin.role,
    allow_unsigned: Annotated[bool, typer.Option(
        "--allow-unsigned", help="Deploy without checking the image's signature and provenance (by default an "
                                 "unsigned, re-tagged or edited image is refused before anything starts).")] = False,
    verify_key: Annotated[str | None, typer.Option(
        "--verify-key", help="Public key the image's signature must verify with: a PEM file, awskms:///alias/NAME "
                             "or aliyunkms://REGION/KEY (default: ngcx's own, which `ngcx push` signs with).")] = None,
    replicas: Annotated[int | None, typer.Option(
        "--replicas", min=1, max=64, help="A service: N replicas behind a load balancer (the cloud's own; locally "
                                          "haproxy); the URL printed is the balancer's.")] = None,
    service: Annotated[str | None, typer.Option(
        "--service", help="Roll this service (s1, …) to the image: new replicas first, then the old ones drain.")]
    = None,
    drain: Annotated[int, typer.Option("--drain", min=0, max=3600,
                                       help="Service: seconds a leaving replica keeps its in-flight requests.")] = 30,
    health_interval: Annotated[int, typer.Option(
        "--health-interval", min=1, max=300, help="Service: seconds between the balancer's health checks.")] = 5,
    certificate: Annotated[str | None, typer.Option(
        "--certificate", help="Service on a cloud: your certificate at the balancer's HTTPS listener (Alibaba Cloud "
                              "certificate service id, or an ACM ARN).")] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="--cloud kubernetes: the new folder the manifests are written to.")] = None,
    min_replicas: Annotated[int | None, typer.Option("--min", min=0, help="Autoscaled service: fewest replicas.")]
    = None,
    max_replicas: Annotated[int | None, typer.Option("--max", min=1, help="Autoscaled service: most replicas.")]
    = None,
    target_requests: Annotated[float, typer.Option(
        "--target-requests", min=0.001, help="Autoscaled service on a cloud: requests per replica per minute at the "
                                             "balancer that its scaling group keeps (target tracking).")] = 600.0,
    on_demand_base: Annotated[int, typer.Option(
        "--on-demand-base", min=0, help="Autoscaled service with --spot: this many replicas always on demand, the "
                                        "rest spot (several instance types, capacity-optimized).")] = 0,
    canary: Annotated[int | None, typer.Option(
        "--canary", help="With --service: release the image as a canary at PCT % of requests, judged on the replicas' "
                         "own /metrics, then promoted in steps (PCT, 50, 100 %) or rolled back by itself.")] = None,
    max_error_rate: Annotated[float, typer.Option(
        "--max-error-rate", help="Canary: the largest fraction of failed requests it may answer (0.01 = 1 %).")]
    = 0.01,
    max_p99_ms: Annotated[float, typer.Option(
        "--max-p99-ms", help="Canary: the slowest p99 it may answer in, ms (and at most 2x the old version's).")]
    = 1000.0,
    canary_window: Annotated[float, typer.Option(
        "--canary-window", help="Canary: seconds each step is watched (extended while too little traffic came).")]
    = 60.0,
    node_labels: Annotated[str | None, typer.Option(
        "--node-labels", help="--cloud kubernetes: ack or eks, whose GPU node labels select the nodes (default: the "
                              "one whose offers table has --gpu).")] = None,
    kserve: Annotated[bool, typer.Option("--kserve", help="--cloud kubernetes: also a KServe InferenceService.")]
    = False,
    gpus_per_pod: Annotated[str | None, typer.Option(
        "--gpus-per-pod", help="--cloud kubernetes: GPUs each pod asks for (nvidia.com/gpu), all of them serving; "
                               "N or node (the largest instance type's count); default 1.")] = None,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="--cloud kubernetes: the admission policy that verifies the image's signature in the "
                         "cluster: kyverno (default), sigstore (policy-controller) or none.")] = None,
    project_file: ProjectFileOpt = None,
    variant: VariantOpt = None,
    catalog_file: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve an image (or this folder's project) on this workstation or a cloud GPU; prints the URL."""
    from ..deploy.common import DeployConfig
    from ..deploy.image import pushes, resolve
    from .services import check_flags

    check_flags(cloud.value, replicas, service)
    release = _canary_flags(service, (min_replicas, max_replicas), (canary, max_error_rate, max_p99_ms,
                                                                     canary_window))
    k8s = _kubernetes_options(cloud, dry_run, output, replicas, service, (min_replicas, max_replicas), node_labels,
                              kserve, policy, gpus_per_pod)
    ref, cmd = _split_command(ref, list(ctx.args))
    image, labels = resolve(ref, project_file, variant, catalog_file)
    if not cmd and "ai.ngcx.project.name" not in labels and labels.get("ai.ngcx.image"):
        raise UserError(f"{image} is a catalog image without a model to serve",
                        hint="deploy a project (ngcx init) or give the command: -- ngcx-runtime serve MODEL")
    mode = (gpu_mode or (GpuMode.auto if cloud == Cloud.local else GpuMode.require)).value
    config = DeployConfig(cloud=cloud.value, image=image, pull_ref=None, registry=None, labels=labels,
                          model=labels.get("ai.ngcx.project.name"), cmd=cmd, gpu=gpu, gpu_mode=mode,
                          workload=workload.value, region=region, zone=zone, max_price=max_price, spot=spot,
                          port=port, allow_from=_cidr(allow_from), ready_timeout=ready_timeout,
                          auth=not no_auth, tls=cloud != Cloud.local, registry_login=registry_login.value,
                          trust_key=verify_key, allow_unsigned=allow_unsigned)
    if k8s is not None:
        return _kubernetes(config, k8s, as_json)
    if no_auth and cloud != Cloud.local:
        _check_open_endpoint(config.allow_from)
    if dry_run:
        return _dry_run(config)
    if release is not None:
        return _canary(config, registry, release, as_json)
    if service is not None or replicas is not None:
        from .services import deploy_service

        warn_interrupted()
        return deploy_service(config, registry, replicas, service, (port, drain, health_interval, certificate),
                              as_json)
    if on_demand_base and (min_replicas, max_replicas) == (None, None):
        raise UserError("--on-demand-base is for an autoscaled service", hint="add --spot --min A --max B")
    if (min_replicas, max_replicas) != (None, None):
        from .services import deploy_group

        warn_interrupted()
        return deploy_group(config, registry, (min_replicas, max_replicas, target_requests, on_demand_base),
                            (port, drain, health_interval, certificate), as_json)
    if cloud != Cloud.local:
        config.pushes = pushes(image, registry, sign=not config.allow_unsigned)
        config.pull_ref, config.registry = config.pick_push(lambda _host: True) or (None, None)
    warn_interrupted()
    from ..deploy.common import format_phases
    from ..deploy.flow import clouds_with_credentials, deploy, deploy_any

    record = deploy_any(config, clouds_with_credentials()) if cloud == Cloud.any else deploy(config)
    if as_json:
        from ..core.output import emit_json

        return emit_json(record.as_json())
    print(f"ngcx: deployment {record.id} ready ({record.path}{', ' + record.instance_id if record.instance_id else ''})"
          f": {format_phases(record.phases)}", file=sys.stderr)
    if record.detail:
        print(f"ngcx: note: {record.detail}", file=sys.stderr)
    from ..deploy.security import gpus_line, how_to_call

    if gpus_line(record):
        print(f"ngcx: {gpus_line(record)}", file=sys.stderr)

    for line in how_to_call(record, show_key=sys.stderr.isatty()):
        print(f"ngcx: {line}", file=sys.stderr)
    print(record.endpoint)


def _canary_flags(service: str | None, scale: tuple[int | None, int | None],
                 flags: tuple[int | None, float, float, float]) -> Any:
    """`--canary PCT` and its SLO flags, checked in one line each before anything is read or made: (the service,
    canary.Policy), or None without --canary."""
    first, max_error_rate, max_p99_ms, window = flags
    if first is None:
        return None
    from ..deploy import canary, service_group, store

    if service is None:
        raise UserError("--canary releases a new version of an existing service",
                        hint="add --service sN (see `ngcx deployments ls`)")
    policy = canary.Policy(steps=canary.steps_of(first), max_error_rate=max_error_rate, max_p99_ms=max_p99_ms,
                           window_s=window)
    canary.check(policy)
    svc = store.service(store.parse_service_id(service))
    if scale != (None, None) or service_group.is_group(svc):
        raise UserError(f"--canary on {svc.ref}: canary releases are for fixed-replica services (--replicas N), "
                        "not autoscaled ones (--min/--max)",
                        hint=f"roll {svc.ref} with `ngcx deploy --service {svc.ref}` (no --canary)")
    return svc, policy


def _canary(config: Any, registry: str | None, release: Any, as_json: bool) -> None:
    """`--service sN --canary PCT`: the image pushed where the service's hosts pull (clouds), then canary.run."""
    from ..deploy import canary
    from ..deploy.image import pushes
    from .services import _print_ready, say

    svc, policy = release
    if svc.cloud != "local":
        config.pushes = pushes(config.image, registry, sign=not config.allow_unsigned)
        config.pull_ref, config.registry = config.pick_push(lambda _host: True) or (None, None)
    warn_interrupted()
    _print_ready(canary.run(svc, config, policy, say), as_json)


def _kubernetes_options(cloud: Cloud, dry_run: bool, output: Path | None, replicas: int | None, service: str | None,
                        scale: tuple[int | None, int | None], node_labels: str | None, kserve: bool,
                        policy: str | None = None, gpus_per_pod: str | None = None) -> Any:
    """--cloud kubernetes's flags, checked before anything is read (None for the other clouds)."""
    if cloud != Cloud.kubernetes:
        if scale != (None, None) and (replicas is not None or service is not None):
            raise UserError("--min/--max with --replicas or --service", hint="--min A --max B makes an autoscaled "
                                                                             "service; --replicas N a fixed one")
        if scale != (None, None) and None in scale:
            raise UserError("--min and --max go together", hint="e.g. --min 1 --max 4")
        if output is not None or node_labels is not None or kserve or policy is not None or gpus_per_pod is not None:
            raise UserError("-o, --node-labels, --kserve, --policy and --gpus-per-pod are for --cloud kubernetes",
                            hint="every other target verifies the image itself before it starts")
        return None
    from ..deploy.kubernetes.manifests import options_from_flags
    from ..deploy.kubernetes.policy import DEFAULT_POLICY

    return options_from_flags(dry_run, output, replicas, service, scale, node_labels, kserve, policy or DEFAULT_POLICY,
                              gpus_per_pod)


def _kubernetes(config: Any, options: Any, as_json: bool) -> None:
    from ..deploy.kubernetes.manifests import summary, write

    done = write(config, options)
    if as_json:
        from ..core.output import emit_json

        return emit_json(done.as_json())
    for line in summary(done, show_key=sys.stderr.isatty()):
        print(f"ngcx: {line}", file=sys.stderr)
    print(done.out)


def _check_open_endpoint(allow_from: str) -> None:
    """--no-auth on a cloud: the security group must keep the internet out."""
    import ipaddress

    if ipaddress.ip_network(allow_from).prefixlen == 0:
        raise UserError(f"--no-auth with --allow-from {allow_from} would let anyone on the internet call every API "
                        "of the endpoint, model control included",
                        hint="give --allow-from your network (e.g. 203.0.113.0/24), or drop --no-auth")


def _split_command(ref: str | None, extra: list[str]) -> tuple[str | None, list[str]]:
    """(IMAGE, CMD): click hands the first word after `--` to the optional IMAGE when none was given
    (a project deploy with a command), so the split is read from the command line itself."""
    argv = sys.argv[1:]
    if "--" not in argv:
        if extra:
            raise UserError(f"unexpected {extra[0]!r}", hint="put the container's command after `--`")
        return ref, []
    cut = argv.index("--")
    cmd = argv[cut + 1:]
    return (ref if ref is not None and ref in argv[:cut] else None), cmd


def _cidr(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise UserError(f"--allow-from {text!r} is not a CIDR", hint="e.g. 203.0.113.7/32 or 0.0.0.0/0") from None


def _dry_run(config: Any) -> None:
    """What a deploy would do, without a single write call (offline ranking for clouds)."""
    if config.cloud == "local":
        print(f"would serve {config.image} on this host's Docker engine (gpu mode {config.gpu_mode}), "
              f"port {config.port or 'a free one'} on 127.0.0.1")
        return
    from ..deploy import CLOUDS, offers
    from ..deploy.flow import choices_across

    choices = choices_across(config, list(CLOUDS) if config.cloud == "any" else [config.cloud])
    lines = offers.explain_merged(choices) if len(choices) > 1 else offers.explain(choices[0])
    for line in lines:
        print(line)
    if not any(choice.candidates for choice in choices):
        raise UserError(f"no {config.cloud} instance type fits {config.image}", hint="see the reasons above")


def warn_interrupted() -> None:
    """One warning per deployment an interrupted ngcx left in flight (`deploy` and `deployments` say it first)."""
    from ..deploy import store

    for record in store.interrupted():
        print(f"ngcx: warning: deployment {record.id} ({record.cloud}) was interrupted while {record.status}"
              f"{' with instance ' + record.instance_id if record.instance_id else ''}; "
              "run `ngcx deployments gc` to find and clean up what it left", file=sys.stderr)
