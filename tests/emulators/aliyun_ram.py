"""RAM roles and policies and the STS credentials of those roles, for the ECS emulator.

Why: a host gets no registry secret. It asks the metadata service (100.100.100.200 on ECS) for the
temporary credentials of the RAM role attached to its instance and signs cr GetAuthorizationToken
with them itself. Testing that needs all the pieces a real account has, with their real names,
shapes and error codes: RAM (2015-05-01) to create the role and its policy idempotently, ECS to
attach the role (RunInstances RamRoleName, AttachInstanceRamRole), STS keys that the API gateway
accepts only with their SecurityToken, and a metadata service that answers only the instance itself.
EcsEmulator (aliyun_ecs.py) owns the instances and wires these in. This module is RAM (roles,
policies, attachments) and the STS keys of its roles: STS stays with RAM because a key is a role's and
its only check is that role's policies. Apart from it: the policy documents (aliyun_ram_policies.py),
ECS's Attach/Detach/DescribeInstanceRamRole (aliyun_instance_roles.py) and the metadata service that
hands the keys to the machines (aliyun_metadata.py).

Where the real API leaves a choice open or is undocumented, the emulator takes the stricter reading
and says so here (and, for their parts, aliyun_instance_roles.py and aliyun_metadata.py):
- DeletePolicy of a policy still attached to a role answers DeleteConflict.Role.Policy (the code the
  Terraform provider retries on for DeletePolicy); DeleteRole of a role attached to an instance is
  allowed (the instance keeps a dangling name, its metadata then has no credentials).
- Only cr GetAuthorizationToken evaluates a role's policies; other actions called with STS keys are
  not checked (the product calls nothing else with them).
- System policies: AdministratorAccess and AliyunContainerRegistryReadOnlyAccess only; the second's
  document is an approximation (Get*/List*/Pull* on cr).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .aliyun_ram_policies import as_list, parse_document, statement_matches, trusts_ecs, wildcard
from .aliyun_rpc import Action, ApiError, as_bool, as_int, iso_now, required

RAM_VERSION = "2015-05-01"
ACCOUNT_UID = "5012345678901234"         # the emulated account (fake, 16 digits as real UIDs)
STS_LIFETIME_S = 3600                     # instance role credentials live one hour
STS_REFRESH_S = 15 * 60                   # ... and are replaced once within 15 minutes of expiry
MAX_POLICY_VERSIONS = 5
ROTATE_STRATEGIES = ("None", "DeleteOldestNonDefaultVersionWhenLimitExceeded")
ROLE_NAME = re.compile(r"[A-Za-z0-9.@-]+")
POLICY_NAME = re.compile(r"[A-Za-z0-9-]+")
SYSTEM_POLICIES = {
    "AdministratorAccess": ("Full access to all Alibaba Cloud resources.",
                            {"Version": "1", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
    "AliyunContainerRegistryReadOnlyAccess": (
        "Read-only access to Container Registry.",
        {"Version": "1", "Statement": [{"Effect": "Allow", "Action": ["cr:Get*", "cr:List*", "cr:Pull*"],
                                        "Resource": "*"}]}),
}
# The actions of RAM 2015-05-01 the emulator serves (all regionless: RAM is a global service).
RAM_ACTIONS = frozenset({"CreateRole", "GetRole", "DeleteRole", "ListRoles", "CreatePolicy", "GetPolicy",
                         "CreatePolicyVersion", "DeletePolicy", "AttachPolicyToRole", "DetachPolicyFromRole",
                         "ListPoliciesForRole"})


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def iso_at(epoch: float) -> str:
    """STS and metadata times: UTC `YYYY-MM-DDTHH:MM:SSZ`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def role_arn(name: str) -> str:
    """`acs:ram::<uid>:role/<name>`: RAM prints role ARNs with the name in lower case."""
    return f"acs:ram::{ACCOUNT_UID}:role/{name.lower()}"


# --- state -------------------------------------------------------------------------------------

