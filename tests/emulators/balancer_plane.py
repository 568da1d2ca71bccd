"""The data plane of the emulated cloud load balancers (Alibaba Cloud ALB, AWS ALB): real haproxy processes.

Why haproxy: the balancer emulators (aliyun_alb.py, aws_elbv2.py) keep the API state; the traffic must
meet a real proxy, so that what a rolling update test measures (failed requests, 503s, who answered)
is what a proxy in front of real hosts does. haproxy runs its own HTTP health checks against the
emulated hosts and alone decides who gets requests: a host is taken out by its server answering
something else than `HealthCheck.codes` (or not answering) `unhealthy_threshold` times in a row, and
comes back after `healthy_threshold` good checks. Nothing here pretends: health() reads haproxy's
`show stat` / `show servers state`.

Two haproxy processes per listener, changed at run time, never reloaded. A listener's "front" haproxy
owns the public port (`address()`, chosen once) and relays each request over a unix socket to its
"back" haproxy, which holds the targets, runs the checks and balances. Each listener has its own pair
(configs, stats socket, pid files and log under `workdir/<listener>/`), so adding or removing a listener
never touches another one. Target changes go through the back haproxy's runtime API on its admin stats
socket, never through a reload, because a reload closes the old process's idle keep-alive client
connections (a client sending on one at that moment sees a reset) and forgets dynamic servers:
- add: `add server BACKEND/NAME ADDR:PORT weight 0 check ...` (dynamic servers start in maintenance),
  `enable health`, `enable server`, `set server ... health down`, then the real weight: haproxy puts
  a server leaving maintenance UP before any check ran; forcing it down (at weight 0, so no request can
  slip in between) makes it wait for `healthy_threshold` passing checks, as a cloud's "initial" target.
- drain / undrain: `set server ... state drain|ready` (no new requests, in-flight ones finish);
- weight: `set server ... weight N` (0..256; 0 means no requests, as ALB weight 0);
- remove: `set server ... state maint`, then `del server` once haproxy says it has no connections
  left (retried on every later apply() and servers() call while a slow request still runs). Server
  names carry a serial number, so a target removed and added again at once never clashes with its
  old self.
Only a change of a listener's HealthCheck or backend_scheme needs a new config (httpchk and ssl are not
runtime settings in haproxy 2.6). Then only the back haproxy is replaced: the new one takes the unix
socket over from the old one (`-x` + `expose-fd listeners`, `-sf`), with the targets as static servers
and their health, drain and weight carried over in a server-state file; the old one finishes its
requests in flight. The front haproxy and its client connections, idle keep-alive ones included, see
nothing of it (the front opens one connection to the back per request: `option http-server-close`).

Where a listener serves: by default on the plane's `bind` address at a free port (`address()`), and
Listener.port only fills X-Forwarded-Port. With `listener_ports=True` the plane serves every listener at
its own port on `bind`, as a cloud balancer does at its DNS name: the AWS and ALB emulators give each
balancer its own loopback address (`loopback_address()`, 127.0.100.0/24) and call that address its DNS
name, so a client outside the test process (the real CLI) reaches it by the name the API returns (there
is no DNS offline; ports below 1024 need root or CAP_NET_BIND_SERVICE for haproxy).

Limits (not emulated): listener rules / host or path routing / redirects / fixed responses,
sticky sessions, slow start, HTTP/2 and gRPC, connection draining timeouts (the caller removes a
draining target after its own delay), cross-zone behaviour, access logs, ALB's own error pages (503
is haproxy's page), health-check Host headers or methods other than `GET path HTTP/1.0`. A listener
with no healthy, non-draining target answers 503 (haproxy "no server available"), as ALB does.
HealthCheck.enabled False means the targets are not checked and always get traffic; health() then says
"unused" (turning checks on again starts them healthy, checked at once). "initial" is a target that was
never up since it was added and whose checks pass or have failed for less than `unhealthy_threshold`
intervals; "unhealthy" is one failing for longer, or that fell from up and is not back yet.

The listeners, targets and health checks, their validation, the haproxy configs rendered from them, the
retries and TLS termination those configs set: balancer_config.py.
"""

