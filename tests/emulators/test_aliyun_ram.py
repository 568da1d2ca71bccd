"""Instance RAM roles end to end, through the real aliyun-python-sdk-core/-ecs: RAM roles and policies
(2015-05-01 on the emulator's port), the role on an instance (RunInstances RamRoleName,
Attach/Describe/DetachInstanceRamRole), the metadata service handing that instance its role's STS
credentials, and those credentials getting a registry token from cr GetAuthorizationToken only when
the role's policies allow it.

The machines are PaperHosts (hosts_api.py) whose first private IP the test chooses, so that one of
them is "127.0.0.1" and this process can call the metadata service as that instance.
"""

from __future__ import annotations

import calendar
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.auth.credentials import StsTokenCredential
from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import CommonRequest
from aliyunsdkecs.request.v20140526 import (
    AttachInstanceRamRoleRequest,
    DescribeInstanceRamRoleRequest,
    DetachInstanceRamRoleRequest,
    RunInstancesRequest,
)

from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_instance_roles import ROLE_ATTACHED
from emulators.aliyun_ram import ACCOUNT_UID
from emulators.hosts_api import PaperHosts

AK, SECRET = "test-ak", "test-secret"
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
A10 = "ecs.gn7i-c8g1.2xlarge"
ROLE = "ngcx-Pull"
ACR = "cri-emulated"
ECS_TRUST = json.dumps({"Version": "1", "Statement": [
    {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": ["ecs.aliyuncs.com"]}}]})
ACCOUNT_TRUST = json.dumps({"Version": "1", "Statement": [
    {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"RAM": [f"acs:ram::{ACCOUNT_UID}:root"]}}]})
REPO = f"acs:cr:cn-hangzhou:{ACCOUNT_UID}:repository/{ACR}/ngcx/*"
PULL_POLICY = json.dumps({"Version": "1", "Statement": [
    {"Effect": "Allow", "Action": ["cr:GetAuthorizationToken"], "Resource": f"acs:cr:*:*:instance/{ACR}"},
    {"Effect": "Allow", "Action": ["cr:PullRepository", "cr:Get*"], "Resource": [REPO, "acs:cr:*:*:instance/x"]}]})


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends even 127.0.0.1 through HTTP(S)_PROXY (it ignores NO_PROXY)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def emu() -> Iterator[EcsEmulator]:
    hosts = PaperHosts()
    hosts.addresses.append("127.0.0.1")     # the first machine is this process, so the test can be it
    with EcsEmulator(hosts, boot_seconds=0.05, start_seconds=0.05, stop_seconds=0.05) as emulator:
        yield emulator


@pytest.fixture
def client(emu: EcsEmulator) -> AcsClient:
    return AcsClient(AK, SECRET, "cn-hangzhou", port=emu.port)


def sts_client(emu: EcsEmulator, creds: dict[str, str], token: str | None = None) -> AcsClient:
    """The SDK as a host uses it: StsTokenCredential, so every request carries SecurityToken."""
    credential = StsTokenCredential(creds["AccessKeyId"], creds["AccessKeySecret"],
                                    creds["SecurityToken"] if token is None else token)
    return AcsClient(region_id="cn-hangzhou", port=emu.port, credential=credential, auto_retry=False)


def api(client: AcsClient, version: str, product: str, action: str, **params: Any) -> dict[str, Any]:
    """A CommonRequest as the product sends it (domain: the emulator instead of {product}.aliyuncs.com)."""
    request = CommonRequest(domain="127.0.0.1", version=version, action_name=action, product=product)
    request.set_method("POST")
    for key, value in params.items():
        request.add_query_param(key, value)
    return json.loads(client.do_action_with_exception(request))


def ram(client: AcsClient, action: str, **params: Any) -> dict[str, Any]:
    return api(client, "2015-05-01", "Ram", action, **params)


def registry_token(client: AcsClient, instance: str = ACR) -> dict[str, Any]:
    return api(client, "2018-12-01", "cr", "GetAuthorizationToken", InstanceId=instance)


def typed(client: AcsClient, request: Any, **fields: Any) -> dict[str, Any]:
    request.set_endpoint("127.0.0.1")
    for name, value in fields.items():
        getattr(request, f"set_{name}")(value)
    return json.loads(client.do_action_with_exception(request))


def refused(call: Any, *args: Any, **kwargs: Any) -> ServerException:
    with pytest.raises(ServerException) as info:
        call(*args, **kwargs)
    return info.value


def launch(client: AcsClient, **fields: Any) -> str:
    request = RunInstancesRequest.RunInstancesRequest()
    return typed(client, request, ImageId=IMAGE, InstanceType=A10, ZoneId="cn-hangzhou-i",
                 **fields)["InstanceIdSets"]["InstanceIdSet"][0]


def wait_running(emu: EcsEmulator, instance_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:
        found = next(i for i in emu.instances() if i["id"] == instance_id)
        if found["status"] == "Running":
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.02)


def metadata(emu: EcsEmulator, path: str, method: str = "GET", headers: dict[str, str] | None = None,
             source: str = "127.0.0.1") -> tuple[int, str]:
    """One request to the metadata service from `source` (the caller's instance is found by it)."""
    host, port = emu.metadata_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(source, 0))
    try:
        connection.request(method, path, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def epoch(utc: str) -> float:
    return calendar.timegm(time.strptime(utc, "%Y-%m-%dT%H:%M:%SZ"))


def role_credentials(emu: EcsEmulator, role: str = ROLE) -> dict[str, str]:
    status, body = metadata(emu, f"/latest/meta-data/ram/security-credentials/{role}")
    assert status == 200, body
    return json.loads(body)


def pull_role(client: AcsClient, policy: str | None = PULL_POLICY) -> None:
    """The role a deploy makes: trusted by ECS, with the pull policy attached."""
    ram(client, "CreateRole", RoleName=ROLE, AssumeRolePolicyDocument=ECS_TRUST, Description="ngcx pulls")
    if policy is not None:
        ram(client, "CreatePolicy", PolicyName="ngcx-pull", PolicyDocument=policy)
        ram(client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="ngcx-pull", RoleName=ROLE)


# --- RAM -----------------------------------------------------------------------------------------

def test_roles_create_get_conflict_and_errors(emu: EcsEmulator, client: AcsClient) -> None:
    created = ram(client, "CreateRole", RoleName=ROLE, AssumeRolePolicyDocument=ECS_TRUST, Description="pulls",
                  MaxSessionDuration=7200)["Role"]
    assert created["Arn"] == f"acs:ram::{ACCOUNT_UID}:role/ngcx-pull" and created["RoleName"] == ROLE
    assert created["RoleId"].isdigit() and created["AssumeRolePolicyDocument"] == ECS_TRUST
    got = ram(client, "GetRole", RoleName=ROLE, RegionId="eu-central-1")["Role"]   # RAM is global
    assert got["RoleId"] == created["RoleId"] and got["MaxSessionDuration"] == 7200
    again = refused(ram, client, "CreateRole", RoleName=ROLE.upper(), AssumeRolePolicyDocument=ECS_TRUST)
    assert (again.get_http_status(), again.get_error_code()) == (409, "EntityAlreadyExists.Role")
    assert refused(ram, client, "GetRole", RoleName="nobody").get_error_code() == "EntityNotExist.Role"
    assert refused(ram, client, "CreateRole", RoleName="bad name",
                   AssumeRolePolicyDocument=ECS_TRUST).get_error_code() == "InvalidParameter.RoleName.InvalidChars"
    for document in ("{not json", '{"Version": "2", "Statement": []}', '{"Version": "1", "Statement": [{}]}'):
        error = refused(ram, client, "CreateRole", RoleName="other", AssumeRolePolicyDocument=document)
        assert (error.get_http_status(), error.get_error_code()) == (400, "MalformedPolicyDocument")
    assert [r["RoleName"] for r in ram(client, "ListRoles")["Roles"]["Role"]] == [ROLE]


def test_policies_versions_attachments_and_delete_conflicts(emu: EcsEmulator, client: AcsClient) -> None:
    pull_role(client, policy=None)
    policy = ram(client, "CreatePolicy", PolicyName="ngcx-pull", PolicyDocument=PULL_POLICY)["Policy"]
    assert (policy["PolicyType"], policy["DefaultVersion"]) == ("Custom", "v1")
    assert refused(ram, client, "CreatePolicy", PolicyName="ngcx-pull",
                   PolicyDocument=PULL_POLICY).get_error_code() == "EntityAlreadyExists.Policy"
    bad = '{"Version": "1", "Statement": [{"Effect": "Allow", "Action": "cr:*"}]}'     # no Resource
    assert refused(ram, client, "CreatePolicy", PolicyName="x",
                   PolicyDocument=bad).get_error_code() == "MalformedPolicyDocument"
    newer = PULL_POLICY.replace("ngcx/*", "ngcx/model")
    assert ram(client, "CreatePolicyVersion", PolicyName="ngcx-pull", PolicyDocument=newer,
               SetAsDefault="true")["PolicyVersion"]["VersionId"] == "v2"
    got = ram(client, "GetPolicy", PolicyName="ngcx-pull", PolicyType="Custom")
    assert got["DefaultPolicyVersion"]["PolicyDocument"] == newer and got["Policy"]["DefaultVersion"] == "v2"
    for _ in range(3):
        ram(client, "CreatePolicyVersion", PolicyName="ngcx-pull", PolicyDocument=newer)
    full = refused(ram, client, "CreatePolicyVersion", PolicyName="ngcx-pull", PolicyDocument=newer)
    assert (full.get_http_status(), full.get_error_code()) == (409, "LimitExceeded.Policy.Version")
    assert ram(client, "CreatePolicyVersion", PolicyName="ngcx-pull", PolicyDocument=PULL_POLICY, SetAsDefault=True,
               RotateStrategy="DeleteOldestNonDefaultVersionWhenLimitExceeded")["PolicyVersion"]["VersionId"] == "v6"

    ram(client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="ngcx-pull", RoleName=ROLE)
    ram(client, "AttachPolicyToRole", PolicyType="System", PolicyName="AliyunContainerRegistryReadOnlyAccess",
        RoleName=ROLE)
    assert refused(ram, client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="ngcx-pull",
                   RoleName=ROLE).get_error_code() == "EntityAlreadyExists.Role.Policy"
    assert refused(ram, client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="absent",
                   RoleName=ROLE).get_error_code() == "EntityNotExist.Policy"
    listed = ram(client, "ListPoliciesForRole", RoleName=ROLE)["Policies"]["Policy"]
    assert [(p["PolicyName"], p["PolicyType"]) for p in listed] == [
        ("ngcx-pull", "Custom"), ("AliyunContainerRegistryReadOnlyAccess", "System")]
    assert refused(ram, client, "DeleteRole", RoleName=ROLE).get_error_code() == "DeleteConflict.Role.Policy"
    assert refused(ram, client, "DeletePolicy", PolicyName="ngcx-pull").get_error_code() == "DeleteConflict.Role.Policy"
    ram(client, "DetachPolicyFromRole", PolicyType="Custom", PolicyName="ngcx-pull", RoleName=ROLE)
    assert refused(ram, client, "DetachPolicyFromRole", PolicyType="Custom", PolicyName="ngcx-pull",
                   RoleName=ROLE).get_error_code() == "EntityNotExist.Role.Policy"
    ram(client, "DetachPolicyFromRole", PolicyType="System", PolicyName="AliyunContainerRegistryReadOnlyAccess",
        RoleName=ROLE)
    ram(client, "DeleteRole", RoleName=ROLE)
    assert refused(ram, client, "DeletePolicy", PolicyName="ngcx-pull").get_error_code() == (
        "DeleteConflict.Policy.Version")      # v6 and older versions are left
    assert emu.ram.roles() == {}


# --- the role on instances -------------------------------------------------------------------------

def test_run_instances_with_a_role_then_attach_describe_detach(emu: EcsEmulator, client: AcsClient) -> None:
    ram(client, "CreateRole", RoleName="not-for-ecs", AssumeRolePolicyDocument=ACCOUNT_TRUST)
    assert refused(launch, client, RamRoleName="absent").get_error_code() == "InvalidRamRole.NotFound"
    assert refused(launch, client, RamRoleName="not-for-ecs").get_error_code() == "InvalidRamRole.NotEcsRole"
    pull_role(client)
    with_role, without = launch(client, RamRoleName=ROLE), launch(client)
    assert {i["id"]: i["ram_role"] for i in emu.instances()} == {with_role: ROLE, without: ""}

    described = typed(client, DescribeInstanceRamRoleRequest.DescribeInstanceRamRoleRequest(),
                      InstanceIds=json.dumps([with_role, without]))
    assert described["InstanceRamRoleSets"]["InstanceRamRoleSet"] == [{"InstanceId": with_role, "RamRoleName": ROLE}]
    attached = typed(client, AttachInstanceRamRoleRequest.AttachInstanceRamRoleRequest(), RamRoleName=ROLE,
                     InstanceIds=json.dumps([with_role, without]))
    results = {r["InstanceId"]: r for r in attached["AttachInstanceRamRoleResults"]["AttachInstanceRamRoleResult"]}
    assert (attached["TotalCount"], attached["FailCount"], attached["RamRoleName"]) == (2, 1, ROLE)
    assert results[without]["Code"] == "200" and results[without]["Success"] is True
    assert results[with_role]["Code"] == ROLE_ATTACHED and results[with_role]["Success"] is False
    by_role = typed(client, DescribeInstanceRamRoleRequest.DescribeInstanceRamRoleRequest(), RamRoleName=ROLE)
    assert by_role["TotalCount"] == 2 and by_role["RegionId"] == "cn-hangzhou"

    detached = typed(client, DetachInstanceRamRoleRequest.DetachInstanceRamRoleRequest(),
                     InstanceIds=json.dumps([without]))
    result = detached["DetachInstanceRamRoleResults"]["DetachInstanceRamRoleResult"][0]
    assert detached["FailCount"] == 0 and result["InstanceRamRoleSets"]["InstanceRamRoleSet"] == [
        {"InstanceId": without, "RamRoleName": ROLE}]
    assert {i["id"]: i["ram_role"] for i in emu.instances()} == {with_role: ROLE, without: ""}
    malformed = refused(typed, client, AttachInstanceRamRoleRequest.AttachInstanceRamRoleRequest(), RamRoleName=ROLE,
                        InstanceIds="i-not-json")
    assert malformed.get_error_code() == "InvalidInstanceIds.Malformed"
    assert refused(typed, client, AttachInstanceRamRoleRequest.AttachInstanceRamRoleRequest(), RamRoleName=ROLE,
                   InstanceIds='["i-absent"]').get_error_code() == "InvalidInstanceId.NotFound"


# --- the metadata service ----------------------------------------------------------------------------

def test_metadata_answers_the_instance_its_role_credentials(emu: EcsEmulator, client: AcsClient) -> None:
    pull_role(client)
    instance = launch(client, RamRoleName=ROLE)           # the first machine is 127.0.0.1: this process
    assert wait_running(emu, instance)["private_ip"] == "127.0.0.1"
    assert metadata(emu, "/latest/meta-data/instance-id") == (200, instance)
    assert metadata(emu, "/latest/meta-data/region-id") == (200, "cn-hangzhou")
    assert metadata(emu, "/latest/meta-data/ram/security-credentials/") == (200, ROLE)
    creds = role_credentials(emu)
    assert set(creds) == {"AccessKeyId", "AccessKeySecret", "SecurityToken", "Expiration", "LastUpdated", "Code"}
    assert creds["Code"] == "Success" and creds["AccessKeyId"].startswith("STS.")
    assert abs(epoch(creds["Expiration"]) - (time.time() + 3600)) < 60
    assert role_credentials(emu) == creds                  # the same until 15 minutes before expiry
    assert set(emu.issued_secrets()) == {creds["AccessKeySecret"], creds["SecurityToken"]}

    assert metadata(emu, "/latest/meta-data/ram/security-credentials/other")[0] == 404
    assert metadata(emu, "/latest/meta-data/instance-id", source="127.0.0.2")[0] == 404   # not an instance
    assert metadata(emu, "/latest/meta-data/instance-id", method="POST")[0] == 405
    assert metadata(emu, "/latest/meta-data/instance-id", method="BREW")[0] == 405
    for odd in ("/%ff%fe/../..", "/latest/meta-data/ram/security-credentials/%00", "//", "/latest?x=%zz"):
        assert metadata(emu, odd)[0] == 404
    for ttl in ("²", "9" * 5000):
        assert metadata(emu, "/latest/api/token", "PUT", {"X-aliyun-ecs-metadata-token-ttl-seconds": ttl})[0] == 400

    typed(client, DetachInstanceRamRoleRequest.DetachInstanceRamRoleRequest(), InstanceIds=json.dumps([instance]))
    assert metadata(emu, "/latest/meta-data/ram/security-credentials/")[0] == 404
    assert metadata(emu, f"/latest/meta-data/ram/security-credentials/{ROLE}")[0] == 404


def test_metadata_hardened_mode_tokens(emu: EcsEmulator, client: AcsClient) -> None:
    pull_role(client)
    wait_running(emu, launch(client, RamRoleName=ROLE))
    status, token = metadata(emu, "/latest/api/token", "PUT", {"X-aliyun-ecs-metadata-token-ttl-seconds": "300"})
    assert status == 200 and token
    path = "/latest/meta-data/ram/security-credentials/"
    assert metadata(emu, path, headers={"X-aliyun-ecs-metadata-token": token}) == (200, ROLE)
    assert metadata(emu, path, headers={"X-aliyun-ecs-metadata-token": token + "x"})[0] == 401
    for ttl in ("0", "21601", "soon", ""):
        assert metadata(emu, "/latest/api/token", "PUT", {"X-aliyun-ecs-metadata-token-ttl-seconds": ttl})[0] == 400
    assert metadata(emu, "/latest/api/token", "PUT", {"X-aliyun-ecs-metadata-token-ttl-seconds": "60",
                                                      "X-Forwarded-For": "evil.example"})[0] == 403
    short = metadata(emu, "/latest/api/token", "PUT", {"X-aliyun-ecs-metadata-token-ttl-seconds": "1"})[1]
    time.sleep(1.1)
    assert metadata(emu, path, headers={"X-aliyun-ecs-metadata-token": short})[0] == 401


# --- STS credentials at the API -------------------------------------------------------------------

def test_role_credentials_get_a_registry_token_only_with_the_policy(emu: EcsEmulator, client: AcsClient) -> None:
    pull_role(client, policy=None)
    instance = launch(client, RamRoleName=ROLE)
    wait_running(emu, instance)
    creds = role_credentials(emu)
    host = sts_client(emu, creds)
    denied = refused(registry_token, host)
    assert (denied.get_http_status(), denied.get_error_code()) == (403, "Forbidden.RAM")
    ram(client, "CreatePolicy", PolicyName="ngcx-pull", PolicyDocument=PULL_POLICY)
    ram(client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="ngcx-pull", RoleName=ROLE)
    answer = registry_token(host)
    assert answer["IsSuccess"] is True and answer["AuthorizationToken"] == emu.issued_tokens[-1]
    assert abs(answer["ExpireTime"] / 1000 - epoch(creds["Expiration"])) < 2          # as long as the STS credentials
    assert emu.token_grants == [{"token": answer["AuthorizationToken"], "caller": f"role:{ROLE}",
                                 "instance": instance, "pull": sorted([REPO, "acs:cr:*:*:instance/x"])}]
    assert refused(registry_token, host, instance="cri-other").get_error_code() == "Forbidden.RAM"

    deny = json.dumps({"Version": "1", "Statement": [{"Effect": "Deny", "Action": "cr:*", "Resource": "*"}]})
    ram(client, "CreatePolicy", PolicyName="no-cr", PolicyDocument=deny)
    ram(client, "AttachPolicyToRole", PolicyType="Custom", PolicyName="no-cr", RoleName=ROLE)
    assert refused(registry_token, host).get_error_code() == "Forbidden.RAM"     # an explicit Deny wins

    permanent = registry_token(client)
    assert emu.token_grants[-1] == {"token": permanent["AuthorizationToken"], "caller": f"ak:{AK}",
                                    "instance": None, "pull": ["*"]}
    recorded = json.dumps(emu.calls)
    assert not any(secret in recorded for secret in emu.issued_secrets() + emu.issued_tokens)


def test_sts_keys_need_their_own_unexpired_security_token(emu: EcsEmulator, client: AcsClient) -> None:
    pull_role(client)
    wait_running(emu, launch(client, RamRoleName=ROLE))
    creds = role_credentials(emu)
    garbage = refused(registry_token, sts_client(emu, creds, token="CAISnot-a-token"))
    assert (garbage.get_http_status(), garbage.get_error_code()) == (400, "InvalidSecurityToken.Malformed")
    bare = AcsClient(creds["AccessKeyId"], creds["AccessKeySecret"], "cn-hangzhou", port=emu.port, auto_retry=False)
    assert refused(registry_token, bare).get_error_code() == "MissingSecurityToken"

    started = time.time()
    emu.ram.clock = lambda: time.time() + 50 * 60         # within 15 minutes of expiry: fresh credentials
    fresh = role_credentials(emu)
    assert fresh["AccessKeyId"] != creds["AccessKeyId"] and role_credentials(emu) == fresh
    other = refused(registry_token, sts_client(emu, creds, token=fresh["SecurityToken"]))
    assert other.get_error_code() == "InvalidSecurityToken.MismatchWithAccessKey"
    assert registry_token(sts_client(emu, creds))["IsSuccess"]    # the old ones still work until they expire
    emu.ram.clock = lambda: started + 61 * 60
    expired = refused(registry_token, sts_client(emu, creds))
    assert (expired.get_http_status(), expired.get_error_code()) == (400, "InvalidSecurityToken.Expired")
    assert registry_token(sts_client(emu, fresh))["IsSuccess"]
    assert refused(ram, sts_client(emu, creds), "GetRole", RoleName=ROLE).get_error_code() == (
        "InvalidSecurityToken.Expired")                     # every product on the port checks the token
