"""The hosts' registry logins without a secret: one pull-only role per repository, the cloud's own way.

Why roles and not tokens: a token in user-data is kept by ECS for the instance's life, and one in a
Cloud Assistant / SSM command stays in the command history (issue 20). With a role attached to the
instance, the host asks its metadata service (ECS 100.100.100.200, EC2 IMDSv2 169.254.169.254) for
short-lived credentials and exchanges them for a registry login itself (recipes/deploy/role_login.py),
so what ngcx sends to the cloud says only *where* to log in, never *with what*.

Why one role per repository: the narrowest grant a host can hold is "pull this one repository";
hosts reused by a deploy of another repository get that repository's role attached instead
(`attach_role` of each cloud module). The name is a hash of what it grants, so every deploy of the
same repository finds the same role (idempotent, no state row needed) and `--registry-login token`
stays the explicit fallback for registries without roles. A bake's builder pre-pulls several
repositories (bake.py), so its role (a PullRole of several grants) may pull those, and only those.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

ROLE_PREFIX = "ngcx-pull-"

ACR_PULL = ("cr:PullRepository",)
ECR_PULL = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability")


@dataclass(frozen=True)
class PullGrant:
    """What one host may pull: the cloud's registry in a region, one repository of it."""

    cloud: str                   # "aliyun" | "aws"
    region: str
    repository: str              # ACR: NAMESPACE/REPO; ECR: the repository name (may hold slashes)
    registry_instance: str = ""  # ACR Enterprise Edition instance id ("" for the personal edition)

    @property
    def role_name(self) -> str:
        """`ngcx-pull-<12 hex>`: the same repository always names the same role (RAM and IAM allow 64)."""
        what = "/".join((self.cloud, self.region, self.registry_instance, self.repository))
        return ROLE_PREFIX + hashlib.sha256(what.encode()).hexdigest()[:12]

    @property
    def description(self) -> str:
        return f"ngcx deploy hosts: pull {self.repository} only"


@dataclass(frozen=True)
class RoleLogin:
    """The host job's login through its role: which registry API to ask; no credential at all."""

    cloud: str
    region: str
    api: str                     # URL of the registry's token API as the host reaches it
    registry_instance: str = ""


def repository_of(pull_ref: str) -> str:
    """'registry.example.com/ns/app@sha256:…' -> 'ns/app' (the registry host, tag and digest dropped)."""
    path = pull_ref.split("/", 1)[1].split("@", 1)[0] if "/" in pull_ref else pull_ref.split("@", 1)[0]
    head, _, last = path.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


def aliyun_trust() -> str:
    return json.dumps({"Version": "1", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                      "Principal": {"Service": ["ecs.aliyuncs.com"]}}]})


@dataclass(frozen=True)
class PullRole:
    """What one role may pull: a deploy's single repository, or every repository a bake pre-pulls."""

    grants: tuple[PullGrant, ...]

    @property
    def role_name(self) -> str:
        """A single grant keeps its own name (roles made before bakes had roles are found again)."""
        if len(self.grants) == 1:
            return self.grants[0].role_name
        what = "\n".join(sorted(g.role_name for g in self.grants))
        return ROLE_PREFIX + hashlib.sha256(what.encode()).hexdigest()[:12]

    @property
    def repositories(self) -> str:
        return ", ".join(sorted({g.repository for g in self.grants}))

    @property
    def description(self) -> str:
        if len(self.grants) == 1:
            return self.grants[0].description
        return f"ngcx host bakes: pull {len(self.grants)} repositories only"


def pull_role(what: PullGrant | PullRole) -> PullRole:
    return what if isinstance(what, PullRole) else PullRole((what,))


def _one_or_list(values: list[str], as_list: bool) -> str | list[str]:
    """The resources of one statement; a single AWS resource stays a string (the document IAM keeps today)."""
    unique = sorted(set(values))
    return unique if as_list or len(unique) > 1 else unique[0]


def aliyun_policy(what: PullGrant | PullRole) -> str:
    """RAM policy: a token for each ACR instance, pulls from the granted repositories only (cloud-apis.md §8)."""
    instances, repositories = [], []
    for grant in pull_role(what).grants:
        if grant.registry_instance:
            instances.append(f"acs:cr:{grant.region}:*:instance/{grant.registry_instance}")
            repositories.append(f"acs:cr:{grant.region}:*:repository/{grant.registry_instance}/{grant.repository}")
        else:
            instances.append("*")
            repositories.append(f"acs:cr:{grant.region}:*:repository/{grant.repository}")
    instances = ["*"] if "*" in instances else instances
    return json.dumps({"Version": "1", "Statement": [
        {"Effect": "Allow", "Action": ["cr:GetAuthorizationToken"], "Resource": _one_or_list(instances, True)},
        {"Effect": "Allow", "Action": list(ACR_PULL), "Resource": _one_or_list(repositories, True)}]},
        sort_keys=True)


def aws_trust() -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                                "Principal": {"Service": "ec2.amazonaws.com"}}]})


def aws_policy(what: PullGrant | PullRole, partition: str, account: str) -> str:
    """IAM inline policy: ECR's token (which IAM allows only on "*") and pulls from the granted repositories."""
    repositories = [f"arn:{partition}:ecr:{g.region}:{account}:repository/{g.repository}"
                    for g in pull_role(what).grants]
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
        {"Effect": "Allow", "Action": list(ECR_PULL), "Resource": _one_or_list(repositories, False)}]},
        sort_keys=True)


def same_document(a: str | dict[str, Any], b: str) -> bool:
    """Policy documents compared as data (the clouds hand them back re-serialized, IAM URL-encoded)."""
    from urllib.parse import unquote

    try:
        left = a if isinstance(a, dict) else json.loads(unquote(a) if a.startswith("%7B") else a)
        return bool(left == json.loads(b))
    except ValueError:
        return False
