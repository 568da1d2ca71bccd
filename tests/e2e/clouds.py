"""The clouds the deploy tests run against, built once per session and shared by every e2e module.

Loaded as a plugin by tests/conftest.py (`pytest_plugins`), not as tests/e2e/conftest.py: a second
top-level `conftest` module would shadow the one the integration tests import helpers from.

Why session-scoped: each cloud's setup does the one cold pull of the test image (the bake), a minute
or more on this machine; the e2e, the fault suite and the cross-cloud test then boot from it. Each
cloud is its real SDK against a real local server (the ECS emulator; moto behind tests/emulators/
aws_ec2.py), with real machines behind the instances (tests/emulators/docker_hosts.py), and a
`Cloud` object that spells each cloud's faults, so the fault suite is written once for all of them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e.deploy_helpers import built_zero_code, ngcx

NO_PROXY_ENV = {"HTTP_PROXY": "", "HTTPS_PROXY": "", "http_proxy": "", "https_proxy": ""}  # SDKs ignore NO_PROXY
_EMULATORS: dict[str, Any] = {}          # the session's clouds by name, for the failure report below


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failing test's report carries what the emulators' machines raised (their `host_errors`): the cloud only
    says "deleted while booting", and the why lives in the pytest process, gone once CI ends (stop 41's CI)."""
    report = yield
    if report.failed:
        for name, emulator in _EMULATORS.items():
            errors = getattr(emulator, "host_errors", [])
            if errors:
                lines = [f"{resource}: {what}" for resource, what in errors[-8:]]
                report.sections.append((f"{name} emulator: machine errors ({len(errors)}, last 8)", "\n".join(lines)))
    return report


