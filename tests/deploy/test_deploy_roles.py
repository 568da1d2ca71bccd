"""Hosts log in to ACR/ECR with their instance role: no registry secret in what ngcx sends (issue 20 item 4).

What a user notices: the host job (user-data, Cloud Assistant / SSM command) names only where to log
in, never a password; each repository gets its own pull-only role, found again by name on the next
deploy; `--registry-login token` is the explicit fallback. The login program the hosts run
(recipes/deploy/role_login.py) is exercised against the emulators' metadata services and token APIs
in tests/deploy/test_role_login.py and, on emulated hosts, in tests/e2e.
"""

from __future__ import annotations

import json
import shlex
import subprocess

from ngcx.deploy import roles
from ngcx.deploy.hostscript import HostJob, render, role_login_program
from ngcx.registry.credentials import Credentials

ACR_REF = "registry-vpc.cn-hangzhou.aliyuncs.com/team/app@sha256:" + "a" * 64
ECR_REF = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/app@sha256:" + "c" * 64


def test_each_repository_names_its_own_role_and_the_same_one_every_time():
    grant = roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-1")
    assert grant.role_name == roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-1").role_name
    others = [roles.PullGrant("aliyun", "cn-hangzhou", "team/other", "cri-1"),
              roles.PullGrant("aliyun", "cn-shanghai", "team/app", "cri-1"),
              roles.PullGrant("aws", "cn-hangzhou", "team/app", "cri-1")]
    assert grant.role_name not in {g.role_name for g in others}
    assert grant.role_name.startswith("ngcx-pull-") and len(grant.role_name) <= 64


def test_the_repository_is_read_from_any_reference():
    assert roles.repository_of(ACR_REF) == "team/app"
    assert roles.repository_of("127.0.0.1:5000/e2e/onnx-zero-code@sha256:" + "b" * 64) == "e2e/onnx-zero-code"
    assert roles.repository_of("registry.example.com/a/b/c:v1") == "a/b/c"
    assert roles.repository_of("host:5000/app") == "app"


