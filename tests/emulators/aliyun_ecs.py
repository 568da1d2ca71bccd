"""An Alibaba Cloud ECS emulator: a real HTTP server that aliyun-python-sdk-core talks to unchanged.

Why: the deploy code must be tested through the real SDK (signature v1, its retry policy, its
error rewriting) against a cloud that keeps real state — ClientToken idempotency, the instance
state machine, per-zone stock, economical-mode stops — and that can fail on purpose. The API
state lives here; "being a VM" is delegated to a HostBackend (hosts_api.py), so the same
emulator runs on paper in its own tests and on Docker containers in the product's e2e tests.

This module is the product dispatch: which API version (product) an action belongs to, the endpoint,
the metadata service's lifecycle, and ACR's GetAuthorizationToken (2018-12-01, the one cr action). Each
ECS family is a module and a class EcsEmulator inherits (none imports this module):

- aliyun_ecs_machines.py: the instances, images and security groups, and the machines behind them;
- aliyun_ecs_instances.py: RunInstances, DescribeInstances, Start/Stop/Delete, the placement catalogue;
- aliyun_ecs_network.py: VPC, vSwitches, security groups;
- aliyun_ecs_images.py: CreateImage / DescribeImages / DeleteImage;
- aliyun_cloud_assistant.py: RunCommand / DescribeInvocationResults, the serial console.

Instance RAM roles, RAM itself (2015-05-01, on the same port), the STS keys of roles and the
metadata service live in aliyun_ram.py, ALB (2020-06-16) and its haproxy data plane in aliyun_alb.py,
Auto Scaling (ESS 2022-02-22: groups of these instances behind ALB) in aliyun_ess.py; this module only wires
them in.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Self

from .aliyun_alb import ALB_IDEMPOTENT, ALB_UNLOCKED, ALB_VERSION, Alb
from .aliyun_cloud_assistant import UNLOCKED, CloudAssistant
from .aliyun_ecs_images import EcsImages
from .aliyun_ecs_instances import EcsInstances
from .aliyun_ecs_network import EcsNetwork
from .aliyun_ess import ESS_IDEMPOTENT, ESS_VERSION, Ess
from .aliyun_instance_roles import InstanceRoles
from .aliyun_metadata import MetadataServer, MetadataService
from .aliyun_ram import ACCOUNT_UID, RAM_ACTIONS, RAM_VERSION, Ram
from .aliyun_roa import RoaGateway
from .aliyun_rpc import required
from .hosts_api import HostBackend

ECS_VERSION = "2014-05-26"
CR_VERSION = "2018-12-01"
CR_PERSONAL_VERSION = "2016-06-07"   # ACR Personal Edition's API: ROA GET /tokens (aliyun_roa.py)
# Actions whose ClientToken makes a retry safe (same token + same params -> the first answer).
IDEMPOTENT = frozenset({"RunInstances", "CreateImage", "CreateSecurityGroup", "DeleteInstances", "RunCommand"})


class EcsEmulator(CloudAssistant, EcsImages, EcsNetwork, EcsInstances, RoaGateway):
    """ECS (2014-05-26) + ACR GetAuthorizationToken (2018-12-01) + RAM (2015-05-01) on 127.0.0.1, state
    behind one lock, and the instances' metadata service on its own port (metadata_address)."""

    products = {ECS_VERSION: ("Ecs", "ecs.aliyuncs.com"), CR_VERSION: ("cr", "cr.aliyuncs.com"),
                RAM_VERSION: ("Ram", "ram.aliyuncs.com"), ALB_VERSION: ("Alb", "alb.aliyuncs.com"),
                ESS_VERSION: ("Ess", "ess.aliyuncs.com")}
    idempotent = IDEMPOTENT | ALB_IDEMPOTENT | ESS_IDEMPOTENT
    unlocked = UNLOCKED | ALB_UNLOCKED
    regionless = frozenset({"DescribeRegions"}) | RAM_ACTIONS

    def __init__(self, hosts: HostBackend, *, access_keys: Mapping[str, str] | None = None,
                 region: str = "cn-hangzhou",
                 zones: Iterable[str] = ("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j"),
                 boot_seconds: float = 0.5, start_seconds: float = 0.5, stop_seconds: float = 0.2,
                 offerings: Mapping[str, Iterable[str]] | None = None, metadata_host: str = "127.0.0.1") -> None:
        """`offerings`: zone -> the instance types it sells; default every type everywhere except
        ecs.gn8is.2xlarge, which only the last zone offers (so ZoneNotSupported can happen).
        `metadata_host`: where the metadata service listens (the instances must reach it there)."""
        super().__init__(hosts, {"test-ak": "test-secret"} if access_keys is None else access_keys, region,
                         zones=zones, boot_seconds=boot_seconds, start_seconds=start_seconds,
                         stop_seconds=stop_seconds, offerings=offerings)
        self.issued_tokens: list[str] = []
        self.token_grants: list[dict[str, Any]] = []   # {"token", "caller", "instance", "pull"} per issued token
        self.ram = Ram(self._lock)
        self.temporary_keys = self.ram.temporary_secret
        self.instance_roles = InstanceRoles(self.ram, self._instance, lambda: self._instances.values(), region)
        self.metadata_host = metadata_host
        self._metadata: MetadataServer | None = None
        self.alb = Alb(self._lock, self._spawn, self._sleep_until, self._vpc_id, self._vswitches, self._instances.get,
                       region)    # ALB 2020-06-16 (aliyun_alb.py), its data plane a haproxy per load balancer
        self.ess = Ess(self)    # Auto Scaling 2022-02-22 (aliyun_ess.py): groups of these instances behind ALB
        self.actions = {
            ECS_VERSION: {
                "DescribeRegions": self._describe_regions, "DescribeZones": self._describe_zones,
                "DescribeInstanceTypes": self._describe_instance_types,
                "DescribeAvailableResource": self._describe_available_resource,
                "DescribeVpcs": self._describe_vpcs, "DescribeVSwitches": self._describe_vswitches,
                "DescribeSecurityGroups": self._describe_security_groups,
                "DescribeSecurityGroupAttribute": self._describe_security_group_attribute,
                "CreateSecurityGroup": self._create_security_group,
                "AuthorizeSecurityGroup": self._authorize_security_group,
                "RunInstances": self._run_instances, "DescribeInstances": self._describe_instances,
                "StartInstance": self._start_instances, "StartInstances": self._start_instances,
                "StopInstance": self._stop_instances, "StopInstances": self._stop_instances,
                "DeleteInstance": self._delete_instances, "DeleteInstances": self._delete_instances,
                "CreateImage": self._create_image, "DescribeImages": self._describe_images,
                "DeleteImage": self._delete_image, "RunCommand": self._run_command,
                "DescribeInvocationResults": self._describe_invocation_results,
                "GetInstanceConsoleOutput": self._console_output,
            },
            CR_VERSION: {"GetAuthorizationToken": self._get_authorization_token},
            RAM_VERSION: self.ram.actions,
            ALB_VERSION: self.alb.actions,
            ESS_VERSION: self.ess.actions,
        }
        self.actions[ECS_VERSION].update(self.instance_roles.actions)
        self.roa[("GET", "/tokens")] = ("cr", CR_PERSONAL_VERSION, "GetAuthorizationToken", self._get_personal_token)

    def start(self) -> Self:
        """The API on a free loopback port, the metadata service on a free port of metadata_host."""
        super().start()
        if self._metadata is None:
            self._metadata = MetadataServer(self.metadata_host,
                                            MetadataService(self._metadata_caller, self.ram, self.region,
                                                            self._termination_time))
        return self

    @property
    def metadata_address(self) -> str:
        """host:port of the metadata service (what 100.100.100.200:80 is on ECS)."""
        if self._metadata is None:
            raise RuntimeError("EcsEmulator.start() first")
        return self._metadata.address

    def close(self) -> None:
        """Stop serving, let running backend calls finish, then have the backend remove its machines."""
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None
        super().close()
        self.alb.close()
        self.hosts.close()

    # --- inspection (tests) --------------------------------------------------------------------

    def balancer_address(self, load_balancer: str, listener_port: int) -> tuple[str, int]:
        """(host, port) where the data plane serves this ALB listener (load balancer id or DNSName)."""
        return self.alb.address(load_balancer, listener_port)

    def issued_secrets(self) -> list[str]:
        """Every STS AccessKeySecret and SecurityToken handed out (tests search logs for them)."""
        return self.ram.issued_secrets()

    def _metadata_caller(self, ip: str) -> tuple[str, str] | None:
        """(instance id, role) of the one Running instance with this private IP: the metadata caller."""
        with self._lock:
            found = [i for i in self._instances.values() if i.status == "Running" and i.private_ip == ip]
            return (found[0].id, found[0].ram_role) if len(found) == 1 else None

    # --- ACR ------------------------------------------------------------------------------------

    def _get_authorization_token(self, params: dict[str, str]) -> dict[str, Any]:
        """cr 2018-12-01: a fresh temporary registry password per call, valid one hour for a permanent
        key; for a role's STS keys only if its policies allow cr:GetAuthorizationToken on the instance
        (else 403 Forbidden.RAM), valid as long as the keys. Each is recorded with its scope."""
        instance = required(params, "InstanceId")
        token, expires = self._registry_token(params["AccessKeyId"], f"instance/{instance}")
        return {"IsSuccess": True, "TempUsername": "cr_temp_user", "AuthorizationToken": token, "ExpireTime": expires}

    def _get_personal_token(self, params: dict[str, str]) -> dict[str, Any]:
        """cr 2016-06-07 (Personal Edition, no instance): ROA GET /tokens, the same grant rules on the account's
        personal registry; the answer's shape as cloud-apis.md §8 gives it (`data`, camelCase)."""
        token, expires = self._registry_token(params["AccessKeyId"], "personal")
        return {"data": {"authorizationToken": token, "tempUserName": "cr_temp_user", "expireDate": expires}}

    def _registry_token(self, access_key_id: str, what: str) -> tuple[str, int]:
        """A fresh temporary registry password (one hour for a permanent key, the STS keys' lifetime for a
        role allowed cr:GetAuthorizationToken, else 403 Forbidden.RAM), recorded with its scope."""
        grant = self.ram.registry_grant(access_key_id, f"acs:cr:{self.region}:{ACCOUNT_UID}:{what}")
        token = secrets.token_urlsafe(48)
        self.issued_tokens.append(token)
        self.token_grants.append({"token": token, "caller": grant.caller, "instance": grant.instance,
                                  "pull": grant.pull})
        return token, int(grant.expires * 1000)
