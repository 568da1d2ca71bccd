"""Alibaba Cloud Container Registry (ACR): `acr://REGION/NAMESPACE` targets and temporary logins.

Why its own module: push (`ngcx push --registry acr://…`) and deploy (the host's pull) both need
the registry's address and a short-lived login from the SDK (GetAuthorizationToken, valid 1 h,
cloud-apis.md §8), and hosts pull through the VPC endpoint (registry-vpc.REGION…), not the public
one, so in-region pulls stay on the fast private network.
NGCX_ACR_ENDPOINT / NGCX_ACR_VPC_ENDPOINT override the two addresses (tests: the loopback registry
and the address emulated hosts reach it at); NGCX_ACR_INSTANCE_ID names an Enterprise instance;
NGCX_ACR_API_HOST_ENDPOINT is the token API's URL as hosts reach it (their role login,
recipes/deploy/role_login.py; tests: a relay to the emulator).
"""

from __future__ import annotations

import os
import re

from ..core.errors import UserError
from .credentials import Credentials

ACR = re.compile(r"acr://(?P<region>[a-z]{2}-[a-z0-9-]+)(?:/(?P<namespace>[a-z0-9]+(?:[._-][a-z0-9]+)*))?/?")


def parse(target: str) -> tuple[str, str] | None:
    """'acr://cn-hangzhou/team' -> ('cn-hangzhou', 'team'); None when `target` is not an acr:// URL."""
    if not target.startswith("acr://"):
        return None
    match = ACR.fullmatch(target.strip())
    if not match or not match["namespace"]:
        raise UserError(f"registry {target!r} is not acr://REGION/NAMESPACE",
                        hint="e.g. --registry acr://cn-hangzhou/myteam")
    return match["region"], match["namespace"]


def endpoint(region: str) -> str:
    return os.environ.get("NGCX_ACR_ENDPOINT") or f"registry.{region}.aliyuncs.com"


def vpc_endpoint(region: str) -> str:
    return os.environ.get("NGCX_ACR_VPC_ENDPOINT") or f"registry-vpc.{region}.aliyuncs.com"


def api_host_endpoint(region: str) -> str:
    """The URL of ACR's API (GetAuthorizationToken) that a host's role login calls."""
    return os.environ.get("NGCX_ACR_API_HOST_ENDPOINT") or f"https://cr.{region}.aliyuncs.com"


def instance_id() -> str:
    """The ACR Enterprise Edition instance the registry belongs to ("" for the personal edition)."""
    return os.environ.get("NGCX_ACR_INSTANCE_ID", "")


def region_of(registry_host: str) -> str | None:
    """The region whose ACR endpoint is `registry_host` (public), else None."""
    override = os.environ.get("NGCX_ACR_ENDPOINT")
    if override and registry_host == override:
        return os.environ.get("NGCX_ACR_REGION", "cn-hangzhou")
    match = re.fullmatch(r"registry(?:-vpc)?\.([a-z]{2}-[a-z0-9-]+)\.aliyuncs\.com", registry_host)
    return match[1] if match else None


def temporary_login(region: str) -> Credentials:
    """A 1-hour registry login from GetAuthorizationToken, through the SDK: an Enterprise Edition instance's
    from cr 2018-12-01 (RPC, InstanceId required), the Personal Edition's (no instance, the default) from
    cr 2016-06-07 (ROA `GET /tokens`, answer `data.{tempUserName, authorizationToken}`). Before issue 47 the
    Personal Edition case called 2018-12-01 without its required InstanceId (cli/clouds/ALIYUN_API_NOTES.md)."""
    from ..clouds.aliyun import Api

    if instance_id():
        answer = Api(region).cr("GetAuthorizationToken", {"InstanceId": instance_id()})
        user, token = answer.get("TempUsername"), answer.get("AuthorizationToken")
        ok = answer.get("IsSuccess", True)
    else:
        answer = Api(region).cr_personal("GetAuthorizationToken", "/tokens")
        data = answer.get("data") or {}
        user, token, ok = data.get("tempUserName"), data.get("authorizationToken"), True
    if not ok or not user or not token:
        raise UserError(f"ACR in {region} gave no temporary login (answer keys: {sorted(answer)})",
                        hint="check that the RAM user may call cr:GetAuthorizationToken")
    return Credentials(user, token)
