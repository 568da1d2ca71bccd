"""Every Alibaba Cloud request ngcx made in this test session conforms to the official API models (issue 47).

What a user notices: on the real cloud an unknown parameter is refused or silently ignored (an ESS lookup whose
filter is ignored answers every group in the region). The models are Alibaba's own (cli/clouds/aliyun_models.yaml,
generated from the v2 SDKs); the record is what the emulators' gateways received (conftest.py here turns it on
and runs these tests last). Judged: ngcx's own requests (the CLI's SDK client and the host's role login name
themselves in their User-Agent) — action known in that product and version, every parameter name known,
required ones present, JSON-style values parsing. A test's hand-made requests (some wrong on purpose) are not
judged here: the gateway answers them from the same models at once.

Run alone (`pytest tests/conformance`), the session records nothing, so the test runs the Alibaba Cloud API
tests (ALIYUN_TESTS) in a child pytest with the record on and the gateways' own check off, and judges that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aliyunsdkcore.acs_exception.exceptions import ServerException
from aliyunsdkcore.client import AcsClient
from aliyunsdkcore.request import CommonRequest
from emulators.aliyun_ecs import EcsEmulator
from emulators.aliyun_models_check import REQUEST_LOG_ENV
from emulators.hosts_api import PaperHosts
from judge import findings, requests_in

from ngcx.clouds.aliyun import AliyunCredentials, AliyunError, Api

TESTS = Path(__file__).resolve().parents[1]
ALIYUN_TESTS = ["emulators/test_aliyun_alb.py", "emulators/test_aliyun_ess.py", "emulators/test_aliyun_ess_alarms.py",
                "emulators/test_aliyun_ess_refresh.py", "emulators/test_aliyun_ess_spot.py",
                "emulators/test_aliyun_ram.py", "emulators/test_ecs_emulator.py",
                "emulators/test_ecs_images_commands.py", "deploy/test_aliyun_alb_client.py",
                "deploy/test_aliyun_ess_client.py", "deploy/test_aliyun_command_channel.py",
                "deploy/test_aliyun_acr_personal.py", "deploy/test_role_login.py", "deploy/test_vm_paths.py"]
PRODUCTS_EXERCISED = {"ecs", "alb", "ess", "ram", "cr"}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK sends even 127.0.0.1 through HTTP(S)_PROXY (it ignores NO_PROXY)."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


def _session_record() -> list[dict[str, Any]]:
    ngcx = [r for r in requests_in(Path(os.environ[REQUEST_LOG_ENV])) if r.get("sender") == "ngcx"]
    if {r["product"] for r in ngcx} >= PRODUCTS_EXERCISED:
        return ngcx
    log = Path(os.environ[REQUEST_LOG_ENV]).with_name("child-requests.jsonl")
    env = {**os.environ, REQUEST_LOG_ENV: str(log), "NGCX_ALIYUN_MODEL_CHECK": "off"}
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header",
                            *[str(TESTS / t) for t in ALIYUN_TESTS]], cwd=TESTS.parent, env=env,
                           capture_output=True, text=True, timeout=1200)
    record = [r for r in requests_in(log) if r.get("sender") == "ngcx"]
    # A failing test there still leaves its requests to judge (its own failure is reported where it runs);
    # a record without every product means those tests did not run at all.
    assert {r["product"] for r in record} >= PRODUCTS_EXERCISED, f"the Alibaba Cloud tests: {child.stdout[-2000:]}"
    return record


def test_every_request_ngcx_sent_to_alibaba_cloud_conforms_to_the_official_models() -> None:
    record = _session_record()
    products = {r["product"] for r in record}
    assert products >= PRODUCTS_EXERCISED, f"ngcx's requests to {sorted(products)} only: the record is not on"
    problems = findings(record)
    assert not problems, "requests the real API refuses:\n" + "\n".join(problems)


@pytest.fixture
def emu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EcsEmulator]:
    monkeypatch.setenv(REQUEST_LOG_ENV, str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("NGCX_ALIYUN_ECS_ENDPOINT", "127.0.0.1:1")         # replaced once the port is known
    with EcsEmulator(PaperHosts()) as emulator:
        monkeypatch.setenv("NGCX_ALIYUN_ECS_ENDPOINT", emulator.endpoint)
        yield emulator


def _ngcx_sdk_request(emu: EcsEmulator, action: str, params: dict[str, str]) -> ServerException:
    """A request as ngcx's SDK client would send it, had the CLI not checked it first."""
    client = AcsClient("test-ak", "test-secret", "cn-hangzhou", port=emu.port, auto_retry=False, max_retry_time=0)
    client.append_user_agent("ngcx", "cli")
    request = CommonRequest(domain="127.0.0.1", version="2022-02-22", action_name=action, product="Ess")
    request.set_method("POST")
    request.set_protocol_type("http")
    for key, value in params.items():
        request.add_query_param(key, value)
    with pytest.raises(ServerException) as info:
        client.do_action_with_exception(request)
    return info.value


