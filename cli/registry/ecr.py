"""Amazon ECR: `ecr://REGION[/REPO]` push targets, repositories created on demand, temporary logins.

Why its own module (like acr.py): push (`ngcx push --registry ecr://us-east-1/team`) and deploy
(the host's pull) both need the registry's address and a short-lived login from the SDK
(GetAuthorizationToken: a base64 "AWS:<password>" valid 12 h, cloud-apis.md §10.2). The address
is the one the token names (`<account>.dkr.ecr.<region>.amazonaws.com`, `.com.cn` in China), so no
extra call is needed for the account id. ECR refuses a push to a repository that does not exist,
so push creates it first, with a tag-mutability choice (see `DEFAULT_MUTABILITY`).
Hosts pull through the same name (an ECR interface endpoint in the VPC keeps it, with private DNS).

NGCX_ECR_ENDPOINT / NGCX_ECR_VPC_ENDPOINT override the two addresses (tests: the loopback registry
and the address emulated hosts reach it at); NGCX_ECR_REGION names the region an overridden
endpoint belongs to (default: the AWS region of the environment); NGCX_ECR_API_HOST_ENDPOINT is
the token API's URL as hosts reach it (their role login, recipes/deploy/role_login.py; tests: a relay
to the AWS double).
"""

from __future__ import annotations

import base64
import os
import re
from functools import cache

from ..core.errors import UserError
from .credentials import Credentials

ECR = re.compile(r"ecr://(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)"
                 r"(?:/(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*))?/?")
ECR_HOST = re.compile(r"\d{12}\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.amazonaws\.com(?:\.cn)?")
# MUTABLE by default: deploys always pull REPO@DIGEST (what was pushed and verified), so a moved tag
# never changes what runs; a project's edit -> build -> push loop re-pushes the same tag (`latest`),
# which an IMMUTABLE repository refuses. Catalog release repositories can choose IMMUTABLE.
MUTABILITY = ("MUTABLE", "IMMUTABLE")
DEFAULT_MUTABILITY = "MUTABLE"


def parse(target: str) -> tuple[str, str] | None:
    """'ecr://us-east-1/team' -> ('us-east-1', 'team'); 'ecr://us-east-1' -> ('us-east-1', ''); None if not ecr://."""
    if not target.startswith("ecr://"):
        return None
    match = ECR.fullmatch(target.strip())
    if not match:
        raise UserError(f"registry {target!r} is not ecr://REGION[/REPO]",
                        hint="e.g. --registry ecr://us-east-1 or ecr://us-east-1/myteam (lowercase)")
    return match["region"], match["repo"] or ""


def endpoint(region: str) -> str:
    """The registry host of this account in `region` (from the token's proxyEndpoint), or NGCX_ECR_ENDPOINT."""
    override = os.environ.get("NGCX_ECR_ENDPOINT")
    if override:
        return override
    return _token(region)[0]


def vpc_endpoint(registry_host: str) -> str:
    """What hosts pull from: NGCX_ECR_VPC_ENDPOINT, else the same name (private DNS of an interface endpoint)."""
    return os.environ.get("NGCX_ECR_VPC_ENDPOINT") or registry_host


def api_host_endpoint(region: str) -> str:
    """The URL of ECR's API (GetAuthorizationToken) that a host's role login calls (.com.cn in China)."""
    suffix = ".cn" if region.startswith("cn-") else ""
    return os.environ.get("NGCX_ECR_API_HOST_ENDPOINT") or f"https://api.ecr.{region}.amazonaws.com{suffix}"


def region_of(registry_host: str) -> str | None:
    """The region whose ECR is `registry_host`, else None (another registry)."""
    override = os.environ.get("NGCX_ECR_ENDPOINT")
    if override and registry_host == override:
        from ..clouds.aws import default_region

        return os.environ.get("NGCX_ECR_REGION") or default_region() or "us-east-1"
    match = ECR_HOST.fullmatch(registry_host)
    return match["region"] if match else None


def temporary_login(region: str) -> Credentials:
    """A fresh 12-hour login (user AWS) from GetAuthorizationToken; one per host job, never cached."""
    return _fetch_token(region)[1]


def push_login(region: str) -> Credentials:
    """The login for this process's push (one token call serves endpoint() and the upload)."""
    return _token(region)[1]


@cache
def _token(region: str) -> tuple[str, Credentials]:
    return _fetch_token(region)


def _fetch_token(region: str) -> tuple[str, Credentials]:
    from ..clouds.aws import Api

    answer = Api(region).call("ecr", "get_authorization_token")
    [data, *_] = answer.get("authorizationData") or [{}]
    try:
        user, _, password = base64.b64decode(data.get("authorizationToken", "")).decode().partition(":")
    except ValueError:
        user, password = "", ""
    host = re.sub(r"^https?://", "", data.get("proxyEndpoint") or "").rstrip("/")
    if not user or not password or not host:
        raise UserError(f"ECR in {region} gave no usable authorization token (keys: {sorted(data)})",
                        hint="check that the identity may call ecr:GetAuthorizationToken")
    return host, Credentials(user, password)


def ensure_repository(region: str, name: str, mutability: str | None = None) -> str:
    """Create repository `name` when missing (scan on push, tag mutability as chosen); its mutability.

    An existing repository is left as it is: its mutability is returned, not changed.
    """
    from ..clouds.aws import Api, AwsError

    wanted = (mutability or os.environ.get("NGCX_ECR_TAG_MUTABILITY") or DEFAULT_MUTABILITY).upper()
    if wanted not in MUTABILITY:
        raise UserError(f"ECR tag mutability {wanted!r} is not one of {', '.join(MUTABILITY)}")
    api = Api(region)
    try:
        [repo] = api.call("ecr", "describe_repositories", repositoryNames=[name])["repositories"]
        return str(repo.get("imageTagMutability") or "MUTABLE")
    except AwsError as exc:
        if exc.code != "RepositoryNotFoundException":
            raise
    try:
        api.call("ecr", "create_repository", idempotent=False, repositoryName=name, imageTagMutability=wanted,
                 imageScanningConfiguration={"scanOnPush": True}, tags=[{"Key": "ngcx:created-by", "Value": "push"}])
    except AwsError as exc:
        if exc.code != "RepositoryAlreadyExistsException":   # a racing push made it: fine
            raise
    return wanted