@dataclass
class Role:
    name: str
    description: str
    trust_text: str
    trust: dict[str, Any]
    max_session: int
    role_id: str = field(default_factory=lambda: _random(string.digits, 19))
    created: str = field(default_factory=iso_now)
    updated: str = field(default_factory=iso_now)

    def view(self) -> dict[str, Any]:
        return {"RoleId": self.role_id, "RoleName": self.name, "Arn": role_arn(self.name),
                "Description": self.description, "AssumeRolePolicyDocument": self.trust_text,
                "MaxSessionDuration": self.max_session, "CreateDate": self.created, "UpdateDate": self.updated}


@dataclass
class PolicyVersion:
    version_id: str
    text: str
    document: dict[str, Any]
    default: bool
    created: str = field(default_factory=iso_now)

    def view(self) -> dict[str, Any]:
        return {"VersionId": self.version_id, "IsDefaultVersion": self.default, "PolicyDocument": self.text,
                "CreateDate": self.created}


@dataclass
class Policy:
    name: str
    kind: str                    # "Custom" or "System"
    description: str
    versions: list[PolicyVersion]
    next_version: int = 2
    created: str = field(default_factory=iso_now)
    updated: str = field(default_factory=iso_now)

    @property
    def default(self) -> PolicyVersion:
        return next(v for v in self.versions if v.default)

    def view(self, attachments: int) -> dict[str, Any]:
        return {"PolicyName": self.name, "PolicyType": self.kind, "Description": self.description,
                "DefaultVersion": self.default.version_id, "CreateDate": self.created, "UpdateDate": self.updated,
                "AttachmentCount": attachments}


@dataclass
class StsCredential:
    access_key_id: str
    secret: str
    token: str
    role: str                    # the role's name as created
    instance_id: str
    issued: float                # epoch seconds, Ram.clock's
    expires: float

    def metadata(self) -> dict[str, str]:
        """The body of /latest/meta-data/ram/security-credentials/<role>."""
        return {"AccessKeyId": self.access_key_id, "AccessKeySecret": self.secret, "SecurityToken": self.token,
                "Expiration": iso_at(self.expires), "LastUpdated": iso_at(self.issued), "Code": "Success"}


@dataclass(frozen=True)
class Grant:
    """Who a registry token was issued to and what it may pull (EcsEmulator.token_grants)."""

    caller: str                  # "role:<name>" or "ak:<AccessKeyId>"
    instance: str | None         # the instance whose role credentials asked, None for a permanent key
    pull: list[str]              # Resources of Allow statements for cr:PullRepository (["*"] for a permanent key)
    expires: float               # epoch seconds


def _system_policies() -> dict[str, Policy]:
    return {name: Policy(name, "System", description,
                         [PolicyVersion("v1", json.dumps(document), document, True)])
            for name, (description, document) in SYSTEM_POLICIES.items()}


