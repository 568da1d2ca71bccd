"""The ECS emulator's images, Cloud Assistant, serial console and ACR token, driven through the real SDK
(ecs_sdk.py), and the gateway's `hold`: the families beside the instances (test_ecs_emulator.py).

The machines behind the instances are PaperHosts: an in-memory HostBackend that only records
calls and hands out made-up IPs. Nothing runs on them; the product's e2e tests use the real,
Docker-backed backend.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import pytest
from aliyunsdkcore.request import CommonRequest
from aliyunsdkecs.request.v20140526 import (
    CreateImageRequest,
    DeleteImageRequest,
    DescribeImagesRequest,
    DescribeInvocationResultsRequest,
    GetInstanceConsoleOutputRequest,
    RunCommandRequest,
)

from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_ecs_machines import PUBLIC_IMAGES
from emulators.ecs_sdk import call, launch, run_request, sdk, server_error, wait_status
from emulators.hosts_api import CommandResult, PaperHosts


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends even 127.0.0.1 through HTTP(S)_PROXY (it ignores NO_PROXY)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hosts() -> PaperHosts:
    return PaperHosts()


@pytest.fixture
def emu(hosts: PaperHosts) -> Iterator[EcsEmulator]:
    with EcsEmulator(hosts, boot_seconds=0.15, start_seconds=0.15, stop_seconds=0.1) as emulator:
        yield emulator
    assert hosts.closed


# --- images ---------------------------------------------------------------------------------

def test_create_describe_use_and_delete_an_image(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    [iid] = launch(client)
    wait_status(client, [iid], "Running")
    create = CreateImageRequest.CreateImageRequest()
    create.set_InstanceId(iid)
    create.set_ImageName("ngcx-host-v1")
    create.set_ClientToken("bake-1")
    create.set_Tags([{"Key": "ngcx", "Value": "host"}])
    image_id = call(client, create)["ImageId"]
    assert image_id.startswith("m-") and call(client, create)["ImageId"] == image_id   # idempotent
    listing = DescribeImagesRequest.DescribeImagesRequest()
    listing.set_ImageOwnerAlias("self")
    listing.set_Status("Creating,Available")
    deadline = time.monotonic() + 5
    while (images := call(client, listing)["Images"]["Image"])[0]["Status"] != "Available":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert [(m["ImageId"], m["ImageName"]) for m in images] == [(image_id, "ngcx-host-v1")]
    assert images[0]["Tags"]["Tag"] == [{"TagKey": "ngcx", "TagValue": "host"}]
    assert hosts.named("snapshot") == [("snapshot", iid, image_id)]
    system = DescribeImagesRequest.DescribeImagesRequest()
    system.set_ImageOwnerAlias("system")
    system.set_PageSize(50)
    assert {m["ImageId"] for m in call(client, system)["Images"]["Image"]} == set(PUBLIC_IMAGES)

    [child] = launch(client, image=image_id)
    wait_status(client, [child], "Running")
    assert hosts.named("create")[-1][1:3] == (child, image_id)
    delete = DeleteImageRequest.DeleteImageRequest()
    delete.set_ImageId(image_id)
    call(client, delete)
    assert call(client, listing)["Images"]["Image"] == []
    assert server_error(client, run_request(image=image_id)).get_error_code() == "InvalidImageId.NotFound"
    deadline = time.monotonic() + 5
    while image_id in hosts.images and time.monotonic() < deadline:
        time.sleep(0.02)
    assert image_id not in hosts.images


# --- Cloud Assistant, console, ACR, hold ------------------------------------------------------

def test_run_command_and_invocation_results(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    [iid] = launch(client, UserData=base64.b64encode(b"echo booted").decode())
    wait_status(client, [iid], "Running")
    hosts.results["docker ps"] = CommandResult(0, "CONTAINER ID   IMAGE\n")
    hosts.results["false"] = CommandResult(1, "")
    invokes = {}
    for script, encoding in (("docker ps", "Base64"), ("false", "PlainText")):
        request = RunCommandRequest.RunCommandRequest()
        request.set_Type("RunShellScript")
        request.set_CommandContent(base64.b64encode(script.encode()).decode() if encoding == "Base64" else script)
        request.set_ContentEncoding(encoding)
        request.set_InstanceIds([iid])
        request.set_Timeout(30)
        answer = call(client, request)
        assert answer["CommandId"].startswith("c-") and answer["InvokeId"].startswith("t-")
        invokes[script] = answer["InvokeId"]
    assert ("run_command", iid, "docker ps", 30) in hosts.calls
    results = {}
    deadline = time.monotonic() + 5
    while len(results) < 2:
        for script, invoke_id in invokes.items():
            request = DescribeInvocationResultsRequest.DescribeInvocationResultsRequest()
            request.set_InvokeId(invoke_id)
            [result] = call(client, request)["Invocation"]["InvocationResults"]["InvocationResult"]
            if result["InvocationStatus"] != "Running":
                results[script] = result
        assert time.monotonic() < deadline
    assert base64.b64decode(results["docker ps"]["Output"]).decode() == "CONTAINER ID   IMAGE\n"
    assert (results["docker ps"]["InvocationStatus"], results["docker ps"]["ExitCode"]) == ("Success", 0)
    assert (results["false"]["InvocationStatus"], results["false"]["ExitCode"]) == ("Failed", 1)

    console = GetInstanceConsoleOutputRequest.GetInstanceConsoleOutputRequest()
    console.set_InstanceId(iid)
    answer = call(client, console)
    assert answer["InstanceId"] == iid and base64.b64decode(answer["ConsoleOutput"]).decode().endswith("echo booted")


def test_acr_get_authorization_token_is_fresh_and_never_recorded(emu: EcsEmulator) -> None:
    client = sdk(emu)
    answers = []
    for _ in range(2):
        request = CommonRequest(domain="127.0.0.1", version="2018-12-01", action_name="GetAuthorizationToken",
                                product="cr")
        request.set_method("POST")
        request.add_query_param("InstanceId", "cri-emulated")
        answers.append(json.loads(client.do_action_with_exception(request)))
    first, second = answers
    assert set(first) == {"RequestId", "IsSuccess", "TempUsername", "AuthorizationToken", "ExpireTime"}
    assert first["IsSuccess"] is True and first["TempUsername"]
    assert first["AuthorizationToken"] != second["AuthorizationToken"]
    assert abs(first["ExpireTime"] - (time.time() + 3600) * 1000) < 60_000
    assert emu.issued_tokens == [first["AuthorizationToken"], second["AuthorizationToken"]]
    assert not any(token in json.dumps(emu.calls) for token in emu.issued_tokens)


def test_hold_answers_only_after_the_event_and_counts_performed(emu: EcsEmulator) -> None:
    release = threading.Event()
    emu.hold("RunInstances", release)
    answer: list[list[str]] = []
    caller = threading.Thread(target=lambda: answer.append(launch(sdk(emu, auto_retry=False))))
    caller.start()
    deadline = time.monotonic() + 5
    while emu.performed("RunInstances") == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.1)
    assert len(emu.instances()) == 1 and not answer      # the cloud did it; the caller has no answer yet
    release.set()
    caller.join(timeout=5)
    assert answer == [[emu.instances()[0]["id"]]]
