"""Elastic Load Balancing v2 (Application Load Balancers) in the AWS double: moto's API state, a real data plane.

Why: ngcx puts a service's replicas behind an ALB (issue 21); what it must get right is what a user notices
on AWS: traffic reaches only healthy targets, a deregistered target finishes its in-flight requests before
it is gone, creates can be retried. aws_ec2.Ec2Emulator routes every request signed for
`elasticloadbalancing` here; each call goes to moto, and this module adds around it what moto lacks.

What moto 5 does (moto/elbv2/models.py): it keeps balancers, listeners (and rules), target groups and their
attributes, registered targets and tags, validates names, ports, protocols and actions, refuses to delete a
group a listener uses. But CreateLoadBalancer with a name in use makes a *second* balancer (the duplicate
check compares ARNs with random ids); CreateTargetGroup with a name in use always answers
DuplicateTargetGroupName; DescribeTargetHealth says `healthy` for every registered target, HealthCheckPort
`traffic-port`; DeregisterTargets forgets a target at once (the delay attribute is stored, never used); a
terminated instance stays registered; nothing serves traffic.

What this module adds:
- A data plane (aws_elbv2_planes.py, the base class): a real haproxy per balancer, converged to moto's
  state read back after every successful non-Describe call; `balancer_address`, `plane`, `own_addresses`
  and TLS at HTTPS listeners are documented there.
- DescribeTargetHealth from the plane's checks, in AWS's shapes: `initial` (Elb.RegistrationInProgress /
  Elb.InitialHealthChecking), `healthy`, `unhealthy` (Target.ResponseCodeMismatch "Health checks failed with
  these codes: [503]", Target.Timeout, else Target.FailedHealthChecks: the plane says only "unhealthy", one
  probe of the health route tells why), `draining` (Target.DeregistrationInProgress), `unused`
  (Target.NotRegistered; Target.NotInUse: no listener forwards to the group; Target.InvalidState: an instance
  without a running machine), `unavailable` (Target.HealthCheckDisabled); HealthCheckPort resolved.
- Deregistration delay: a deregistered target is `draining` (no new requests, in-flight ones complete) for
  deregistration_delay.timeout_seconds (default 300) x `time_scale` (which also scales the health checks'
  interval and timeout), then gone; deregistering it again meanwhile succeeds (moto: InvalidTarget).
  TerminateInstances deregisters the instance from its groups (Ec2Emulator calls `instances_terminated`).
- Idempotent creates: CreateLoadBalancer / CreateTargetGroup with a name in use and the same settings answer
  the existing one (same ARN); other settings: 400 DuplicateLoadBalancerName / DuplicateTargetGroupName.
  "Same": the request's parameters (tags and list order aside) equal those of the create that made it
  (ModifyTargetGroup folded in), so an omitted parameter and its default spelled out differ. CreateListener
  on a port the balancer listens on already: the same settings answer that listener, others 400
  DuplicateListener (moto made a second listener on the port).
Faults (fail_next, hold), SigV4 and role checks are Ec2Emulator's; errors come in ELB's `<ErrorResponse>`
shape (aws_wire.error_response); throttling is `Throttling` (400).

Not emulated: listener rules (only default actions route), SSL policies (haproxy's TLS 1.2+ defaults), SNI
certificate lists (the default certificate only), a health check port other than the traffic port, per-group checks
when a listener forwards to several groups, one target id registered with two ports (moto keys targets by
id), slow start, stickiness, zones (every target gets traffic), NLB/GWLB, `provisioning` (moto: active).
"""

from __future__ import annotations

import http.client
import re
import ssl
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from typing import Any

from .aws_elbv2_planes import (
    SERVICE,
    VERSION,
    Drain,
    Elbv2Planes,
    Group,
    arn_region,
    listener_name,
)
from .aws_wire import (
    AwsError,
    WireRequest,
    WireResponse,
    child,
    child_text,
    local,
    members,
    new_request_id,
    parse_xml,
    path,
    xml_bytes,
)

