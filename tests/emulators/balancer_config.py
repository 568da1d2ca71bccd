"""What a balancer plane is told, and the haproxy configuration it becomes: the data model of balancer_plane.py.

Why apart from balancer_plane.py: the listeners, targets and health checks a cloud emulator (aliyun_alb.py,
aws_elbv2_planes.py) hands a plane, their validation, and the two haproxy configs rendered from them are
pure values and text, testable without a process; balancer_plane.py runs the processes and changes them at
run time. This module imports nothing of the plane.

Retries (haproxy `retry-on conn-failure`, `retries 3`, `option redispatch 1`): a request is sent again,
to another target, when the connection to its target (or the TLS handshake) failed, so nothing was
sent: a target that just stopped listening costs no failed request, as on a cloud ALB. A request that
reached its target is never retried: the target dying mid-request, answering garbage or timing out
gives the client 502/504, as ALB does. Server-side connections are closed after each response
(`option http-server-close`; client keep-alive stays), so no request goes out on a stale pooled
connection and a removed target holds no idle connection. A health check over https sets `check-ssl`
explicitly: dynamic servers do not inherit it from `ssl` as static ones do.

TLS termination: a listener with `certificate` (a PEM file holding the certificate, its chain and the
key, as haproxy's `crt` reads it) serves HTTPS with it (haproxy's default ciphers, TLS 1.2+); without
one the front is plain HTTP. A listener whose certificate or port changes gets a new front haproxy
(its client connections are closed: a cloud swaps certificates without that).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NAME = re.compile(r"[A-Za-z0-9_.-]+")
MAX_WEIGHT = 256


class PlaneError(RuntimeError):
    """haproxy refused a command, did not start, or the desired state is invalid."""


@dataclass(frozen=True)
class HealthCheck:
    path: str = "/v2/health/ready"
    interval_s: float = 2.0
    timeout_s: float = 1.0
    healthy_threshold: int = 2      # haproxy rise
    unhealthy_threshold: int = 2    # haproxy fall
    codes: str = "200"              # "200", "200,204" or a range "200-399" (as ALB / elbv2 matchers say it)
    scheme: str = "http"            # "https": check over TLS without verifying (hosts serve their own self-signed cert)
    enabled: bool = True


@dataclass(frozen=True)
class Target:
    host: str                       # an IP the machine running the tests can reach (loopback or a docker bridge IP)
    port: int
    weight: int = 100
    draining: bool = False          # no new requests; in-flight ones finish (the caller removes it after its delay)


@dataclass(frozen=True)
class Listener:
    name: str                       # unique in the plane, [A-Za-z0-9_.-]
    port: int                       # the port the balancer listens on in the cloud (80/443): informational
    backend_scheme: str = "http"    # "http" | "https" to the targets (TLS to targets without verification, as ALB does)
    targets: tuple[Target, ...] = ()
    health: HealthCheck = HealthCheck()
    certificate: str | None = None  # PEM file (certificate, chain, key): the front terminates TLS with it


def status_regex(codes: str) -> str:
    """haproxy `rstatus` regex for a matcher: "200", "200,204", "200-399" (also Aliyun's "http_2xx,http_3xx")."""
    wanted: list[int] = []
    for part in (p.strip() for p in codes.split(",") if p.strip()):
        if m := re.fullmatch(r"http_([1-5])xx", part):
            low = int(m.group(1)) * 100
            wanted.extend(range(low, low + 100))
        elif m := re.fullmatch(r"(\d{3})-(\d{3})", part):
            wanted.extend(range(int(m.group(1)), int(m.group(2)) + 1))
        elif re.fullmatch(r"\d{3}", part):
            wanted.append(int(part))
        else:
            raise PlaneError(f"health check codes {codes!r}: {part!r} is not a code, a range or http_Nxx")
    if not wanted:
        raise PlaneError(f"health check codes {codes!r} name no status")
    return "^(" + "|".join(str(c) for c in sorted(set(wanted))) + ")$"


def validate(listeners: Sequence[Listener]) -> None:
    names = [lst.name for lst in listeners]
    if len(set(names)) != len(names):
        raise PlaneError(f"listener names must be unique: {names}")
    for lst in listeners:
        check_name(lst.name, "listener")
        if lst.backend_scheme not in ("http", "https"):
            raise PlaneError(f"{lst.name}: backend_scheme {lst.backend_scheme!r} is not http or https")
        _check_health(lst.name, lst.health)
        keys = [(t.host, t.port) for t in lst.targets]
        if len(set(keys)) != len(keys):
            raise PlaneError(f"{lst.name}: a target is listed twice: {keys}")
        for t in lst.targets:
            _check_target(lst.name, t)


def check_name(name: str, what: str) -> None:
    if not NAME.fullmatch(name) or set(name) == {"."}:
        raise PlaneError(f"{what} name {name!r} must match [A-Za-z0-9_.-]+ (and be no folder like '..')")


def _check_health(listener: str, hc: HealthCheck) -> None:
    if hc.scheme not in ("http", "https"):
        raise PlaneError(f"{listener}: health check scheme {hc.scheme!r} is not http or https")
    if not re.fullmatch(r"/\S*", hc.path):
        raise PlaneError(f"{listener}: health check path {hc.path!r} must start with / and hold no space")
    if min(hc.interval_s, hc.timeout_s) <= 0 or min(hc.healthy_threshold, hc.unhealthy_threshold) < 1:
        raise PlaneError(f"{listener}: health check intervals must be > 0 and thresholds >= 1: {hc}")
    status_regex(hc.codes)


def _check_target(listener: str, t: Target) -> None:
    try:
        ipaddress.IPv4Address(t.host)
    except ValueError:
        raise PlaneError(f"{listener}: target host {t.host!r} is not an IPv4 address (haproxy resolves no "
                         "names for servers added at run time)") from None
    if not 0 < t.port < 65536 or not 0 <= t.weight <= MAX_WEIGHT:
        raise PlaneError(f"{listener}: {t.host}:{t.port} weight {t.weight}: port 1..65535, weight 0..{MAX_WEIGHT}")


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@dataclass
class Server:
    name: str
    target: Target


def server_options(lst: Listener, static: bool = False) -> str:
    """The `server` (static) / `add server` keywords of a target of `lst`, its weight aside."""
    opts = ["ssl verify none"] if lst.backend_scheme == "https" else []
    hc = lst.health
    if hc.enabled:
        opts.append(f"check inter {_ms(hc.interval_s)} rise {hc.healthy_threshold} fall {hc.unhealthy_threshold}")
        if hc.scheme == "https":
            opts.append("check-ssl verify none")    # dynamic servers do not inherit it from `ssl`
        elif static and lst.backend_scheme == "https":
            opts.append("no-check-ssl")             # static ones do
    return " ".join(opts)


DEFAULTS = ["defaults", "    mode http", "    timeout connect 2s", "    timeout client 60s", "    timeout server 60s",
            "    timeout http-keep-alive 60s", "    timeout http-request 10s", "    option http-server-close"]


def render_front(lst: Listener, bind: str, port: int, traffic: Path, sock: Path) -> str:
    """The listener's stable haproxy: the public port, relaying each request to the back haproxy."""
    tls = f" ssl crt {lst.certificate}" if lst.certificate else ""
    return "\n".join([
        "global", f"    stats socket {sock} mode 600 level user", "    nbthread 1", "    hard-stop-after 5s",
        "    ssl-default-bind-options ssl-min-ver TLSv1.2",
        *DEFAULTS, "    retries 3",
        f"frontend fe_{lst.name}", f"    bind {bind}:{port}{tls}", "    option forwardfor",
        f"    http-request set-header X-Forwarded-Proto {'https' if lst.certificate else 'http'}",
        f"    http-request set-header X-Forwarded-Port {lst.port}",
        "    default_backend back", "backend back", f"    server back unix@{traffic}", ""])


def render_back(lst: Listener, traffic: Path, sock: Path, servers: Sequence[Server] = (),
                state_file: Path | None = None) -> str:
    """The listener's balancing haproxy. Targets are added at run time; `servers` only on a rebuild."""
    hc = lst.health
    check = [f"    option httpchk GET {hc.path}", f"    http-check expect rstatus {status_regex(hc.codes)}",
             f"    timeout check {_ms(hc.timeout_s)}"] if hc.enabled else []
    state = ([f"    server-state-file {state_file}"], ["    load-server-state-from-file global"]) if state_file \
        else ([], [])
    static = [f"    server {s.name} {s.target.host}:{s.target.port} weight {s.target.weight} "
              f"{server_options(lst, static=True)}" for s in servers]
    return "\n".join([
        "global", f"    stats socket {sock} mode 600 level admin expose-fd listeners", "    nbthread 1",
        "    ssl-server-verify none", "    hard-stop-after 5s", *state[0],
        *DEFAULTS, "    retries 3", "    retry-on conn-failure", "    option redispatch 1", *state[1],
        f"frontend fe_{lst.name}", f"    bind unix@{traffic} mode 600", f"    default_backend be_{lst.name}",
        f"backend be_{lst.name}", "    balance roundrobin", *check, *static, ""])
