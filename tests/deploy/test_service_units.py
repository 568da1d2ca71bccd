"""Services' pieces that need no engine (cli/deploy/service.py, store.py, commands/services.py).

What a user would notice: a service and a deployment are never confused (s1 vs 1); a service's row holds
its config without any key; a mistake on a service command is one line with exit 2 and touches nothing;
a service an ngcx was killed on is recognised as interrupted; scale-in lets go of the broken, then newest.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ngcx.core.errors import UserError
from ngcx.deploy import keys, service, store
from ngcx.deploy.common import FAILED, READY, DeployConfig, DeployRecord


@pytest.fixture
def state(monkeypatch, tmp_path):
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def config(**kw) -> DeployConfig:
    return DeployConfig(cloud="local", image="ngcx-app/demo:latest", pull_ref=None, registry=None,
                        labels={"ai.ngcx.project.name": "demo"}, model="demo", cmd=["ngcx-runtime", "serve", "m"],
                        pushes=[("127.0.0.1:5000/demo", "sha256:" + "a" * 64)], version="sha256:" + "b" * 64, **kw)


def test_a_service_row_keeps_its_config_without_a_key_and_gives_it_back(state):
    cfg = config(key_hashes=("f" * 64,), service_id=9, replica=2)
    row = service.config_row(cfg, service.Options(port=8443, drain_s=7))
    assert "key_hashes" not in row and "service_id" not in row and "f" * 64 not in str(row)
    svc = store.create_service("local", None, 3, row)
    assert (svc.ref, svc.name, svc.status, svc.replicas) == ("s1", f"ngcx-svc-{store.owner_id()[:8]}-1", "creating", 3)
    back, options = service.config_of(store.service(svc.id).config)
    assert back.image == cfg.image and back.cmd == cfg.cmd and back.version == cfg.version
    assert back.pushes == cfg.pushes and back.key_hashes == () and back.service_id is None
    assert options == service.Options(port=8443, drain_s=7)


def test_service_ids_and_deployment_ids_are_never_confused(state):
    assert store.is_service_ref("s3") and store.is_service_ref("S3")
    assert not store.is_service_ref("3") and not store.is_service_ref("sx")
    assert store.parse_service_id("s12") == store.parse_service_id("#12") == 12
    with pytest.raises(UserError, match="not a service id"):
        store.parse_service_id("web")
    with pytest.raises(UserError, match="no service s4"):
        store.service(4)


def test_a_service_whose_ngcx_died_is_interrupted_and_a_running_one_is_not(state):
    svc = store.create_service("local", None, 2, {})
    assert not store.service_interrupted(svc)                  # this process is alive and made it
    dead = store.update_service(svc.id, pid=2 ** 22 + 12345)     # above pid_max: no such process
    assert store.service_interrupted(dead)
    assert not store.service_interrupted(store.update_service(svc.id, status=READY))


def test_scale_in_lets_go_of_replicas_that_are_not_ready_first_then_the_newest():
    def rec(i: int, status: str) -> DeployRecord:
        return DeployRecord(id=i, cloud="local", image="x", status=status, created_at=0, updated_at=0)

    current = [rec(1, READY), rec(2, READY), rec(3, FAILED), rec(4, READY)]
    assert [r.id for r in service._victims(current, 2)] == [3, 4]
    assert [r.id for r in service._victims(current, 0)] == []


def test_the_service_key_is_kept_apart_from_deployment_keys(state):
    key = keys.create("s1")
    assert keys.get("s1") == key and keys.kept() == set()      # security.prune never forgets it
    keys.forget("s1")
    assert keys.get("s1") is None


@pytest.mark.parametrize("args, message", [
    (["deployments", "scale", "s7", "2"], "no service s7"),
    (["deployments", "scale", "web", "2"], "'web' is not a service id"),
    (["deployments", "rollback", "s7"], "no service s7"),
    (["deployments", "reconcile", "s7"], "no service s7"),
    (["deployments", "show", "s7"], "no service s7"),
    (["deployments", "destroy", "s7", "--yes"], "no service s7"),
    (["deploy", "ngcx-app/demo:latest", "--replicas", "2", "--service", "s1"], "--replicas and --service together"),
    (["deploy", "ngcx-app/demo:latest", "--cloud", "any", "--replicas", "2"], "a service lives on one cloud"),
])
def test_a_service_command_mistake_is_one_line_with_exit_2(state, args, message):
    done = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=120,
                          env={"NGCX_STATE_DIR": str(state / "state"), "PATH": "/usr/bin:/bin", "HOME": str(state)})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len([ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error")]) == 1


def test_each_local_replica_gets_one_gpu_round_robin_where_the_host_has_several(monkeypatch):
    """The NVML probe answers two GPUs (this machine has none; the choice is what is tested, the engine is not)."""
    from ngcx.deploy.local import verbs as local
    from ngcx.workstation import host

    monkeypatch.setattr(host, "host_gpus", lambda: ("580.65", [{"index": 0}, {"index": 1}]))
    picks = [local._gpus(config(service_id=1, replica=i)).device_ids for i in range(3)]
    assert picks == [["0"], ["1"], ["0"]]
    lone = local._gpus(config())
    assert lone.count == -1 and not lone.device_ids                 # a lone deploy takes every GPU
    monkeypatch.setattr(host, "host_gpus", lambda: ("580.65", [{"index": 0}]))
    assert local._gpus(config(service_id=1, replica=1)).count == -1   # one GPU: every replica shares it


@pytest.mark.parametrize("cloud", ["aws", "aliyun"])
def test_a_cloud_service_without_a_certificate_is_refused_before_its_row_or_key_exists(state, cloud):
    with pytest.raises(UserError, match=f"a service on {cloud} needs --certificate"):
        service.create(DeployConfig(cloud=cloud, image="x", pull_ref="r/x@sha256:" + "c" * 64, registry="r",
                                    labels={}, model=None), 3, service.Options(), print)
    assert store.services(include_gone=True) == [] and keys.get("s1") is None


@pytest.mark.parametrize("args, message", [
    (["deployments", "start", "s1"], "cannot start service s1: it is ready"),
    (["deployments", "rotate-key", "s1"], "service s1 has no key (deployed with --no-auth)"),
    (["deployments", "rollback", "s1"], "service s1 was never updated: there is nothing to roll back to"),
    (["deployments", "scale", "s1", "3"], "service s1 is autoscaled: give its bounds, not a count"),
    (["deployments", "scale", "s1", "--min", "3", "--max", "2"], "--min 3 --max 2: need 0 <= min <= max"),
    (["deployments", "scale", "s2", "--min", "1", "--max", "3"], "service s2 has a fixed count: give COUNT"),
])
def test_what_an_autoscaled_service_refuses_is_one_line_and_changes_nothing(state, args, message):
    """An autoscaled service (service_group.py, group_update.py) refuses a verb that does not apply now in one
    line, before any cloud call (no credentials here), and its row stays as it was; a fixed service refuses
    --min/--max."""
    group = {"min_size": 1, "max_size": 2, "target_requests": 60.0, "ref": {"name": "g", "template_id": "lt-1",
                                                                            "version": "1"}}
    made = store.create_service("aws", "us-east-1", 1, {"image": "x", "group": group})
    store.update_service(made.id, status=READY, pid=None)
    fixed = store.create_service("local", None, 2, {"image": "x"})
    store.update_service(fixed.id, status=READY, pid=None)
    done = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=120,
                          env={"NGCX_STATE_DIR": str(state / "state"), "PATH": "/usr/bin:/bin", "HOME": str(state)})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len([ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error")]) == 1
    assert store.service(made.id).status == READY and store.service(made.id).config["group"] == group
