"""`ngcx deploy --cloud aliyun` through the real Alibaba Cloud SDK against the ECS emulator, whose
instances are real machines (containers with their own dockerd, disk and address: tests/emulators).

What a user notices (issue 10, "Done when"): push to ACR -> bake a host image -> deploy -> a correct
KServe inference through the printed URL -> stop -> deploy again from the stopped host -> a restart
that fails for stock falls back to a new host -> destroy, and the instances are gone in the cloud.
Faults: throttling and a 5xx whose answer was lost create no second instance; NoStock in one zone
lands in the next; kill -9 between RunInstances and the record update is found by gc; a wrong
secret is one line. No secret (access key secret, ACR token) in any output, state row or host file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from deploy_helpers import built_zero_code, ngcx, one_inference
from emulators.aliyun_ecs import EcsEmulator
from emulators.docker_hosts import DockerHosts, RegistryRelay, bridge_gateway

pytestmark = [pytest.mark.docker, pytest.mark.slow]

AK, SECRET = "LTAI5tNgcxE2eTest", "aliyun-secret-never-printed-7f3c"
A10 = "ecs.gn7i-c8g1.2xlarge"


@dataclass
class Cloud:
    emulator: EcsEmulator
    hosts: DockerHosts
    project: Path
    env: dict[str, str]
    outputs: list[str]

    def ngcx(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = ngcx(self.project, *args, env={**self.env, **(env or {})})
        self.outputs += [done.stdout, done.stderr]
        return done

    def deploy(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.ngcx("deploy", "--cloud", "aliyun", "--gpu", "A10", "--gpu-mode", "auto", *extra)

    def records(self) -> list[dict]:
        return json.loads(self.ngcx("deployments", "ls", "--all", "--json").stdout)

    def mine(self, record_id: int) -> list[dict]:
        """The emulator's instances tagged with this deployment (a duplicate would show here)."""
        return [i for i in self.emulator.instances() if i["tags"].get("ngcx:deployment") == str(record_id)]


def phase_line(done: subprocess.CompletedProcess[str]) -> str:
    """The line a deploy ends with: where the seconds went."""
    return next(line for line in done.stderr.splitlines() if " ready (" in line)


@pytest.fixture(scope="module")
def cloud(docker_client, registry, base_image, tmp_path_factory):
    project = built_zero_code(tmp_path_factory)
    home = tmp_path_factory.mktemp("home")
    with RegistryRelay(registry, listen_host=bridge_gateway(docker_client)) as relay:
        hosts = DockerHosts(docker_client, insecure_registries=[relay.address])
        # boot/start seconds: the API-side delay on top of the machine's own real boot (its dockerd start)
        with EcsEmulator(hosts, access_keys={AK: SECRET}, boot_seconds=1.0, start_seconds=1.0) as emulator:
            env = {"ALIBABA_CLOUD_ACCESS_KEY_ID": AK, "ALIBABA_CLOUD_ACCESS_KEY_SECRET": SECRET,
                   "NGCX_ALIYUN_ECS_ENDPOINT": emulator.endpoint, "NGCX_ACR_ENDPOINT": registry,
                   "NGCX_ACR_VPC_ENDPOINT": relay.address, "NGCX_STATE_DIR": str(home / "state"),
                   "NGCX_ACR_INSTANCE_ID": "cri-e2etest", "HOME": str(home), "DOCKER_CONFIG": str(home / ".docker"),
                   # the SDK sends even loopback calls through a proxy and ignores NO_PROXY
                   "HTTP_PROXY": "", "HTTPS_PROXY": "", "http_proxy": "", "https_proxy": ""}
            yield Cloud(emulator, hosts, project, env, [])


@pytest.fixture(scope="module")
def pushed(cloud) -> str:
    done = cloud.ngcx("push", "ngcx-app/onnx-zero-code:latest", "--registry", "acr://cn-hangzhou/e2e")
    assert done.returncode == 0, done.stderr[-2000:]
    assert cloud.emulator.issued_tokens, "the push must log in with an ACR temporary token"
    return done.stdout.strip()


