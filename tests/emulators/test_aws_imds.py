"""Instance roles on the AWS double (tests/emulators/aws_imds.py): IMDSv2 on `metadata_address`, the role's
session credentials it hands out, and what the harness lets those credentials do.

What a product developer relies on: a host launched with an instance profile gets its role's credentials
only through IMDSv2 (a token first; v1, forwarded PUTs and strangers refused); ECR GetAuthorizationToken
signed with them works only when the role's policies allow it, and only with the session token, before
it expires; `token_grants` says who got each registry password and what it may pull; replacing the
profile association changes the role the host sees at once.

The machines are paper (nothing runs) but their addresses are loopback ones, so this test process,
binding its socket to such an address, is that machine as far as IMDS can tell. One emulator serves the
module (moto's first IAM call loads every AWS managed policy, about a second, and so does its reset);
each test terminates what it launched, so an address names one running instance at a time.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
import pytest
from botocore.config import Config

from emulators.aws_ec2 import Ec2Emulator
from emulators.hosts_api import LoopbackHosts
from emulators.test_aws_emulator import client, error_of, gpu_ami, launch, until

REGION = "us-east-1"
ACCOUNT = "123456789012"
SSM_CORE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
APP_REPO = f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/ngcx/app"
PULL_APP = [{"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
            {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                           "ecr:BatchCheckLayerAvailability"], "Resource": APP_REPO}]
IMDS_V2 = {"HttpTokens": "required", "HttpEndpoint": "enabled"}
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Ec2Emulator, LoopbackHosts]]:
    hosts = LoopbackHosts()
    with Ec2Emulator(hosts, boot_seconds=0.1, start_seconds=0.1) as emulator:
        yield emulator, hosts


@pytest.fixture
def cloud(shared: tuple[Ec2Emulator, LoopbackHosts]) -> Iterator[tuple[Ec2Emulator, LoopbackHosts]]:
    emulator, hosts = shared
    hosts.addresses.clear()
    yield emulator, hosts
    left = [i["id"] for i in emulator.instances() if i["state"] not in ("terminated", "shutting-down")]
    if left:
        client(emulator, "ec2").terminate_instances(InstanceIds=left)
    assert emulator.proxy_errors == [] and emulator.host_errors == []


def view_of(emulator: Ec2Emulator, instance_id: str) -> dict[str, Any]:
    [view] = [i for i in emulator.instances() if i["id"] == instance_id]
    return view


# --- helpers -----------------------------------------------------------------------------------------

def make_role(emulator: Ec2Emulator, name: str, statements: Sequence[dict[str, Any]] = (),
              managed: Sequence[str] = (SSM_CORE,)) -> str:
    """A role EC2 may assume, its inline policy and managed attachments, and an instance profile of the
    same name holding it (what the CLI creates per repository). Returns the profile's ARN."""
    iam = client(emulator, "iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                                     "Action": "sts:AssumeRole"}]}
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    if statements:
        iam.put_role_policy(RoleName=name, PolicyName="ngcx-pull", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": list(statements)}))
    for arn in managed:
        iam.attach_role_policy(RoleName=name, PolicyArn=arn)
    arn = iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Arn"]
    iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return arn


def running(emulator: Ec2Emulator, **extra: Any) -> str:
    ec2 = client(emulator, "ec2")
    instance_id = launch(ec2, gpu_ami(emulator), **extra)["InstanceId"]
    until("running", lambda: view_of(emulator, instance_id)["state"] == "running")
    return instance_id


def imds(emulator: Ec2Emulator, method: str, url_path: str, headers: dict[str, str] | None = None,
         source: str = "127.0.0.1") -> tuple[int, str, dict[str, str]]:
    """One IMDS request from `source` (a machine's address): status, body, headers."""
    host, port = emulator.metadata_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(source, 0))
    try:
        conn.request(method, url_path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(), dict(answer.getheaders())
    finally:
        conn.close()


def token(emulator: Ec2Emulator, source: str = "127.0.0.1", ttl: str = "21600") -> str:
    status, body, _ = imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": ttl},
                           source)
    assert status == 200, body
    return body


def read(emulator: Ec2Emulator, url_path: str, source: str = "127.0.0.1") -> tuple[int, str]:
    status, body, _ = imds(emulator, "GET", url_path, {"X-aws-ec2-metadata-token": token(emulator, source)}, source)
    return status, body


def host_credentials(emulator: Ec2Emulator) -> dict[str, str]:
    """What the host script does, with urllib as it will: a token, the role's name, the role's keys."""
    base = f"http://{emulator.metadata_address}/latest"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    put = urllib.request.Request(base + "/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
    with opener.open(put, timeout=5) as answer:
        session = answer.read().decode()
        assert answer.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"

    def get(suffix: str) -> str:
        request = urllib.request.Request(base + suffix, headers={"X-aws-ec2-metadata-token": session})
        with opener.open(request, timeout=5) as answer:
            return answer.read().decode()
    role = get("/meta-data/iam/security-credentials/").strip()
    return {"Role": role, **json.loads(get(f"/meta-data/iam/security-credentials/{role}"))}


def as_role(emulator: Ec2Emulator, service: str, creds: dict[str, str], session_token: str | None = "",
            secret: str | None = None):
    """A boto3 client signing with the role's keys (session_token="" means: the right one)."""
    return boto3.client(service, endpoint_url=emulator.endpoint, region_name=REGION,
                        aws_access_key_id=creds["AccessKeyId"],
                        aws_secret_access_key=secret or creds["SecretAccessKey"],
                        aws_session_token=creds["Token"] if session_token == "" else session_token,
                        config=Config(retries={"total_max_attempts": 1}))


def password_of(answer: dict[str, Any]) -> str:
    [data] = answer["authorizationData"]
    return base64.b64decode(data["authorizationToken"]).decode().partition(":")[2]


# --- the host's login through its role ------------------------------------------------------------------

def test_a_host_gets_its_roles_credentials_through_imdsv2_and_logs_in_to_ecr_with_them(cloud):
    emulator, _ = cloud
    profile_arn = make_role(emulator, "ngcx-pull-app", PULL_APP)
    instance_id = running(emulator, IamInstanceProfile={"Name": "ngcx-pull-app"}, MetadataOptions=IMDS_V2)
    view = view_of(emulator, instance_id)
    assert view["instance_profile"] == "ngcx-pull-app" and view["metadata_options"]["HttpTokens"] == "required"

    creds = host_credentials(emulator)
    assert creds["Role"] == "ngcx-pull-app" and creds["Code"] == "Success" and creds["Type"] == "AWS-HMAC"
    assert creds["AccessKeyId"].startswith("ASIA") and len(creds["AccessKeyId"]) == 20
    hours = (time.mktime(time.strptime(creds["Expiration"], "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(time.gmtime())) / 3600
    assert 5.9 < hours <= 6.0
    assert host_credentials(emulator)["AccessKeyId"] == creds["AccessKeyId"], "the same keys until near expiry"
    assert read(emulator, "/latest/meta-data/instance-id") == (200, instance_id)
    assert read(emulator, "/latest/meta-data/placement/region") == (200, REGION)
    info = json.loads(read(emulator, "/latest/meta-data/iam/info")[1])
    assert info["InstanceProfileArn"] == profile_arn
    document = json.loads(read(emulator, "/latest/dynamic/instance-identity/document")[1])
    assert (document["instanceId"], document["region"], document["accountId"]) == (instance_id, REGION, ACCOUNT)

    password = password_of(as_role(emulator, "ecr", creds).get_authorization_token())
    assert emulator.token_grants[-1] == {"token": password, "caller": "role:ngcx-pull-app", "instance": instance_id,
                                         "pull": [APP_REPO]}
    assert emulator.issued_tokens[-1] == password
    assert {creds["SecretAccessKey"], creds["Token"]} <= set(emulator.issued_secrets())

    key_password = password_of(client(emulator, "ecr").get_authorization_token())
    assert key_password != password, "every grant its own password"
    assert emulator.token_grants[-1] == {"token": key_password, "caller": "key:AKIAEMULATORTEST0000",
                                         "instance": None, "pull": ["*"]}

    me = as_role(emulator, "sts", creds).get_caller_identity()
    assert me["Arn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/ngcx-pull-app/{instance_id}"
    launched = emulator.performed("RunInstances")
    code, status, message = error_of(lambda: launch(as_role(emulator, "ec2", creds), gpu_ami(emulator)))
    assert (code, status) == ("UnauthorizedOperation", 403) and "ec2:RunInstances" in message
    assert emulator.performed("RunInstances") == launched


def test_session_credentials_need_their_own_token_and_expire(cloud):
    emulator, _ = cloud
    make_role(emulator, "ngcx-pull-ec2", PULL_APP + [{"Effect": "Allow", "Action": "ec2:Describe*", "Resource": "*"}])
    running(emulator, IamInstanceProfile={"Name": "ngcx-pull-ec2"}, MetadataOptions=IMDS_V2)
    creds = host_credentials(emulator)
    grants = len(emulator.token_grants)
    assert as_role(emulator, "ec2", creds).describe_instances()["Reservations"]

    for wrong in ("not-the-token", None):
        assert error_of(lambda w=wrong: as_role(emulator, "ecr", creds, w).get_authorization_token())[:2] == (
            "UnrecognizedClientException", 400)
        assert error_of(lambda w=wrong: as_role(emulator, "ec2", creds, w).describe_instances())[:2] == (
            "AuthFailure", 401)
        assert error_of(lambda w=wrong: as_role(emulator, "sts", creds, w).get_caller_identity())[:2] == (
            "InvalidClientTokenId", 403)
    assert error_of(lambda: as_role(emulator, "ecr", creds, secret="x" * 40).get_authorization_token())[0] == \
        "InvalidSignatureException"
    assert len(emulator.token_grants) == grants, "no password for a refused caller"

    emulator.expire_session_credentials()
    code, status, message = error_of(lambda: as_role(emulator, "ecr", creds).get_authorization_token())
    assert (code, status, message) == ("ExpiredTokenException", 400,
                                       "The security token included in the request is expired")
    assert error_of(lambda: as_role(emulator, "ec2", creds).describe_instances())[:2] == ("RequestExpired", 400)
    assert error_of(lambda: as_role(emulator, "sts", creds).get_caller_identity())[:2] == ("ExpiredToken", 403)
    fresh = host_credentials(emulator)
    assert fresh["AccessKeyId"] != creds["AccessKeyId"], "IMDS hands out new keys once the old ones expired"
    assert password_of(as_role(emulator, "ecr", fresh).get_authorization_token())


def test_ecr_login_follows_the_roles_policies_as_they_are_now(cloud):
    emulator, _ = cloud
    make_role(emulator, "ngcx-bare")                  # only AmazonSSMManagedInstanceCore
    instance_id = running(emulator, IamInstanceProfile={"Name": "ngcx-bare"}, MetadataOptions=IMDS_V2)
    ecr, iam = as_role(emulator, "ecr", host_credentials(emulator)), client(emulator, "iam")
    principal = f"arn:aws:sts::{ACCOUNT}:assumed-role/ngcx-bare/{instance_id}"
    grants = len(emulator.token_grants)

    def put(*statements: dict[str, Any]) -> None:
        iam.put_role_policy(RoleName="ngcx-bare", PolicyName="ngcx-pull",
                            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": list(statements)}))

    code, status, message = error_of(ecr.get_authorization_token)
    assert (code, status) == ("AccessDeniedException", 400)
    assert message == (f"User: {principal} is not authorized to perform: ecr:GetAuthorizationToken on resource: * "
                       "because no identity-based policy allows the ecr:GetAuthorizationToken action")
    put({"Effect": "Allow", "Action": "ecr:*", "Resource": APP_REPO})
    assert error_of(ecr.get_authorization_token)[0] == "AccessDeniedException", "the token needs Resource *"
    put({"Effect": "Allow", "Action": "ECR:Get*", "Resource": "*"},
        {"Effect": "Allow", "Action": "ecr:BatchGetImage", "Resource": [APP_REPO, APP_REPO + "-cache"]})
    password = password_of(ecr.get_authorization_token())
    assert emulator.token_grants[-1]["token"] == password
    assert emulator.token_grants[-1]["pull"] == [APP_REPO, APP_REPO + "-cache"]
    put({"Effect": "Allow", "Action": "ecr:*", "Resource": "*"},
        {"Effect": "Deny", "Action": "ecr:GetAuthorization?oken", "Resource": "*"})
    assert "with an explicit deny" in error_of(ecr.get_authorization_token)[2]
    assert len(emulator.token_grants) == grants + 1


# --- IMDS: who may ask, and how ------------------------------------------------------------------------------

def test_imds_wants_a_token_from_the_same_running_instance_and_refuses_the_rest(cloud):
    emulator, hosts = cloud
    make_role(emulator, "ngcx-pull-imds", PULL_APP)
    hosts.addresses += ["127.0.0.2", "127.0.0.3"]
    with_role = running(emulator, IamInstanceProfile={"Name": "ngcx-pull-imds"}, MetadataOptions=IMDS_V2)
    bare = running(emulator)                          # no profile, no MetadataOptions: moto keeps HttpTokens=optional
    role_ip, bare_ip = "127.0.0.2", "127.0.0.3"
    creds_path = "/latest/meta-data/iam/security-credentials/"

    assert imds(emulator, "GET", creds_path, source=role_ip)[0] == 401, "IMDSv1 is off with HttpTokens=required"
    assert imds(emulator, "GET", creds_path, {"X-aws-ec2-metadata-token": "AQAEAforged"}, role_ip)[0] == 401
    assert imds(emulator, "GET", creds_path, {"X-aws-ec2-metadata-token": token(emulator, bare_ip)}, role_ip)[0] == \
        401, "a token is good only on the instance that got it"
    for ttl in ("0", "21601", "-5", "abc", "+60", ""):
        assert imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": ttl},
                    role_ip)[0] == 400, ttl
    assert imds(emulator, "PUT", "/latest/api/token", {}, role_ip)[0] == 400
    assert imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60",
                                                       "X-Forwarded-For": "203.0.113.7"}, role_ip)[0] == 403
    assert imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                "127.0.0.9")[0] == 404, "no instance has that address"
    assert read(emulator, creds_path, role_ip) == (200, "ngcx-pull-imds")
    assert read(emulator, "/latest/meta-data/instance-id", role_ip) == (200, with_role)

    assert read(emulator, creds_path, bare_ip)[0] == 404, "no instance profile, no credentials"
    assert read(emulator, "/latest/meta-data/iam/", bare_ip)[0] == 404
    assert imds(emulator, "GET", "/latest/meta-data/instance-id", source=bare_ip)[:2] == (200, bare), \
        "HttpTokens=optional (moto's default without MetadataOptions) answers IMDSv1"
    client(emulator, "ec2").modify_instance_metadata_options(InstanceId=bare, HttpTokens="required")
    assert imds(emulator, "GET", "/latest/meta-data/instance-id", source=bare_ip)[0] == 401
    client(emulator, "ec2").modify_instance_metadata_options(InstanceId=bare, HttpEndpoint="disabled")
    assert imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                bare_ip)[0] == 403

    session = token(emulator, role_ip)
    for method, odd in (("GET", "/latest/meta-data/../../etc/passwd"), ("GET", "/latest/meta-data/%00%ff"),
                        ("GET", "/latest/meta-data/instance-id/more"), ("POST", "/latest/api/token"),
                        ("DELETE", "/latest/meta-data/"), ("PUT", "/latest/meta-data/instance-id")):
        status = imds(emulator, method, odd, {"X-aws-ec2-metadata-token": session}, role_ip)[0]
        assert status in (404, 405), (method, odd, status)
    listing = imds(emulator, "GET", "/latest/meta-data/", {"X-aws-ec2-metadata-token": session}, role_ip)[1]
    assert {"iam/", "instance-id", "placement/"} <= set(listing.split("\n"))
    short = token(emulator, role_ip, ttl="1")
    time.sleep(1.1)
    assert imds(emulator, "GET", creds_path, {"X-aws-ec2-metadata-token": short}, role_ip)[0] == 401, "expired"

    ec2 = client(emulator, "ec2")
    ec2.stop_instances(InstanceIds=[with_role])
    until("stopped", lambda: view_of(emulator, with_role)["state"] == "stopped")
    assert imds(emulator, "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
                role_ip)[0] == 404, "a stopped instance has no metadata service"


# --- profile associations -------------------------------------------------------------------------------------

def test_replacing_the_association_changes_the_role_the_host_sees(cloud):
    emulator, _ = cloud
    first_arn = make_role(emulator, "ngcx-pull-first", PULL_APP)
    make_role(emulator, "ngcx-pull-other", [{"Effect": "Allow", "Action": "ecr:GetAuthorizationToken",
                                              "Resource": "*"}])
    instance_id = running(emulator, IamInstanceProfile={"Arn": first_arn}, MetadataOptions=IMDS_V2)
    ec2, ssm = client(emulator, "ec2"), client(emulator, "ssm")
    old = host_credentials(emulator)

    [association] = ec2.describe_iam_instance_profile_associations(Filters=[
        {"Name": "instance-id", "Values": [instance_id]}, {"Name": "state", "Values": ["associated"]}])[
        "IamInstanceProfileAssociations"]
    assert association["IamInstanceProfile"]["Arn"] == first_arn
    replaced = ec2.replace_iam_instance_profile_association(
        AssociationId=association["AssociationId"], IamInstanceProfile={"Name": "ngcx-pull-other"})[
        "IamInstanceProfileAssociation"]
    assert replaced["AssociationId"] != association["AssociationId"] and replaced["InstanceId"] == instance_id
    assert error_of(lambda: ec2.replace_iam_instance_profile_association(
        AssociationId=association["AssociationId"], IamInstanceProfile={"Name": "ngcx-pull-first"}))[0] == \
        "InvalidAssociationID.NotFound"
    new = host_credentials(emulator)
    assert new["Role"] == "ngcx-pull-other" and new["AccessKeyId"] != old["AccessKeyId"]
    assert view_of(emulator, instance_id)["instance_profile"] == "ngcx-pull-other"
    assert ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0][
        "IamInstanceProfile"]["Arn"].endswith("/ngcx-pull-other")
    as_role(emulator, "ecr", new).get_authorization_token()
    assert emulator.token_grants[-1]["caller"] == "role:ngcx-pull-other" and emulator.token_grants[-1]["pull"] == []
    as_role(emulator, "ecr", old).get_authorization_token()    # STS keys outlive the association, until they expire
    assert emulator.token_grants[-1]["caller"] == "role:ngcx-pull-first"

    ec2.disassociate_iam_instance_profile(AssociationId=replaced["AssociationId"])
    assert read(emulator, "/latest/meta-data/iam/security-credentials/")[0] == 404
    command = {"InstanceIds": [instance_id], "DocumentName": "AWS-RunShellScript",
               "Parameters": {"commands": ["true"]}}
    assert error_of(lambda: ssm.send_command(**command))[0] == "InvalidInstanceId", "no role, no SSM agent"
    code, status, message = error_of(lambda: ec2.associate_iam_instance_profile(
        InstanceId=instance_id, IamInstanceProfile={"Name": "ngcx-missing"}))
    assert (code, status) == ("InvalidParameterValue", 400) and "Invalid IAM Instance Profile name" in message
    ec2.associate_iam_instance_profile(InstanceId=instance_id, IamInstanceProfile={"Name": "ngcx-pull-first"})
    assert host_credentials(emulator)["Role"] == "ngcx-pull-first"
    assert ssm.send_command(**command)["Command"]["CommandId"]


def test_every_instance_of_one_launch_gets_the_profile_and_unknown_profiles_fail_as_on_ec2(cloud):
    emulator, _ = cloud
    make_role(emulator, "ngcx-pull-many", PULL_APP)
    ec2, ami = client(emulator, "ec2"), gpu_ami(emulator)
    launched = emulator.performed("RunInstances")
    code, status, message = error_of(lambda: launch(ec2, ami, IamInstanceProfile={"Name": "ngcx-missing"}))
    assert (code, status, message) == ("InvalidParameterValue", 400, "Value (ngcx-missing) for parameter "
                                       "iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name")
    assert emulator.performed("RunInstances") == launched
    made = [i["InstanceId"] for i in ec2.run_instances(ImageId=ami, InstanceType="g5.xlarge", MinCount=2, MaxCount=2,
                                                       IamInstanceProfile={"Name": "ngcx-pull-many"})["Instances"]]
    associations = ec2.describe_iam_instance_profile_associations(Filters=[
        {"Name": "instance-id", "Values": made}])["IamInstanceProfileAssociations"]
    assert sorted(a["InstanceId"] for a in associations) == sorted(made)
    assert {view_of(emulator, i)["instance_profile"] for i in made} == {"ngcx-pull-many"}
