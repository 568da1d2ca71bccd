"""LocalBalancer (cli/deploy/local/balancer.py): haproxy in a container in front of real replica containers.

The replicas are the ECS emulator's web image (python3 on the offline base, tests/emulators/
test_docker_hosts.py), running a small threaded HTTP server: it answers its container name, /slow?s=N
after N seconds, and its health route 503 while /tmp/sick exists. Traffic goes only to the balancer's
127.0.0.1 port. Checks every second, up or down after 2 checks, so each state change takes ~2-3 s.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import secrets
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from docker.errors import ImageNotFound, NotFound
from emulators.test_docker_hosts import WEB_DOCKERFILE

from ngcx.core.engine import containers
from ngcx.core.errors import UserError
from ngcx.deploy.balancer import HEALTH_STATES, BalancerRef, BalancerSpec
from ngcx.deploy.local.balancer import LABEL_BALANCER, LABEL_CHECKS, LocalBalancer, _Admin, folder_of
from support import LOOPBACK_REGISTRY

pytestmark = pytest.mark.docker

REPLICA_PORT = 8000
REPLICA = r"""
import os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
NAME = os.environ["REPLICA"].encode()
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        url = urlsplit(self.path)
        code = 503 if url.path == "/v2/health/ready" and os.path.exists("/tmp/sick") else 200
        if url.path == "/slow":
            time.sleep(float(parse_qs(url.query)["s"][0]))
        self.send_response(code)
        self.send_header("Content-Length", str(len(NAME)))
        self.end_headers()
        self.wfile.write(NAME)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
"""


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return result


class Client:
    """One keep-alive HTTP client of the balancer: reconnects after an error, counts what failed."""

    def __init__(self, address: str) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.conn: http.client.HTTPConnection | None = None
        self.answers: Counter[str] = Counter()
        self.failed: list[str] = []

    def get(self, path: str = "/") -> tuple[int, str]:
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=15)
            self.conn.request("GET", path)
            response = self.conn.getresponse()
            status, body = response.status, response.read().decode()
        except (OSError, http.client.HTTPException) as exc:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            status, body = 0, repr(exc)
        if status == 200:
            self.answers[body] += 1
        else:
            self.failed.append(f"{status} {body[:80]}")
        return status, body


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name in ("state", "config"):
            folder = tmp_path_factory.mktemp(f"lb-{name}")
            mp.setenv(f"NGCX_{name.upper()}_DIR", str(folder))
        yield


@pytest.fixture(scope="module")
def web_image(docker_client: Any, base_image: str) -> str:
    """The ECS emulator's web image, under the tag its own fixture gives it (built here when missing)."""
    digest = hashlib.sha256((WEB_DOCKERFILE + docker_client.images.get(base_image).id).encode()).hexdigest()[:12]
    tag = f"{LOOPBACK_REGISTRY}/ngcx-test/ecs-web:{digest}"
    try:
        docker_client.images.get(tag)
    except ImageNotFound:
        docker_client.images.build(fileobj=io.BytesIO(WEB_DOCKERFILE.encode()), tag=tag, rm=True, pull=False)
    return tag


@pytest.fixture(scope="module")
def replicas(docker_client: Any, web_image: str) -> Iterator[list[Any]]:
    prefix = f"ngcx-lbtest-{secrets.token_hex(3)}"
    made = []
    try:
        for i in range(4):
            name = f"{prefix}-r{i}"
            made.append(docker_client.containers.run(
                web_image, ["python3", "-c", REPLICA], name=name, detach=True, environment={"REPLICA": name},
                labels={"ai.ngcx.test": "local-balancer"}))
        yield made
    finally:
        for container in made:
            container.remove(force=True)


@pytest.fixture
def fresh(replicas: list[Any]) -> list[Any]:
    """The replicas, each running and healthy (no /tmp/sick)."""
    for container in replicas:
        container.reload()
        if container.status != "running":
            container.start()
        container.exec_run(["rm", "-f", "/tmp/sick"])
    return replicas