NS = "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"
DEFAULT_DELAY_S = 300
DEREGISTRATION_DELAY = "deregistration_delay.timeout_seconds"
_LIST_KEY = re.compile(r"^(.*?)\.member\.\d+(.*)$")
_REASONS = {
    "registration": ("initial", "Elb.RegistrationInProgress", "Target registration is in progress"),
    "initial": ("initial", "Elb.InitialHealthChecking", "Initial health checks in progress"),
    "draining": ("draining", "Target.DeregistrationInProgress", "Target deregistration is in progress"),
    "not-registered": ("unused", "Target.NotRegistered", "Target is not registered to the target group"),
    "not-in-use": ("unused", "Target.NotInUse",
                   "Target group is not configured to receive traffic from the load balancer"),
    "stopped": ("unused", "Target.InvalidState", "Target is in the stopped state"),
    "disabled": ("unavailable", "Target.HealthCheckDisabled", "Health checks are disabled"),
    "timeout": ("unhealthy", "Target.Timeout", "Request timed out"),
    "failed": ("unhealthy", "Target.FailedHealthChecks", "Health checks failed"),
}


def listed(params: dict[str, str], prefix: str) -> list[dict[str, str]]:
    """`Targets.member.1.Id`, `Targets.member.1.Port`, ... as [{"Id": ..., "Port": ...}] in index order."""
    found: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        head, _, rest = key.partition(".member.")
        number, _, leaf = rest.partition(".")
        if head == prefix and number.isdigit():
            found.setdefault(int(number), {})[leaf] = value
    return [found[n] for n in sorted(found)]


def settings(params: dict[str, str], drop: Iterable[str] = ()) -> dict[str, Any]:
    """A create request's settings, comparable across calls: no Action/Version/tags, lists as sorted lists."""
    dropped = {"Action", "Version", *drop}
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in dropped or key.startswith("Tags."):
            continue
        match = _LIST_KEY.match(key)
        out.setdefault(match.group(1) + match.group(2), []).append(value) if match else out.update({key: value})
    return {k: sorted(v) if isinstance(v, list) else v for k, v in out.items()}


def codes_match(codes: str, status: int) -> bool:
    """ELB's matcher: "200", "200,204", "200-399"."""
    ranges = [(low, high or low) for low, _, high in (p.strip().partition("-") for p in codes.split(","))]
    return any(low.isdigit() and high.isdigit() and int(low) <= status <= int(high) for low, high in ranges)


def answer(action: str, build: Callable[[ET.Element], None]) -> WireResponse:
    """An ELB success answer: <ActionResponse><ActionResult>...</ActionResult><ResponseMetadata/>."""
    root = ET.Element(f"{{{NS}}}{action}Response")
    build(ET.SubElement(root, f"{{{NS}}}{action}Result"))
    ET.SubElement(ET.SubElement(root, f"{{{NS}}}ResponseMetadata"), f"{{{NS}}}RequestId").text = new_request_id()
    return WireResponse(200, (("Content-Type", "text/xml"),), xml_bytes(root))


def sub(parent: ET.Element, name: str, text: str | None = None) -> ET.Element:
    element = ET.SubElement(parent, f"{{{NS}}}{name}")
    element.text = text
    return element


