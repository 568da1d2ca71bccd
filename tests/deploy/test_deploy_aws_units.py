"""The AWS target's pieces that need no engine: credentials, region, endpoints, retries, errors, ECR.

Real boto3 against the AWS test double (moto's server behind tests/emulators/aws_ec2.py, on paper
machines: nothing boots, no Docker), so every error arrives in AWS's wire shape. What a user would
notice: a wrong secret is one line without the secret; throttling and a lost answer never make a
second instance (the same ClientToken on every retry of one attempt); no capacity is a CapacityError
for the failover, not a retry; a script sent through SSM runs once; the profile's region and
AWS_ENDPOINT_URL(_EC2) are honoured as the AWS CLI honours them; boto3 missing names the extra.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators.aws_ec2 import Ec2Emulator
from emulators.hosts_api import CommandResult, PaperHosts

from ngcx.clouds.aws import Api, AwsError, default_region, session
from ngcx.core.errors import UserError
from ngcx.deploy import vm
from ngcx.deploy.aws import ec2
from ngcx.deploy.aws import verbs as aws
from ngcx.deploy.common import CapacityError, DeployConfig
from ngcx.registry import ecr

KEY, SECRET = "AKIAUNITTEST00000001", "unit-secret-never-printed-51f2"
AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
            "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_SSM",
            "AWS_ENDPOINT_URL_ECR", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "NGCX_ECR_ENDPOINT",
            "NGCX_ECR_VPC_ENDPOINT", "NGCX_ECR_REGION", "NGCX_ECR_TAG_MUTABILITY", "NGCX_AWS_INSTANCE_PROFILE",
            "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


class PaperMachines(PaperHosts):
    """The emulator's HostBackend without machines: a command's output names the command, `exit N` exits N."""

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        super().run_command(instance_id, script, timeout)
        code = int(script.split("exit ", 1)[1].split()[0]) if "exit " in script else 0
        return CommandResult(code, f"ran on {instance_id}: {script[:40]}\n")


@pytest.fixture(scope="module")
def emulator() -> Iterator[Ec2Emulator]:
    with Ec2Emulator(PaperMachines(), access_keys={KEY: SECRET}, boot_seconds=0.2, start_seconds=0.2) as emu:
        yield emu
        assert emu.proxy_errors == []


@pytest.fixture
def clean_env(monkeypatch, tmp_path) -> Path:
    """No AWS settings of this machine leak in; HOME has no ~/.aws; the metadata service is not asked."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


