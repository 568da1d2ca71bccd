"""A command channel that refuses for good ends a deploy's wait at once, naming the cloud's code (issue 47 item 6).

What a user saw: against an ECS endpoint answering Cloud Assistant's RunCommand with InvalidAction.NotFound, ngcx
asked 143 times in 5 minutes, then said the deployment "was not ready ... (a large image or model may need
--ready-timeout)"; a RAM user without Cloud Assistant waited 15 minutes for the same wrong hint. Now a permanent
refusal (unknown action, missing permission, unknown instance) is one line with the code and what to do, within
seconds; a transient one (Throttling) is still retried. The cloud is the real SDK against the ECS emulator, its
host on paper (no engine); the emulator's `refuse` switch answers every call of an action with the error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
from emulators.hosts_api import PaperHosts

from ngcx.deploy import flow, store, vm
from ngcx.deploy.common import DeployConfig
from support import aliyun_sdk_on, quick_ecs

AK, SECRET = "LTAI5tChannelTest", "aliyun-channel-secret-never-printed"
CONFIG = DeployConfig(cloud="aliyun", image="ngcx-app/x:latest", pull_ref=None, registry=None,
                      labels={"ai.ngcx.compute-capabilities": "8.6", "ai.ngcx.min-driver": "535"},
                      model=None, gpu="A10", region="cn-hangzhou", zone="cn-hangzhou-h")
NOBODY = "http://127.0.0.1:9"          # the host's endpoint: nothing answers there, so only the channel can end it


@pytest.fixture(scope="module")
def ecs() -> Iterator[Any]:
    with quick_ecs(PaperHosts(), AK, SECRET) as emulator:
        yield emulator


@pytest.fixture
def record(ecs, monkeypatch, tmp_path) -> Iterator[Any]:
    """A deployment whose host runs (on paper) and whose server never answers."""
    from ngcx.deploy.aliyun import verbs

    aliyun_sdk_on(monkeypatch, ecs.endpoint, AK, SECRET)
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    cloud = verbs.cloud_for("cn-hangzhou")
    cloud.prepare_network("0.0.0.0/0")
    instance_id = cloud.create(vm.CreateSpec("ecs.gn7i-c8g1.2xlarge", "cn-hangzhou-h",
                                             "ubuntu_22_04_x64_20G_alibase_20240926.vhd", "#!/bin/sh\n",
                                             f"channel-{tmp_path.name}", {vm.TAG_OWNER: "unit"}, "ngcx-channel-test"))
    vm.wait_state(cloud, instance_id, "running", 30)
    intent = store.create_intent(CONFIG)
    yield dataclasses.replace(intent, instance_id=instance_id, region="cn-hangzhou", endpoint=NOBODY)
    ecs.refuse("RunCommand", None)
    ecs.refuse("DescribeInvocationResults", None)


@pytest.mark.parametrize(("action", "code", "status", "says"), [
    ("RunCommand", "InvalidAction.NotFound", 404, "has no Cloud Assistant API"),
    ("RunCommand", "Forbidden.RAM", 403, "grant the RAM user ecs:RunCommand"),
    ("DescribeInvocationResults", "Forbidden.RAM", 403, "ecs:DescribeInvocationResults"),
])
def test_a_permanent_refusal_ends_the_ready_wait_in_seconds_in_one_line_naming_the_code(
        ecs, record, action: str, code: str, status: int, says: str) -> None:
    ecs.refuse(action, code, status)
    asked_before = sum(1 for name, _ in ecs.calls if name == action)
    started = time.monotonic()
    with pytest.raises(vm.ChannelError) as refused:
        flow.wait_ready(flow.target("aliyun"), record, 900.0)
    assert time.monotonic() - started < 15
    line = refused.value.line()
    assert f"Alibaba Cloud refused {action} on {record.instance_id} for good: {code}" in line and says in line
    assert "\n" not in line and "ready-timeout" not in line and SECRET not in line
    assert sum(1 for name, _ in ecs.calls if name == action) - asked_before == 1      # asked once, not 143 times


def test_a_transient_refusal_is_retried_and_the_command_runs(ecs, record) -> None:
    ecs.fail_next("RunCommand", "Throttling", 400, times=2)
    cloud = flow.target("aliyun")._cloud(record)
    assert cloud.run_command(record.instance_id, "true", 60) == (0, "")
    assert ecs.performed("RunCommand") >= 1
