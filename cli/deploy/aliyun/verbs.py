"""The Alibaba Cloud target's verbs (the router's contract, deploy/__init__.py VERBS), over ECS hosts (ecs.py)
behind the VM contract of cli/deploy/vm.py.

What is ECS-specific lives in this package: RunInstances with a ClientToken the record holds before the call
(aliyun_api retries with the same token; the SDK's own retry would send none), the stock check
DescribeAvailableResource before RunInstances, StopCharging stops (GPU and vCPUs stop billing, the
disk keeps the pulled layers; a restart can fail for stock, OperationDenied.NoStock, and vm.py then
creates a new host), Cloud Assistant (RunCommand) as the command channel, ACR's VPC endpoint and a
RAM role per repository for the host's pull (roles.py; `--registry-login token`: a 1-hour token
instead), and ngcx's tags on every instance: ngcx:owner (this state store), ngcx:deployment (the record).
"""

from __future__ import annotations

from typing import Any

from ...core.errors import UserError
from .. import roles, vm
from ..common import Capabilities, DeployConfig, DeployRecord
from .ecs import FALLBACK_IMAGE, NAME, Ecs, cloud_for

CAPABILITIES = Capabilities(stop_start_host=True, choose_instance=True, bake=True, list_orphans=True)
DEFAULT_REGION = "cn-hangzhou"
TOKEN_NOTE = ("--registry-login token: a 1-hour ACR token travels in this host job (user-data or Cloud Assistant "
              "command, which ECS keeps); it pulls whatever the RAM user may until it expires")


def has_credentials() -> bool:
    """Whether Alibaba Cloud credentials are configured here (variables or the aliyun CLI's profile file)."""
    import os
    from pathlib import Path

    return bool(os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")) or (Path.home() / ".aliyun" / "config.json").is_file()


def region_of(config: DeployConfig) -> str:
    from ...clouds.aliyun import credentials

    return config.region or credentials().region or DEFAULT_REGION


def choose(config: DeployConfig) -> Any:
    """The ranked instance types for this image over the Alibaba Cloud table."""
    return vm.choose(NAME, config)


def prepare(config: DeployConfig) -> vm.Plan:
    """Read-only checks: credentials work, an instance type fits, the image is in a registry."""
    from ...registry import acr

    picked = config.pick_push(lambda host: acr.region_of(host) is not None)
    if picked is None:
        raise UserError(f"{config.image} has not been pushed to a registry the host can pull from",
                        hint="push it first (ngcx push IMAGE --registry acr://REGION/NAMESPACE) or pass --registry")
    config_pull, config_registry = picked
    cloud = cloud_for(region_of(config))
    cloud.api.ecs("DescribeRegions")  # proves the credentials before anything is written
    choice = choose(config)
    if not choice.candidates:
        reasons = "; ".join(f"{r.itype.name}: {r.reason}" for r in choice.rejected[:4])
        raise UserError(f"no Alibaba Cloud instance type fits {config.image}: {reasons}",
                        hint="relax --gpu / --max-price, or see them all with --dry-run")
    host_image = vm.baked_or(cloud, lambda: FALLBACK_IMAGE, (
        f"no baked ngcx host image in {cloud.region}: a fresh host installs its driver and Docker at boot "
        f"(5-10 min); make one once: ngcx hosts bake --cloud aliyun --region {cloud.region}"))
    acr_region = acr.region_of(config_registry)
    pull_ref, registry = config_pull, config_registry
    if acr_region:  # hosts pull in-region through the VPC endpoint, logged in by their RAM role
        registry = acr.vpc_endpoint(acr_region)
        pull_ref = registry + pull_ref[len(config_registry):]
    if not acr_region:
        return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry, lambda: None)
    if config.registry_login == "token":
        return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry,
                       lambda: acr.temporary_login(acr_region), [TOKEN_NOTE])
    grant = roles.PullGrant(NAME, acr_region, roles.repository_of(pull_ref), acr.instance_id())
    login = roles.RoleLogin(NAME, acr_region, acr.api_host_endpoint(acr_region), grant.registry_instance)
    return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry, lambda: login, grant=grant)


# ---------------------------------------------------------------- the contract's verbs (vm.py does the work)

def _cloud(record: DeployRecord) -> Ecs:
    return cloud_for(record.region or DEFAULT_REGION)


(run, report_phases, container_failure, cleanup_failed, query, start, stop, terminate,
 logs, install_key_hashes, certificate) = vm.Verbs(_cloud).all()


def orphans() -> list[dict[str, str]]:
    from ...clouds.aliyun import credentials

    default = credentials().region or DEFAULT_REGION
    return vm.orphans_in([cloud_for(region) for region in vm.record_regions(NAME, default)])


def delete_orphan(item: dict[str, str]) -> None:
    cloud_for(item["region"]).delete(item["id"])


# ---------------------------------------------------------------- services (issue 21): service.py's verbs

CERTIFICATE = ("a Certificate Management Service (CAS) certificate id", "CERT_ID-REGION")


def check_service(config: DeployConfig, options: Any) -> None:
    """Refuses a service without --certificate, before any cloud call (vm.check_service)."""
    vm.check_service(options, NAME, CERTIFICATE)


def service_spec(name: str, zones: tuple[str, ...], tags: dict[str, str], options: Any, config: DeployConfig) -> Any:
    """An ALB: HTTPS on 443 with the CAS certificate, the hosts' own TLS behind it (vm.service_spec)."""
    return vm.service_spec(name, zones, tags, options, NAME, CERTIFICATE)


def service_zones(config: DeployConfig) -> tuple[str, ...]:
    return vm.service_zones_with(cloud_for(region_of(config)), NAME, config)


def balancer(config: DeployConfig | None = None) -> Any:
    """alb.Alb in the service's region (the default region without a config: gc). Its ensure
    needs the hosts' network (subnets, security group), prepared here with the service's --allow-from."""
    from ...clouds.aliyun import credentials
    from .alb import Alb

    region = region_of(config) if config is not None else (credentials().region or DEFAULT_REGION)
    cloud = cloud_for(region)
    if config is not None:
        cloud.prepare_network(config.allow_from)
    return Alb(cloud)




member = vm.member


def scaling_group(config: DeployConfig | None = None) -> Any:
    """Services' --min/--max (service_group.py): vm_groups.ServiceGroups over ESS (ess.py) in the
    service's region (the default region without a config: gc). Hosts get no extra user-data wrapping."""
    from ...clouds.aliyun import credentials
    from .. import vm_groups
    from . import ess as aliyun_ess

    cloud = cloud_for(region_of(config) if config is not None else (credentials().region or DEFAULT_REGION))
    return vm_groups.ServiceGroups(config, cloud, prepare, str, aliyun_ess.kit(cloud.api))
