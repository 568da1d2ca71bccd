"""The machines behind emulated ECS instances (tests/emulators/docker_hosts.py), used as the ECS
emulator and a deploy would use them: boot with user-data that pulls from the "VPC registry" and
serves on port 8000, stop/start, snapshot, Cloud Assistant, console, delete, close.

The machines share one DockerHosts and one booted web host per module (boots cost seconds); the
tests run in file order and say which state they expect. Run with -s to see the timings.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
from docker.errors import ImageNotFound, NotFound

from emulators.docker_hosts import (
    DISK_PREFIX,
    IMAGE_PREFIX,
    NAME_PREFIX,
    SNAPSHOT_REPO,
    DockerHosts,
    HostError,
    RegistryRelay,
    bridge_gateway,
    ensure_host_image,
    host_image_tag,
)
from ngcx.core.engine import containers
from support import missing

pytestmark = pytest.mark.docker

PAGE = "ngcx ecs emulator: served from inside an emulated instance"
# python3's http.server, FROM the offline base. /usr/share/doc is removed and made again in the same
# layer: an overlay "opaque" directory (an xattr), which a careless disk copy would lose, letting the
# base layer's docs show through again on a machine made from a snapshot.
WEB_DOCKERFILE = f"""FROM ngcx/base:bookworm
RUN apt-get update -q \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3 \\
 && rm -rf /var/lib/apt/lists/* /usr/share/doc && mkdir /usr/share/doc \\
 && mkdir -p /srv/web && printf '%s' '{PAGE}' > /srv/web/index.html
WORKDIR /srv/web
CMD ["python3", "-m", "http.server", "8000"]
"""


def _wait_console(hosts: DockerHosts, instance_id: str, needle: str, count: int = 1, timeout: float = 90) -> float:
    """Seconds until the console shows `needle` `count` times (fails with the console's tail)."""
    start = time.monotonic()
    while (console := hosts.console_output(instance_id)).count(needle) < count:
        if time.monotonic() - start > timeout:
            pytest.fail(f"{instance_id}: no {needle!r} (x{count}) on the console after {timeout} s:\n{console[-3000:]}")
        time.sleep(0.1)
    return time.monotonic() - start


def _get(url: str, timeout: float = 90) -> str:
    """The body at `url`, retried until it answers 200 (a service starting after a boot, or thawing after a
    snapshot's pause: on a loaded 2-core CI machine that took over 30 s once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            resp = requests.get(url, timeout=2)
            if resp.status_code == 200:
                return resp.text
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{url} did not answer 200 within {timeout} s")
        time.sleep(0.2)


def _refused(url: str) -> bool:
    try:
        requests.get(url, timeout=1)
    except requests.RequestException:
        return True
    return False


def _ok(hosts: DockerHosts, instance_id: str, script: str) -> str:
    result = hosts.run_command(instance_id, script, timeout=60)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def timings() -> dict[str, float]:
    found: dict[str, float] = {}
    yield found
    print("\n[docker_hosts timings] " + ", ".join(f"{name}: {secs:.1f} s" for name, secs in found.items()))


@pytest.fixture(scope="module")
def host_image(docker_client, base_image, timings) -> str:
    if not Path("/sys/fs/cgroup").is_dir():
        missing("no /sys/fs/cgroup on this machine: an inner dockerd needs the cgroup tree")
    try:
        docker_client.images.get(host_image_tag())
        cached = True
    except ImageNotFound:
        cached = False
    start = time.monotonic()
    tag = ensure_host_image(docker_client)
    timings["host image " + ("(cached)" if cached else "build (cold)")] = time.monotonic() - start
    return tag


@pytest.fixture(scope="module")
def relay(docker_client, registry):
    with RegistryRelay(registry, listen_host=bridge_gateway(docker_client)) as relay:
        yield relay


@pytest.fixture(scope="module")
def web_image(docker_client, registry, base_image) -> str:
    """The served image, pushed to the loopback registry; returns its repository path there."""
    digest = hashlib.sha256((WEB_DOCKERFILE + docker_client.images.get(base_image).id).encode()).hexdigest()[:12]
    path = f"ngcx-test/ecs-web:{digest}"
    local = f"{registry}/{path}"
    try:
        docker_client.images.get(local)
    except ImageNotFound:
        docker_client.images.build(fileobj=io.BytesIO(WEB_DOCKERFILE.encode()), tag=local, rm=True, pull=False)
    push = subprocess.run(["/usr/bin/docker", "push", local], capture_output=True, text=True, timeout=300)
    assert push.returncode == 0, push.stderr
    return path


@pytest.fixture(scope="module")
def hosts(docker_client, host_image, relay):
    backend = DockerHosts(docker_client, insecure_registries=[relay.address])
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def web_host(hosts, relay, web_image, timings) -> tuple[str, str]:
    """A booted machine whose user-data pulled the web image through the relay and serves it on :8000."""
    instance_id = f"i-ngcxtest{secrets.token_hex(5)}"
    ref = f"{relay.address}/{web_image}"
    user_data = (f"#!/bin/sh\nset -e\necho \"user-data: hello from $(hostname)\"\n"
                 f"date +%s >> /var/lib/cloud/runs\ndocker pull -q {ref}\n"
                 f"docker run -d --init --name web --restart unless-stopped -p 8000:8000 {ref}\n"
                 f"echo user-data: serving\n")
    start = time.monotonic()
    ip = hosts.create(instance_id, "debian_12_x64_20G_alibase", user_data.encode())
    timings["create returned"] = time.monotonic() - start
    timings["create to `docker info`"] = _wait_console(hosts, instance_id, "ngcx-host: dockerd up") + \
        timings["create returned"]
    _wait_console(hosts, instance_id, "ngcx-host: user-data exited")
    timings["create to user-data done (pull + run)"] = time.monotonic() - start
    return instance_id, ip


def test_user_data_pulls_through_the_relay_and_serves_on_port_8000(hosts, web_host, relay):
    instance_id, ip = web_host
    console = hosts.console_output(instance_id)
    assert f"user-data: hello from {instance_id}" in console
    assert "user-data: serving" in console
    assert "ngcx-host: user-data exited 0" in console
    assert _get(f"http://{ip}:8000/") == PAGE
    assert relay.bytes_from_target > 1_000_000, "the image's layers came through the relay"
    assert "user-data: serving" in _ok(hosts, instance_id, "cat /var/log/cloud-init-output.log")


def test_stop_start_keeps_the_disk_and_runs_the_user_data_once(hosts, web_host, web_image, relay, timings):
    instance_id, ip = web_host
    pulled_before = relay.bytes_from_target
    start = time.monotonic()
    hosts.stop(instance_id)
    timings["stop"] = time.monotonic() - start
    assert _refused(f"http://{ip}:8000/")
    with pytest.raises(HostError, match="not running"):
        hosts.run_command(instance_id, "true", timeout=5)

    start = time.monotonic()
    ip = hosts.start(instance_id)
    _wait_console(hosts, instance_id, "ngcx-host: dockerd up", count=2)
    timings["start to `docker info`"] = time.monotonic() - start
    assert _get(f"http://{ip}:8000/") == PAGE, "the --restart unless-stopped container came back"
    timings["start to serving again"] = time.monotonic() - start

    console = hosts.console_output(instance_id)
    assert console.count("ngcx-host: running user-data") == 1
    assert "ngcx-host: user-data already ran on this instance" in console
    assert _ok(hosts, instance_id, "wc -l < /var/lib/cloud/runs").strip() == "1"
    assert web_image.split(":")[0] in _ok(hosts, instance_id, "docker images --format '{{.Repository}}:{{.Tag}}'")
    assert relay.bytes_from_target == pulled_before, "nothing pulled again after stop/start"


def test_run_command_merges_output_keeps_the_exit_code_and_is_bounded(hosts, web_host):
    instance_id, _ = web_host
    result = hosts.run_command(instance_id, "echo to-stdout; echo to-stderr >&2; whoami; exit 7", timeout=10)
    assert result.exit_code == 7
    assert result.output.split() == ["to-stdout", "to-stderr", "root"]
    start = time.monotonic()
    result = hosts.run_command(instance_id, "echo started; sleep 60 & sleep 60", timeout=1)
    assert result.exit_code == 124 and "started" in result.output
    assert time.monotonic() - start < 10
    assert "sleep 60" not in _ok(hosts, instance_id, "ps -eo args"), "the timed-out script's jobs were killed"


def test_snapshot_of_a_running_host_makes_machines_that_already_have_the_image(
        docker_client, hosts, web_host, web_image, relay, timings):
    instance_id, ip = web_host
    image_id = f"m-ngcxtest{secrets.token_hex(5)}"
    start = time.monotonic()
    hosts.snapshot(instance_id, image_id)
    timings["snapshot (running host)"] = time.monotonic() - start
    assert _get(f"http://{ip}:8000/") == PAGE, "the source machine goes on after the snapshot"

    pulled_before = relay.bytes_from_target
    copy_id = f"i-ngcxtest{secrets.token_hex(5)}"
    ref = f"{relay.address}/{web_image}"
    user_data = (f"docker image inspect {ref} >/dev/null && echo user-data: image present\n"
                 f"echo \"doc entries: $(docker run --rm --entrypoint ls {ref} -A /usr/share/doc | wc -l)\"\n"
                 "exit 3\n")  # no shebang: run by sh; a failing user-data still counts as run
    start = time.monotonic()
    copy_ip = hosts.create(copy_id, image_id, user_data.encode())
    _wait_console(hosts, copy_id, "ngcx-host: user-data exited")
    timings["create from snapshot to user-data done"] = time.monotonic() - start
    try:
        console = hosts.console_output(copy_id)
        assert "user-data: image present" in console
        assert "doc entries: 0" in console, "overlay opaque directories survived the disk copy"
        assert "ngcx-host: user-data exited 3" in console
        assert "user-data: hello from" not in console, "the source machine's user-data did not run again"
        assert _get(f"http://{copy_ip}:8000/") == PAGE, "the baked container starts from the image's disk"
        assert relay.bytes_from_target == pulled_before, "nothing was pulled: the layers came with the image"

        hosts.stop(copy_id)
        hosts.start(copy_id)
        _wait_console(hosts, copy_id, "ngcx-host: dockerd up", count=2)
        assert hosts.console_output(copy_id).count("ngcx-host: running user-data") == 1
    finally:
        hosts.delete(copy_id)
    with pytest.raises(NotFound):
        docker_client.containers.get(NAME_PREFIX + copy_id)
    with pytest.raises(NotFound):
        docker_client.volumes.get(DISK_PREFIX + copy_id)
    with pytest.raises(HostError):
        hosts.console_output(copy_id)
    hosts.delete(copy_id)  # already gone: no error (the emulator may retry a delete)

    hosts.delete_image(image_id)
    with pytest.raises(NotFound):
        docker_client.volumes.get(IMAGE_PREFIX + image_id)
    with pytest.raises(ImageNotFound):
        docker_client.images.get(f"{SNAPSHOT_REPO}:{image_id}")


def test_close_removes_every_machine_disk_and_image_it_made(docker_client, host_image, timings):
    backend = DockerHosts(docker_client, memory="768m")
    other = DockerHosts(docker_client)  # another session on the same engine: close() leaves it alone
    instance_id, other_id = f"i-ngcxtest{secrets.token_hex(5)}", f"i-ngcxtest{secrets.token_hex(5)}"
    try:
        backend.create(instance_id, "debian_12", b"")
        other.create(other_id, "debian_12", b"")
        _wait_console(backend, instance_id, "ngcx-host: no user-data")
        other.delete(instance_id)  # not other's machine: nothing happens to it
        with pytest.raises(HostError):
            other.console_output(instance_id)
        limit = _ok(backend, instance_id,
                    "cat /sys/fs/cgroup/memory$(awk -F: '$2 == \"memory\" {print $3}' /proc/self/cgroup)"
                    "/memory.limit_in_bytes")
        assert int(limit) == 768 * 2**20, "the machine's memory size is the one asked for"
        backend.stop(instance_id)
        start = time.monotonic()
        backend.snapshot(instance_id, f"m-{instance_id}")  # a stopped machine: the product's CreateImage path
        timings["snapshot (stopped host)"] = time.monotonic() - start
        backend.close()
        mine = {"label": f"{backend.label}={backend.owner}"}
        assert containers(docker_client, mine) == []
        assert docker_client.volumes.list(filters=mine) == []
        assert docker_client.images.list(filters=mine) == []
        assert other.console_output(other_id).startswith("ngcx-host: booting")
    finally:
        backend.close()
        other.close()


def test_relay_carries_the_registry_api_and_closes_cleanly(docker_client, registry):
    gateway = bridge_gateway(docker_client)
    with RegistryRelay(registry, listen_host=gateway) as relay:
        assert relay.address.startswith(f"{gateway}:")
        assert requests.get(f"http://{relay.address}/v2/", timeout=5).status_code == 200
        host, _, port = relay.address.rpartition(":")
        idle = socket.create_connection((host, int(port)), timeout=5)  # a client that never speaks
        time.sleep(0.2)
        start = time.monotonic()
    assert time.monotonic() - start < 3, "close() does not wait on idle connections"
    with idle:
        assert idle.recv(1) == b"", "an open connection is cut when the relay closes"
    assert relay.connections == 2 and relay.bytes_from_target > 0
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_the_host_engines_bridge_survives_the_inner_engines(docker_client, base_image, hosts, web_host):
    """An inner dockerd in the host's namespace would delete docker0; ours live in their own."""
    bridge = docker_client.api.inspect_network("bridge")["Options"].get("com.docker.network.bridge.name", "docker0")
    assert Path(f"/sys/class/net/{bridge}").exists()
    output = docker_client.containers.run(base_image, ["cat", "/proc/net/route"], network_mode="bridge", remove=True)
    assert b"eth0" in output, "a plain container still gets an address on the host's bridge"
