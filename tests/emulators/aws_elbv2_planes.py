"""elbv2's data plane: moto's balancers, listeners and target groups read back, a real haproxy per balancer.

Why apart from aws_elbv2.py: that module fixes the API calls moto gets wrong (what a client is answered);
this one makes the traffic real (what a client's requests meet), and knows nothing of the API's answers
beyond reading moto's state back. It is the base class of aws_elbv2.Elbv2Balancers and imports no API code.

- A data plane: a balancer_plane.BalancerPlane (real haproxy) per balancer. After every successful
  non-Describe call the region's state is read back from moto (Describe LoadBalancers / Listeners /
  TargetGroups, moto's DescribeTargetHealth for the registered targets) and each plane converges to it: a
  plane listener per listener, with the targets of the groups its default action forwards to (ForwardConfig
  weights kept: each group's weight shared by its targets; a group at weight 0 gets none), checked as the
  first such group says. Read back, not tracked, so any call that changes
  listeners, groups or targets (Modify*, Delete*, ...) is followed without parsing each one; the harness
  keeps only what moto forgets (draining targets). A target's host: the IP itself for type `ip`; for
  `instance`, its machine's address as Ec2Emulator knows it (a DockerHosts bridge IP), looked up every tick.
- `balancer_address(dns_name_or_arn, listener_port)`: where the plane serves that listener (tests send the
  balancer's traffic there); `plane(...)`: the plane. DeleteLoadBalancer stops its haproxy.
- `own_addresses` (off by default): each balancer gets its own loopback address (balancer_plane.
  loopback_address(), 127.0.100.0/24), its plane serves every listener there at the listener's own port, and
  every answer's DNSName is that IP literal instead of moto's name, so a client in another process (the CLI)
  reaches the balancer by the name the API gave it. The emulator's limit: there is no DNS offline, so the
  name is an address (a certificate for it names the IP); ports 80/443 need root or CAP_NET_BIND_SERVICE.
- TLS at HTTPS listeners: the plane terminates TLS with the listener's default certificate when it is in
  moto's ACM (a test imports it: acm.import_certificate with the PEM certificate, key and chain); the PEM
  the plane loads is written to a private folder of this emulator (mode 600). An HTTPS listener whose
  certificate ACM does not hold serves plain HTTP.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .aws_wire import Upstream, WireRequest, WireResponse, child_text, local, members, parse_xml, path
from .balancer_config import HealthCheck, Listener, Target
from .balancer_plane import BalancerPlane, loopback_address, release_loopback

SERVICE = "elasticloadbalancing"
VERSION = "2015-12-01"
NS = "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"
TICK_S = 0.1                       # how often draining deadlines and instance addresses are looked at


# --- moto's state, as read back -------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    """A target group: its health check and the targets moto has registered (id, port)."""

    arn: str
    protocol: str
    target_type: str
    check: HealthCheck                         # as the group says (unscaled)
    check_port: str
    targets: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ListenerState:
    port: int
    forwards: tuple[tuple[str, int], ...]      # (target group ARN, weight)
    protocol: str = "HTTP"
    certificate: str = ""                      # the default certificate's ARN (HTTPS)


@dataclass
class Balancer:
    arn: str
    name: str
    dns: str
    region: str
    listeners: tuple[ListenerState, ...] = ()
    address: str = ""                          # its own loopback address (own_addresses), its DNSName then
    plane: BalancerPlane | None = None
    applied: tuple[Listener, ...] | None = None


@dataclass(frozen=True)
class Drain:
    group: str
    id: str
    port: int
    host: str
    until: float                               # time.monotonic()


class Elbv2Planes:
    """A BalancerPlane per balancer in moto, converged to moto's state after each change and on a ticker."""

    def __init__(self, forward: Callable[[WireRequest], WireResponse], upstream: Callable[[], Upstream],
                 instance_ip: Callable[[str], str], plane_factory: Callable[[str], BalancerPlane] = BalancerPlane,
                 time_scale: float = 1.0) -> None:
        """forward: the emulator's own (counts `performed`); instance_ip: an instance's machine address ("" when
        it has no running machine); plane_factory: name -> a BalancerPlane."""
        self._forward, self._upstream, self._instance_ip = forward, upstream, instance_ip
        self._plane_factory = plane_factory
        self.time_scale = time_scale
        self.own_addresses = False                           # see the module docstring
        self._pems = Path(tempfile.mkdtemp(prefix="elbv2-certs-"))
        self.errors: list[str] = []                          # plane failures (a test asserts there are none)
        self._lock = threading.RLock()                       # the model below
        self._refresh_lock = threading.Lock()                # one read-back at a time: the last one wins
        self._converge_lock = threading.Lock()
        self._balancers: dict[str, Balancer] = {}
        self._groups: dict[str, Group] = {}
        self._drains: list[Drain] = []
        self._closing = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- where the planes serve (tests) ---------------------------------------------------------------

    def balancer_address(self, dns_name_or_arn: str, listener_port: int) -> tuple[str, int]:
        """Where the plane serves that balancer's listener: (host, port) for a test client's requests."""
        plane = self.plane(dns_name_or_arn)
        with self._lock:
            balancer = self._find(dns_name_or_arn)
            if not any(x.port == listener_port for x in balancer.listeners):
                raise KeyError(f"load balancer {balancer.name} has no listener on port {listener_port}")
        return plane.address(listener_name(listener_port))

    def plane(self, dns_name_or_arn: str) -> BalancerPlane:
        """The balancer's data plane, converged (KeyError for a balancer that does not exist (any more))."""
        with self._lock:
            balancer = self._find(dns_name_or_arn)
        self.converge(balancer)
        if balancer.plane is None:
            raise KeyError(f"load balancer {balancer.name} has no data plane: {self.errors[-1:]}")
        return balancer.plane

    def _find(self, dns_name_or_arn: str) -> Balancer:
        wanted = dns_name_or_arn.lower().rstrip(".")
        found = next((b for b in self._balancers.values() if wanted in (b.arn.lower(), b.dns.lower(), b.address)),
                     None)
        if found is None:
            raise KeyError(f"no load balancer {dns_name_or_arn}")
        return found

    def close(self) -> None:
        """Stop the ticker and every balancer's haproxy."""
        self._closing.set()
        if self._ticker is not None:
            self._ticker.join(5)
        with self._lock:
            planes = [b.plane for b in self._balancers.values() if b.plane is not None]
            for balancer in self._balancers.values():
                release_loopback(balancer.address)
            self._balancers.clear()
        for plane in planes:
            self._close_plane(plane)
        shutil.rmtree(self._pems, ignore_errors=True)

    # --- calls moto gets wrong ----------------------------------------------------------------------

    def _moto(self, region: str, action: str, params: dict[str, str]) -> ET.Element | None:
        reply = self._upstream().query(SERVICE, region, action, VERSION, params)
        return parse_xml(reply.body) if reply.ok else None

    # --- reading moto back, converging the planes ----------------------------------------------------

    def refresh(self, region: str) -> None:
        """Read the region's balancers, listeners, groups and registered targets from moto; converge the planes."""
        with self._refresh_lock:
            groups = {g.arn: g for g in self._read_groups(region)}
            balancers: dict[str, tuple[str, str, tuple[ListenerState, ...]]] = {}
            root = self._moto(region, "DescribeLoadBalancers", {"PageSize": "400"})     # AWS's largest page
            for member in members(path(root, "DescribeLoadBalancersResult") if root is not None else None,
                                  "LoadBalancers"):
                arn = child_text(member, "LoadBalancerArn")
                balancers[arn] = (child_text(member, "LoadBalancerName"), child_text(member, "DNSName"),
                                  self._read_listeners(region, arn))
            closed: list[tuple[BalancerPlane | None, str]] = []
            with self._lock:
                self._groups = {**{a: g for a, g in self._groups.items() if arn_region(a) != region}, **groups}
                self._drains = [d for d in self._drains if d.group in self._groups
                                and (d.id, d.port) not in self._groups[d.group].targets]   # registered again
                for arn in [a for a, b in self._balancers.items() if b.region == region and a not in balancers]:
                    gone = self._balancers.pop(arn)
                    closed.append((gone.plane, gone.address))
                for arn, (name, dns, listeners) in balancers.items():
                    if arn not in self._balancers:
                        address = loopback_address() if self.own_addresses else ""
                        self._balancers[arn] = Balancer(arn, name, dns, region, address=address)
                    balancer = self._balancers[arn]
                    balancer.listeners = listeners
            for plane, address in closed:
                if plane is not None:
                    self._close_plane(plane)
                release_loopback(address)          # once its haproxy is gone: a new balancer may bind it
        self._start_ticker()
        self.converge_all()

    def _read_groups(self, region: str) -> list[Group]:
        root = self._moto(region, "DescribeTargetGroups", {})
        found = []
        for m in members(path(root, "DescribeTargetGroupsResult") if root is not None else None, "TargetGroups"):
            arn = child_text(m, "TargetGroupArn")
            health = self._moto(region, "DescribeTargetHealth", {"TargetGroupArn": arn})
            targets = tuple((child_text(path(t, "Target"), "Id"), int(child_text(path(t, "Target"), "Port") or 0))
                            for t in members(path(health, "DescribeTargetHealthResult") if health is not None
                                             else None, "TargetHealthDescriptions"))
            text = {local(e.tag): e.text or "" for e in m} | {"HttpCode": child_text(path(m, "Matcher"), "HttpCode")}
            check = HealthCheck(
                text.get("HealthCheckPath") or "/", float(text.get("HealthCheckIntervalSeconds") or 30),
                float(text.get("HealthCheckTimeoutSeconds") or 5), int(text.get("HealthyThresholdCount") or 5),
                int(text.get("UnhealthyThresholdCount") or 2), text["HttpCode"] or "200",
                (text.get("HealthCheckProtocol") or "HTTP").lower(), text.get("HealthCheckEnabled") != "false")
            found.append(Group(arn, text.get("Protocol") or "HTTP", text.get("TargetType") or "instance", check,
                               text.get("HealthCheckPort") or "traffic-port", targets))
        return found

    def _read_listeners(self, region: str, balancer_arn: str) -> tuple[ListenerState, ...]:
        root = self._moto(region, "DescribeListeners", {"LoadBalancerArn": balancer_arn})
        found = []
        for m in members(path(root, "DescribeListenersResult") if root is not None else None, "Listeners"):
            forwards: list[tuple[str, int]] = []
            for action in [a for a in members(m, "DefaultActions") if child_text(a, "Type") == "forward"]:
                weighted = members(path(action, "ForwardConfig"), "TargetGroups")
                if weighted:
                    forwards += [(child_text(g, "TargetGroupArn"), int(child_text(g, "Weight") or 1)) for g in weighted]
                elif child_text(action, "TargetGroupArn"):
                    forwards.append((child_text(action, "TargetGroupArn"), 1))
            certificates = [child_text(c, "CertificateArn") for c in members(m, "Certificates")]
            found.append(ListenerState(int(child_text(m, "Port") or 0), tuple(forwards),
                                       child_text(m, "Protocol") or "HTTP", (certificates or [""])[0]))
        return tuple(sorted(found, key=lambda x: x.port))

    def _host(self, group: Group, target_id: str) -> str:
        return target_id if group.target_type == "ip" else self._instance_ip(target_id)

    def _desired(self, balancer: Balancer) -> tuple[Listener, ...]:
        now = time.monotonic()
        with self._lock:
            groups, listeners = dict(self._groups), balancer.listeners
            drains = [d for d in self._drains if d.until > now]
        planned = []
        for listener in listeners:
            forwards = [(groups[a], w) for a, w in listener.forwards if a in groups and w > 0]
            # ALB splits requests between groups by weight, then each group over its own targets: a target's
            # haproxy weight is its group's weight over the group's size (scaled so the largest is 100)
            per_target = [w / max(1, len(g.targets)) for g, w in forwards]
            top = max(per_target, default=1.0)
            targets: dict[tuple[str, int], Target] = {}
            for (group, _), share in zip(forwards, per_target, strict=True):
                for target_id, port in group.targets:
                    host = self._host(group, target_id)
                    if host and (host, port) not in targets:
                        targets[(host, port)] = Target(host, port, weight=max(1, round(100 * share / top)))
                for d in drains:
                    if d.group == group.arn and (d.host, d.port) not in targets:
                        targets[(d.host, d.port)] = Target(d.host, d.port, draining=True)
            first = forwards[0][0] if forwards else None
            check = HealthCheck() if first is None else replace(
                first.check, interval_s=first.check.interval_s * self.time_scale,
                timeout_s=first.check.timeout_s * self.time_scale)
            certificate = self._certificate(listener) if listener.protocol == "HTTPS" else None
            planned.append(Listener(listener_name(listener.port), listener.port,
                                    backend_scheme=(first.protocol if first else "HTTP").lower(),
                                    targets=tuple(targets.values()), health=check, certificate=certificate))
        return tuple(planned)

    def _certificate(self, listener: ListenerState) -> str | None:
        """The PEM file (certificate, chain, key) of the listener's ACM certificate; None when ACM has none."""
        from moto.acm.models import AWS_ROOT_CA, acm_backends

        parts = listener.certificate.split(":")
        if len(parts) < 6 or parts[2] != "acm":
            return None
        try:
            bundle = acm_backends[parts[4]][parts[3]].get_certificate(listener.certificate)
        except Exception:  # moto: AWSResourceNotFoundException; the plane then serves plain HTTP
            return None
        chain = bundle.chain.replace(AWS_ROOT_CA, b"").strip()          # moto appends its own fake root
        pem = b"\n".join(part.strip() for part in (bundle.cert, chain, bundle.key) if part.strip()) + b"\n"
        path = self._pems / f"{hashlib.sha256(pem).hexdigest()[:20]}.pem"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_bytes(pem)
        return str(path)

    def converge(self, balancer: Balancer) -> None:
        """Bring the balancer's plane to the desired state (a no-op when nothing changed since the last apply)."""
        with self._converge_lock:
            try:
                with self._lock:        # a plane is made only for a balancer that still exists (refresh closes it)
                    if self._balancers.get(balancer.arn) is not balancer or self._closing.is_set():
                        return
                    if balancer.plane is None:
                        name = f"{balancer.name}-{balancer.arn.rpartition('/')[2][:8]}"
                        balancer.plane = self._plane_factory(name, **(
                            {"bind": balancer.address, "listener_ports": True} if balancer.address else {}))
                desired = self._desired(balancer)
                if desired != balancer.applied:
                    balancer.plane.apply(desired)
                    balancer.applied = desired
            except Exception as exc:  # reported; the next tick tries again
                self._failed(balancer, "apply", exc)

    def converge_all(self) -> None:
        with self._lock:
            balancers = list(self._balancers.values())
        for balancer in balancers:
            self.converge(balancer)

    def _start_ticker(self) -> None:
        with self._lock:
            if self._ticker is not None or self._closing.is_set():
                return
            self._ticker = threading.Thread(target=self._tick, name="elbv2-planes", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        """Draining targets leave when their delay is over; instances' new addresses reach the planes."""
        while not self._closing.wait(TICK_S):
            now = time.monotonic()
            with self._lock:
                self._drains = [d for d in self._drains if d.until > now]
            self.converge_all()

    def _failed(self, balancer: Balancer, call: str, exc: BaseException) -> None:
        message = f"{balancer.name}: {call}: {type(exc).__name__}: {exc}"[:500]
        with self._lock:
            self.errors += [message] if message not in self.errors[-1:] else []

    def _close_plane(self, plane: BalancerPlane) -> None:
        with self._converge_lock:
            try:
                plane.close()
            except Exception as exc:  # reported
                self.errors.append(f"close: {type(exc).__name__}: {exc}"[:500])


def listener_name(port: int) -> str:
    return f"listener-{port}"


def arn_region(arn: str) -> str:
    return arn.split(":")[3] if arn.count(":") >= 4 else ""