@pytest.fixture(scope="module")
def baked(cloud, pushed) -> str:
    """`ngcx hosts bake`: the cold pull happens once, on the builder; deploys boot with the layers on disk."""
    t0 = time.monotonic()
    done = cloud.ngcx("hosts", "bake", "--cloud", "aliyun", "--region", "cn-hangzhou")
    assert done.returncode == 0, done.stderr[-3000:]
    image_id = done.stdout.strip()
    [image] = [m for m in cloud.emulator.images() if m["id"] == image_id]
    assert image["status"] == "Available" and image["tags"].get("ngcx:host-image") == "1"
    assert not [i for i in cloud.emulator.instances() if i["tags"].get("ngcx:role") == "bake"], "builder left"
    print(f"bake: {time.monotonic() - t0:.1f} s")
    return image_id


def test_push_deploy_infer_stop_redeploy_restart_failure_destroy(cloud, baked):
    first = cloud.deploy()
    assert first.returncode == 0, first.stderr[-3000:]
    url = first.stdout.strip()
    one_inference(cloud.project, url)
    [rec] = [r for r in cloud.records() if r["status"] == "ready"]
    assert rec["path"] == "fresh-host" and rec["instance_type"] == A10
    [inst] = cloud.mine(rec["id"])
    assert inst["image_id"] == baked and inst["status"] == "Running" and inst["client_token"] == rec["client_token"]
    assert set(rec["phases"]) == {"api", "boot", "pull", "start", "ready"}
    print("fresh (baked):", phase_line(first))

    assert cloud.ngcx("deployments", "stop", str(rec["id"])).returncode == 0
    [inst] = [i for i in cloud.emulator.instances() if i["id"] == rec["instance_id"]]
    assert (inst["status"], inst["stopped_mode"]) == ("Stopped", "StopCharging")

    again = cloud.deploy()                                      # the stopped host, with its pulled layers
    assert again.returncode == 0, again.stderr[-3000:]
    one_inference(cloud.project, again.stdout.strip())
    second = cloud.records()[0]
    assert second["path"] == "stopped-host" and second["instance_id"] == rec["instance_id"]
    assert second["phases"]["pull"] < 5, second["phases"]                # nothing crossed the network
    print("stopped host:", phase_line(again))

    logs = cloud.ngcx("deployments", "logs", str(second["id"]), "--tail", "20")
    assert logs.returncode == 0 and "ready" in logs.stdout.lower(), logs.stdout[-1500:]   # via Cloud Assistant
    assert cloud.ngcx("deployments", "stop", str(second["id"])).returncode == 0
    started = cloud.ngcx("deployments", "start", str(second["id"]))       # the container comes back with the host
    assert started.returncode == 0, started.stderr[-2000:]
    one_inference(cloud.project, started.stdout.strip())

    running = cloud.deploy()                                    # the running host: swap the container only
    assert running.returncode == 0, running.stderr[-3000:]
    third = cloud.records()[0]
    assert third["path"] == "running-host" and third["instance_id"] == rec["instance_id"]
    one_inference(cloud.project, running.stdout.strip())
    print("running host:", phase_line(running))

    assert cloud.ngcx("deployments", "stop", str(third["id"])).returncode == 0
    cloud.emulator.fail_restart(rec["instance_id"])             # StopCharging released the GPU; none left
    fallback = cloud.deploy()
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "cannot start again (OperationDenied.NoStock" in fallback.stderr
    fourth = cloud.records()[0]
    assert fourth["path"] == "fresh-host" and fourth["instance_id"] != rec["instance_id"]
    one_inference(cloud.project, fallback.stdout.strip())

    for record in (fourth, third):
        assert cloud.ngcx("deployments", "destroy", str(record["id"]), "--yes").returncode == 0
    left = {i["id"] for i in cloud.emulator.instances()}
    assert rec["instance_id"] not in left and fourth["instance_id"] not in left