from __future__ import annotations

import ipaddress
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Self

from .balancer_config import (
    HealthCheck,
    Listener,
    PlaneError,
    Server,
    Target,
    check_name,
    render_back,
    render_front,
    server_options,
    validate,
)

HAPROXY = "haproxy"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
SOCKET_DIR_MAX = 80        # longer folders get their sockets in a short temp dir (AF_UNIX paths <= 107 bytes)
STATES = ("healthy", "unhealthy", "initial", "draining", "unused")
# `show servers state` srv_admin_state bits (haproxy management guide).
ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20
ADMIN_DRAIN = 0x08 | 0x10
GOOD_CHECKS = ("L4OK", "L6OK", "L7OK", "L7OKC")


def cli(sock: Path, command: str, timeout: float = 5.0) -> str:
    """One command (or several joined by ';') on haproxy's stats socket; its whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


LOOPBACK_NET = ipaddress.IPv4Network("127.0.100.0/24")   # balancers' own addresses (listener_ports planes)
_loopback_lock = threading.Lock()
_loopback_used: set[str] = set()


def loopback_address() -> str:
    """A loopback address of LOOPBACK_NET no live balancer of this process has (lowest first); give it back
    with release_loopback(). A test's certificate may name every address of LOOPBACK_NET."""
    with _loopback_lock:
        for host in LOOPBACK_NET.hosts():
            if str(host) not in _loopback_used:
                _loopback_used.add(str(host))
                return str(host)
    raise PlaneError(f"every address of {LOOPBACK_NET} has a balancer")


def release_loopback(address: str) -> None:
    with _loopback_lock:
        _loopback_used.discard(address)


def free_port(bind: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind, 0))
        return int(s.getsockname()[1])


