"""The data plane of the emulated load balancers (tests/emulators/balancer_plane.py), as a user of the ALB
emulators notices it: requests sent to a listener's address reach only targets that haproxy's own health
checks found healthy, a target whose health route fails leaves after `unhealthy_threshold` checks and
comes back after `healthy_threshold`, a new target gets nothing before it passed its checks, a draining
target gets no new request while its slow one finishes, weights are honoured, targets come and go under
constant keep-alive load without one failed request, a listener with nothing healthy answers 503, the
address of a listener never moves, https targets are checked and served over TLS, and close() leaves no
haproxy behind.

The targets are small real HTTP servers in this process on 127.0.0.1: /v2/health/ready answers the
status the test sets, /who says which target answered, /slow waits until the test releases it. Checks run
every 0.2 s, so a state change takes about half a second.
"""

from __future__ import annotations

import gc
import http.client
import os
import shutil
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from emulators.balancer_config import HealthCheck, Listener, PlaneError, Target, status_regex
from emulators.balancer_plane import HAPROXY, BalancerPlane
from emulators.traffic import tls_server_context
from support import missing

FAST = HealthCheck(interval_s=0.2, timeout_s=0.5)


class Handler(BaseHTTPRequestHandler):
    server: Backend

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        backend = self.server
        if self.path == "/v2/health/ready":
            backend.checks.append((time.monotonic(), backend.health_status))
            return self.reply(backend.health_status, "ok" if backend.health_status < 400 else "sick")
        backend.served += 1
        backend.headers = self.headers
        if self.path == "/slow":
            backend.slow_started.set()
            backend.release.wait(10)
        self.reply(200, backend.tag)

    def reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass


class Backend(ThreadingHTTPServer):
    """One emulated host: a real HTTP server on a free loopback port."""

    daemon_threads = True

    def __init__(self, tag: str, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.tag, self.health_status, self.served = tag, 200, 0
        self.headers: Message | None = None
        self.checks: list[tuple[float, int]] = []
        self.slow_started, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), name=f"backend-{tag}", daemon=True)
        self.thread.start()

    @property
    def target(self) -> Target:
        return Target("127.0.0.1", self.server_address[1])

    def checks_since(self, since: float, status: int) -> int:
        return sum(1 for at, code in self.checks if at >= since and code == status)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass    # haproxy ends its checks with a reset once it read the status line

    def stop(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


def until(what: str, check: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(every)
    return value


def get(address: tuple[str, int], path: str = "/who", conn: http.client.HTTPConnection | None = None
        ) -> tuple[int, str]:
    own = conn is None
    conn = conn or http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        if own:
            conn.close()


def state_of(plane: BalancerPlane, listener: str, backend: Backend) -> str | None:
    return plane.health().get(listener, {}).get((backend.target.host, backend.target.port))


def all_healthy(plane: BalancerPlane, listener: str, *backends: Backend) -> None:
    until(f"{[b.tag for b in backends]} healthy on {listener}",
          lambda: all(state_of(plane, listener, b) == "healthy" for b in backends))


@pytest.fixture(autouse=True)
def haproxy() -> None:
    if shutil.which(HAPROXY) is None:
        missing("haproxy not installed (apt: haproxy; scripts/setup.sh installs it)")


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[BalancerPlane]:
    with BalancerPlane("test", workdir=tmp_path / "plane") as p:
        yield p


@pytest.fixture
def backends() -> Iterator[Callable[..., Backend]]:
    made: list[Backend] = []

    def make(tag: str, tls: ssl.SSLContext | None = None) -> Backend:
        made.append(Backend(tag, tls))
        return made[-1]

    yield make
    for backend in made:
        backend.stop()


def test_traffic_reaches_only_healthy_targets_round_robin(plane: BalancerPlane, backends) -> None:
    a, b, sick = backends("a"), backends("b"), backends("sick")
    sick.health_status = 500
    plane.apply([Listener("web", 80, targets=(a.target, b.target, sick.target), health=FAST)])
    assert set(plane.health()["web"].values()) == {"initial"}, "no target is healthy or unhealthy before its checks"
    all_healthy(plane, "web", a, b)
    until("sick unhealthy", lambda: state_of(plane, "web", sick) == "unhealthy")
    answers = Counter(get(plane.address("web"))[1] for _ in range(20))
    assert answers == {"a": 10, "b": 10}, answers
    assert sick.served == 0
    assert a.headers and (a.headers["X-Forwarded-For"], a.headers["X-Forwarded-Port"]) == ("127.0.0.1", "80")


def test_a_new_target_gets_nothing_before_it_passed_its_checks(plane: BalancerPlane, backends) -> None:
    a = backends("a")
    slow_rise = HealthCheck(interval_s=0.4, timeout_s=0.3, healthy_threshold=3)
    plane.apply([Listener("web", 80, targets=(a.target,), health=slow_rise)])
    assert state_of(plane, "web", a) == "initial"
    assert get(plane.address("web"))[0] == 503
    assert a.served == 0
    all_healthy(plane, "web", a)
    assert a.checks_since(0, 200) >= 3
    assert get(plane.address("web")) == (200, "a")


def test_failing_target_leaves_after_fall_and_returns_after_rise(plane: BalancerPlane, backends) -> None:
    a, b = backends("a"), backends("b")
    hc = HealthCheck(interval_s=0.3, timeout_s=0.2, healthy_threshold=2, unhealthy_threshold=2)
    plane.apply([Listener("web", 80, targets=(a.target, b.target), health=hc)])
    all_healthy(plane, "web", a, b)

    b.health_status, since = 503, time.monotonic()
    until("b's first failed check", lambda: b.checks_since(since, 503) >= 1)
    assert state_of(plane, "web", b) == "healthy", "one failed check is below unhealthy_threshold"
    until("b unhealthy", lambda: state_of(plane, "web", b) == "unhealthy")
    assert b.checks_since(since, 503) >= 2
    served = b.served
    assert {get(plane.address("web"))[1] for _ in range(10)} == {"a"}
    assert b.served == served

    b.health_status, since = 200, time.monotonic()
    until("b's first good check", lambda: b.checks_since(since, 200) >= 1)
    assert state_of(plane, "web", b) == "unhealthy", "one good check is below healthy_threshold"
    until("b healthy again", lambda: state_of(plane, "web", b) == "healthy")
    assert b.checks_since(since, 200) >= 2
    assert {get(plane.address("web"))[1] for _ in range(10)} == {"a", "b"}


def test_draining_target_finishes_its_slow_request_and_gets_no_new_one(plane: BalancerPlane, backends) -> None:
    a, b = backends("a"), backends("b")
    plane.apply([Listener("web", 80, targets=(b.target,), health=FAST)])
    all_healthy(plane, "web", b)
    slow: list[tuple[int, str]] = []
    client = threading.Thread(target=lambda: slow.append(get(plane.address("web"), "/slow")))
    client.start()
    until("the slow request reached b", b.slow_started.is_set)

    plane.apply([Listener("web", 80, targets=(a.target, replace(b.target, draining=True)), health=FAST)])
    all_healthy(plane, "web", a)
    assert state_of(plane, "web", b) == "draining"
    served = b.served
    assert {get(plane.address("web"))[1] for _ in range(10)} == {"a"}
    assert b.served == served

    plane.apply([Listener("web", 80, targets=(a.target,), health=FAST)])   # deregistered, request still running
    assert set(plane.health()["web"]) == {(a.target.host, a.target.port)}
    assert f"{b.target.host}:{b.target.port}" in plane.servers("web"), "haproxy keeps it while it serves"
    b.release.set()
    client.join(10)
    assert slow == [(200, "b")]
    until("haproxy deleted b", lambda: plane.servers("web") == [f"{a.target.host}:{a.target.port}"])


def test_weights_are_honoured_and_weight_zero_gets_nothing(plane: BalancerPlane, backends) -> None:
    a, b = backends("a"), backends("b")
    plane.apply([Listener("web", 80, targets=(replace(a.target, weight=30), replace(b.target, weight=10)),
                          health=FAST)])
    all_healthy(plane, "web", a, b)
    answers = Counter(get(plane.address("web"))[1] for _ in range(40))
    assert abs(answers["a"] - 30) <= 2 and abs(answers["b"] - 10) <= 2, answers
    plane.apply([Listener("web", 80, targets=(replace(a.target, weight=0), b.target), health=FAST)])
    assert {get(plane.address("web"))[1] for _ in range(10)} == {"b"}


def test_listener_without_a_usable_target_answers_503(plane: BalancerPlane, backends) -> None:
    sick, a = backends("sick"), backends("a")
    sick.health_status = 500
    plane.apply([Listener("empty", 80, health=FAST),
                 Listener("sick", 80, targets=(sick.target,), health=FAST),
                 Listener("drained", 80, targets=(a.target,), health=FAST)])
    all_healthy(plane, "drained", a)
    plane.apply([Listener("empty", 80, health=FAST), Listener("sick", 80, targets=(sick.target,), health=FAST),
                 Listener("drained", 80, targets=(replace(a.target, draining=True),), health=FAST)])
    until("sick unhealthy", lambda: state_of(plane, "sick", sick) == "unhealthy")
    for name in ("empty", "sick", "drained"):
        assert get(plane.address(name))[0] == 503, name
    assert a.served == 0 and sick.served == 0


def test_a_connection_failure_is_retried_on_another_target(plane: BalancerPlane, backends) -> None:
    a, dead = backends("a"), backends("dead")
    dead.stop()     # its port refuses connections; unchecked, haproxy keeps sending it requests
    unchecked = HealthCheck(enabled=False)
    plane.apply([Listener("web", 80, targets=(a.target, dead.target), health=unchecked)])
    assert plane.health()["web"] == {(a.target.host, a.target.port): "unused",
                                     (dead.target.host, dead.target.port): "unused"}
    assert [get(plane.address("web")) for _ in range(10)] == [(200, "a")] * 10


def test_targets_change_under_keepalive_load_without_a_failed_request(plane: BalancerPlane, backends) -> None:
    a, b, c, d = (backends(tag) for tag in "abcd")
    plane.apply([Listener("web", 80, targets=(a.target, b.target), health=FAST)])
    all_healthy(plane, "web", a, b)
    stop, results = threading.Event(), Counter[str]()
    lock, errors = threading.Lock(), list[str]()

    def load() -> None:
        conn = http.client.HTTPConnection(*plane.address("web"), timeout=10)
        deadline = time.monotonic() + 6
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                status, body = get(plane.address("web"), conn=conn)
                outcome = body if status == 200 else f"HTTP {status}"
            except (OSError, http.client.HTTPException) as exc:
                outcome = f"{type(exc).__name__}: {exc}"
                conn.close()
            with lock:
                results[outcome] += 1
                if outcome not in "abcd":
                    errors.append(outcome)
        conn.close()

    clients = [threading.Thread(target=load, name=f"load-{i}") for i in range(4)]
    for thread in clients:
        thread.start()
    drain, heavy = (lambda h: replace(h.target, draining=True)), replace(d.target, weight=200)
    steps = [((a.target, b.target, c.target), (c,)),     # add, wait until healthy
             ((drain(a), b.target, c.target), ()),       # drain
             ((b.target, c.target, d.target), (d,)),     # remove the drained one, add another
             ((drain(b), c.target, heavy), ()),          # drain and reweight
             ((c.target, heavy), ())]                    # remove
    for i, (targets, fresh) in enumerate(steps):
        health = FAST if i < 2 else replace(FAST, interval_s=0.25)    # a health check change on the way
        plane.apply([Listener("web", 80, targets=targets, health=health)])
        all_healthy(plane, "web", *fresh)
        time.sleep(0.3)     # let the load run on this step (bounded: the clients stop after 6 s anyway)
    a.stop()                # deregistered hosts go away, as a rolling update stops them
    stop.set()
    for thread in clients:
        thread.join(15)
    total = sum(results.values())
    print(f"{total} requests under load, by target: {dict(results)}")
    assert not errors, f"{len(errors)} of {total} requests failed: {Counter(errors)}"
    assert total > 100 and set(results) == set("abcd"), f"{total} requests: {results}"
    assert plane.servers("web") == sorted(f"{h.target.host}:{h.target.port}" for h in (c, d)), "removed ones deleted"


def test_address_is_stable_and_keepalive_connections_survive_every_change(plane: BalancerPlane, backends) -> None:
    a, b = backends("a"), backends("b")
    plane.apply([Listener("web", 80, targets=(a.target,), health=FAST)])
    address, pids = plane.address("web"), plane.pids()
    all_healthy(plane, "web", a)
    conn = http.client.HTTPConnection(*address, timeout=10)
    assert get(address, conn=conn) == (200, "a")
    local = conn.sock.getsockname()

    plane.apply([Listener("web", 80, targets=(a.target, b.target), health=FAST),
                 Listener("api", 443, targets=(b.target,), health=FAST)])
    plane.apply([Listener("web", 80, targets=(b.target,), health=FAST)])
    assert plane.address("web") == address and plane.pids() == pids, "no restart, no new port"
    with pytest.raises(KeyError):
        plane.address("api")
    all_healthy(plane, "web", b)
    assert get(address, conn=conn) == (200, "b")
    assert conn.sock.getsockname() == local, "the idle keep-alive connection survived"

    front = plane.pids("web")[0]
    plane.apply([Listener("web", 80, targets=(b.target,), health=HealthCheck(interval_s=0.3, timeout_s=0.5))])
    assert plane.address("web") == address and plane.pids("web")[0] == front
    assert state_of(plane, "web", b) == "healthy", "health carried over a health-check change"
    assert get(address, conn=conn) == (200, "b")
    assert conn.sock.getsockname() == local, "the idle keep-alive connection survived the new health check"




def test_https_targets_are_checked_and_served_over_tls(plane: BalancerPlane, backends, tmp_path: Path) -> None:
    secure = backends("secure", tls_server_context(tmp_path))
    hc = HealthCheck(interval_s=0.2, timeout_s=0.5, scheme="https", codes="200-399")
    plane.apply([Listener("tls", 443, backend_scheme="https", targets=(secure.target,), health=hc)])
    all_healthy(plane, "tls", secure)
    assert get(plane.address("tls")) == (200, "secure")
    assert secure.checks, "the checks reached the TLS server"
    plane.apply([Listener("tls", 443, backend_scheme="https", targets=(secure.target,),
                          health=replace(hc, interval_s=0.3))])       # a new haproxy config, same targets
    assert state_of(plane, "tls", secure) == "healthy"
    assert get(plane.address("tls")) == (200, "secure")


def test_close_stops_haproxy_and_removes_its_files(tmp_path: Path, backends) -> None:
    a = backends("a")
    plane = BalancerPlane("closing", workdir=tmp_path / "plane")
    plane.apply([Listener("one", 80, targets=(a.target,), health=FAST), Listener("two", 80, health=FAST)])
    pids = plane.pids()
    assert len(pids) == 4 and any((tmp_path / "plane").iterdir()), "a front and a back haproxy per listener"
    plane.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any((tmp_path / "plane").iterdir())
    with pytest.raises(PlaneError):
        plane.apply([])

    forgotten = BalancerPlane("forgotten")
    forgotten.apply([Listener("one", 80, health=FAST)])
    pids, workdir = forgotten.pids(), forgotten.workdir
    del forgotten
    gc.collect()
    assert not workdir.exists(), "a plane nobody closed is stopped when it is collected (or at exit)"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_health_check_matchers_and_bad_input() -> None:
    assert status_regex("200") == "^(200)$"
    assert status_regex("200,204") == "^(200|204)$"
    assert status_regex("200-202") == "^(200|201|202)$"
    assert status_regex("http_2xx").count("|") == 99
    with pytest.raises(PlaneError):
        status_regex("ok")
    bad = [[Listener("x", 80), Listener("x", 81)], [Listener("..", 80)],
           [Listener("x", 80, targets=(Target("host", 1),))], [Listener("x", 80, health=HealthCheck(path="/a b"))],
           [Listener("x", 80, targets=(Target("10.0.0.1", 1, weight=300),))]]
    with BalancerPlane("bad") as plane:
        for listeners in bad:
            with pytest.raises(PlaneError):
                plane.apply(listeners)
        assert plane.pids() == []


def test_a_port_taken_meanwhile_is_skipped(plane: BalancerPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    import emulators.balancer_plane as module

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports, free_port = iter([taken]), module.free_port
        monkeypatch.setattr(module, "free_port", lambda bind: next(ports, None) or free_port(bind))
        plane.apply([Listener("web", 80, health=FAST)])
        assert plane.address("web")[1] != taken
        assert get(plane.address("web"))[0] == 503