def test_throttling_and_a_lost_5xx_make_no_duplicate_and_nostock_moves_zones(cloud, baked):
    emu = cloud.emulator
    before = emu.performed("RunInstances")
    emu.fail_next("RunInstances", "OperationDenied.NoStock", 403)            # the first zone: sold out
    emu.fail_next("RunInstances", "Throttling", 400, times=2)
    emu.fail_next("RunInstances", "ServiceUnavailable", 503, after_effect=True)  # created, answer lost
    done = cloud.deploy()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OperationDenied.NoStock; trying the next" in done.stderr
    rec = cloud.records()[0]
    [inst] = cloud.mine(rec["id"])                                           # one instance, not two
    assert emu.performed("RunInstances") - before == 1
    assert inst["zone"] != "cn-hangzhou-h" and inst["id"] == rec["instance_id"]
    one_inference(cloud.project, done.stdout.strip())
    assert cloud.ngcx("deployments", "destroy", str(rec["id"]), "--yes").returncode == 0


def test_kill_9_between_run_instances_and_the_record_is_found_by_gc(cloud, baked):
    emu = cloud.emulator
    release = threading.Event()
    emu.hold("RunInstances", release)
    before = emu.performed("RunInstances")
    proc = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--cloud", "aliyun", "--gpu", "A10",
                             "--gpu-mode", "auto"], cwd=cloud.project, env={**os.environ, **cloud.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while emu.performed("RunInstances") == before:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)                    # the cloud made it; ngcx never heard back
        proc.wait(timeout=30)
    finally:
        release.set()                                       # later RunInstances answer at once again

    rec = cloud.records()[0]
    assert rec["status"] == "creating" and rec["instance_id"] is None and rec["client_token"]
    [orphan] = cloud.mine(rec["id"])

    listed = cloud.ngcx("deployments", "ls")
    assert f"deployment {rec['id']} (aliyun) was interrupted while creating" in listed.stderr
    gc = cloud.ngcx("deployments", "gc", "--yes")
    assert gc.returncode == 0 and orphan["id"] in gc.stdout, gc.stderr[-2000:]
    assert not cloud.mine(rec["id"])
    assert cloud.records()[0]["status"] == "failed"


def test_a_wrong_secret_is_one_line_without_the_secret(cloud, pushed):
    wrong = "this-is-the-wrong-secret-9d1e"
    done = cloud.ngcx("deploy", "--cloud", "aliyun", "--gpu", "A10", env={"ALIBABA_CLOUD_ACCESS_KEY_SECRET": wrong})
    assert done.returncode == 2
    [line] = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "rejected the access key secret (InvalidAccessKeySecret)" in line and wrong not in done.stderr


def test_no_secret_in_outputs_state_or_on_the_hosts(cloud, baked):
    needles = [SECRET, *cloud.emulator.issued_tokens]
    assert len(needles) > 1
    for text in cloud.outputs:
        assert not [n for n in needles if n in text]
    db = Path(cloud.env["NGCX_STATE_DIR"]) / "state.db"
    blob = b"".join(p.read_bytes() for p in db.parent.glob("state.db*"))
    assert not [n for n in needles if n.encode() in blob]
    config = Path(cloud.env["DOCKER_CONFIG"]) / "config.json"
    assert not config.exists() or not [n for n in needles if n in config.read_text()]
    for inst in cloud.emulator.instances():
        if inst["status"] != "Running":
            continue
        console = cloud.hosts.console_output(inst["id"])
        files = cloud.hosts.run_command(inst["id"], "cat /var/lib/cloud/* /root/.docker/config.json "
                                        "/var/lib/ngcx/* /var/log/cloud-init-output.log 2>/dev/null; true", 30)
        assert not [n for n in needles if n in console or n in files.output], inst["id"]


def test_a_container_that_never_gets_ready_shows_its_last_lines_and_its_host_is_deleted(cloud, baked):
    done = cloud.deploy("--", "sh", "-c", "echo weights-file-truncated >&2; exit 3")
    assert done.returncode == 2
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert "weights-file-truncated" in line and "exited" in line
    rec = cloud.records()[0]
    assert rec["status"] == "failed" and "weights-file-truncated" in rec["detail"] and "deleted" in rec["detail"]
    assert not cloud.mine(rec["id"])                                     # nothing billed is left
