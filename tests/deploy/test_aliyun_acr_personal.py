"""An ACR Personal Edition registry (no NGCX_ACR_INSTANCE_ID, the default) gets its temporary login from the
Personal Edition's API, cr 2016-06-07 (ROA `GET /tokens`), in the CLI and on the host (issue 47).

What a user noticed before: with no instance id, both the CLI and the host's role login asked cr 2018-12-01
GetAuthorizationToken without its required InstanceId, which the real API refuses (MissingParameter), so a push or
a pull to a Personal Edition registry could not log in. Real aliyun-python-sdk-core (the CLI) and the very host
program (recipes/deploy/role_login.py, imported) against the ECS emulator's ROA gateway (tests/emulators/
aliyun_roa.py), which checks the ROA signature, the STS token and the request against the official model.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from emulators.hosts_api import LoopbackHosts

from ngcx.core import paths
from ngcx.deploy import roles
from ngcx.registry import acr
from support import aliyun_sdk_on, quick_ecs

AK, SECRET = "LTAI5tPersonalAcr", "aliyun-personal-acr-secret-never-printed"


@pytest.fixture(scope="module")
def ecs() -> Iterator[Any]:
    with quick_ecs(LoopbackHosts(), AK, SECRET) as emulator:
        yield emulator


@pytest.fixture
def cloud(ecs, monkeypatch) -> Iterator[Any]:
    from ngcx.clouds.aliyun import Api
    from ngcx.deploy.aliyun.ecs import Ecs

    aliyun_sdk_on(monkeypatch, ecs.endpoint, AK, SECRET)
    monkeypatch.delenv("NGCX_ACR_INSTANCE_ID", raising=False)
    made: list[str] = []
    yield Ecs(Api("cn-hangzhou")), made
    for instance_id in made:
        Ecs(Api("cn-hangzhou")).delete(instance_id)


def test_the_cli_logs_in_to_a_personal_edition_registry_through_its_own_api(ecs, cloud) -> None:
    before = len(ecs.token_grants)
    login = acr.temporary_login("cn-hangzhou")
    [granted] = ecs.token_grants[before:]
    assert login.username == "cr_temp_user" and login.password == granted["token"]
    assert granted["caller"] == f"ak:{AK}"
    assert not [params for action, params in ecs.calls if action == "GetAuthorizationToken"]   # no RPC 2018 call


def test_an_enterprise_instance_still_uses_the_2018_api_with_its_instance(ecs, cloud, monkeypatch) -> None:
    monkeypatch.setenv("NGCX_ACR_INSTANCE_ID", "cri-unit")
    login = acr.temporary_login("cn-hangzhou")
    [sent] = [params for action, params in ecs.calls if action == "GetAuthorizationToken"][-1:]
    assert sent["Version"] == "2018-12-01" and sent["InstanceId"] == "cri-unit"
    assert login.password == ecs.token_grants[-1]["token"]


def _login_program(metadata_address: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("role_login_personal", paths.recipes_dir() / "deploy" /
                                                  "role_login.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _base, header, where = module.METADATA["aliyun"]
    module.METADATA["aliyun"] = (f"http://{metadata_address}", header, where)
    return module


def test_a_host_logs_in_to_a_personal_edition_registry_with_its_ram_role(ecs, cloud) -> None:
    ecs_cloud, made = cloud
    grant = roles.PullGrant("aliyun", "cn-hangzhou", "team/app")
    role = ecs_cloud.ensure_pull_role(grant)
    params = {"RegionId": "cn-hangzhou", "ImageId": "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
              "InstanceType": "ecs.gn7i-c8g1.2xlarge", "ZoneId": "cn-hangzhou-h", "Amount": 1, "RamRoleName": role}
    instance_id = ecs_cloud.api.ecs("RunInstances", params, write=True)["InstanceIdSets"]["InstanceIdSet"][0]
    made.append(instance_id)
    deadline = time.monotonic() + 20
    while ecs_cloud.describe([instance_id])[instance_id].state != "running":
        assert time.monotonic() < deadline, f"{instance_id} never ran"
        time.sleep(0.05)
    program = _login_program(ecs.metadata_address)
    creds = program.role_credentials("aliyun")
    user, password = program.acr_login("cn-hangzhou", f"http://{ecs.endpoint}", "", creds)
    [granted] = [g for g in ecs.token_grants if g["token"] == password]
    assert user == "cr_temp_user" and granted["caller"] == f"role:{role}"
    assert granted["pull"] == ["acs:cr:cn-hangzhou:*:repository/team/app"]

    forged = {**creds, "AccessKeySecret": "not-the-secret"}
    with pytest.raises(program.LoginError, match="HTTP 400 SignatureDoesNotMatch") as refused:
        program.acr_login("cn-hangzhou", f"http://{ecs.endpoint}", "", forged)
    assert creds["AccessKeySecret"] not in str(refused.value) and creds["SecurityToken"] not in str(refused.value)