@dataclass
class Cloud:
    """One emulated cloud as the tests drive it, with how its faults are spelled."""

    name: str
    emulator: Any
    hosts: Any
    project: Path
    env: dict[str, str]
    gpu: str                                  # --gpu for deploys (a model the emulator sells)
    instance_type: str                        # what that --gpu picks first
    capacity: tuple[str, int]                 # (code, HTTP status) of "no capacity in this zone"
    throttle: tuple[str, int]
    server_error: tuple[str, int]
    secret_var: str                           # the variable that holds the secret key
    secret: str
    set_capacity: Callable[[str, str, bool], None]
    outputs: list[str] = field(default_factory=list)
    baked: str = ""
    bake_window: tuple[int, int, int, int] = (0, 0, 0, 0)   # emulator.calls and .token_grants during the bake

    def ngcx(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = ngcx(self.project, *args, env={**self.env, **(env or {})})
        self.outputs += [done.stdout, done.stderr]
        return done

    def deploy(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.ngcx("deploy", "--cloud", self.name, "--gpu", self.gpu, "--gpu-mode", "auto", *extra)

    def records(self) -> list[dict]:
        return json.loads(self.ngcx("deployments", "ls", "--all", "--json").stdout)

    def mine(self, record_id: int) -> list[dict]:
        """The emulator's live instances tagged with this deployment (a duplicate would show here)."""
        return [i for i in self.emulator.instances() if i["tags"].get("ngcx:deployment") == str(record_id)
                and state_of(i) not in ("terminated", "shutting-down")]


def state_of(instance: dict) -> str:
    """'running' / 'stopped' / … whichever emulator described the instance."""
    return str(instance.get("status") or instance.get("state") or "").lower()


def phase_line(done: subprocess.CompletedProcess[str]) -> str:
    """The line a deploy ends with: where the seconds went."""
    return next(line for line in done.stderr.splitlines() if " ready (" in line)


@pytest.fixture(scope="session")
def project(base_image, tmp_path_factory) -> Path:
    """examples/onnx-zero-code exported and built once for every deploy test."""
    return built_zero_code(tmp_path_factory)


@pytest.fixture(scope="session")
def relay(docker_client, registry) -> Iterator[Any]:
    """The loopback registry as hosts reach it (their "VPC endpoint"), shared by every cloud."""
    from emulators.docker_hosts import RegistryRelay, bridge_gateway

    with RegistryRelay(registry, listen_host=bridge_gateway(docker_client)) as bridge:
        yield bridge


def reach_from_hosts(stack: contextlib.ExitStack, emulator: Any, hosts: Any, gateway: str, metadata: str) -> str:
    """Hosts reach the emulator as on the cloud: its metadata server at the cloud's own address (`metadata`,
    DNAT in each machine), its API through a relay on the gateway. Returns the API's URL as hosts call it."""
    from emulators.docker_hosts import RegistryRelay

    hosts.route_metadata(metadata, emulator.metadata_address)
    api = stack.enter_context(RegistryRelay(emulator.endpoint.split("://")[-1], listen_host=gateway))
    return f"http://{api.address}"


def _bake(cloud: Cloud, *args: str) -> str:
    """`ngcx hosts bake`; what it sent the cloud and the logins its builder got are kept for the secrets test."""
    emulator, t0 = cloud.emulator, time.monotonic()
    first_call, first_grant = len(emulator.calls), len(emulator.token_grants)
    done = cloud.ngcx("hosts", "bake", "--cloud", cloud.name, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    cloud.bake_window = (first_call, len(emulator.calls), first_grant, len(emulator.token_grants))
    print(f"{cloud.name} bake: {time.monotonic() - t0:.1f} s")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def aliyun(docker_client, registry, relay, project, tmp_path_factory) -> Iterator[Cloud]:
    """Alibaba Cloud: the ECS emulator, the image pushed to "ACR" and a host image baked."""
    from emulators.aliyun_ecs import EcsEmulator
    from emulators.docker_hosts import DockerHosts, bridge_gateway

    ak, secret = "LTAI5tNgcxE2eTest", "aliyun-secret-never-printed-7f3c"
    home = tmp_path_factory.mktemp("aliyun-home")
    hosts = DockerHosts(docker_client, insecure_registries=[relay.address])
    gateway = bridge_gateway(docker_client)
    # boot/start seconds: the API-side delay on top of the machine's own real boot (its dockerd start)
    with contextlib.ExitStack() as stack:
        emulator = stack.enter_context(EcsEmulator(hosts, access_keys={ak: secret}, boot_seconds=1.0,
                                                   start_seconds=1.0, metadata_host=gateway))
        _EMULATORS["aliyun"] = emulator
        api = reach_from_hosts(stack, emulator, hosts, gateway, "100.100.100.200:80")
        env = {"ALIBABA_CLOUD_ACCESS_KEY_ID": ak, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": secret,
               "NGCX_ALIYUN_ECS_ENDPOINT": emulator.endpoint, "NGCX_ACR_ENDPOINT": registry,
               "NGCX_ACR_VPC_ENDPOINT": relay.address, "NGCX_ACR_INSTANCE_ID": "cri-e2etest",
               "NGCX_ACR_API_HOST_ENDPOINT": api,
               "NGCX_STATE_DIR": str(home / "state"), "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker"),
               **NO_PROXY_ENV}
        cloud = Cloud("aliyun", emulator, hosts, project, env, "A10", "ecs.gn7i-c8g1.2xlarge",
                      ("OperationDenied.NoStock", 403), ("Throttling", 400), ("ServiceUnavailable", 503),
                      "ALIBABA_CLOUD_ACCESS_KEY_SECRET", secret, emulator.set_stock)
        pushed = cloud.ngcx("push", "ngcx-app/onnx-zero-code:latest", "--registry", "acr://cn-hangzhou/e2e")
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        assert emulator.issued_tokens, "the push must log in with an ACR temporary token"
        cloud.baked = _bake(cloud, "--region", "cn-hangzhou")
        yield cloud


AWS_KEY, AWS_SECRET, AWS_REGION = "AKIANGCXE2ETEST00001", "aws-secret-never-printed-4b9e", "us-east-1"


@pytest.fixture(scope="session")
def aws(docker_client, registry, relay, project, tmp_path_factory) -> Iterator[Cloud]:
    """AWS: the EC2/SSM/ECR double, the image pushed to "ECR" and a host image baked."""
    from emulators.aws_ec2 import Ec2Emulator  # moto keeps one state per process: one AWS double per session
    from emulators.docker_hosts import DockerHosts, bridge_gateway

    home = tmp_path_factory.mktemp("aws-home")
    hosts = DockerHosts(docker_client, insecure_registries=[relay.address])
    gateway = bridge_gateway(docker_client)
    # boot/start seconds: the API-side delay on top of the machine's own real boot (its dockerd start)
    with contextlib.ExitStack() as stack:
        emulator = stack.enter_context(Ec2Emulator(hosts, access_keys={AWS_KEY: AWS_SECRET}, boot_seconds=1.0,
                                                   start_seconds=1.0, metadata_host=gateway))
        _EMULATORS["aws"] = emulator
        api = reach_from_hosts(stack, emulator, hosts, gateway, "169.254.169.254:80")
        env = {"AWS_ENDPOINT_URL": emulator.endpoint, "AWS_ACCESS_KEY_ID": AWS_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
               "AWS_DEFAULT_REGION": AWS_REGION, "AWS_EC2_METADATA_DISABLED": "true",
               "NGCX_ECR_ENDPOINT": registry, "NGCX_ECR_VPC_ENDPOINT": relay.address, "NGCX_ECR_API_HOST_ENDPOINT": api,
               "NGCX_STATE_DIR": str(home / "state"), "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker"),
               **NO_PROXY_ENV}
        cloud = Cloud("aws", emulator, hosts, project, env, "A10G", "g5.xlarge", ("InsufficientInstanceCapacity", 500),
                      ("RequestLimitExceeded", 503), ("InternalError", 500), "AWS_SECRET_ACCESS_KEY", AWS_SECRET,
                      emulator.set_capacity)
        # a repository of its own: "ECR" and "ACR" are the same loopback registry, where the two clouds' states
        # would sign one digest with two keys, and a signature tag holds the last signer's (cli/trust/sign.py)
        pushed = cloud.ngcx("push", "ngcx-app/onnx-zero-code:latest", "--registry", f"ecr://{AWS_REGION}/aws-e2e")
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        created = [c for name, c in emulator.calls if name == "CreateRepository"]
        assert [c["repositoryName"] for c in created] == ["aws-e2e/onnx-zero-code"]
        assert [name for name, _ in emulator.calls].count("GetAuthorizationToken") >= 1, "push logs in with a token"
        cloud.baked = _bake(cloud, "--region", AWS_REGION)
        assert [m["state"] for m in emulator.images() if m["id"] == cloud.baked] == ["available"]
        assert not [i for i in emulator.instances() if i["tags"].get("ngcx:role") == "bake"
                    and state_of(i) not in ("terminated", "shutting-down")], "the builder is left"
        yield cloud