@pytest.fixture
def spec() -> BalancerSpec:
    service = secrets.token_hex(4)
    return BalancerSpec(name=f"ngcx-svc-t{service}", zones=("local",), tags={"ngcx:service": service}, port=0,
                        health_interval_s=1, healthy_threshold=2, unhealthy_threshold=2, drain_s=30)


@pytest.fixture
def lb(state: None, docker_client: Any, base_image: str) -> LocalBalancer:
    return LocalBalancer(docker_client)


@pytest.fixture
def ref(lb: LocalBalancer, spec: BalancerSpec) -> Iterator[BalancerRef]:
    made = lb.ensure(spec)
    yield made
    lb.delete(made)


def healthy(lb: LocalBalancer, ref: BalancerRef, *names: str) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        health = lb.health(ref)
        return health if all(health.get(n) == "healthy" for n in names) else None

    return until(check, 15, f"{names} healthy")


def on_network(docker_client: Any, network: str) -> set[str]:
    return {c.name for c in docker_client.networks.get(network).containers}


def test_ensure_is_idempotent_tagged_finds_it_and_delete_leaves_nothing(lb, spec, docker_client):
    first = lb.ensure(spec)
    assert lb.ensure(spec) == first
    assert first.dns_name.startswith("127.0.0.1:") and first.group_id == spec.name
    found = containers(docker_client, {"label": f"{LABEL_BALANCER}={spec.name}"})
    assert [c.name for c in found] == [first.balancer_id]
    assert [n.name for n in docker_client.networks.list(names=[spec.name])] == [spec.name]
    container = found[0]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert container.labels["ngcx:service"] == spec.tags["ngcx:service"]
    assert json.loads(container.labels[LABEL_CHECKS])["path"] == spec.health_path
    assert "version 2.6" in container.exec_run(["haproxy", "-v"]).output.decode()
    bindings = container.attrs["HostConfig"]["PortBindings"]
    assert [b["HostIp"] for ports in bindings.values() for b in ports] == ["127.0.0.1"]   # no admin TCP port
    sock = os.stat(folder_of(spec.name) / "admin.sock")
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600 and sock.st_uid == os.getuid()
    status, _ = Client(first.dns_name).get()
    assert status == 503                       # no replica yet: haproxy's "no server available"
    assert lb.tagged(spec.tags) == [first]
    assert lb.tagged({**spec.tags, "ngcx:service": "another"}) == []

    lb.delete(first)
    with pytest.raises(NotFound):
        docker_client.containers.get(first.balancer_id)
    assert docker_client.networks.list(names=[spec.name]) == []
    assert not folder_of(spec.name).exists()
    lb.delete(first)                           # gone is done
    assert lb.tagged(spec.tags) == []


def test_three_registered_replicas_all_get_traffic_and_are_healthy(lb, ref, fresh):
    names = [r.name for r in fresh[:3]]
    for replica in fresh[:3]:
        lb.register(ref, replica.name, REPLICA_PORT)
    assert set(lb.health(ref).values()) <= {"initial", "healthy"}
    lb.register(ref, fresh[0].id, REPLICA_PORT)              # again, by id: nothing changes
    health = healthy(lb, ref, *names)
    assert health == dict.fromkeys(names, "healthy") and set(health.values()) <= set(HEALTH_STATES)
    client = Client(ref.dns_name)
    for _ in range(30):
        client.get()
    assert client.failed == [] and set(client.answers) == set(names)
    assert len(_Admin(ref.group_id, {}).rows()) == 3


def test_a_failing_or_stopped_replica_gets_no_traffic_once_out(lb, ref, fresh):
    sick, stopped, well = fresh[0], fresh[1], fresh[2]
    for replica in (sick, stopped, well):
        lb.register(ref, replica.name, REPLICA_PORT)
    healthy(lb, ref, sick.name, stopped.name, well.name)
    sick.exec_run(["touch", "/tmp/sick"])
    stopped.kill()
    client = Client(ref.dns_name)
    deadline = time.monotonic() + 15
    while {lb.health(ref)[n] for n in (sick.name, stopped.name)} != {"unhealthy"}:
        assert time.monotonic() < deadline, lb.health(ref)
        client.get()
    print(f"while going out: {dict(client.answers)}, failed {client.failed}")
    client.answers.clear()
    for _ in range(40):
        client.get()
    assert client.failed == [] and set(client.answers) == {well.name}