def test_a_misspelled_parameter_fails_the_judge_the_emulator_and_the_cli(emu: EcsEmulator, tmp_path: Path) -> None:
    # 2014-08-28's singular spelling with 2022-02-22: what `--min/--max` services sent before issue 47
    refused = _ngcx_sdk_request(emu, "DescribeScalingGroups", {"ScalingGroupId.1": "asg-1"})
    assert (refused.get_http_status(), refused.get_error_code()) == (400, "InvalidParameter")
    assert '"ScalingGroupId.1"' in refused.get_error_msg()
    record = requests_in(tmp_path / "requests.jsonl")
    assert [r["action"] for r in record] == ["DescribeScalingGroups"]
    assert findings(record) == [
        'ess 2022-02-22 DescribeScalingGroups: InvalidParameter: The specified parameter "ScalingGroupId.1" is not '
        "valid: ess 2022-02-22 DescribeScalingGroups has no such parameter."]

    api = Api("cn-hangzhou", AliyunCredentials("test-ak", "test-secret", "a test"))
    with pytest.raises(AliyunError) as info:                      # the CLI refuses it before it leaves
        api.ess("DescribeScalingGroups", {"ScalingGroupId.1": "asg-1"})
    assert info.value.code == "InvalidParameter" and "ScalingGroupId.1" in info.value.line()
    assert len(requests_in(tmp_path / "requests.jsonl")) == 1     # nothing more was sent
    assert api.ess("DescribeScalingGroups", {"ScalingGroupIds.1": "asg-1"})["ScalingGroups"]["ScalingGroup"] == []


@pytest.mark.parametrize(("product", "version", "action", "params", "code"), [
    ("ess", "2022-02-22", "CreateScalingRule", {"ScalingGroupId": "asg-1", "ClientToken": "t"}, "InvalidParameter"),
    ("ess", "2022-02-22", "CreateScalingGroup", {"MaxSize": "1"}, "MissingParameter"),
    ("ess", "2014-08-28", "CreateAlarm", {"ScalingGroupId": "g", "AlarmActions.1": "ari"}, "InvalidParameter"),
    ("cr", "2018-12-01", "GetAuthorizationToken", {}, "MissingParameter"),
    ("ecs", "2014-05-26", "RunCommand", {"Type": "RunShellScript", "CommandContent": "x", "Parameters": "{"},
     "InvalidParameter"),
    ("alb", "2020-06-16", "NoSuchAction", {}, "InvalidAction.NotFound"),
])
def test_the_judge_names_each_kind_of_refusal(product: str, version: str, action: str, params: dict[str, str],
                                              code: str) -> None:
    problems = findings([{"product": product, "version": version, "action": action, "params": params}])
    assert len(problems) == 1 and f": {code}: " in problems[0], json.dumps(problems)