def test_the_policies_grant_the_token_and_pulls_from_one_repository_only():
    acr = json.loads(roles.aliyun_policy(roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-1")))
    actions = {a: s["Resource"] for s in acr["Statement"] for a in s["Action"]}
    assert actions == {"cr:GetAuthorizationToken": ["acs:cr:cn-hangzhou:*:instance/cri-1"],
                       "cr:PullRepository": ["acs:cr:cn-hangzhou:*:repository/cri-1/team/app"]}
    ecr = json.loads(roles.aws_policy(roles.PullGrant("aws", "us-east-1", "team/app"), "aws", "123456789012"))
    actions = {a: s["Resource"] for s in ecr["Statement"] for a in s["Action"]}
    assert actions.pop("ecr:GetAuthorizationToken") == "*"        # IAM allows this one only on "*"
    assert set(actions.values()) == {"arn:aws:ecr:us-east-1:123456789012:repository/team/app"}
    assert not [a for a in actions if not a.startswith(("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                                        "ecr:BatchCheckLayerAvailability"))]


def test_a_role_login_host_job_holds_no_secret_and_runs_the_login_program():
    login = roles.RoleLogin("aliyun", "cn-hangzhou", "https://cr.cn-hangzhou.aliyuncs.com", "cri-1")
    text = render(HostJob(5, ACR_REF, "registry-vpc.cn-hangzhou.aliyuncs.com", "1", "auto", login), "user-data")
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert "--password-stdin" not in text.split("python3 -")[0]            # no token login before the program
    call = next(line for line in text.splitlines() if line.startswith("python3 - "))
    assert shlex.split(call.rstrip("\\"))[2:] == ["aliyun", "cn-hangzhou", "https://cr.cn-hangzhou.aliyuncs.com",
                                                  "registry-vpc.cn-hangzhou.aliyuncs.com", "cri-1"]
    program = text.split("<<'NGCX_ROLE_LOGIN'", 1)[1].split("\n", 1)[1].split("\nNGCX_ROLE_LOGIN\n", 1)[0]
    assert program == role_login_program()
    compile(program, "role_login.py", "exec")                                 # what the host runs is Python
    assert 'rm -rf "$LOGIN_DIR"' in text and 'export DOCKER_CONFIG="$LOGIN_DIR"' in text


def test_a_token_login_is_still_possible_when_asked():
    job = HostJob(5, ECR_REF, "123456789012.dkr.ecr.us-east-1.amazonaws.com", "1", "auto",
                  Credentials("AWS", "token-asked-for-explicitly"))
    text = render(job, "command")
    assert "python3 - " not in text and "--password-stdin" in text


def test_the_role_login_keeps_user_data_well_under_its_16_kb():
    login = roles.RoleLogin("aws", "us-east-1", "https://api.ecr.us-east-1.amazonaws.com")
    text = render(HostJob(5, ECR_REF, ECR_REF.split("/")[0], "1", "auto", login, auth_hashes=("d" * 64,)),
                  "user-data")
    assert len(text.encode()) < 13 * 1024, "leave room for the user's CMD and environment"


def test_a_bake_role_may_pull_each_pre_pulled_repository_and_nothing_else():
    one = roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-1")
    both = roles.PullRole((one, roles.PullGrant("aliyun", "cn-hangzhou", "team/other", "cri-1")))
    assert roles.PullRole((one,)).role_name == one.role_name          # a deploy's role keeps its name
    assert both.role_name.startswith("ngcx-pull-") and both.role_name != one.role_name
    assert roles.aliyun_policy(roles.PullRole((one,))) == roles.aliyun_policy(one)
    acr = json.loads(roles.aliyun_policy(both))
    pulls = {r for s in acr["Statement"] if "cr:PullRepository" in s["Action"] for r in s["Resource"]}
    assert pulls == {f"acs:cr:cn-hangzhou:*:repository/cri-1/team/{name}" for name in ("app", "other")}
    ecr = json.loads(roles.aws_policy(roles.PullRole((roles.PullGrant("aws", "us-east-1", "a"),
                                                      roles.PullGrant("aws", "us-east-1", "b"))), "aws", "1"))
    [pull] = [s for s in ecr["Statement"] if "ecr:BatchGetImage" in s["Action"]]
    assert pull["Resource"] == ["arn:aws:ecr:us-east-1:1:repository/a", "arn:aws:ecr:us-east-1:1:repository/b"]


def test_a_bake_script_logs_in_with_the_builders_role_and_holds_no_secret():
    from ngcx.deploy import bake
    from ngcx.deploy.hostscript import render_bake

    registry = "registry-vpc.cn-hangzhou.aliyuncs.com"
    refs = [f"{registry}/team/app@sha256:" + "a" * 64, f"{registry}/team/other@sha256:" + "b" * 64,
            "docker.io/library/busybox:1"]
    logins = {registry: roles.RoleLogin("aliyun", "cn-hangzhou", "https://cr.cn-hangzhou.aliyuncs.com", "cri-1")}
    text = render_bake(refs, logins)
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    call = next(line for line in text.splitlines() if line.startswith("python3 - "))
    assert shlex.split(call.rstrip("\\"))[2:] == ["aliyun", "cn-hangzhou", "https://cr.cn-hangzhou.aliyuncs.com",
                                                  registry, "cri-1"]
    assert "printf" not in text and 'rm -rf "$LOGIN_DIR"' in text          # no token piped to docker login
    role = bake.pull_role(refs, logins)                   # busybox is public: not in the role
    assert sorted(g.repository for g in role.grants) == ["team/app", "team/other"]
    assert bake.pull_role(refs[2:], logins) is None
    tokens = render_bake(refs, {registry: Credentials("cr_temp_user", "token-asked-for-explicitly")})
    assert "python3 - " not in tokens and "printf '%s' token-asked-for-explicitly" in tokens