class Ram:
    """RAM (2015-05-01) state and actions, and the STS credentials of instance roles.

    `lock` is the emulator's own (actions already run under it); the STS lookups and the metadata
    service, which run on other threads, take it themselves. `clock` is the STS clock only (tests move
    it to see credentials refreshed or expired; request timestamps keep checking real time).
    """

    def __init__(self, lock: threading.RLock, clock: Callable[[], float] = time.time) -> None:
        self.lock = lock
        self.clock = clock
        self._roles: dict[str, Role] = {}                          # lower-case name -> role
        self._custom: dict[str, Policy] = {}
        self._system = _system_policies()
        self._attached: dict[str, dict[tuple[str, str], str]] = {}   # role key -> {(type, policy): AttachDate}
        self._sts: dict[str, StsCredential] = {}                     # AccessKeyId -> credential
        self._by_instance: dict[tuple[str, str], StsCredential] = {}  # (instance, role key) -> latest
        self.actions: dict[str, Action] = {
            "CreateRole": self._create_role, "GetRole": self._get_role, "DeleteRole": self._delete_role,
            "ListRoles": self._list_roles, "CreatePolicy": self._create_policy, "GetPolicy": self._get_policy,
            "CreatePolicyVersion": self._create_policy_version, "DeletePolicy": self._delete_policy,
            "AttachPolicyToRole": self._attach_policy, "DetachPolicyFromRole": self._detach_policy,
            "ListPoliciesForRole": self._list_policies_for_role,
        }

    # --- lookups ---

    def role(self, name: str) -> Role:
        found = self._roles.get(name.lower())
        if found is None:
            raise ApiError(404, "EntityNotExist.Role", "The role does not exist.")
        return found

    def _policy(self, name: str, kind: str) -> Policy:
        found = (self._custom if kind == "Custom" else self._system).get(name)
        if found is None:
            raise ApiError(404, "EntityNotExist.Policy", "The policy does not exist.")
        return found

    def _attachments(self, policy: Policy) -> int:
        return sum((policy.kind, policy.name) in attached for attached in self._attached.values())

    def role_policies(self, name: str) -> list[Policy]:
        """The policies attached to a role (by its name, any case), in attachment order."""
        return [self._policy(policy, kind) for kind, policy in self._attached.get(name.lower(), {})]

    def check_ecs_role(self, name: str) -> Role:
        """The role ECS may attach to instances, else the error RunInstances/AttachInstanceRamRole answer."""
        found = self._roles.get(name.lower())
        if found is None:
            raise ApiError(404, "InvalidRamRole.NotFound", "The specified RAMRoleName does not exist.")
        if not trusts_ecs(found.trust):
            raise ApiError(404, "InvalidRamRole.NotEcsRole",
                           "The specified ram role is not authorized for ecs, please check your role policy.")
        return found

    # --- roles ---

    @staticmethod
    def _role_name(params: Mapping[str, str], key: str = "RoleName") -> str:
        name = required(params, key)
        if len(name) > 64:
            raise ApiError(400, "InvalidParameter.RoleName.Length",
                           'The parameter - "RoleName" beyond the length limit.')
        if not ROLE_NAME.fullmatch(name):
            raise ApiError(400, "InvalidParameter.RoleName.InvalidChars",
                           'The parameter - "RoleName" contains invalid chars.')
        return name

    def _create_role(self, params: dict[str, str]) -> dict[str, Any]:
        name = self._role_name(params)
        text = required(params, "AssumeRolePolicyDocument")
        trust = parse_document(text, "AssumeRolePolicyDocument", trust=True)
        description = params.get("Description", "")
        if len(description) > 1024:
            raise ApiError(400, "InvalidParameter.Description.Length",
                           'The parameter - "Description" beyond the length limit.')
        try:
            session = as_int(params, "MaxSessionDuration", 3600, 3600, 43200)
        except ApiError:
            raise ApiError(400, "InvalidParameter.MaxSessionDuration",
                           'The parameter - "MaxSessionDuration" must be 3600 to 43200.') from None
        if name.lower() in self._roles:
            raise ApiError(409, "EntityAlreadyExists.Role", "The role does already EXIST.")
        role = self._roles[name.lower()] = Role(name, description, text, trust, session)
        return {"Role": role.view()}

    def _get_role(self, params: dict[str, str]) -> dict[str, Any]:
        return {"Role": self.role(self._role_name(params)).view()}

    def _delete_role(self, params: dict[str, str]) -> dict[str, Any]:
        role = self.role(self._role_name(params))
        if self._attached.get(role.name.lower()):
            raise ApiError(409, "DeleteConflict.Role.Policy",
                           "The role CAN NOT has any attached policy while deleting the role.")
        del self._roles[role.name.lower()]
        return {}

    def _list_roles(self, params: dict[str, str]) -> dict[str, Any]:
        roles = [r.view() for r in self._roles.values()]
        for view in roles:
            view.pop("AssumeRolePolicyDocument")
        return {"IsTruncated": False, "Roles": {"Role": roles}}

    # --- policies ---

    @staticmethod
    def _policy_name(params: Mapping[str, str]) -> str:
        name = required(params, "PolicyName")
        if len(name) > 128:
            raise ApiError(400, "InvalidParameter.PolicyName.Length",
                           'The parameter - "PolicyName" beyond the length limit.')
        if not POLICY_NAME.fullmatch(name):
            raise ApiError(400, "InvalidParameter.PolicyName.InvalidChars",
                           'The parameter - "PolicyName" contains invalid chars.')
        return name

    @staticmethod
    def _policy_type(params: Mapping[str, str]) -> str:
        kind = required(params, "PolicyType")
        if kind not in ("Custom", "System"):
            raise ApiError(400, "InvalidParameter.PolicyType", 'The parameter - "PolicyType" is incorrect.')
        return kind

    def _create_policy(self, params: dict[str, str]) -> dict[str, Any]:
        name = self._policy_name(params)
        text = required(params, "PolicyDocument")
        document = parse_document(text, "PolicyDocument")
        if name in self._custom or name in self._system:
            raise ApiError(409, "EntityAlreadyExists.Policy", "The policy does already EXIST.")
        policy = self._custom[name] = Policy(name, "Custom", params.get("Description", ""),
                                             [PolicyVersion("v1", text, document, True)])
        view = policy.view(0)
        view.pop("UpdateDate")
        view.pop("AttachmentCount")
        return {"Policy": view}

    def _get_policy(self, params: dict[str, str]) -> dict[str, Any]:
        policy = self._policy(self._policy_name(params), self._policy_type(params))
        return {"Policy": policy.view(self._attachments(policy)), "DefaultPolicyVersion": policy.default.view()}

    def _create_policy_version(self, params: dict[str, str]) -> dict[str, Any]:
        policy = self._policy(self._policy_name(params), "Custom")
        text = required(params, "PolicyDocument")
        document = parse_document(text, "PolicyDocument")
        make_default = as_bool(params, "SetAsDefault")
        rotate = params.get("RotateStrategy") or "None"
        if rotate not in ROTATE_STRATEGIES:
            raise ApiError(400, "InvalidParameter.RotateStrategy", 'The parameter - "RotateStrategy" is incorrect.')
        if len(policy.versions) >= MAX_POLICY_VERSIONS:
            if rotate == "None":
                raise ApiError(409, "LimitExceeded.Policy.Version",
                               "The count of policy version beyond the current limits.")
            policy.versions.remove(next(v for v in policy.versions if not v.default))
        version = PolicyVersion(f"v{policy.next_version}", text, document, make_default)
        policy.next_version += 1
        if make_default:
            for old in policy.versions:
                old.default = False
        policy.versions.append(version)
        policy.updated = version.created
        return {"PolicyVersion": version.view()}

    def _delete_policy(self, params: dict[str, str]) -> dict[str, Any]:
        policy = self._policy(self._policy_name(params), "Custom")
        if self._attachments(policy):
            raise ApiError(409, "DeleteConflict.Role.Policy", "The policy CAN NOT be attached to any role while "
                                                              "deleting the policy.")
        if len(policy.versions) > 1:
            raise ApiError(409, "DeleteConflict.Policy.Version",
                           "The policy CAN NOT has any version except the default version.")
        del self._custom[policy.name]
        return {}

    # --- attachments ---

    def _attachment(self, params: dict[str, str]) -> tuple[Role, Policy]:
        kind, name = self._policy_type(params), self._policy_name(params)
        role = self.role(self._role_name(params))
        return role, self._policy(name, kind)

    def _attach_policy(self, params: dict[str, str]) -> dict[str, Any]:
        role, policy = self._attachment(params)
        attached = self._attached.setdefault(role.name.lower(), {})
        if (policy.kind, policy.name) in attached:
            raise ApiError(409, "EntityAlreadyExists.Role.Policy", "The role has already been attached this policy.")
        attached[(policy.kind, policy.name)] = iso_now()
        return {}

    def _detach_policy(self, params: dict[str, str]) -> dict[str, Any]:
        role, policy = self._attachment(params)
        attached = self._attached.get(role.name.lower(), {})
        if attached.pop((policy.kind, policy.name), None) is None:
            raise ApiError(404, "EntityNotExist.Role.Policy", "The policy is not attached to the role.")
        return {}

    def _list_policies_for_role(self, params: dict[str, str]) -> dict[str, Any]:
        role = self.role(self._role_name(params))
        views = []
        for (kind, name), attached in self._attached.get(role.name.lower(), {}).items():
            policy = self._policy(name, kind)
            views.append({"PolicyName": name, "PolicyType": kind, "Description": policy.description,
                          "DefaultVersion": policy.default.version_id, "AttachDate": attached})
        return {"Policies": {"Policy": views}}

    # --- evaluation ---

    def _statements(self, role: str) -> list[Mapping[str, Any]]:
        return [s for policy in self.role_policies(role) for s in policy.default.document["Statement"]]

    def allows(self, role: str, action: str, resource: str) -> bool:
        """RAM's decision for the role's current policies: an explicit Deny wins, else any Allow."""
        matching = [s for s in self._statements(role) if statement_matches(s, action, resource)]
        return any(s["Effect"] == "Allow" for s in matching) and not any(s["Effect"] == "Deny" for s in matching)

    def allowed_resources(self, role: str, action: str) -> list[str]:
        """The Resource patterns of the role's Allow statements for `action` (the scope a token carries)."""
        return sorted({r for s in self._statements(role) if s["Effect"] == "Allow"
                       and any(wildcard(a, action, ignore_case=True) for a in as_list(s["Action"]))
                       for r in as_list(s["Resource"])})

    # --- STS ---

    def _issue(self, role: Role, instance_id: str) -> StsCredential:
        now = self.clock()
        credential = StsCredential("STS." + _random(string.ascii_letters + string.digits, 25),
                                   _random(string.ascii_letters + string.digits, 44),
                                   "CAIS" + secrets.token_urlsafe(120), role.name, instance_id, now,
                                   now + STS_LIFETIME_S)
        self._sts[credential.access_key_id] = credential
        self._by_instance[(instance_id, role.name.lower())] = credential
        return credential

    def instance_credentials(self, instance_id: str, role_name: str) -> StsCredential | None:
        """The credentials the metadata service hands the instance for its role: the same ones until
        they are within STS_REFRESH_S of expiry, then fresh ones (None: the role no longer exists)."""
        with self.lock:
            role = self._roles.get(role_name.lower())
            if role is None:
                return None
            current = self._by_instance.get((instance_id, role.name.lower()))
            if current is None or self.clock() >= current.expires - STS_REFRESH_S:
                current = self._issue(role, instance_id)
            return current

    def temporary_secret(self, access_key_id: str, token: str) -> str | None:
        """rpc.TemporaryKeys: the secret of an issued STS key presented with its own, unexpired token."""
        with self.lock:
            credential = self._sts.get(access_key_id)
            if credential is None:
                return None
            if not token:
                raise ApiError(400, "MissingSecurityToken")
            if not secrets.compare_digest(token, credential.token):
                mismatch = any(secrets.compare_digest(token, c.token) for c in self._sts.values())
                raise ApiError(400, "InvalidSecurityToken.MismatchWithAccessKey" if mismatch
                               else "InvalidSecurityToken.Malformed")
            if self.clock() >= credential.expires:
                raise ApiError(400, "InvalidSecurityToken.Expired")
            return credential.secret

    def registry_grant(self, access_key_id: str, resource: str) -> Grant:
        """cr GetAuthorizationToken's authorization: a permanent key (the account) may, STS keys only if
        their role allows cr:GetAuthorizationToken on `resource` (else 403 Forbidden.RAM). An STS
        caller's token lives as long as its credentials, as ACR documents."""
        credential = self._sts.get(access_key_id)
        if credential is None:
            return Grant(f"ak:{access_key_id}", None, ["*"], time.time() + 3600)
        if not self.allows(credential.role, "cr:GetAuthorizationToken", resource):
            raise ApiError(403, "Forbidden.RAM")
        return Grant(f"role:{credential.role}", credential.instance_id,
                     self.allowed_resources(credential.role, "cr:PullRepository"), credential.expires)

    # --- inspection (tests) ---

    def expire_credentials(self) -> None:
        """Every issued STS credential expires now (a test of InvalidSecurityToken.Expired and refresh)."""
        with self.lock:
            for credential in self._sts.values():
                credential.expires = min(credential.expires, self.clock())

    def issued_secrets(self) -> list[str]:
        """Every STS AccessKeySecret and SecurityToken handed out, for tests that search logs for leaks."""
        with self.lock:
            return [s for c in self._sts.values() for s in (c.secret, c.token)]

    def roles(self) -> dict[str, list[str]]:
        """Role name -> the names of the policies attached to it."""
        with self.lock:
            return {r.name: [name for _, name in self._attached.get(key, {})] for key, r in self._roles.items()}