def test_deregister_lets_the_request_in_flight_finish_then_the_server_goes(lb, ref, fresh, docker_client):
    gone, stays = fresh[0], fresh[1]
    for replica in (gone, stays):
        lb.register(ref, replica.name, REPLICA_PORT)
    healthy(lb, ref, gone.name, stays.name)
    admin = _Admin(ref.group_id, {})
    results: list[tuple[int, str]] = []
    slow = [threading.Thread(target=lambda: results.append(Client(ref.dns_name).get("/slow?s=3"))) for _ in range(2)]
    for n, thread in enumerate(slow, 1):       # round robin: one slow request on each replica
        thread.start()
        until(lambda n=n: sum(int(r.get("scur") or 0) for r in admin.rows().values()) >= n, 5, f"{n} in flight")
    lb.deregister(ref, gone.name, REPLICA_PORT)
    lb.deregister(ref, gone.name, REPLICA_PORT)              # again: nothing changes
    assert lb.health(ref) == {gone.name: "draining", stays.name: "healthy"}
    client = Client(ref.dns_name)
    for _ in range(10):
        client.get()
    assert client.failed == [] and set(client.answers) == {stays.name}
    assert gone.name in on_network(docker_client, ref.group_id)   # still serving its slow request
    for thread in slow:
        thread.join(10)
    assert sorted(results) == sorted([(200, gone.name), (200, stays.name)])
    until(lambda: gone.name not in lb.health(ref), 5, "the drained server deleted by a sweep")
    assert on_network(docker_client, ref.group_id) == {ref.balancer_id, stays.name}
    assert len(admin.rows()) == 1


def test_a_draining_replica_comes_back_and_a_drain_past_its_time_shuts_its_sessions(lb, spec, fresh):
    ref = lb.ensure(BalancerSpec(**{**spec.__dict__, "drain_s": 2}))
    try:
        cut, stays = fresh[0], fresh[1]
        for replica in (cut, stays):
            lb.register(ref, replica.name, REPLICA_PORT)
        healthy(lb, ref, cut.name, stays.name)
        admin = _Admin(ref.group_id, {})
        results: list[tuple[int, str]] = []
        slow = [threading.Thread(target=lambda: results.append(Client(ref.dns_name).get("/slow?s=5")))
                for _ in range(2)]
        for n, thread in enumerate(slow, 1):       # round robin: one slow request on each replica
            thread.start()
            until(lambda n=n: sum(int(r.get("scur") or 0) for r in admin.rows().values()) >= n, 5, f"{n} in flight")
        lb.deregister(ref, stays.name, REPLICA_PORT)
        assert lb.health(ref)[stays.name] == "draining"      # its request holds it
        lb.register(ref, stays.name, REPLICA_PORT)           # taken back before its drain time passed
        assert lb.health(ref) == {cut.name: "healthy", stays.name: "healthy"}
        started = time.monotonic()
        lb.deregister(ref, cut.name, REPLICA_PORT)
        until(lambda: cut.name not in lb.health(ref), 4, "the server deleted once its drain time passed")
        assert time.monotonic() - started < 4.5             # before its slow request would have ended
        for thread in slow:
            thread.join(15)
        print(f"drain past its time: {results}")
        assert len(results) == 2 and (200, stays.name) in results and (200, cut.name) not in results
    finally:
        lb.delete(ref)


