"""Driving EcsEmulator through the real aliyun-python-sdk-core/-ecs, for its tests (test_ecs_emulator.py,
test_ecs_images_commands.py): an SDK client on the emulator's port, typed requests, polling, and requests
signed by hand (what a replaying or clock-skewed client sends, which the SDK cannot).

Why a module of its own: both test modules drive the same calls; a test module importing another one's
helpers would have pytest's collection and the helpers' home mixed up.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.client import AcsClient
from aliyunsdkecs.request.v20140526 import (
    DescribeInstancesRequest,
    RunInstancesRequest,
    StartInstanceRequest,
    StopInstanceRequest,
)

from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_rpc import signed_query

AK, SECRET = "test-ak", "test-secret"
IMAGE = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
A10 = "ecs.gn7i-c8g1.2xlarge"
ZONE_H, ZONE_I, ZONE_J = "cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j"


def sdk(emu: EcsEmulator, secret: str = SECRET, **kwargs: Any) -> AcsClient:
    return AcsClient(AK, secret, "cn-hangzhou", port=emu.port, **kwargs)


def call(client: AcsClient, request: Any) -> dict[str, Any]:
    request.set_endpoint("127.0.0.1")
    return json.loads(client.do_action_with_exception(request))


def server_error(client: AcsClient, request: Any) -> ServerException:
    with pytest.raises(ServerException) as info:
        call(client, request)
    return info.value


def run_request(zone: str = ZONE_I, itype: str = A10, **fields: Any) -> RunInstancesRequest.RunInstancesRequest:
    request = RunInstancesRequest.RunInstancesRequest()
    request.set_ImageId(fields.pop("image", IMAGE))
    request.set_InstanceType(itype)
    if zone:
        request.set_ZoneId(zone)
    for name, value in fields.items():
        getattr(request, f"set_{name}")(value)
    return request


def launch(client: AcsClient, **fields: Any) -> list[str]:
    return call(client, run_request(**fields))["InstanceIdSets"]["InstanceIdSet"]


def describe(client: AcsClient, ids: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    request = DescribeInstancesRequest.DescribeInstancesRequest()
    if ids is not None:
        request.set_InstanceIds(json.dumps(ids))
    for name, value in fields.items():
        getattr(request, f"set_{name}")(value)
    return call(client, request)


def wait_status(client: AcsClient, ids: list[str], status: str, timeout: float = 5) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = describe(client, ids, PageSize=100)["Instances"]["Instance"]
        if len(found) == len(ids) and all(i["Status"] == status for i in found):
            return found
        assert time.monotonic() < deadline, f"never {status}: {[(i['InstanceId'], i['Status']) for i in found]}"
        time.sleep(0.03)


def stop(client: AcsClient, instance_id: str, mode: str = "KeepCharging") -> None:
    request = StopInstanceRequest.StopInstanceRequest()
    request.set_InstanceId(instance_id)
    request.set_StoppedMode(mode)
    call(client, request)


def start(client: AcsClient, instance_id: str) -> None:
    request = StartInstanceRequest.StartInstanceRequest()
    request.set_InstanceId(instance_id)
    call(client, request)


def hand_url(emu: EcsEmulator, action: str, secret: str = SECRET, method: str = "GET", **extra: str) -> str:
    """A request signed by hand with the §1 algorithm (what a replaying or clock-skewed client sends)."""
    params = {"AccessKeyId": AK, "Action": action, "Version": "2014-05-26", "Format": "JSON",
              "SignatureMethod": "HMAC-SHA1", "SignatureVersion": "1.0", "SignatureNonce": uuid.uuid4().hex,
              "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "RegionId": "cn-hangzhou"}
    params.update(extra)
    params = {k: v for k, v in params.items() if v is not None}
    return f"http://{emu.endpoint}/?{signed_query(method, params, secret)}"


def fetch(url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers or {}), timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