@pytest.fixture
def env(clean_env, monkeypatch, emulator) -> Ec2Emulator:
    monkeypatch.setenv("AWS_ENDPOINT_URL", emulator.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return emulator


@pytest.fixture
def cloud(env) -> ec2.Ec2:
    host = ec2.cloud_for("us-east-1")
    host.api.deadline_s = 20.0
    host.prepare_network("10.0.0.0/8")
    return host


def spec(cloud: ec2.Ec2, token: str, zone: str = "us-east-1a", **extra) -> vm.CreateSpec:
    return vm.CreateSpec("g5.xlarge", zone, cloud.fallback_image(), "#!/bin/sh\necho hi\n", token,
                         {vm.TAG_OWNER: "unit", vm.TAG_DEPLOYMENT: token}, f"ngcx-{token}", **extra)


def wire(emulator: Ec2Emulator, action: str) -> list[dict]:
    return [params for name, params in emulator.calls if name == action]


# --- credentials, region, endpoints ------------------------------------------------------------------

def test_region_comes_from_aws_region_then_aws_default_region_then_the_profile(clean_env, monkeypatch):
    config = clean_env / "config"
    config.write_text("[default]\nregion = eu-west-1\n[profile work]\nregion = ap-northeast-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    assert default_region() == "eu-west-1"
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert default_region() == "ap-northeast-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert default_region() == "us-west-2"
    monkeypatch.setenv("AWS_REGION", "eu-central-1")           # the AWS CLI v2 order: AWS_REGION wins
    assert default_region() == "eu-central-1"
    assert aws.region_of(DeployConfig("aws", "img", None, None, {}, None, region="sa-east-1")) == "sa-east-1"


def test_without_any_setting_the_region_is_us_east_1(clean_env):
    assert aws.default_region() == "us-east-1"


def test_a_profile_missing_from_the_aws_files_is_one_line(clean_env, monkeypatch):
    monkeypatch.setenv("AWS_PROFILE", "nope")
    with pytest.raises(UserError, match=r"AWS profile 'nope' \(AWS_PROFILE\) is not in"):
        session()


def test_a_profile_in_the_credentials_file_signs_the_requests(env, monkeypatch, clean_env):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds = clean_env / "credentials"
    creds.write_text(f"[team]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert aws.has_credentials()
    ec2.cloud_for("us-east-1").check()       # the emulator verifies the SigV4 signature with that key


def test_one_session_serves_a_command_until_its_credentials_change_and_each_thread_has_its_own(clean_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    first = session()
    assert session() is first                       # one command's calls share it, and the models it parsed
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret-7d1c")
    changed = session()
    assert changed is not first and changed.get_credentials().secret_key == "another-secret-7d1c"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (clean_env / ".aws").mkdir()
    (clean_env / ".aws" / "credentials").write_text("[default]\naws_access_key_id = AKIAFILE\n"
                                                    "aws_secret_access_key = from-the-file\n")
    assert session().get_credentials().secret_key == "from-the-file"     # a credentials file written since
    made: list = []
    worker = threading.Thread(target=lambda: made.append(session()))
    worker.start()
    worker.join()
    assert made[0] is not session()                 # botocore sessions are not thread-safe: one per thread


def test_aws_endpoint_url_reaches_every_client_and_a_service_variable_overrides_it(clean_env, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:4599")
    api = Api("us-east-1")
    assert api.client("ssm").meta.endpoint_url == "http://127.0.0.1:4566"
    assert api.client("ecr").meta.endpoint_url == "http://127.0.0.1:4566"
    assert api.client("ec2").meta.endpoint_url == "http://127.0.0.1:4599"
    assert api.client("ec2").meta.config.retries["total_max_attempts"] == 1   # ngcx retries, botocore does not


def test_no_credentials_is_one_line_that_says_credentials(clean_env):
    assert not aws.has_credentials()
    with pytest.raises(UserError) as err:
        ec2.cloud_for("us-east-1").check()
    assert "no AWS credentials found" in err.value.line() and "\n" not in err.value.line()


def test_a_wrong_secret_is_one_line_naming_its_source_without_the_secret(env, monkeypatch):
    wrong = "wrong-secret-9d1e-never-printed"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    for call in (lambda: ec2.cloud_for("us-east-1").check(),                 # EC2: AuthFailure
                 lambda: Api("us-east-1").call("ssm", "get_parameter", Name=ec2.GPU_AMI_PARAMETER)):  # SSM
        with pytest.raises(UserError) as err:
            call()
        line = err.value.line()
        assert "AWS rejected the credentials" in line and "AWS_ACCESS_KEY_ID" in line and KEY[-4:] in line
        assert wrong not in line and SECRET not in line and KEY not in line


def test_a_missing_sdk_names_the_extra(clean_env, monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)     # `import boto3` now raises ImportError
    with pytest.raises(UserError, match=r"pip install 'ngcx\[aws\]'"):
        session()


# --- retries, tokens, capacity -------------------------------------------------------------------------

def test_throttling_and_a_lost_answer_resend_the_same_token_and_make_one_instance(cloud, env):
    before = env.performed("RunInstances")
    env.fail_next("RunInstances", "RequestLimitExceeded", 503, times=2)
    env.fail_next("RunInstances", "InternalError", 500, after_effect=True)     # made, answer lost
    instance_id = cloud.create(spec(cloud, "unit-token-1"))
    tokens = [p["ClientToken"] for p in wire(env, "RunInstances")[-4:]]
    assert tokens == ["unit-token-1"] * 4
    assert env.performed("RunInstances") - before == 1
    [made] = [i for i in env.instances() if i["client_token"] == "unit-token-1"]
    assert made["id"] == instance_id and made["tags"][vm.TAG_DEPLOYMENT] == "unit-token-1"
    assert made["volume_ids"], "the volumes carry the tags too (TagSpecifications for volume)"


def test_no_capacity_is_a_capacity_error_for_the_failover_not_a_retry(cloud, env):
    env.set_capacity("us-east-1b", "g5.xlarge", False)
    try:
        sent = len(wire(env, "RunInstances"))
        with pytest.raises(CapacityError) as err:
            cloud.create(spec(cloud, "unit-token-2", zone="us-east-1b"))
        assert (err.value.code, err.value.where) == ("InsufficientInstanceCapacity", "us-east-1b")
        assert len(wire(env, "RunInstances")) == sent + 1
    finally:
        env.set_capacity("us-east-1b", "g5.xlarge", True)


def test_a_permission_error_is_one_line_naming_the_call(env, monkeypatch):
    api = Api("us-east-1", deadline_s=5)
    env.fail_next("DescribeInstances", "UnauthorizedOperation", 403)
    with pytest.raises(UserError, match=r"AWS DescribeInstances: the credentials from .* may not call it") as err:
        api.call("ec2", "describe_instances")
    assert "grant ec2:DescribeInstances" in err.value.line()


def test_zones_are_those_that_sell_the_type_and_have_a_default_subnet(cloud, env):
    assert cloud.zones_for("g5.xlarge", None) == list(env.zones)
    assert cloud.zones_for("g5.xlarge", "us-east-1c") == ["us-east-1c"]
    assert cloud.zones_for("g5.xlarge", "us-east-1d") == []     # not in this region's available zones
    assert cloud.zones_for("p5.48xlarge", None) != cloud.zones_for("no.such-type", None) == []


def test_the_network_is_made_once_and_a_second_deploy_finds_it(cloud, env):
    made = [len(wire(env, action)) for action in ("CreateSecurityGroup", "CreateInstanceProfile",
                                                  "AuthorizeSecurityGroupIngress")]
    again = ec2.cloud_for("us-east-1")
    again.prepare_network("10.0.0.0/8")
    assert again.security_group == cloud.security_group and again.instance_profile == ec2.INSTANCE_PROFILE
    assert [len(wire(env, action)) for action in ("CreateSecurityGroup", "CreateInstanceProfile",
                                                  "AuthorizeSecurityGroupIngress")] == made
    wider = ec2.cloud_for("us-east-1")
    wider.prepare_network("192.168.0.0/16")          # another --allow-from: one more rule on the same group
    assert wider.security_group == cloud.security_group
    assert len(wire(env, "AuthorizeSecurityGroupIngress")) == made[2] + 1


# --- the command channel --------------------------------------------------------------------------------

def test_a_command_runs_once_through_ssm_with_its_exit_code_and_output(cloud, env):
    instance_id = cloud.create(spec(cloud, "unit-token-3"))
    vm.wait_state(cloud, instance_id, "running", 30)
    assert cloud.run_command(instance_id, "echo fine", 30) == (0, f"ran on {instance_id}: echo fine\n")
    code, output = cloud.run_command(instance_id, "echo nope; exit 3", 30)
    assert code == 3 and "echo nope" in output
    env.fail_next("SendCommand", "InternalServerError", 500, after_effect=True)   # it ran; the answer got lost
    sent = len(wire(env, "SendCommand"))
    with pytest.raises(AwsError, match="InternalServerError"):
        cloud.run_command(instance_id, "echo once", 30)
    assert len(wire(env, "SendCommand")) == sent + 1, "a script that may have run is never sent again"


def test_an_instance_without_an_instance_profile_is_unreachable_in_one_line(cloud, env, monkeypatch):
    monkeypatch.setattr(ec2, "AGENT_WAIT_S", 0.5)
    cloud.instance_profile = None
    instance_id = cloud.create(spec(cloud, "unit-token-4"))
    vm.wait_state(cloud, instance_id, "running", 30)
    with pytest.raises(UserError, match="SSM Run Command cannot reach") as err:
        cloud.run_command(instance_id, "true", 10)
    assert "AmazonSSMManagedInstanceCore" in err.value.line()


def test_the_ssm_agent_check_goes_after_the_shebang():
    text = ec2.with_ssm_agent("#!/bin/sh\n# ngcx host script\necho run\n")
    assert text.startswith("#!/bin/sh\nif ! systemctl is-active") and text.endswith("# ngcx host script\necho run\n")


# --- ECR ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, parsed", [("ecr://us-east-1", ("us-east-1", "")),
                                         ("ecr://eu-west-2/team", ("eu-west-2", "team")),
                                         ("ecr://cn-north-1/team/sub", ("cn-north-1", "team/sub")),
                                         ("registry.example.com/ns", None)])
def test_ecr_urls(url, parsed):
    assert ecr.parse(url) == parsed


@pytest.mark.parametrize("url", ["ecr://", "ecr://US-EAST-1", "ecr://us-east-1/Team", "ecr://us-east-1/a//b"])
def test_a_malformed_ecr_url_is_one_line(url):
    with pytest.raises(UserError, match=r"is not ecr://REGION\[/REPO\]"):
        ecr.parse(url)


def test_an_ecr_host_names_its_region(clean_env, monkeypatch):
    assert ecr.region_of("123456789012.dkr.ecr.eu-west-1.amazonaws.com") == "eu-west-1"
    assert ecr.region_of("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn") == "cn-north-1"
    assert ecr.region_of("registry.cn-hangzhou.aliyuncs.com") is None
    monkeypatch.setenv("NGCX_ECR_ENDPOINT", "127.0.0.1:5000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert ecr.region_of("127.0.0.1:5000") == "us-west-2"


def test_the_ecr_login_and_endpoint_come_from_one_token(env):
    creds = ecr.temporary_login("us-east-1")
    assert creds.username == "AWS" and creds.password
    assert ecr.endpoint("us-east-1") == "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def test_a_missing_repository_is_created_with_the_chosen_mutability_and_an_existing_one_left_alone(env, monkeypatch):
    assert ecr.ensure_repository("us-east-1", "team/app") == "MUTABLE"
    assert ecr.ensure_repository("us-east-1", "team/app", "IMMUTABLE") == "MUTABLE"   # exists: not changed
    monkeypatch.setenv("NGCX_ECR_TAG_MUTABILITY", "immutable")
    assert ecr.ensure_repository("us-east-1", "team/locked") == "IMMUTABLE"
    [created] = [p for p in wire(env, "CreateRepository") if p["repositoryName"] == "team/locked"]
    assert created["imageTagMutability"] == "IMMUTABLE"
    with pytest.raises(UserError, match="mutability 'SOMETIMES'"):
        ecr.ensure_repository("us-east-1", "team/other", "sometimes")