def test_registering_and_deregistering_under_load_fails_no_request(lb, ref, fresh):
    a, b, c = fresh[0], fresh[1], fresh[2]
    lb.register(ref, a.name, REPLICA_PORT)
    healthy(lb, ref, a.name)
    stop = threading.Event()
    clients = [Client(ref.dns_name) for _ in range(2)]

    def load(client: Client) -> None:
        deadline = time.monotonic() + 8
        while not stop.is_set() and time.monotonic() < deadline:
            client.get()

    threads = [threading.Thread(target=load, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    try:
        lb.register(ref, b.name, REPLICA_PORT)
        lb.register(ref, c.name, REPLICA_PORT)
        healthy(lb, ref, b.name, c.name)
        lb.deregister(ref, a.name, REPLICA_PORT)
        until(lambda: a.name not in lb.health(ref), 5, f"{a.name} deleted")
        lb.register(ref, a.name, REPLICA_PORT)
        lb.deregister(ref, b.name, REPLICA_PORT)
        healthy(lb, ref, a.name)
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    answers = sum((client.answers for client in clients), Counter())
    failed = [f for client in clients for f in client.failed]
    print(f"under load: {sum(answers.values())} requests answered {dict(answers)}, {len(failed)} failed {failed[:5]}")
    assert failed == [] and set(answers) == {a.name, b.name, c.name}


def test_a_restarted_balancer_or_new_checks_keep_the_replicas_and_the_port(lb, ref, spec, fresh, docker_client):
    replica = fresh[3]
    lb.register(ref, replica.name, REPLICA_PORT)
    healthy(lb, ref, replica.name)
    docker_client.containers.get(ref.balancer_id).restart(timeout=5)
    until(lambda: Client(ref.dns_name).get() == (200, replica.name), 15, "traffic after a restart")
    assert healthy(lb, ref, replica.name) == {replica.name: "healthy"}
    old_id = docker_client.containers.get(ref.balancer_id).id
    again = lb.ensure(BalancerSpec(**{**spec.__dict__, "health_interval_s": 2}))
    assert again == ref and docker_client.containers.get(ref.balancer_id).id != old_id
    until(lambda: Client(ref.dns_name).get() == (200, replica.name), 15, "traffic with the new checks")


def test_registering_a_replica_again_after_its_address_changed_moves_the_server(lb, ref, fresh, docker_client):
    replica = fresh[2]
    lb.register(ref, replica.name, REPLICA_PORT)
    healthy(lb, ref, replica.name)
    network = docker_client.networks.get(ref.group_id)

    def ip() -> str:
        return docker_client.containers.get(replica.id).attrs["NetworkSettings"]["Networks"][ref.group_id]["IPAddress"]

    before = ip()
    network.disconnect(replica, force=True)
    placeholder = docker_client.containers.run(replica.image, ["sleep", "30"], detach=True,
                                               labels={"ai.ngcx.test": "local-balancer"})
    try:
        network.connect(placeholder)           # takes the freed address: the replica comes back at another
        network.connect(replica)
        assert ip() != before
        until(lambda: lb.health(ref)[replica.name] == "unhealthy", 10, "checks of the old address failing")
        lb.register(ref, replica.name, REPLICA_PORT)
        healthy(lb, ref, replica.name)
        assert Client(ref.dns_name).get() == (200, replica.name)
    finally:
        placeholder.remove(force=True)


def test_a_missing_base_image_is_one_line_saying_how_to_make_it():
    class Images:
        def get(self, ref: str) -> Any:
            raise ImageNotFound(f"no such image: {ref}")

    class Engine:
        images = Images()

    with pytest.raises(UserError) as err:
        LocalBalancer(Engine()).image()
    assert "ngcx/base:bookworm" in err.value.line() and "ngcx base bootstrap" in err.value.line()
    assert "\n" not in err.value.line()


def test_settings_that_would_change_the_haproxy_config_are_refused(state):
    for bad in ("/ready\n    stats enable", "/a b", "ready"):
        with pytest.raises(UserError, match="health path"):
            LocalBalancer(object()).ensure(BalancerSpec(name="ngcx-svc-bad", zones=(), health_path=bad))
    with pytest.raises(UserError, match="cannot name a Docker network"):
        LocalBalancer(object()).ensure(BalancerSpec(name="bad name", zones=()))
