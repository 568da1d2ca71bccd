"""The ECS emulator, driven through the real aliyun-python-sdk-core/-ecs (and by hand where the
SDK cannot misbehave on purpose): signature v1, the SDK's retry traps, ClientToken, stock, the
instance state machine; images, Cloud Assistant, the console and ACR: test_ecs_images_commands.py.

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
from aliyunsdkcore.client import AcsClient
from aliyunsdkecs.request.v20140526 import (
    AuthorizeSecurityGroupRequest,
    CreateSecurityGroupRequest,
    DeleteInstanceRequest,
    DeleteInstancesRequest,
    DescribeAvailableResourceRequest,
    DescribeInstancesRequest,
    DescribeInstanceTypesRequest,
    DescribeRegionsRequest,
    DescribeSecurityGroupAttributeRequest,
    DescribeSecurityGroupsRequest,
    DescribeVSwitchesRequest,
    DescribeZonesRequest,
    StartInstanceRequest,
    StopInstanceRequest,
    StopInstancesRequest,
)

from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_rpc import NonceStore, sign, string_to_sign, verify
from emulators.ecs_sdk import (
    A10,
    IMAGE,
    SECRET,
    ZONE_H,
    ZONE_I,
    ZONE_J,
    call,
    describe,
    fetch,
    hand_url,
    launch,
    run_request,
    sdk,
    server_error,
    start,
    stop,
    wait_status,
)
from emulators.hosts_api import PaperHosts


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



# --- signature and protocol -------------------------------------------------------------------

def test_signature_v1_reference_vector_signs_and_verifies() -> None:
    params = {"AccessKeyId": "testid", "Action": "DescribeRegions", "Format": "XML", "SignatureMethod": "HMAC-SHA1",
              "SignatureNonce": "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf", "SignatureVersion": "1.0",
              "Timestamp": "2016-02-23T12:46:24Z", "Version": "2014-05-26"}
    sts = string_to_sign("GET", params)
    assert sts == ("GET&%2F&AccessKeyId%3Dtestid%26Action%3DDescribeRegions%26Format%3DXML%26SignatureMethod%3D"
                   "HMAC-SHA1%26SignatureNonce%3D3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf%26SignatureVersion%3D1.0"
                   "%26Timestamp%3D2016-02-23T12%253A46%253A24Z%26Version%3D2014-05-26")
    assert sign(sts, "testsecret") == "OLeaidS1JvxuMvnyHOwuJ+uX5qY="
    signed = {**params, "Signature": "OLeaidS1JvxuMvnyHOwuJ+uX5qY="}
    then = time.mktime(time.strptime("2016-02-23T12:50:00", "%Y-%m-%dT%H:%M:%S")) - time.timezone
    verify("GET", signed, {"testid": "testsecret"}, NonceStore(), threading.Lock(), now=then)  # raises if not


def test_sdk_typed_request_is_accepted(emu: EcsEmulator) -> None:
    answer = call(sdk(emu), DescribeRegionsRequest.DescribeRegionsRequest())
    assert answer["Regions"]["Region"][0]["RegionId"] == "cn-hangzhou" and answer["RequestId"]
    action, params = emu.calls[-1]
    assert action == "DescribeRegions" and "Signature" not in params and params["SignatureType"] == ""


def test_wrong_secret_is_invalid_access_key_secret_and_the_secret_is_nowhere(emu: EcsEmulator) -> None:
    wrong = "wrong-secret-7Qx"
    error = server_error(sdk(emu, secret=wrong), DescribeRegionsRequest.DescribeRegionsRequest())
    assert error.get_error_code() == "InvalidAccessKeySecret" and error.get_http_status() == 400
    status, body = fetch(hand_url(emu, "DescribeRegions", secret=wrong))
    reply = json.loads(body)
    assert status == 400 and reply["Code"] == "SignatureDoesNotMatch"
    assert reply["Message"].split("server string to sign is:")[1].startswith("GET&%2F&AccessKeyId%3Dtest-ak")
    assert set(reply) == {"RequestId", "HostId", "Code", "Message", "Recommend"}
    seen = str(error) + error.get_error_msg() + body.decode() + json.dumps(emu.calls)
    assert wrong not in seen and SECRET not in seen


def test_unknown_access_key_is_404(emu: EcsEmulator) -> None:
    error = server_error(AcsClient("nobody", SECRET, "cn-hangzhou", port=emu.port),
                         DescribeRegionsRequest.DescribeRegionsRequest())
    assert (error.get_http_status(), error.get_error_code()) == (404, "InvalidAccessKeyId.NotFound")


def test_replayed_nonce_is_refused(emu: EcsEmulator) -> None:
    url = hand_url(emu, "DescribeRegions")
    assert fetch(url)[0] == 200
    status, body = fetch(url)
    assert (status, json.loads(body)["Code"]) == (400, "SignatureNonceUsed")


def test_timestamp_more_than_15_minutes_off_is_expired(emu: EcsEmulator) -> None:
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 16 * 60))
    status, body = fetch(hand_url(emu, "DescribeRegions", Timestamp=old))
    assert (status, json.loads(body)["Code"]) == (400, "InvalidTimeStamp.Expired")
    recent = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 10 * 60))
    assert fetch(hand_url(emu, "DescribeRegions", Timestamp=recent))[0] == 200


def test_unknown_action_missing_parameter_and_xml_by_default(emu: EcsEmulator) -> None:
    status, body = fetch(hand_url(emu, "LaunchRockets"))
    assert (status, json.loads(body)["Code"]) == (404, "InvalidAction.NotFound")
    status, body = fetch(hand_url(emu, "DescribeRegions", SignatureNonce=None))
    assert (status, json.loads(body)["Code"]) == (400, "MissingParameter") and b"SignatureNonce" in body
    status, body = fetch(hand_url(emu, "RunInstances", InstanceType=A10))
    assert (status, json.loads(body)["Code"]) == (400, "MissingImageId")
    status, body = fetch(hand_url(emu, "DescribeRegions", Format=None))
    assert status == 200 and body.startswith(b"<?xml") and b"<RegionId>cn-hangzhou</RegionId>" in body


def test_post_form_body_is_signed_and_merged(emu: EcsEmulator) -> None:
    query = hand_url(emu, "DescribeRegions", method="POST").split("?", 1)[1]
    status, body = fetch(f"http://{emu.endpoint}/", data=query.encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and json.loads(body)["Regions"]["Region"]
    assert fetch(hand_url(emu, "DescribeRegions", method="POST"))[0] == 400  # signed for POST, sent as GET


# --- catalog, stock, network ------------------------------------------------------------------

def test_instance_types_zones_and_available_resource(emu: EcsEmulator) -> None:
    client = sdk(emu)
    types = {t["InstanceTypeId"]: t for t in
             call(client, DescribeInstanceTypesRequest.DescribeInstanceTypesRequest())["InstanceTypes"]["InstanceType"]}
    assert len(types) == 6 and types[A10]["GPUSpec"] == "NVIDIA A10" and types[A10]["GPUAmount"] == 1
    assert types["ecs.gn7-c12g1.3xlarge"]["GPUMemorySize"] == 40
    zones = call(client, DescribeZonesRequest.DescribeZonesRequest())["Zones"]["Zone"]
    assert [z["ZoneId"] for z in zones] == [ZONE_H, ZONE_I, ZONE_J]
    vswitches = call(client, DescribeVSwitchesRequest.DescribeVSwitchesRequest())["VSwitches"]["VSwitch"]
    assert sorted(v["ZoneId"] for v in vswitches) == [ZONE_H, ZONE_I, ZONE_J]

    emu.set_stock(ZONE_H, A10, False)
    request = DescribeAvailableResourceRequest.DescribeAvailableResourceRequest()
    request.set_DestinationResource("InstanceType")
    request.set_InstanceType(A10)
    answer = call(client, request)["AvailableZones"]["AvailableZone"]
    status = {z["ZoneId"]: z["AvailableResources"]["AvailableResource"][0]["SupportedResources"]
              ["SupportedResource"][0] for z in answer}
    assert status[ZONE_H]["Status"] == "SoldOut" and status[ZONE_H]["StatusCategory"] == "WithoutStock"
    assert status[ZONE_I]["Status"] == "Available" and status[ZONE_I]["StatusCategory"] == "WithStock"


def test_security_group_create_authorize_describe(emu: EcsEmulator) -> None:
    client = sdk(emu)
    vpc_id = call(client, DescribeVSwitchesRequest.DescribeVSwitchesRequest())["VSwitches"]["VSwitch"][0]["VpcId"]
    create = CreateSecurityGroupRequest.CreateSecurityGroupRequest()
    create.set_VpcId(vpc_id)
    create.set_Tags([{"Key": "ngcx", "Value": "serve"}])
    group_id = call(client, create)["SecurityGroupId"]
    rule = AuthorizeSecurityGroupRequest.AuthorizeSecurityGroupRequest()
    rule.set_SecurityGroupId(group_id)
    rule.set_IpProtocol("tcp")
    rule.set_PortRange("8000/8000")
    rule.set_SourceCidrIp("0.0.0.0/0")
    call(client, rule)
    call(client, rule)  # the same rule again is no duplicate
    found = DescribeSecurityGroupsRequest.DescribeSecurityGroupsRequest()
    found.set_VpcId(vpc_id)
    found.set_Tags([{"Key": "ngcx", "Value": "serve"}])
    assert [g["SecurityGroupId"] for g in call(client, found)["SecurityGroups"]["SecurityGroup"]] == [group_id]
    attribute = DescribeSecurityGroupAttributeRequest.DescribeSecurityGroupAttributeRequest()
    attribute.set_SecurityGroupId(group_id)
    rules = call(client, attribute)["Permissions"]["Permission"]
    assert [(r["IpProtocol"], r["PortRange"], r["SourceCidrIp"]) for r in rules] == [("TCP", "8000/8000", "0.0.0.0/0")]
    rule.set_PortRange("8000")
    assert server_error(client, rule).get_error_code() == "InvalidPortRange.Malformed"
    ids = launch(client, SecurityGroupId=group_id)
    assert emu.instances()[0]["security_group_ids"] == [group_id] and ids


# --- RunInstances ------------------------------------------------------------------------------

def test_run_instances_boots_to_running_with_ips(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    script = b"#!/bin/sh\necho hello from user-data\n"
    [instance_id] = launch(client, UserData=base64.b64encode(script).decode(), InternetMaxBandwidthOut=10,
                           InstanceName="ngcx-a10", Tags=[{"Key": "ngcx:deployment", "Value": "d1"}])
    assert emu.instances()[0]["status"] in ("Pending", "Starting")   # answered before the machine is up
    [running] = wait_status(client, [instance_id], "Running")
    assert hosts.named("create") == [("create", instance_id, IMAGE, script)]
    ip = running["VpcAttributes"]["PrivateIpAddress"]["IpAddress"][0]
    assert ip.startswith("10.99.0.") and running["PublicIpAddress"]["IpAddress"] == [ip]
    assert (running["InstanceName"], running["ZoneId"], running["RegionId"]) == ("ngcx-a10", ZONE_I, "cn-hangzhou")
    assert (running["GPUAmount"], running["GPUSpec"], running["StoppedMode"]) == (1, "NVIDIA A10", "Not-applicable")
    assert running["Tags"]["Tag"] == [{"TagKey": "ngcx:deployment", "TagValue": "d1"}]
    [private_only] = launch(client)
    [shown] = wait_status(client, [private_only], "Running")
    assert shown["PublicIpAddress"]["IpAddress"] == [] and "Tags" not in shown


def test_client_token_same_params_same_instance_other_params_mismatch(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    first = launch(client, ClientToken="deploy-42")
    again = launch(client, ClientToken="deploy-42")
    assert first == again and len(emu.instances()) == 1 and emu.instances()[0]["client_token"] == "deploy-42"
    error = server_error(client, run_request(ClientToken="deploy-42", InstanceName="other"))
    assert (error.get_http_status(), error.get_error_code()) == (400, "IdempotentParameterMismatch")
    wait_status(client, first, "Running")
    assert len(hosts.named("create")) == 1 and emu.performed("RunInstances") == 1


def test_throttling_is_retried_by_the_sdk_then_succeeds(emu: EcsEmulator) -> None:
    emu.fail_next("RunInstances", "Throttling", 400)
    ids = launch(sdk(emu))
    assert len(ids) == 1 and len(emu.instances()) == 1
    assert [a for a, _ in emu.calls].count("RunInstances") == 2
    emu.fail_next("RunInstances", "Throttling.User", 400)      # not on the SDK's retry list
    assert server_error(sdk(emu), run_request()).get_error_code() == "Throttling.User"


def test_sdk_retry_without_client_token_duplicates_instance_trap(emu: EcsEmulator) -> None:
    """The cloud created the instance but the answer was a 503: the SDK re-sends RunInstances
    with no ClientToken (its _add_request_client_token is dead code), so a second one is billed."""
    emu.fail_next("RunInstances", "ServiceUnavailable", 503, after_effect=True)
    ids = launch(sdk(emu))
    assert len(ids) == 1 and len(emu.instances()) == 2 and emu.performed("RunInstances") == 2
    sent = [params for action, params in emu.calls if action == "RunInstances"]
    assert len(sent) == 2 and all("ClientToken" not in params for params in sent)


def test_sdk_retry_with_a_client_token_does_not_duplicate(emu: EcsEmulator) -> None:
    emu.fail_next("RunInstances", "InternalError", 500, after_effect=True)
    ids = launch(sdk(emu), ClientToken="deploy-43")
    assert [i["id"] for i in emu.instances()] == ids and emu.performed("RunInstances") == 1


def test_without_auto_retry_the_lost_answer_reaches_the_caller(emu: EcsEmulator) -> None:
    emu.fail_next("RunInstances", "ServiceUnavailable", 503, after_effect=True)
    error = server_error(sdk(emu, auto_retry=False), run_request())
    assert (error.get_http_status(), error.get_error_code()) == (503, "ServiceUnavailable")
    assert len(emu.instances()) == 1   # created all the same: only a ClientToken retry finds it again


def test_no_stock_and_unsupported_types_per_zone(emu: EcsEmulator) -> None:
    client = sdk(emu)
    emu.set_stock(ZONE_H, A10, False)
    error = server_error(client, run_request(zone=ZONE_H))
    assert (error.get_http_status(), error.get_error_code()) == (403, "OperationDenied.NoStock")
    assert launch(client, zone=ZONE_I)
    error = server_error(client, run_request(zone=ZONE_H, itype="ecs.gn8is.2xlarge"))
    assert (error.get_http_status(), error.get_error_code()) == (403, "InvalidInstanceType.ZoneNotSupported")
    assert launch(client, zone=ZONE_J, itype="ecs.gn8is.2xlarge")
    error = server_error(client, run_request(itype="ecs.gn99-made-up"))
    assert (error.get_http_status(), error.get_error_code()) == (400, "InvalidInstanceType.ValueNotSupported")
    error = server_error(client, run_request(image="no_such_image.vhd"))
    assert (error.get_http_status(), error.get_error_code()) == (404, "InvalidImageId.NotFound")
    [picked] = launch(client, zone="")          # no zone: the cloud picks one that has stock
    assert next(i["zone"] for i in emu.instances() if i["id"] == picked) == ZONE_I
    assert emu.performed("RunInstances") == 3


def test_user_data_must_be_base64_and_at_most_16_kib(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    error = server_error(client, run_request(UserData="#!/bin/sh not base64!"))
    assert (error.get_http_status(), error.get_error_code()) == (400, "InvalidUserData.Base64FormatInvalid")
    error = server_error(client, run_request(UserData=base64.b64encode(b"x" * (16 * 1024 + 1)).decode()))
    assert error.get_error_code() == "InvalidUserData.SizeExceeded"
    error = server_error(client, run_request(Amount=101))
    assert (error.get_http_status(), error.get_error_code()) == (400, "InvalidParameter")
    [instance_id] = launch(client, UserData=base64.b64encode(b"y" * 16 * 1024).decode())
    wait_status(client, [instance_id], "Running")
    assert hosts.named("create")[0][3] == b"y" * 16 * 1024


# --- the state machine ---------------------------------------------------------------------

def test_stop_start_keepcharging_stopcharging_and_restart_without_stock(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    [iid] = launch(client, InternetMaxBandwidthOut=5)
    wait_status(client, [iid], "Running")
    error = server_error(client, _start_request(iid))
    assert (error.get_http_status(), error.get_error_code()) == (403, "IncorrectInstanceStatus")

    stop(client, iid)                                             # KeepCharging: GPU and public IP kept
    assert emu.instances()[0]["status"] == "Stopping"
    [stopped] = wait_status(client, [iid], "Stopped")
    assert stopped["StoppedMode"] == "KeepCharging" and stopped["PublicIpAddress"]["IpAddress"]
    error = server_error(client, _stop_request(iid))
    assert error.get_error_code() == "IncorrectInstanceStatus"
    emu.set_stock(ZONE_I, A10, False)
    start(client, iid)                                            # KeepCharging needs no new stock
    [running] = wait_status(client, [iid], "Running")
    assert running["StoppedMode"] == "Not-applicable"

    stop(client, iid, "StopCharging")                             # economical: GPU and public IP released
    [stopped] = wait_status(client, [iid], "Stopped")
    assert stopped["StoppedMode"] == "StopCharging" and stopped["PublicIpAddress"]["IpAddress"] == []
    assert stopped["VpcAttributes"]["PrivateIpAddress"]["IpAddress"]
    error = server_error(client, _start_request(iid))
    assert (error.get_http_status(), error.get_error_code()) == (403, "OperationDenied.NoStock")
    assert describe(client, [iid])["Instances"]["Instance"][0]["Status"] == "Stopped"
    emu.set_stock(ZONE_I, A10, True)
    start(client, iid)
    [running] = wait_status(client, [iid], "Running")
    new_ip = running["PublicIpAddress"]["IpAddress"][0]
    assert new_ip == running["VpcAttributes"]["PrivateIpAddress"]["IpAddress"][0] != stopped["VpcAttributes"][
        "PrivateIpAddress"]["IpAddress"][0]
    assert [c[0] for c in hosts.calls if c[1] == iid] == ["create", "stop", "start", "stop", "start"]

    emu.fail_restart(iid)                                         # the next start fails once, whatever the mode
    stop(client, iid)
    wait_status(client, [iid], "Stopped")
    assert server_error(client, _start_request(iid)).get_error_code() == "OperationDenied.NoStock"
    start(client, iid)
    wait_status(client, [iid], "Running")


def _start_request(instance_id: str) -> StartInstanceRequest.StartInstanceRequest:
    request = StartInstanceRequest.StartInstanceRequest()
    request.set_InstanceId(instance_id)
    return request


def _stop_request(instance_id: str) -> StopInstanceRequest.StopInstanceRequest:
    request = StopInstanceRequest.StopInstanceRequest()
    request.set_InstanceId(instance_id)
    return request


def test_batch_stop_answers_each_instance(emu: EcsEmulator) -> None:
    client = sdk(emu)
    ids = launch(client, Amount=2)
    wait_status(client, ids, "Running")
    request = StopInstancesRequest.StopInstancesRequest()
    request.set_InstanceIds(ids)
    answer = call(client, request)["InstanceResponses"]["InstanceResponse"]
    assert [(a["InstanceId"], a["PreviousStatus"], a["CurrentStatus"]) for a in answer] == [
        (i, "Running", "Stopping") for i in ids]
    wait_status(client, ids, "Stopped")


def test_delete_only_stopped_unless_forced(emu: EcsEmulator, hosts: PaperHosts) -> None:
    client = sdk(emu)
    keep, force = launch(client, Amount=2)
    wait_status(client, [keep, force], "Running")
    request = DeleteInstanceRequest.DeleteInstanceRequest()
    request.set_InstanceId(force)
    assert server_error(client, request).get_error_code() == "IncorrectInstanceStatus"
    request.set_Force(True)
    call(client, request)
    assert [i["InstanceId"] for i in describe(client)["Instances"]["Instance"]] == [keep]
    stop(client, keep)
    wait_status(client, [keep], "Stopped")
    plural = DeleteInstancesRequest.DeleteInstancesRequest()
    plural.set_InstanceIds([keep])
    call(client, plural)
    assert describe(client)["TotalCount"] == 0
    error = server_error(client, plural)
    assert (error.get_http_status(), error.get_error_code()) == (404, "InvalidInstanceId.NotFound")
    deadline = time.monotonic() + 5
    while hosts.machines and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(c[1] for c in hosts.named("delete")) == sorted([keep, force]) and not hosts.machines


@pytest.mark.parametrize("boot_seconds, expect", [
    (0.0, ["create", "delete"]),   # deleted while the machine is being made: made, then removed
    (2.0, []),                     # deleted while Pending: the machine is never powered on
])
def test_deleted_while_booting_leaves_no_machine(boot_seconds: float, expect: list[str]) -> None:
    slow = PaperHosts(create_delay=0.3)
    with EcsEmulator(slow, boot_seconds=boot_seconds) as emu:
        client = sdk(emu)
        [iid] = launch(client)
        if expect:
            deadline = time.monotonic() + 5
            while not slow.named("create") and time.monotonic() < deadline:
                time.sleep(0.01)
        request = DeleteInstanceRequest.DeleteInstanceRequest()
        request.set_InstanceId(iid)
        request.set_Force(True)
        call(client, request)
        deadline = time.monotonic() + 5
        while len(slow.calls) < len(expect) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(boot_seconds + 0.1)           # a Pending boot that would wrongly go on has had its chance
        assert [c[0] for c in slow.calls] == expect and not slow.machines
        assert describe(client)["TotalCount"] == 0


# --- DescribeInstances ----------------------------------------------------------------------

def test_paging_and_filters(emu: EcsEmulator) -> None:
    client = sdk(emu)
    blue = launch(client, Amount=12, Tags=[{"Key": "team", "Value": "blue"}])
    red = launch(client, zone=ZONE_H, Tags=[{"Key": "team", "Value": "red"}, {"Key": "tier", "Value": "gpu"}])
    first = describe(client, PageSize=5)
    assert (first["TotalCount"], first["PageNumber"], first["PageSize"]) == (13, 1, 5)
    pages = [describe(client, PageSize=5, PageNumber=n)["Instances"]["Instance"] for n in (1, 2, 3)]
    assert [len(p) for p in pages] == [5, 5, 3]
    assert [i["InstanceId"] for p in pages for i in p] == blue + red
    assert len(describe(client)["Instances"]["Instance"]) == 10          # the default PageSize
    assert [i["InstanceId"] for i in describe(client, Tags=[{"Key": "team", "Value": "red"}])["Instances"][
        "Instance"]] == red
    assert describe(client, Tags=[{"Key": "team", "Value": "blue"}, {"Key": "tier"}])["TotalCount"] == 0
    assert describe(client, Tags=[{"Key": "tier"}])["TotalCount"] == 1
    assert describe(client, ZoneId=ZONE_H)["TotalCount"] == 1
    assert describe(client, [blue[0], red[0]])["TotalCount"] == 2
    assert describe(client, InstanceType="ecs.gn6i-c4g1.xlarge")["TotalCount"] == 0
    assert server_error(client, _describe_page_size(101)).get_error_code() == "InvalidParameter"


def _describe_page_size(size: int) -> DescribeInstancesRequest.DescribeInstancesRequest:
    request = DescribeInstancesRequest.DescribeInstancesRequest()
    request.set_PageSize(size)
    return request
