"""On AWS too, SSM Run Command refusing for good ends a deploy's wait at once, naming AWS's code (issue 47 item 6).

The twin of test_aliyun_command_channel.py: AccessDeniedException (a caller without ssm:SendCommand) and
InvalidInstanceId after the agent's registration grace are permanent, so the readiness wait ends in one line with
the code and what to do instead of asking every few seconds until --ready-timeout and blaming the image size.
Real boto3 against the AWS test double (tests/emulators/aws_ec2.py, paper machines); its `refuse` switch answers
every call of an action with the error.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest
from emulators.aws_ec2 import Ec2Emulator
from emulators.hosts_api import PaperHosts

from ngcx.deploy import flow, store, vm
from ngcx.deploy.aws import ec2
from ngcx.deploy.common import DeployConfig

KEY, SECRET = "AKIACHANNELTEST00001", "channel-secret-never-printed-7e1"
CONFIG = DeployConfig(cloud="aws", image="ngcx-app/x:latest", pull_ref=None, registry=None, labels={}, model=None,
                      gpu="A10G", region="us-east-1")
NOBODY = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def emulator() -> Iterator[Ec2Emulator]:
    with Ec2Emulator(PaperHosts(), access_keys={KEY: SECRET}, boot_seconds=0.2, start_seconds=0.2) as emu:
        yield emu


@pytest.fixture
def record(emulator, monkeypatch, tmp_path) -> Iterator[Any]:
    """A deployment whose host runs (on paper) and whose server never answers."""
    for name in ("AWS_PROFILE", "AWS_REGION", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                 "AWS_SESSION_TOKEN", "NGCX_AWS_INSTANCE_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1",
                        "NGCX_STATE_DIR": str(tmp_path / "state"), "AWS_ENDPOINT_URL": emulator.endpoint,
                        "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}.items():
        monkeypatch.setenv(name, value)
    cloud = ec2.cloud_for("us-east-1")
    cloud.prepare_network("10.0.0.0/8")
    instance_id = cloud.create(vm.CreateSpec("g5.xlarge", "us-east-1a", cloud.fallback_image(), "#!/bin/sh\n",
                                             f"channel-{tmp_path.name}", {vm.TAG_OWNER: "unit"}, "ngcx-channel"))
    vm.wait_state(cloud, instance_id, "running", 30)
    yield dataclasses.replace(store.create_intent(CONFIG), instance_id=instance_id, region="us-east-1",
                              endpoint=NOBODY)
    emulator.refuse("SendCommand", None)


def test_access_denied_ends_the_ready_wait_in_seconds_in_one_line_naming_the_code(emulator, record) -> None:
    emulator.refuse("SendCommand", "AccessDeniedException", 400)
    started = time.monotonic()
    with pytest.raises(vm.ChannelError) as refused:
        flow.wait_ready(flow.target("aws"), record, 900.0)
    assert time.monotonic() - started < 20
    line = refused.value.line()
    assert f"AWS refused SendCommand on {record.instance_id} for good: AccessDeniedException" in line
    assert "ssm:SendCommand" in line and "\n" not in line and "ready-timeout" not in line and SECRET not in line


def test_an_instance_the_channel_never_registers_ends_the_wait_after_the_grace(emulator, record, monkeypatch) -> None:
    monkeypatch.setattr(ec2, "AGENT_WAIT_S", 0.5)
    emulator.refuse("SendCommand", "InvalidInstanceId", 400)
    started = time.monotonic()
    with pytest.raises(vm.ChannelError) as refused:
        flow.wait_ready(flow.target("aws"), record, 900.0)
    assert time.monotonic() - started < 20
    assert "InvalidInstanceId" in refused.value.line() and "AmazonSSMManagedInstanceCore" in refused.value.line()
