"""EC2 hosts' pull roles: one IAM role + instance profile per ECR repository (roles.py says why).

Apart from ec2.py because IAM is its own API with its own consistency rules: a new instance profile
is refused by RunInstances / AssociateIamInstanceProfile for seconds (ec2.py retries those), and
every create answers EntityAlreadyExists when an earlier, interrupted run made it, which is done.
The role also carries AmazonSSMManagedInstanceCore: an instance has one profile, and SSM Run
Command (the command channel, ec2.py) reaches a host only through it.
"""

from __future__ import annotations

import os
from typing import Any

from .. import roles, vm

SSM_POLICY = "AmazonSSMManagedInstanceCore"
INLINE_POLICY = "ngcx-pull"
DONE_CODES = ("EntityAlreadyExists", "LimitExceeded")   # LimitExceeded: the profile holds its role already
LIVE_ASSOCIATIONS = ["associating", "associated"]


def own_profile() -> str | None:
    """The user's own instance profile (NGCX_AWS_INSTANCE_PROFILE): ngcx then makes none and changes none."""
    return os.environ.get("NGCX_AWS_INSTANCE_PROFILE") or None


def profile_name(grant: roles.PullGrant | roles.PullRole) -> str:
    """The profile a host pulling `grant` gets, without a call: the user's own, else the pull role's name."""
    return own_profile() or roles.pull_role(grant).role_name


def ensure_pull_profile(api: Any, grant: roles.PullGrant | roles.PullRole) -> str:
    """The instance profile whose role may pull `grant`'s repositories (and be reached by SSM).

    With the user's own profile (own_profile) its role must allow the pull: nothing is made.
    """
    own = own_profile()
    if own:
        return own
    role = roles.pull_role(grant)
    name = role.role_name
    document = roles.aws_policy(role, api.partition(), _account(api))
    if _current(api, name, document):
        return name
    vm.say(f"creating the IAM role and instance profile {name}: hosts pull {role.repositories} with it "
           "(and SSM reaches them), no registry secret sent")
    ssm = f"arn:{api.partition()}:iam::aws:policy/{SSM_POLICY}"
    steps = [("create_role", {"RoleName": name, "AssumeRolePolicyDocument": roles.aws_trust(),
                              "Description": role.description}),
             ("put_role_policy", {"RoleName": name, "PolicyName": INLINE_POLICY, "PolicyDocument": document}),
             ("attach_role_policy", {"RoleName": name, "PolicyArn": ssm}),
             ("create_instance_profile", {"InstanceProfileName": name}),
             ("add_role_to_instance_profile", {"InstanceProfileName": name, "RoleName": name})]
    for operation, params in steps:
        _ignoring_done(api, operation, params)
    return name


def attach_profile(api: Any, instance_id: str, profile: str) -> None:
    """A reused host gets this repository's profile: replaced when it has another, associated when none."""
    found = api.call("ec2", "describe_iam_instance_profile_associations", Filters=[
        {"Name": "instance-id", "Values": [instance_id]}, {"Name": "state", "Values": LIVE_ASSOCIATIONS}])
    current = found.get("IamInstanceProfileAssociations") or []
    if any(a.get("IamInstanceProfile", {}).get("Arn", "").endswith("/" + profile) for a in current):
        return
    if current:
        api.call("ec2", "replace_iam_instance_profile_association", idempotent=False,
                 IamInstanceProfile={"Name": profile}, AssociationId=current[0]["AssociationId"])
    else:
        api.call("ec2", "associate_iam_instance_profile", idempotent=False,
                 IamInstanceProfile={"Name": profile}, InstanceId=instance_id)


def _current(api: Any, name: str, document: str) -> bool:
    """The profile exists with its role, and the role's pull policy is this one (one read each)."""
    from ...clouds.aws import AwsError

    try:
        profile = api.call("iam", "get_instance_profile", InstanceProfileName=name)["InstanceProfile"]
        if not any(r.get("RoleName") == name for r in profile.get("Roles") or []):
            return False
        policy = api.call("iam", "get_role_policy", RoleName=name, PolicyName=INLINE_POLICY)
    except AwsError as exc:
        if exc.code == "NoSuchEntity":
            return False
        raise
    return roles.same_document(policy.get("PolicyDocument") or "", document)


def _account(api: Any) -> str:
    return str(api.call("sts", "get_caller_identity")["Account"])


def _ignoring_done(api: Any, operation: str, params: dict[str, Any]) -> None:
    from ...clouds.aws import AwsError

    try:
        api.call("iam", operation, **params)
    except AwsError as exc:
        if exc.code not in DONE_CODES:
            raise
