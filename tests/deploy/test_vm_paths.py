"""The VM paths' decisions on a cloud whose machines are paper: a fresh host the cloud deletes while it boots is
made again, and nothing of it stays billed; a redeploy onto the running host asks the cloud only what it must.

ECS forgets an instance whose machine could not be made (SystemFailure.Delete; the emulator does the same in
tests/emulators/aliyun_ecs.py `_boot`). Stop 40's CI saw what ngcx did before: it recorded the replica
`starting` with no address and waited on that for the service's whole ready timeout. What a user notices
now: the deploy says which instance was lost, makes another (vm.BOOT_TRIES per zone, then the next zone),
and a deploy that loses every one fails in one line naming them, with no instance left behind.

A redeploy of the same image onto its running host (issue 24 item 6: <= 3 s) makes no host, so it asks for no host
image, and its host already holds the pull role its record names, so it asks RAM nothing; a redeploy whose
repository changed still gets its own role, on the same host.

The cloud is the Aliyun SDK (through ngcx.deploy.aliyun.ecs.Ecs) against the ECS emulator; its machines are
paper ones (hosts_api.PaperHosts, no engine needed), whose next `fail_next` creates raise, as a machine that
cannot be made does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from emulators.hosts_api import PaperHosts

from ngcx.core.errors import UserError
from ngcx.deploy import roles, store, vm
from ngcx.deploy.common import PATH_FRESH, PATH_RUNNING, READY, STARTING, DeployConfig
from support import aliyun_sdk_on, quick_ecs

AK, SECRET = "LTAI5tBootRetryTest", "aliyun-boot-retry-secret-never-printed"


@pytest.fixture(scope="module")
def ecs() -> Iterator[Any]:
    with quick_ecs(PaperHosts(), AK, SECRET) as emulator:
        yield emulator


@pytest.fixture
def plan(ecs, monkeypatch, tmp_path) -> Iterator[vm.Plan]:
    aliyun_sdk_on(monkeypatch, ecs.endpoint, AK, SECRET)
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    yield new_plan()
    ecs.hosts.fail_next = 0


@dataclass
class HostImage:
    """The image a new host boots (Plan.pick_image), counting how often vm.run asked for it."""

    name: str = "ubuntu_22_04_x64_20G_alibase_20240926.vhd"
    asked: int = 0

    def __call__(self) -> str:
        self.asked += 1
        return self.name


def new_plan(grant: roles.PullGrant | None = None, image: HostImage | None = None) -> vm.Plan:
    """What aliyun.prepare hands vm.run."""
    from ngcx.clouds.aliyun import Api
    from ngcx.deploy.aliyun.ecs import Ecs

    return vm.Plan(Ecs(Api("cn-hangzhou")), vm.choose("aliyun", CONFIG).candidates[:1], image or HostImage(),
                   "registry.example/app@sha256:" + "0" * 64, "registry.example", lambda: None, grant=grant)


CONFIG = DeployConfig(cloud="aliyun", image="ngcx-app/x:latest", pull_ref=None, registry=None,
                      labels={"ai.ngcx.compute-capabilities": "8.6", "ai.ngcx.min-driver": "535"},
                      model=None, gpu="A10", region="cn-hangzhou", zone="cn-hangzhou-h",
                      allow_unsigned=True)   # the paths alone: the host checks signatures in test_trust_deploy


def live(ecs: Any, record_id: int) -> list[str]:
    """The instances of this store's deployment `record_id` the cloud still has (each test has its own store)."""
    return [i["id"] for i in ecs.instances() if i["tags"].get("ngcx:deployment") == str(record_id)
            and i["tags"].get("ngcx:owner") == store.owner_id()]


