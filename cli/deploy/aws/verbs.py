"""The AWS target's verbs (the router's contract, deploy/__init__.py VERBS), over EC2 hosts (ec2.py) behind
the VM contract of cli/deploy/vm.py.

What is EC2-specific lives in this package: RunInstances with ngcx's ClientToken (the record holds it before
the call; aws_api retries with the same token) in a zone that sells the type
(DescribeInstanceTypeOfferings) and has a default subnet, ngcx's tags on the instance AND its EBS
volumes; stops keep the EBS disk with the pulled layers (the GPU is released: a start can fail with
InsufficientInstanceCapacity, and vm.py then creates a new host); SSM Run Command as the command
channel (the host needs an instance profile with AmazonSSMManagedInstanceCore: the repository's
pull profile, roles.py, or `ngcx-host` when there is none, and a running SSM agent, which the
user-data starts when the AMI lacks it); the host image is the newest baked one (tag ngcx:host-image)
or the ECS GPU-optimized AMI from its public SSM parameter; the host logs in to ECR with its instance
profile through IMDSv2 (`--registry-login token`: a fresh 12-hour token in the host job instead).
"""

from __future__ import annotations

import os
from typing import Any

from ...core.errors import UserError
from .. import roles, vm
from ..common import Capabilities, DeployConfig, DeployRecord
from .ec2 import NAME, Ec2, cloud_for, with_ssm_agent

CAPABILITIES = Capabilities(stop_start_host=True, choose_instance=True, bake=True, list_orphans=True)
DEFAULT_REGION = "us-east-1"
FAILURE_CHECK_S = 5.0            # flow.py asks this often whether the container died (one SSM command each)
TOKEN_NOTE = ("--registry-login token: a 12-hour ECR token travels in this host job (user-data or SSM command, "
              "which AWS keeps); it pulls whatever the caller may until it expires")


def has_credentials() -> bool:
    """Whether AWS credentials are configured here, without an API call (`--cloud any` picks clouds with it):
    the variables, a profile, ~/.aws files, a web identity or container role. An EC2 instance role is only
    found by a call to the metadata service, so a host relying on one names --cloud aws explicitly."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("boto3") is None:
        return False
    names = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
    if any(os.environ.get(name) for name in names):
        return True
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or Path.home() / ".aws" / "credentials",
             os.environ.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config"]
    return any(Path(f).is_file() for f in files)


def default_region() -> str:
    from ...clouds.aws import default_region as configured

    return configured() or DEFAULT_REGION


def region_of(config: DeployConfig) -> str:
    return config.region or default_region()


def choose(config: DeployConfig) -> Any:
    """The ranked instance types for this image over the AWS table."""
    return vm.choose(NAME, config)


def prepare(config: DeployConfig) -> vm.Plan:
    """Read-only checks: an instance type fits, credentials work, the image is in a registry."""
    from ...registry import ecr

    picked = config.pick_push(lambda host: ecr.region_of(host) is not None)
    if picked is None:
        raise UserError(f"{config.image} has not been pushed to a registry the host can pull from",
                        hint="push it first (ngcx push IMAGE --registry ecr://REGION) or pass --registry")
    config_pull, config_registry = picked
    choice = choose(config)
    if not choice.candidates:
        reasons = "; ".join(f"{r.itype.name}: {r.reason}" for r in choice.rejected[:4])
        raise UserError(f"no AWS instance type fits {config.image}: {reasons}",
                        hint="relax --gpu / --max-price, or see them all with --dry-run")
    cloud = cloud_for(region_of(config))
    cloud.check()  # proves the credentials before anything is written
    host_image = vm.baked_or(cloud, cloud.fallback_image, (
        f"no baked ngcx host image in {cloud.region}: hosts boot the ECS GPU AMI and pull every layer at deploy "
        "time; make one once (driver, Docker, toolkit, base layers): "
        f"ngcx hosts bake --cloud aws --region {cloud.region}"))
    ecr_region = ecr.region_of(config_registry)
    pull_ref, registry = config_pull, config_registry
    if ecr_region:   # hosts pull through the VPC's name for the registry, logged in by their instance profile
        registry = ecr.vpc_endpoint(config_registry)
        pull_ref = registry + pull_ref[len(config_registry):]
    if not ecr_region:
        return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry, lambda: None)
    if config.registry_login == "token":
        return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry,
                       lambda: ecr.temporary_login(ecr_region), [TOKEN_NOTE])
    grant = roles.PullGrant(NAME, ecr_region, roles.repository_of(pull_ref))
    login = roles.RoleLogin(NAME, ecr_region, ecr.api_host_endpoint(ecr_region))
    return vm.Plan(cloud, choice.candidates, host_image, pull_ref, registry, lambda: login, grant=grant)


# ---------------------------------------------------------------- the contract's verbs (vm.py does the work)

def _cloud(record: DeployRecord) -> Ec2:
    return cloud_for(record.region or DEFAULT_REGION)


(run, report_phases, container_failure, cleanup_failed, query, start, stop, terminate,
 logs, install_key_hashes, certificate) = vm.Verbs(_cloud).all()


def orphans() -> list[dict[str, str]]:
    """Tagged instances no record owns. Intent is recorded before any cloud call, so a store without a
    single aws record has none: gc then makes no call (and needs no credentials or SDK)."""
    from .. import store

    if not store.records(cloud=NAME, include_gone=True):
        return []
    return vm.orphans_in([cloud_for(region) for region in vm.record_regions(NAME, default_region())])


def delete_orphan(item: dict[str, str]) -> None:
    cloud_for(item["region"]).delete(item["id"])


# ---------------------------------------------------------------- services (issue 21): service.py's verbs

CERTIFICATE = ("an ACM certificate ARN", "arn:aws:acm:REGION:ACCOUNT:certificate/ID")


def check_service(config: DeployConfig, options: Any) -> None:
    """Refuses a service without --certificate, before any cloud call (vm.check_service)."""
    vm.check_service(options, NAME, CERTIFICATE)


def service_spec(name: str, zones: tuple[str, ...], tags: dict[str, str], options: Any, config: DeployConfig) -> Any:
    """An ALB: HTTPS on 443 with the ACM certificate, the hosts' own TLS behind it (vm.service_spec)."""
    return vm.service_spec(name, zones, tags, options, NAME, CERTIFICATE)


def service_zones(config: DeployConfig) -> tuple[str, ...]:
    return vm.service_zones_with(cloud_for(region_of(config)), NAME, config)


def balancer(config: DeployConfig | None = None) -> Any:
    """elb.Elb in the service's region (the default region without a config: gc). Its ensure
    needs the hosts' network (subnets, security group), prepared here with the service's --allow-from."""
    from .elb import Elb

    region = region_of(config) if config is not None else default_region()
    cloud = cloud_for(region)
    if config is not None:
        cloud.prepare_network(config.allow_from)
    return Elb(cloud)




member = vm.member


def scaling_group(config: DeployConfig | None = None) -> Any:
    """Services' --min/--max (service_group.py): vm_groups.ServiceGroups over EC2 Auto Scaling (asg.py) in
    the service's region (the default region without a config: gc)."""
    from .. import vm_groups
    from . import asg as aws_asg

    cloud = cloud_for(region_of(config) if config is not None else default_region())
    return vm_groups.ServiceGroups(config, cloud, prepare, with_ssm_agent, aws_asg.kit(cloud.api))