class Elbv2Balancers(Elbv2Planes):
    """elbv2 for Ec2Emulator: `route` picks the requests signed for elasticloadbalancing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_lock = threading.Lock()                 # name check + create, atomically
        self._created: dict[tuple[str, str, str], dict[str, Any]] = {}   # (region, kind, name) -> settings
        self._ticker: threading.Thread | None = None
        self._special: dict[str, Callable[[WireRequest], WireResponse]] = {
            "CreateLoadBalancer": lambda r: self._create(r, "LoadBalancers", "LoadBalancer", "A load balancer"),
            "CreateTargetGroup": lambda r: self._create(r, "TargetGroups", "TargetGroup", "A target group"),
            "CreateListener": self._create_listener,
            "ModifyTargetGroup": self._modify_group,
            "DeregisterTargets": self._deregister,
            "DescribeTargetHealth": self._describe_health,
        }

    # --- the emulator's side ----------------------------------------------------------------------

    def route(self, request: WireRequest) -> Callable[[WireRequest], WireResponse] | None:
        """The handler for an elbv2 request: signed for elasticloadbalancing, else unsigned with elbv2's Version."""
        ours = request.service == SERVICE or (request.service == "" and request.params.get("Version") == VERSION)
        return self.handle if ours and request.protocol == "query" else None

    def handle(self, request: WireRequest) -> WireResponse:
        action = self._special.get(request.action, self._forward)  # the emulator's (counts `performed`)
        result = action(request)
        if result.ok and not request.action.startswith("Describe"):
            self.refresh(request.region)
        with self._lock:
            names = [(b.dns.encode(), b.address.encode()) for b in self._balancers.values() if b.address]
        body = result.body
        for dns, address in names:
            body = body.replace(b">" + dns + b"<", b">" + address + b"<")
        return result if body == result.body else result.with_body(body)

    def _create(self, request: WireRequest, kind: str, noun: str, what: str) -> WireResponse:
        """Same name + same settings: the existing one (AWS's idempotency); other settings: Duplicate...Name."""
        name = request.params.get("Name", "")
        return self._create_once(request, kind, noun, {"Names.member.1": name} if name else None, lambda _m: True,
                                 name, (f"Duplicate{noun}Name", f"{what} with the same name '{name}' exists, "
                                        "but with different settings"))

    def _create_listener(self, request: WireRequest) -> WireResponse:
        """A listener per port (moto made a second one on a taken port): the same settings get the existing
        listener, others DuplicateListener, as AWS answers."""
        arn, port = request.params.get("LoadBalancerArn", ""), request.params.get("Port", "")
        return self._create_once(request, "Listeners", "Listener", {"LoadBalancerArn": arn} if arn else None,
                                 lambda m: child_text(m, "Port") == port,
                                 f"{arn}:{port}", ("DuplicateListener", "A listener already exists on this port "
                                                                        "for this load balancer"))

    def _create_once(self, request: WireRequest, kind: str, noun: str, describe: dict[str, str] | None,
                     match: Callable[[ET.Element], bool], name: str, duplicate: tuple[str, str]) -> WireResponse:
        key, wanted = (request.region, kind, name), settings(request.params)
        with self._create_lock:
            existing = self._moto(request.region, f"Describe{kind}", describe) if describe else None
            result = path(existing, f"Describe{kind}Result") if existing is not None else None
            same = [m for m in members(result, kind) if match(m)]
            if existing is not None and result is not None and same:
                if self._created.get(key, wanted) != wanted:
                    raise AwsError(400, *duplicate)
                found = child(result, kind)
                assert found is not None
                for element in [c for c in result if local(c.tag) != kind]:
                    result.remove(element)            # NextMarker
                for member in [m for m in found if m not in same]:
                    found.remove(member)              # the balancer's listeners on other ports
                existing.tag, result.tag = f"{{{NS}}}Create{noun}Response", f"{{{NS}}}Create{noun}Result"
                return WireResponse(200, (("Content-Type", "text/xml"),), xml_bytes(existing))
            reply = self._forward(request)
            if reply.ok:
                self._created[key] = wanted
            return reply

    def _modify_group(self, request: WireRequest) -> WireResponse:
        """A later identical create compares against the group as modified."""
        reply = self._forward(request)
        name = request.params.get("TargetGroupArn", "").partition(":targetgroup/")[2].partition("/")[0]
        record = self._created.get((request.region, "TargetGroups", name))
        if reply.ok and record is not None:
            record.update(settings(request.params, drop=("TargetGroupArn",)))
        return reply

    def _deregister(self, request: WireRequest) -> WireResponse:
        """moto forgets the target; the harness keeps it draining for the group's deregistration delay."""
        group_arn = request.params.get("TargetGroupArn", "")
        asked = listed(request.params, "Targets")
        now = time.monotonic()
        with self._lock:
            group = self._groups.get(group_arn)
            draining = {(d.id, d.port) for d in self._drains if d.group == group_arn and d.until > now}
        if group is not None and asked and all((t.get("Id", ""), self._port(group, t)) in draining for t in asked):
            return answer("DeregisterTargets", lambda result: None)
        reply = self._forward(request)
        if reply.ok and group is not None:
            self._drain(request.region, group, [(t.get("Id", ""), self._port(group, t)) for t in asked])
        return reply

    def _drain(self, region: str, group: Group, targets: list[tuple[str, int]]) -> None:
        """Keep deregistered targets draining (their hosts as they are now) for the group's delay."""
        attributes = self._moto(region, "DescribeTargetGroupAttributes", {"TargetGroupArn": group.arn})
        result = path(attributes, "DescribeTargetGroupAttributesResult") if attributes is not None else None
        delay = next((float(child_text(m, "Value")) for m in members(result, "Attributes")
                      if child_text(m, "Key") == DEREGISTRATION_DELAY), float(DEFAULT_DELAY_S))
        until = time.monotonic() + delay * self.time_scale
        drains = [Drain(group.arn, i, port, host, until) for i, port in targets if (host := self._host(group, i))]
        with self._lock:
            self._drains += drains

    def instances_terminated(self, region: str, instance_ids: Iterable[str]) -> None:
        """EC2 deregisters a terminated instance from its target groups (draining first); moto does not.
        Call before the instance loses its machine (its address is what drains)."""
        ids = set(instance_ids)
        with self._lock:
            hits = [(g, [t for t in g.targets if t[0] in ids]) for g in self._groups.values()
                    if arn_region(g.arn) == region and g.target_type == "instance"]
        for group, targets in [(g, t) for g, t in hits if t]:
            self._drain(region, group, targets)
            params = {f"Targets.member.{n}.{key}": value for n, (i, port) in enumerate(targets, start=1)
                      for key, value in (("Id", i), ("Port", str(port)))} | {"TargetGroupArn": group.arn}
            self._upstream().query(SERVICE, region, "DeregisterTargets", VERSION, params)
        if any(t for _, t in hits):
            self.refresh(region)

    @staticmethod
    def _port(group: Group, target: dict[str, str]) -> int:
        """A target's port: its own, else the one registered under its id."""
        return int(target.get("Port") or next((p for i, p in group.targets if i == target.get("Id")), 0))

    # --- DescribeTargetHealth ------------------------------------------------------------------------

    def _describe_health(self, request: WireRequest) -> WireResponse:
        """moto's answer says which targets there are; their state comes from the plane (and the drains)."""
        reply = self._forward(request)
        root = parse_xml(reply.body) if reply.ok else None
        if root is None:
            return reply
        group_arn = request.params.get("TargetGroupArn", "")
        asked = {t.get("Id", ""): t.get("Port", "") for t in listed(request.params, "Targets")}
        now = time.monotonic()
        with self._lock:
            self._drains = [d for d in self._drains if d.until > now]
            drains = {(d.id, d.port): d for d in self._drains if d.group == group_arn}
            group = self._groups.get(group_arn)
        rows = [(child_text(path(m, "Target"), "Id"), int(child_text(path(m, "Target"), "Port") or 0),
                 child_text(path(m, "TargetHealth"), "State"))       # id, port, moto's state
                for m in members(path(root, "DescribeTargetHealthResult"), "TargetHealthDescriptions")]
        if not asked:
            rows += [(d.id, d.port, "unused") for key, d in drains.items() if key not in {r[:2] for r in rows}]
        port_of = {d.id: d.port for d in drains.values()}      # a draining target asked for by id alone
        rows = [(i, port_of[i], st) if st != "healthy" and i in port_of and asked.get(i) == "" else (i, p, st)
                for i, p, st in rows]
        health = self._plane_health(group) if group is not None else None

        def build(result: ET.Element) -> None:
            descriptions = sub(result, "TargetHealthDescriptions")
            for target_id, port, moto_state in rows:
                member = sub(descriptions, "member")
                target = sub(member, "Target")
                sub(target, "Id", target_id)
                sub(target, "Port", str(port))
                check_port = group.check_port if group is not None else "traffic-port"
                sub(member, "HealthCheckPort", str(port) if check_port in ("", "traffic-port") else check_port)
                state, reason, description = self._state(group, health, drains, target_id, port, moto_state)
                health_element = sub(member, "TargetHealth")
                sub(health_element, "State", state)
                if reason:
                    sub(health_element, "Reason", reason)
                    sub(health_element, "Description", description)

        return answer("DescribeTargetHealth", build)

    def _state(self, group: Group | None, health: dict[tuple[str, int], str] | None,
               drains: dict[tuple[str, int], Drain], target_id: str, port: int,
               moto_state: str) -> tuple[str, str, str]:
        if (target_id, port) in drains:
            return _REASONS["draining"]
        if group is None or moto_state != "healthy":   # moto: not registered, or a stopped instance
            return _REASONS["stopped"] if moto_state == "unused" and group is not None and any(
                i == target_id for i, _ in group.targets) else _REASONS["not-registered"]
        if health is None:
            return _REASONS["not-in-use"]
        host = self._host(group, target_id)
        if not host:
            return _REASONS["stopped"] if group.target_type == "instance" else _REASONS["registration"]
        if not group.check.enabled:
            return _REASONS["disabled"]
        seen = health.get((host, port))
        if seen == "healthy":
            return "healthy", "", ""
        if seen == "unhealthy":
            return self._probe(group, host, port)
        if seen == "draining":
            return _REASONS["draining"]
        return _REASONS["initial"] if seen == "initial" else _REASONS["registration"]

    def _plane_health(self, group: Group) -> dict[tuple[str, int], str] | None:
        """(host, port) -> the plane's state, over the listeners that forward to the group (None: none do)."""
        with self._lock:
            using = [(b, listener_name(x.port)) for b in self._balancers.values() for x in b.listeners
                     if any(arn == group.arn for arn, _ in x.forwards)]
        if not using:
            return None
        merged: dict[tuple[str, int], str] = {}
        for balancer, name in using:
            self.converge(balancer)
            try:
                states = balancer.plane.health().get(name, {}) if balancer.plane is not None else {}
            except Exception as exc:  # reported; the targets read as initial
                self._failed(balancer, "health", exc)
                states = {}
            merged.update({key: state for key, state in states.items() if merged.get(key) != "healthy"})
        return merged

    def _probe(self, group: Group, host: str, port: int) -> tuple[str, str, str]:
        """Why a target is unhealthy (the plane says only that it is): one request to its health route."""
        timeout = max(0.2, group.check.timeout_s * self.time_scale)
        check_port = port if group.check_port in ("", "traffic-port") else int(group.check_port)
        tls = {"context": ssl._create_unverified_context()} if group.check.scheme == "https" else {}
        conn = (http.client.HTTPSConnection if tls else http.client.HTTPConnection)(host, check_port, timeout=timeout,
                                                                                   **tls)
        try:
            conn.request("GET", group.check.path, headers={"User-Agent": "ELB-HealthChecker/2.0"})
            status = conn.getresponse().status
        except OSError as exc:
            return _REASONS["timeout" if isinstance(exc, TimeoutError) else "failed"]
        finally:
            conn.close()
        if codes_match(group.check.codes, status):
            return _REASONS["failed"]                  # it answers again: the plane has not seen enough checks yet
        return "unhealthy", "Target.ResponseCodeMismatch", f"Health checks failed with these codes: [{status}]"