def test_a_host_the_cloud_deletes_while_booting_is_made_again_in_its_zone(ecs, plan, capsys):
    ecs.hosts.fail_next = 1
    record = vm._create(CONFIG, store.create_intent(CONFIG), plan, 0.0)
    assert record.status == STARTING and record.host and record.host.startswith("10.99.0.")
    assert record.zone == "cn-hangzhou-h" and record.instance_id == ecs.hosts.made()[-1]
    [(lost, _)] = ecs.host_errors[-1:]
    assert f"{lost} (ecs.gn7i-c8g1.2xlarge in cn-hangzhou-h) was deleted by the cloud while booting" in \
        capsys.readouterr().err
    assert live(ecs, record.id) == [record.instance_id]           # only the one that booted


def test_a_deploy_that_loses_every_host_fails_in_one_line_naming_them_and_leaves_none(ecs, plan, capsys):
    ecs.hosts.fail_next = vm.BOOT_TRIES
    errors_before = len(ecs.host_errors)
    intent = store.create_intent(CONFIG)
    with pytest.raises(UserError, match="no capacity for any fitting instance type") as err:
        vm._create(CONFIG, intent, plan, 0.0)
    lost = [instance for instance, _ in ecs.host_errors[errors_before:]]
    assert len(lost) == vm.BOOT_TRIES
    assert all(f"{i} deleted by the cloud while booting" in str(err.value) for i in lost), str(err.value)
    assert live(ecs, intent.id) == [] and store.get(intent.id).instance_id is None
    said = [line for line in capsys.readouterr().err.splitlines() if "deleted by the cloud while booting" in line]
    assert [line.rsplit("; ", 1)[1] for line in said] == ["creating another"] * (vm.BOOT_TRIES - 1) + [
        "no more tries in cn-hangzhou-h"]


def test_a_record_without_an_address_is_not_waited_on(plan):
    """flow.wait_ready says at once that there is no host to ask, instead of polling nothing for the ready timeout."""
    import time

    from ngcx.deploy import flow
    from ngcx.deploy.common import NotReady

    intent = store.create_intent(CONFIG)
    t0 = time.monotonic()
    with pytest.raises(NotReady, match=f"deployment {intent.id} has no address to check"):
        flow.wait_ready(flow.target("aliyun"), intent, 900.0)
    assert time.monotonic() - t0 < 5


def test_a_redeploy_onto_the_running_host_asks_for_no_image_and_no_role_and_keeps_its_role(ecs, plan):
    grant = roles.PullGrant("aliyun", "cn-hangzhou", "team/app", "cri-unit")
    first = vm.run(CONFIG, store.create_intent(CONFIG), new_plan(grant))
    assert first.path == PATH_FRESH and _role_of(ecs, first.instance_id) == grant.role_name
    store.update(first.id, status=READY)
    calls = ("ListPoliciesForRole", "CreateRole", "DescribeImages", "DescribeInstanceRamRole", "AttachInstanceRamRole")
    before, image = {c: ecs.performed(c) for c in calls}, HostImage()
    second = vm.run(CONFIG, store.create_intent(CONFIG), new_plan(grant, image))
    assert second.path == PATH_RUNNING and second.instance_id == first.instance_id
    assert {c: ecs.performed(c) for c in calls} == before and image.asked == 0
    assert _role_of(ecs, second.instance_id) == grant.role_name and second.spec["role"] == grant.role_name


def test_a_redeploy_whose_repository_changed_gets_its_own_role_on_the_running_host(ecs, plan):
    old, new = (roles.PullGrant("aliyun", "cn-hangzhou", f"team/{n}", "cri-unit") for n in ("old", "new"))
    first = vm.run(CONFIG, store.create_intent(CONFIG), new_plan(old))
    store.update(first.id, status=READY)
    made = ecs.performed("CreateRole")
    second = vm.run(CONFIG, store.create_intent(CONFIG), new_plan(new))
    assert second.path == PATH_RUNNING and second.instance_id == first.instance_id
    assert ecs.performed("CreateRole") == made + 1 and _role_of(ecs, second.instance_id) == new.role_name


def _role_of(ecs: Any, instance_id: str | None) -> str:
    return next(i["ram_role"] for i in ecs.instances() if i["id"] == instance_id)
