"""The hosts' role login (recipes/deploy/role_login.py) against both emulated clouds, on loopback.

What a user notices: a host with ngcx's pull role gets a registry login from its metadata service and
the registry's token API, signed as each cloud demands (Alibaba Cloud RPC v1 with the STS token, AWS
SigV4 with the session token), for that one repository; a host without the role, or with a role that
may not pull, fails in one line that names the step and the API's error code and no secret; a host
reused for another repository gets that repository's role instead of its old one.

The roles are made by ngcx's own code (cloud modules' ensure_pull_role / attach_role) through the real
SDKs; the program the hosts run is this very file, imported, with the metadata address pointed at the
emulator's server (on a cloud it is 100.100.100.200 / 169.254.169.254). Machines are "paper": their
address is 127.0.0.1, so this test process *is* the instance the metadata service answers (each test
deletes its instances, so one at a time has that address).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from emulators.hosts_api import LoopbackHosts

from ngcx.core import paths
from ngcx.deploy import roles
from support import aliyun_sdk_on, quick_ecs

AK, SECRET = "LTAI5tRoleLoginTest", "aliyun-role-secret-never-printed"
AWS_KEY, AWS_SECRET = "AKIAROLELOGINTEST001", "aws-role-secret-never-printed-88a1"


def login_program(metadata_address: str, cloud: str) -> ModuleType:
    """recipes/deploy/role_login.py imported as a module, asking `metadata_address` instead of the cloud's."""
    path = paths.recipes_dir() / "deploy" / "role_login.py"
    spec = importlib.util.spec_from_file_location(f"role_login_{cloud}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _base, header, where = module.METADATA[cloud]
    module.METADATA[cloud] = (f"http://{metadata_address}", header, where)
    return module


def wait_running(describe: Any, instance_id: str) -> None:
    import time

    deadline = time.monotonic() + 20
    while describe(instance_id) != "running":
        assert time.monotonic() < deadline, f"{instance_id} never ran"
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------- Alibaba Cloud

@pytest.fixture(scope="module")
def ecs() -> Iterator[Any]:
    with quick_ecs(LoopbackHosts(), AK, SECRET) as emulator:
        yield emulator


@pytest.fixture
def aliyun_cloud(ecs, monkeypatch) -> Iterator[Any]:
    from ngcx.clouds.aliyun import Api
    from ngcx.deploy.aliyun.ecs import Ecs

    aliyun_sdk_on(monkeypatch, ecs.endpoint, AK, SECRET)
    cloud = Ecs(Api("cn-hangzhou"))
    cloud.made = []
    yield cloud
    for instance_id in cloud.made:
        cloud.delete(instance_id)


def _ecs_instance(cloud: Any, role: str | None) -> str:
    params = {"RegionId": "cn-hangzhou", "ImageId": "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
              "InstanceType": "ecs.gn7i-c8g1.2xlarge", "ZoneId": "cn-hangzhou-h", "Amount": 1,
              **({"RamRoleName": role} if role else {})}
    instance_id = cloud.api.ecs("RunInstances", params, write=True)["InstanceIdSets"]["InstanceIdSet"][0]
    cloud.made.append(instance_id)
    wait_running(lambda i: cloud.describe([i])[i].state, instance_id)
    return instance_id


def test_an_ecs_host_logs_in_to_acr_with_its_ram_role_for_one_repository(ecs, aliyun_cloud, monkeypatch):
    grant = roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-unit")
    role = aliyun_cloud.ensure_pull_role(grant)
    assert aliyun_cloud.ensure_pull_role(grant) == role == grant.role_name        # the second deploy finds it
    assert ecs.performed("CreateRole") == 1
    _ecs_instance(aliyun_cloud, role)
    program = login_program(ecs.metadata_address, "aliyun")
    creds = program.role_credentials("aliyun")
    user, password = program.acr_login("cn-hangzhou", f"http://{ecs.endpoint}", "cri-unit", creds)
    [granted] = [g for g in ecs.token_grants if g["token"] == password]
    assert user and granted["caller"] == f"role:{role}"
    assert granted["pull"] == ["acs:cr:cn-hangzhou:*:repository/cri-unit/team/app"]


def test_an_ecs_host_without_the_role_fails_in_one_line_without_a_secret(ecs, aliyun_cloud):
    _ecs_instance(aliyun_cloud, None)
    program = login_program(ecs.metadata_address, "aliyun")
    with pytest.raises(program.LoginError) as failure:
        program.role_credentials("aliyun")
    assert "metadata service" in str(failure.value) and "\n" not in str(failure.value)


def test_a_reused_ecs_host_gets_the_new_repositorys_role(ecs, aliyun_cloud):
    first = aliyun_cloud.ensure_pull_role(roles.PullGrant("aliyun", "cn-hangzhou", "team/one", "cri-unit"))
    second = aliyun_cloud.ensure_pull_role(roles.PullGrant("aliyun", "cn-hangzhou", "team/two", "cri-unit"))
    instance_id = _ecs_instance(aliyun_cloud, first)
    aliyun_cloud.attach_role(instance_id, second)
    aliyun_cloud.attach_role(instance_id, second)                              # already there: nothing to do
    answer = aliyun_cloud.api.ecs("DescribeInstanceRamRole", {"InstanceIds": json.dumps([instance_id])})
    sets = answer["InstanceRamRoleSets"]["InstanceRamRoleSet"]
    assert [s["RamRoleName"] for s in sets if s["InstanceId"] == instance_id] == [second]


def test_a_registry_that_refuses_does_not_stop_the_next_login_and_each_failure_is_named(ecs, aliyun_cloud):
    _ecs_instance(aliyun_cloud, aliyun_cloud.ensure_pull_role(roles.PullGrant("aliyun", "cn-hangzhou", "t/a", "")))
    program = login_program(ecs.metadata_address, "aliyun")
    closed = ["http://127.0.0.1:9", "http://127.0.0.1:7"]     # discard / echo: nothing listens there
    argv = [word for api in closed for word in ("aliyun", "cn-hangzhou", api, "registry.example", "")]
    with pytest.raises(program.LoginError) as failure:
        program.main(argv)                                    # a bake's builder logs in to every registry
    assert all(api in str(failure.value) for api in closed) and "\n" not in str(failure.value)


def test_a_widened_ram_policy_is_narrowed_again_by_the_next_deploy(ecs, aliyun_cloud):
    grant = roles.PullGrant("aliyun", "cn-hangzhou", "team/widened", "cri-unit")
    name = aliyun_cloud.ensure_pull_role(grant)
    wide = json.dumps({"Version": "1", "Statement": [{"Effect": "Allow", "Action": "cr:*", "Resource": "*"}]})
    aliyun_cloud.api.ram("CreatePolicyVersion", {"PolicyName": name, "PolicyDocument": wide, "SetAsDefault": "true"})
    assert aliyun_cloud.ensure_pull_role(grant) == name
    found = aliyun_cloud.api.ram("GetPolicy", {"PolicyType": "Custom", "PolicyName": name})
    assert json.loads(found["DefaultPolicyVersion"]["PolicyDocument"]) == json.loads(roles.aliyun_policy(grant))


# ------------------------------------------------------------------------------------------- AWS

@pytest.fixture(scope="module")
def ec2() -> Iterator[Any]:
    from emulators.aws_ec2 import Ec2Emulator

    with Ec2Emulator(LoopbackHosts(), access_keys={AWS_KEY: AWS_SECRET}, boot_seconds=0.05, start_seconds=0.05,
                     metadata_host="127.0.0.1") as emulator:
        yield emulator


@pytest.fixture
def aws_cloud(ec2, monkeypatch, tmp_path) -> Iterator[Any]:
    from ngcx.clouds.aws import Api
    from ngcx.deploy.aws.ec2 import Ec2

    for name, value in {"AWS_ACCESS_KEY_ID": AWS_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": ec2.endpoint, "HOME": str(tmp_path),
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                 "NGCX_AWS_INSTANCE_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    cloud = Ec2(Api("us-east-1"))
    cloud.made = []
    yield cloud
    for instance_id in cloud.made:
        cloud.delete(instance_id)


def _ec2_instance(cloud: Any, profile: str | None) -> str:
    extra = {"IamInstanceProfile": {"Name": profile}} if profile else {}
    answer = cloud.api.call("ec2", "run_instances", ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=1,
                            MaxCount=1, MetadataOptions={"HttpTokens": "required"}, **extra)
    instance_id = answer["Instances"][0]["InstanceId"]
    cloud.made.append(instance_id)
    wait_running(lambda i: cloud.describe([i]).get(i).state if cloud.describe([i]).get(i) else "", instance_id)
    return instance_id


def test_an_ec2_host_logs_in_to_ecr_with_its_instance_profile_for_one_repository(ec2, aws_cloud):
    grant = roles.PullGrant("aws", "us-east-1", "team/app")
    profile = aws_cloud.ensure_pull_role(grant)
    assert aws_cloud.ensure_pull_role(grant) == profile == grant.role_name
    _ec2_instance(aws_cloud, profile)
    program = login_program(ec2.metadata_address, "aws")
    creds = program.role_credentials("aws")
    user, password = program.ecr_login("us-east-1", ec2.endpoint, creds)
    [granted] = [g for g in ec2.token_grants if g["token"] == password]
    assert user == "AWS" and granted["caller"] == f"role:{profile}"
    assert len(granted["pull"]) == 1 and granted["pull"][0].endswith(":repository/team/app")


def test_a_reused_ec2_host_gets_the_new_repositorys_profile(ec2, aws_cloud):
    first = aws_cloud.ensure_pull_role(roles.PullGrant("aws", "us-east-1", "team/one"))
    second = aws_cloud.ensure_pull_role(roles.PullGrant("aws", "us-east-1", "team/two"))
    instance_id = _ec2_instance(aws_cloud, None)
    aws_cloud.attach_role(instance_id, first)                                   # none yet: associated
    aws_cloud.attach_role(instance_id, second)                                  # another: replaced
    aws_cloud.attach_role(instance_id, second)                                  # the same: nothing to do
    found = aws_cloud.api.call("ec2", "describe_iam_instance_profile_associations", Filters=[
        {"Name": "instance-id", "Values": [instance_id]}, {"Name": "state", "Values": ["associated"]}])
    arns = [a["IamInstanceProfile"]["Arn"] for a in found["IamInstanceProfileAssociations"]]
    assert len(arns) == 1 and arns[0].endswith("/" + second)


def test_a_widened_iam_policy_is_narrowed_again_by_the_next_deploy(ec2, aws_cloud):
    grant = roles.PullGrant("aws", "us-east-1", "team/widened")
    name = aws_cloud.ensure_pull_role(grant)
    wide = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ecr:*",
                                                               "Resource": "*"}]})
    aws_cloud.api.call("iam", "put_role_policy", RoleName=name, PolicyName="ngcx-pull", PolicyDocument=wide)
    assert aws_cloud.ensure_pull_role(grant) == name
    found = aws_cloud.api.call("iam", "get_role_policy", RoleName=name, PolicyName="ngcx-pull")
    assert roles.same_document(found["PolicyDocument"], roles.aws_policy(grant, "aws", aws_cloud.api.call(
        "sts", "get_caller_identity")["Account"]))