def until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise PlaneError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class _Proxy:
    """One listener: its front haproxy (never changed) and back haproxy (the targets; rebuilt on a new
    health check or backend scheme), and the servers the back one was told about."""

    listener: Listener
    bind: str
    port: int
    folder: Path
    sockets: Path                                            # folder, or a short temp dir (AF_UNIX paths)
    servers: dict[tuple[str, int], Server] = field(default_factory=dict)
    retiring: list[str] = field(default_factory=list)       # in maint, to `del server` once idle
    front: subprocess.Popen[bytes] | None = None
    back: subprocess.Popen[bytes] | None = None
    dying: list[subprocess.Popen[bytes]] = field(default_factory=list)     # replaced, finishing requests
    generation: int = 0                                                     # of the back's config and socket
    serial: int = 0                                                         # of server names

    @property
    def backend(self) -> str:
        return f"be_{self.listener.name}"

    @property
    def sock(self) -> Path:
        return self.sockets / f"admin-{self.generation}.sock"

    @property
    def traffic(self) -> Path:
        return self.sockets / "traffic.sock"

    def run(self, command: str) -> str:
        return cli(self.sock, command)

    def expect_silence(self, command: str) -> None:
        answer = self.run(command).strip()
        if answer:
            raise PlaneError(f"{self.listener.name}: haproxy answered {answer!r} to {command!r}")

    # --- processes -----------------------------------------------------------------------------
    def spawn(self, role: str, config: str, *extra: str) -> subprocess.Popen[bytes]:
        cfg = self.folder / f"{role}.cfg"
        cfg.write_text(config)
        argv = [HAPROXY, "-db", "-f", str(cfg), "-p", str(self.folder / f"{role}.pid"), *extra]
        with open(self.folder / "haproxy.log", "ab") as log:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    def start(self) -> None:
        """Both haproxy processes, the back one without targets."""
        self.start_back()
        front = render_front(self.listener, self.bind, self.port, self.traffic, self.sockets / "front.sock")
        self.front = self.spawn("front", front)
        until(self.serving, READY_TIMEOUT_S, f"listener {self.listener.name} to serve {self.bind}:{self.port}")

    def start_back(self, servers: Sequence[Server] = (), state_file: Path | None = None) -> None:
        """Start the back haproxy; with an older one alive, take its listening socket over (-x, -sf)."""
        old, old_sock = self.back, self.sock
        self.generation += 1
        extra = ["-x", str(old_sock), "-sf", str(old.pid)] if old is not None and old.poll() is None else []
        config = render_back(self.listener, self.traffic, self.sock, servers, state_file)
        self.back = self.spawn(f"back-{self.generation}", config, *extra)
        until(self.back_ready, READY_TIMEOUT_S, f"the back haproxy of listener {self.listener.name}")
        if old is not None:
            self.dying.append(old)

    def alive(self, process: subprocess.Popen[bytes] | None) -> None:
        if process is None or process.poll() is not None:
            tail = (self.folder / "haproxy.log").read_text(errors="replace")[-2000:]
            raise PlaneError(f"haproxy of listener {self.listener.name} exited:\n{tail}")

    def back_ready(self) -> bool:
        self.alive(self.back)
        try:
            return "Pid: " in self.run("show info") and self.traffic.exists()
        except OSError:
            return False

    def serving(self) -> bool:
        """The front answers on its CLI (so it bound its port: haproxy exits when a bind fails) and the port."""
        self.alive(self.front)
        try:
            if "Pid: " not in cli(self.sockets / "front.sock", "show info"):
                return False
            with socket.create_connection((self.bind, self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        for process in [self.front, *self.dying, self.back]:
            if process is not None:
                _reap(process, signal.SIGTERM)
        self.front, self.back, self.dying = None, None, []
        if self.sockets != self.folder:
            shutil.rmtree(self.sockets, ignore_errors=True)

    # --- servers -------------------------------------------------------------------------------
    def converge(self, lst: Listener) -> None:
        """Bring haproxy from self.listener to lst: add first, then weights/drain, remove last."""
        if (lst.health, lst.backend_scheme) != (self.listener.health, self.listener.backend_scheme):
            self.rebuild(lst)
        self.listener = lst
        wanted = {(t.host, t.port): t for t in lst.targets}
        for key, target in wanted.items():
            if key not in self.servers:
                self.add(target)
        for key, target in wanted.items():
            self.update(self.servers[key], target)
        for key in [k for k in self.servers if k not in wanted]:
            self.retire(self.servers.pop(key))
        self.reap_retired()

    def add(self, target: Target) -> None:
        self.serial += 1
        server = Server(f"{target.host}_{target.port}_{self.serial}", Target(target.host, target.port, 0))
        ref = f"{self.backend}/{server.name}"
        answer = self.run(f"add server {ref} {target.host}:{target.port} weight 0 "
                          f"{server_options(self.listener)}")
        if "New server registered" not in answer:
            raise PlaneError(f"{self.listener.name}: add server {target.host}:{target.port}: {answer.strip()}")
        enable = f"enable server {ref}"
        if self.listener.health.enabled:
            enable = f"enable health {ref}; {enable}; set server {ref} health down"
        self.expect_silence(enable)
        self.servers[(target.host, target.port)] = server

    def update(self, server: Server, target: Target) -> None:
        ref = f"{self.backend}/{server.name}"
        if target.draining != server.target.draining:
            self.expect_silence(f"set server {ref} state {'drain' if target.draining else 'ready'}")
        if target.weight != server.target.weight:
            self.expect_silence(f"set server {ref} weight {target.weight}")
        server.target = target

    def retire(self, server: Server) -> None:
        self.expect_silence(f"set server {self.backend}/{server.name} state maint")
        self.retiring.append(server.name)

    def reap_retired(self) -> None:
        """`del server` each retired server haproxy lets go of (one still serving a request stays)."""
        self.dying = [process for process in self.dying if process.poll() is None]
        for name in list(self.retiring):
            if "Server deleted" in self.run(f"del server {self.backend}/{name}"):
                self.retiring.remove(name)

    def rebuild(self, lst: Listener) -> None:
        """New health check or backend scheme: a new haproxy with the servers static. Checked before and
        after: health, drain and weight carry over (server-state file). Otherwise the servers start up
        (haproxy's default for static servers, checked at once when checks are on) and converge() drains
        and weighs them again."""
        self.reap_retired()
        state_file: Path | None = None
        if self.listener.health.enabled and lst.health.enabled:
            state_file = self.folder / "servers.state"
            state_file.write_text(self.run(f"show servers state {self.backend}"))
        else:
            for server in self.servers.values():
                server.target = Target(server.target.host, server.target.port, server.target.weight)
        self.listener = replace(lst, targets=self.listener.targets)
        self.retiring = []
        self.start_back(list(self.servers.values()), state_file)

    # --- health --------------------------------------------------------------------------------
    def health(self) -> dict[tuple[str, int], str]:
        stats = stat_table(self.run(f"show stat {self.backend} 4 -1"), ",")
        admin = {row["srv_name"]: int(row["srv_admin_state"])
                 for row in stat_table(self.run(f"show servers state {self.backend}"), " ")}
        by_name = {row["svname"]: row for row in stats}
        out: dict[tuple[str, int], str] = {}
        for key, server in self.servers.items():
            row = by_name.get(server.name)
            out[key] = _state(row, admin.get(server.name, 0), self.listener.health) if row else "unused"
        return out


def stat_table(text: str, sep: str) -> list[dict[str, str]]:
    """Rows of `show stat` (CSV, '# ' header) or `show servers state` (version line, '# ' header)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln.startswith("#")), None)
    if header is None:
        return []
    columns = header.lstrip("# ").split(sep)
    rows = [ln for ln in lines if not ln.startswith("#") and sep in ln]
    return [dict(zip(columns, row.split(sep), strict=False)) for row in rows]


def _state(row: dict[str, str], admin: int, hc: HealthCheck) -> str:
    """Map haproxy's view of one server (a `show stat` row, its admin state) to the cloud's five words.
    A server added down (chkdown 1: the forced `health down`) that was never up is "initial" while its
    checks pass, or fail for less than `unhealthy_threshold` intervals (haproxy's lastchg, whole seconds)."""
    if admin & ADMIN_MAINT or not hc.enabled:
        return "unused"
    if admin & ADMIN_DRAIN:
        return "draining"
    if row.get("status", "").startswith("UP"):
        return "healthy"
    failed = row.get("check_status", "").lstrip("* ") not in ("", "INI", *GOOD_CHECKS)
    never_up = int(row.get("chkdown") or 0) <= 1
    failing_long = int(row.get("lastchg") or 0) >= hc.unhealthy_threshold * hc.interval_s
    return "initial" if never_up and not (failed and failing_long) else "unhealthy"


def _reap(process: subprocess.Popen[bytes], sig: signal.Signals | None = None) -> None:
    """Wait for a haproxy to exit (after `sig`), killing it after STOP_TIMEOUT_S."""
    if sig is not None and process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _shutdown(proxies: dict[str, _Proxy], own_workdir: Path | None) -> None:
    """Stop every haproxy of a plane and remove its files: close(), or the plane's finalizer (garbage
    collection, interpreter exit), so no haproxy outlives the tests that forgot to close."""
    for proxy in proxies.values():
        _drop(proxy)
    proxies.clear()
    if own_workdir is not None:
        shutil.rmtree(own_workdir, ignore_errors=True)


def _drop(proxy: _Proxy) -> None:
    """Stop a listener's haproxy processes and remove its folder (configs, sockets, pid files, log)."""
    proxy.stop()
    shutil.rmtree(proxy.folder, ignore_errors=True)


class BalancerPlane:
    """A set of listeners, each served by its own haproxy on `bind`; see the module docstring."""

    def __init__(self, name: str, workdir: Path | None = None, bind: str = "127.0.0.1",
                 listener_ports: bool = False) -> None:
        check_name(name, "plane")
        if shutil.which(HAPROXY) is None:
            raise PlaneError("haproxy is not installed (apt-get install haproxy; scripts/setup.sh does)")
        self.name, self.bind, self.listener_ports = name, bind, listener_ports
        own = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"plane-{name}-")) if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proxies: dict[str, _Proxy] = {}
        self._lock = threading.RLock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._proxies, self.workdir if own else None)

    def apply(self, listeners: Sequence[Listener]) -> None:
        """Converge to exactly these listeners; returns once haproxy serves them."""
        validate(listeners)
        with self._lock:
            if self._closed:
                raise PlaneError(f"plane {self.name} is closed")
            wanted = {lst.name: lst for lst in listeners}
            for name in [n for n in self._proxies if n not in wanted]:
                _drop(self._proxies.pop(name))
            for name, lst in wanted.items():
                running = self._proxies.get(name)
                if running is not None and (running.listener.certificate != lst.certificate
                                            or (self.listener_ports and running.listener.port != lst.port)):
                    _drop(self._proxies.pop(name))      # a new front: another certificate or port
                if name not in self._proxies:
                    self._proxies[name] = self._launch(lst)
                self._proxies[name].converge(lst)

    def _launch(self, lst: Listener) -> _Proxy:
        """A new listener's haproxy (no targets yet) on a free port; another port if that one was taken."""
        for _ in range(5):
            folder = self.workdir / lst.name
            folder.mkdir(exist_ok=True)
            short = len(str(folder)) <= SOCKET_DIR_MAX
            sockets = folder if short else Path(tempfile.mkdtemp(prefix=f"plane-{lst.name[:20]}-"))
            proxy = _Proxy(replace(lst, targets=()), self.bind,
                           lst.port if self.listener_ports else free_port(self.bind), folder, sockets)
            (folder / "haproxy.log").unlink(missing_ok=True)
            try:
                proxy.start()
                return proxy
            except PlaneError as exc:
                proxy.stop()
                if f":{proxy.port}" not in str(exc) or self.listener_ports:   # "cannot bind socket ... [ADDR:PORT]"
                    raise
        raise PlaneError(f"no free port for listener {lst.name} on {self.bind}")

    def address(self, listener_name: str) -> tuple[str, int]:
        with self._lock:
            proxy = self._proxies.get(listener_name)
            if proxy is None:
                raise KeyError(f"no listener {listener_name!r} in plane {self.name}")
            return self.bind, proxy.port

    def health(self) -> dict[str, dict[tuple[str, int], str]]:
        with self._lock:
            return {name: proxy.health() for name, proxy in self._proxies.items()}

    def servers(self, listener_name: str) -> list[str]:
        """ADDR:PORT of every server haproxy still has for the listener, removed ones not yet deleted included."""
        with self._lock:
            proxy = self._proxies[listener_name]
            proxy.reap_retired()
            rows = stat_table(proxy.run(f"show servers state {proxy.backend}"), " ")
            return sorted(f"{row['srv_addr']}:{row['srv_port']}" for row in rows)

    def counts(self, listener_name: str) -> tuple[int, int]:
        """(requests, refused) the listener's back haproxy has seen since it started: its backend's `stot` and
        `econ`. `refused` is what no target took: a request while no server is up (haproxy's own 503, ALB's
        HTTPCode_ELB_503_Count) or a connection that failed (retried elsewhere when a server was left). The
        scaling emulators read the balancer's CloudWatch / CloudMonitor metrics from these. A rebuilt back
        haproxy (rebuild()) starts again at zero: callers taking differences treat a drop as a restart."""
        with self._lock:
            proxy = self._proxies.get(listener_name)
            if proxy is None:
                return 0, 0
            rows = stat_table(proxy.run(f"show stat {proxy.backend} 2 -1"), ",")
        return (sum(int(r.get("stot") or 0) for r in rows), sum(int(r.get("econ") or 0) for r in rows))

    def listeners(self) -> list[str]:
        with self._lock:
            return list(self._proxies)

    def pids(self, listener_name: str | None = None) -> list[int]:
        """The haproxy processes running now (a listener's or all; for tests and diagnostics)."""
        with self._lock:
            proxies = [self._proxies[listener_name]] if listener_name else list(self._proxies.values())
            processes = [q for p in proxies for q in (p.front, p.back, *p.dying)]
            return [q.pid for q in processes if q is not None and q.poll() is None]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


__all__ = ["HAPROXY", "LOOPBACK_NET", "STATES", "BalancerPlane", "loopback_address", "release_loopback"]
