"""Alibaba Cloud ALB (Application Load Balancer, 2020-06-16) for the ECS emulator, with a real haproxy as data plane.

Why: ngcx services sit behind the cloud's own load balancer (issue 21). Their code must be tested through
the real SDK (CommonRequest, product "Alb", RPC style) against a balancer that keeps real state — load
balancers that take a while to become Active, server groups whose servers are added and removed
asynchronously (JobId, Adding -> Available, Removing with connection draining), listeners, health checks,
tags, ClientToken replays, the gateway's faults — and whose traffic really flows: every Active load
balancer gets a BalancerPlane (balancer_plane.py, haproxy) configured from this state, and haproxy's own
health checks decide which emulated host gets requests. EcsEmulator (aliyun_ecs.py) owns the instances and
serves these actions on its port; this module keeps the ALB state and actions apart from ECS.

Emulated: Create/Get/List/DeleteLoadBalancer, Create/List/Delete/UpdateServerGroupAttribute,
AddServersTo/RemoveServersFrom/ListServerGroupServers, UpdateServerGroupServersAttribute (weight),
Create/List/Delete/GetListenerAttribute, GetListenerHealthStatus, TagResources/UnTagResources/
ListTagResources. Parameter and field names follow aliyun-python-sdk-alb's request classes and the
aliyun-java-sdk-alb unmarshallers; statuses follow the API reference (LoadBalancerStatus Provisioning/Active,
ListenerStatus Provisioning/Running, server Status Adding/Available/Removing, ServerGroupStatus
Available/Configuring, health Status Initial/Unhealthy/Unused/Unavailable).

Not emulated: forwarding rules, ACLs, security policies, access logs, zone changes, QUIC, server types other
than Ecs, server groups of type Ip/Fc, TLS at the balancer (an HTTPS listener keeps its CertificateId; its
data plane stays plain HTTP). LoadBalancerAddresses are made-up VPC addresses: tests and ngcx's harness reach
a listener through EcsEmulator.balancer_address().

Choices and guesses (said here as the brief asks):
- DeleteLoadBalancer deletes the balancer's listeners with it (its documented errors have no "in use" code);
  DeleteServerGroup of a group a listener forwards to answers 400 ResourceInUse.ServerGroup.
- A server group is busy ("Configuring") for `job_seconds` after an add/remove/update of its servers or
  attributes; a second such call meanwhile answers 400 Conflict.Lock (the code is real, when ALB uses it
  exactly is not documented).
- GetListenerHealthStatus lists only NonNormalServers, as the real API does: a server absent there is healthy.
  Mapping from the plane: initial -> Initial, unhealthy -> Unhealthy (ReasonCode RESPONSE_MISMATCH: the plane
  does not say why, the code is a guess), unused -> Unused, health check disabled -> Unavailable; draining
  servers are left out. ListServerGroupServers Status is the server's lifecycle, not its health (real API).
- Guessed error codes: ResourceNotFound.Instance (an unknown ECS ServerId), ResourceAlreadyExist.BackendServer
  (the same ServerId+Port twice), Mismatch.VpcId (an instance or group in another VPC), ResourceNotFound.Vpc,
  IllegalParam.<Name> for values ALB refuses (the pattern of NLB's documented IllegalParam.%s).
  A ClientToken reused with other parameters answers the gateway's IdempotentParameterMismatch (aliyun_rpc).
- HealthCheckCodes http_2xx..http_5xx map to haproxy status ranges; `health_scale` multiplies the check
  interval and timeout and `drain_scale` the ConnectionDrainTimeout, so tests keep real values but short waits.
"""

from __future__ import annotations

import re
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .aliyun_rpc import Action, ApiError, as_bool, as_int, indexed, iso_now, missing, repeated, required

if TYPE_CHECKING:
    from .balancer_plane import BalancerPlane

ALB_VERSION = "2020-06-16"
# Actions whose ClientToken makes a retry safe (same token + same params -> the first answer).
ALB_IDEMPOTENT = frozenset({
    "CreateLoadBalancer", "DeleteLoadBalancer", "CreateServerGroup", "DeleteServerGroup",
    "UpdateServerGroupAttribute", "AddServersToServerGroup", "RemoveServersFromServerGroup",
    "UpdateServerGroupServersAttribute", "CreateListener", "DeleteListener"})
# Actions that ask haproxy while answering, so they must not hold the emulator's lock meanwhile.
ALB_UNLOCKED = frozenset({"GetListenerHealthStatus"})
EDITIONS = ("Basic", "Standard", "StandardWithWaf")
HEALTH_CODES = {"http_2xx": (200, 299), "http_3xx": (300, 399), "http_4xx": (400, 499), "http_5xx": (500, 599)}
RESOURCE_TYPES = ("loadbalancer", "servergroup", "listener")
_ACTION_KEY = re.compile(r"DefaultActions\.(\d+)\.(Type|ForwardGroupConfig\.ServerGroupTuples\.(\d+)\.ServerGroupId)$")


class Machine(Protocol):
    """What ALB reads of an ECS instance (aliyun_ecs.Instance)."""

    status: str
    private_ip: str
    vpc_id: str


def _new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(18))


def _job() -> dict[str, str]:
    return {"JobId": str(uuid.uuid4())}


def illegal(name: str, why: str = "") -> ApiError:
    return ApiError(400, f"IllegalParam.{name}", f"The param of {name} is illegal. {why}".rstrip())


def not_found(kind: str, resource_id: str) -> ApiError:
    return ApiError(404, f"ResourceNotFound.{kind}", f"The specified resource {kind} [{resource_id}] is not found.")


def incorrect_status(kind: str, resource_id: str, status: str) -> ApiError:
    return ApiError(400, f"IncorrectStatus.{kind}", f"The status of {kind} [{resource_id}] is incorrect: {status}.")


def _choice(params: Mapping[str, str], name: str, allowed: Iterable[str], default: str = "") -> str:
    value = params.get(name) or default
    if not value:
        raise missing(name)
    allowed = tuple(allowed)
    if value not in allowed:
        raise illegal(name, f"Expected one of {', '.join(allowed)}.")
    return value


def _paged(items: list[Any], params: Mapping[str, str], key: str) -> dict[str, Any]:
    """NextToken/MaxResults paging (1..100, default 20); the token is the offset of the next page."""
    size = as_int(params, "MaxResults", 20, 1, 100)
    token = params.get("NextToken", "")
    if token and not token.isdigit():
        raise illegal("NextToken")
    start = int(token or 0)
    following = start + size
    return {key: items[start:following], "MaxResults": size, "TotalCount": len(items),
            "NextToken": str(following) if following < len(items) else ""}


def parse_tags(params: Mapping[str, str]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for tag in indexed(params, "Tag"):
        key = tag.get("Key", "")
        if not key or len(key) > 128 or key.startswith(("aliyun", "acs:")) or "http://" in key or "https://" in key:
            raise illegal("Tag.Key", "At most 128 characters, not starting with aliyun or acs:.")
        tags[key] = tag.get("Value", "")
    if len(tags) > 20:
        raise illegal("Tag", "At most 20 tags.")
    return tags


def tags_match(tags: Mapping[str, str], params: Mapping[str, str]) -> bool:
    return all(want.get("Key") in tags and ("Value" not in want or tags[want["Key"]] == want["Value"])
               for want in indexed(params, "Tag"))


def _tag_view(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def plane_codes(codes: Iterable[str]) -> str:
    """['http_2xx', 'http_3xx'] -> '200-399' (adjacent classes merged), as the plane's HealthCheck takes it."""
    spans: list[list[int]] = []
    for low, high in sorted(HEALTH_CODES[code] for code in codes):
        if spans and spans[-1][1] + 1 == low:
            spans[-1][1] = high
        else:
            spans.append([low, high])
    return ",".join(f"{low}-{high}" for low, high in spans)


@dataclass
class HealthConfig:
    enabled: bool = True
    path: str = "/"
    protocol: str = "HTTP"
    interval: int = 2
    timeout: int = 5
    healthy: int = 3
    unhealthy: int = 3
    codes: tuple[str, ...] = ("http_2xx",)

    def update(self, params: Mapping[str, str]) -> None:
        """Apply the HealthCheckConfig.* parameters that are present (absent ones keep their value)."""
        prefix = "HealthCheckConfig."
        self.enabled = as_bool(params, prefix + "HealthCheckEnabled", self.enabled)
        path = params.get(prefix + "HealthCheckPath")
        if path is not None:
            if not path.startswith("/") or len(path) > 80:
                raise illegal("HealthCheckConfig.HealthCheckPath", "1..80 characters starting with /.")
            self.path = path
        if params.get(prefix + "HealthCheckProtocol"):
            self.protocol = _choice(params, prefix + "HealthCheckProtocol", ("HTTP", "HTTPS"))
        self.interval = as_int(params, prefix + "HealthCheckInterval", self.interval, 1, 50)
        self.timeout = as_int(params, prefix + "HealthCheckTimeout", self.timeout, 1, 300)
        self.healthy = as_int(params, prefix + "HealthyThreshold", self.healthy, 2, 10)
        self.unhealthy = as_int(params, prefix + "UnhealthyThreshold", self.unhealthy, 2, 10)
        codes = (repeated(params, prefix + "HealthCheckCodes") or repeated(params, prefix + "HealthCheckHttpCodes"))
        if codes:
            if any(code not in HEALTH_CODES for code in codes):
                raise illegal("HealthCheckConfig.HealthCheckCodes", f"Expected {', '.join(HEALTH_CODES)}.")
            self.codes = tuple(dict.fromkeys(codes))

    def view(self) -> dict[str, Any]:
        return {"HealthCheckEnabled": self.enabled, "HealthCheckPath": self.path, "HealthCheckProtocol": self.protocol,
                "HealthCheckMethod": "GET", "HealthCheckInterval": self.interval, "HealthCheckTimeout": self.timeout,
                "HealthyThreshold": self.healthy, "UnhealthyThreshold": self.unhealthy,
                "HealthCheckCodes": list(self.codes), "HealthCheckHttpVersion": "HTTP1.1"}


@dataclass
class Server:
    server_id: str
    port: int
    weight: int
    description: str
    ip: str
    status: str = "Adding"
    draining: bool = False
    generation: int = 0


@dataclass
class ServerGroup:
    id: str
    name: str
    vpc_id: str
    protocol: str
    health: HealthConfig
    drain_enabled: bool
    drain_timeout: int
    tags: dict[str, str]
    servers: dict[tuple[str, int], Server] = field(default_factory=dict)
    busy_until: float = 0.0
    created: str = field(default_factory=iso_now)


@dataclass
class Listener:
    id: str
    lb_id: str
    protocol: str
    port: int
    group_id: str
    certificates: list[str]
    description: str
    tags: dict[str, str]
    status: str = "Provisioning"


@dataclass
class LoadBalancer:
    id: str
    name: str
    vpc_id: str
    address_type: str
    edition: str
    pay_type: str
    zones: list[tuple[str, str]]
    tags: dict[str, str]
    deletion_protection: bool
    status: str = "Provisioning"
    created: str = field(default_factory=iso_now)
    plane: BalancerPlane | None = None
    plane_error: str = ""
    plane_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Alb:
    """ALB state and actions. `lock` is the emulator's own (actions already run under it, except
    ALB_UNLOCKED); `spawn`/`sleep_until` are its worker helpers; `instance` finds an ECS instance."""

    def __init__(self, lock: threading.RLock, spawn: Callable[..., None], sleep_until: Callable[[float], bool],
                 vpc_id: str, vswitches: Mapping[str, str], instance: Callable[[str], Machine | None],
                 region: str) -> None:
        self._lock, self._spawn, self._sleep_until = lock, spawn, sleep_until
        self._vpc_id, self._vswitches, self._instance, self.region = vpc_id, vswitches, instance, region
        self.provision_seconds = 0.5     # Provisioning -> Active
        self.job_seconds = 0.2           # Adding -> Available; how long a server group stays Configuring
        self.health_scale = 1.0          # multiplies HealthCheckInterval/Timeout for the plane
        self.drain_scale = 1.0           # multiplies ConnectionDrainTimeout
        self.data_plane = True           # False: no haproxy (control-plane-only tests)
        self.plane_errors: list[tuple[str, str]] = []
        self._lbs: dict[str, LoadBalancer] = {}
        self._groups: dict[str, ServerGroup] = {}
        self._listeners: dict[str, Listener] = {}
        self.actions: dict[str, Action] = {
            "CreateLoadBalancer": self._create_lb, "GetLoadBalancerAttribute": self._get_lb,
            "ListLoadBalancers": self._list_lbs, "DeleteLoadBalancer": self._delete_lb,
            "CreateServerGroup": self._create_group, "ListServerGroups": self._list_groups,
            "DeleteServerGroup": self._delete_group, "UpdateServerGroupAttribute": self._update_group,
            "AddServersToServerGroup": self._add_servers, "RemoveServersFromServerGroup": self._remove_servers,
            "UpdateServerGroupServersAttribute": self._update_servers,
            "ListServerGroupServers": self._list_servers, "CreateListener": self._create_listener,
            "ListListeners": self._list_listeners, "GetListenerAttribute": self._get_listener,
            "DeleteListener": self._delete_listener, "GetListenerHealthStatus": self._health_status,
            "TagResources": self._tag, "UnTagResources": self._untag, "ListTagResources": self._list_tags,
        }

    # --- for tests and the harness ------------------------------------------------------------

    def address(self, load_balancer: str, listener_port: int) -> tuple[str, int]:
        """Where the data plane serves this listener (load balancer by id or DNSName)."""
        with self._lock:
            lb = next((b for b in self._lbs.values()
                       if load_balancer in (b.id, self._dns(b))), None)
            if lb is None:
                raise LookupError(f"no load balancer {load_balancer}")
            listener = next((li for li in self._listeners.values()
                             if li.lb_id == lb.id and li.port == listener_port), None)
            if listener is None:
                raise LookupError(f"{lb.id} has no listener on port {listener_port}")
            if lb.plane is None:
                raise LookupError(f"{lb.id} has no data plane ({lb.status}) {lb.plane_error}".rstrip())
            plane = lb.plane
        return plane.address(listener.id)

    def close(self) -> None:
        with self._lock:
            planes = [lb.plane for lb in self._lbs.values() if lb.plane is not None]
            for lb in self._lbs.values():
                lb.plane = None
        for plane in planes:
            self._close_plane(plane)

    # --- lookups ----------------------------------------------------------------------------

    def _dns(self, lb: LoadBalancer) -> str:
        return f"{lb.id}.{self.region}.alb.aliyuncs.com"

    def _lb(self, lb_id: str) -> LoadBalancer:
        lb = self._lbs.get(lb_id)
        if lb is None:
            raise not_found("LoadBalancer", lb_id)
        return lb

    def _group(self, group_id: str) -> ServerGroup:
        group = self._groups.get(group_id)
        if group is None:
            raise not_found("ServerGroup", group_id)
        return group

    def _listener(self, listener_id: str) -> Listener:
        listener = self._listeners.get(listener_id)
        if listener is None:
            raise not_found("Listener", listener_id)
        return listener

    def _lbs_of(self, group_id: str) -> set[str]:
        return {li.lb_id for li in self._listeners.values() if li.group_id == group_id}

    def _claim(self, group: ServerGroup) -> None:
        """A server group takes one change at a time: Configuring for job_seconds, else Conflict.Lock."""
        now = time.monotonic()
        if now < group.busy_until:
            raise ApiError(400, "Conflict.Lock", f"The Lock [{group.id}] is conflict.")
        group.busy_until = now + self.job_seconds

    # --- the data plane ---------------------------------------------------------------------

    def _provision(self, lb: LoadBalancer, ready_at: float) -> None:
        if not self._sleep_until(ready_at):
            return
        plane, error = None, ""
        if self.data_plane:
            try:
                from .balancer_plane import BalancerPlane
                plane = BalancerPlane(lb.id)
            except Exception as exc:  # no haproxy, or it did not start: the API still works
                error = f"{type(exc).__name__}: {exc}"[:500]
        with self._lock:
            alive = self._lbs.get(lb.id) is lb
            if alive:
                lb.status, lb.plane, lb.plane_error = "Active", plane, error
            if error:
                self.plane_errors.append((lb.id, error))
        if plane is not None and not alive:
            self._close_plane(plane)
        elif alive:
            self._sync(lb.id)

    def _close_plane(self, plane: BalancerPlane) -> None:
        try:
            plane.close()
        except Exception as exc:  # reported, the API already forgot the balancer
            with self._lock:
                self.plane_errors.append(("close", f"{type(exc).__name__}: {exc}"[:500]))

    def _ip(self, server: Server) -> str:
        inst = self._instance(server.server_id)
        if inst is not None and inst.status == "Running" and inst.private_ip:
            server.ip = inst.private_ip          # a restarted instance may come back on another address
        return server.ip

    def _desired(self, lb: LoadBalancer) -> list[Any]:
        from .balancer_plane import HealthCheck, Target
        from .balancer_plane import Listener as PlaneListener
        wanted = []
        for li in sorted(self._listeners.values(), key=lambda item: item.port):
            if li.lb_id != lb.id:
                continue
            group = self._groups[li.group_id]
            h = group.health
            interval = max(0.05, h.interval * self.health_scale)
            timeout = min(h.timeout * self.health_scale, interval)
            check = HealthCheck(path=h.path, interval_s=interval, timeout_s=timeout, healthy_threshold=h.healthy,
                                unhealthy_threshold=h.unhealthy, codes=plane_codes(h.codes),
                                scheme=h.protocol.lower(), enabled=h.enabled)
            targets = tuple(Target(self._ip(s), s.port, s.weight, s.draining) for s in group.servers.values()
                            if s.status == "Available" or s.draining)
            wanted.append(PlaneListener(li.id, li.port, group.protocol.lower(), targets, check))
        return wanted

    def _sync(self, lb_id: str) -> None:
        """Converge the balancer's plane to its state (newest state wins: taken under plane_lock)."""
        with self._lock:
            lb = self._lbs.get(lb_id)
        if lb is None:
            return
        with lb.plane_lock:
            with self._lock:
                if self._lbs.get(lb_id) is not lb or lb.status != "Active":
                    return
                plane = lb.plane
                desired = self._desired(lb) if plane is not None else []
            if plane is not None:
                try:
                    plane.apply(desired)
                except Exception as exc:  # reported; listeners stay Provisioning
                    with self._lock:
                        self.plane_errors.append((lb_id, f"apply: {type(exc).__name__}: {exc}"[:500]))
                    return
            with self._lock:
                for li in self._listeners.values():
                    if li.lb_id == lb_id and li.status == "Provisioning":
                        li.status = "Running"

    def _resync(self, lb_ids: Iterable[str]) -> None:
        for lb_id in set(lb_ids):
            self._spawn(self._sync, lb_id)

    # --- load balancers ---------------------------------------------------------------------

    def _create_lb(self, params: dict[str, str]) -> dict[str, Any]:
        vpc_id = required(params, "VpcId")
        if vpc_id != self._vpc_id:
            raise not_found("Vpc", vpc_id)
        address_type = _choice(params, "AddressType", ("Internet", "Intranet"))
        edition = _choice(params, "LoadBalancerEdition", EDITIONS, "Standard")
        pay_type = _choice(params, "LoadBalancerBillingConfig.PayType", ("PostPay",), "PostPay")
        name = params.get("LoadBalancerName", "")
        if name and not re.fullmatch(r"[A-Za-z\u4e00-\u9fa5][\w.\-\u4e00-\u9fa5]{1,127}", name):
            raise illegal("LoadBalancerName", "2..128 characters, starting with a letter.")
        zones = []
        for mapping in indexed(params, "ZoneMappings"):
            zone, vswitch = mapping.get("ZoneId", ""), mapping.get("VSwitchId", "")
            if not zone or not vswitch:
                raise missing("ZoneMappings.N.ZoneId" if not zone else "ZoneMappings.N.VSwitchId")
            if vswitch not in self._vswitches:
                raise not_found("VSwitch", vswitch)
            if self._vswitches[vswitch] != zone:
                raise ApiError(400, "Mismatch.ZoneIdAndVSwitchId", f"The {zone} and {vswitch} are mismatched.")
            zones.append((zone, vswitch))
        if len({zone for zone, _ in zones}) < 2:
            raise illegal("ZoneMappings", "At least two zones.")
        tags = parse_tags(params)
        if as_bool(params, "DryRun"):
            raise ApiError(400, "DryRunOperation", "Request validation has been passed with DryRun flag set.")
        lb = LoadBalancer(_new_id("alb-"), name, vpc_id, address_type, edition, pay_type, zones, tags,
                          as_bool(params, "DeletionProtectionEnabled"))
        self._lbs[lb.id] = lb
        self._spawn(self._provision, lb, time.monotonic() + self.provision_seconds)
        return {"LoadBalancerId": lb.id, **_job()}

    def _lb_view(self, lb: LoadBalancer, full: bool) -> dict[str, Any]:
        view: dict[str, Any] = {
            "LoadBalancerId": lb.id, "LoadBalancerName": lb.name, "LoadBalancerStatus": lb.status,
            "LoadBalancerBussinessStatus": "Normal", "LoadBalancerEdition": lb.edition, "AddressType": lb.address_type,
            "AddressAllocatedMode": "Dynamic", "AddressIpVersion": "IPv4", "DNSName": self._dns(lb), "VpcId": lb.vpc_id,
            "CreateTime": lb.created, "ResourceGroupId": "rg-emulated", "Tags": _tag_view(lb.tags),
            "LoadBalancerBillingConfig": {"PayType": lb.pay_type},
            "DeletionProtectionConfig": {"Enabled": lb.deletion_protection},
            "ModificationProtectionConfig": {"Status": "NonProtection"}, "LoadBalancerOperationLocks": []}
        if full:
            view["RegionId"] = self.region
            view["ZoneMappings"] = [
                {"ZoneId": zone, "VSwitchId": vswitch, "Status": "Active",
                 "LoadBalancerAddresses": [{"Address": f"172.{16 + n}.0.{1 + sum(map(ord, lb.id)) % 250}"}]}
                for n, (zone, vswitch) in enumerate(lb.zones)]
        return view

    def _get_lb(self, params: dict[str, str]) -> dict[str, Any]:
        return self._lb_view(self._lb(required(params, "LoadBalancerId")), full=True)

    def _list_lbs(self, params: dict[str, str]) -> dict[str, Any]:
        ids, names = repeated(params, "LoadBalancerIds"), repeated(params, "LoadBalancerNames")
        found = [lb for lb in self._lbs.values()
                 if (not ids or lb.id in ids) and (not names or lb.name in names) and tags_match(lb.tags, params)
                 and params.get("LoadBalancerStatus", lb.status) == lb.status
                 and params.get("AddressType", lb.address_type) == lb.address_type
                 and params.get("DNSName", self._dns(lb)) == self._dns(lb)]
        return _paged([self._lb_view(lb, full=False) for lb in found], params, "LoadBalancers")

    def _delete_lb(self, params: dict[str, str]) -> dict[str, Any]:
        lb = self._lb(required(params, "LoadBalancerId"))
        if lb.deletion_protection:
            raise ApiError(400, "OperationDenied.DeletionProtectionEnabled",
                           "The operation is not allowed because of DeletionProtectionEnabled.")
        if lb.status != "Active":
            raise incorrect_status("LoadBalancer", lb.id, lb.status)
        del self._lbs[lb.id]
        for li in [li for li in self._listeners.values() if li.lb_id == lb.id]:
            del self._listeners[li.id]
        if lb.plane is not None:
            self._spawn(self._close_plane, lb.plane)
            lb.plane = None
        return _job()

    # --- server groups ----------------------------------------------------------------------

    def _drain_config(self, params: Mapping[str, str], enabled: bool, timeout: int) -> tuple[bool, int]:
        enabled = as_bool(params, "ConnectionDrainConfig.ConnectionDrainEnabled", enabled)
        return enabled, as_int(params, "ConnectionDrainConfig.ConnectionDrainTimeout", timeout, 0, 900)

    def _create_group(self, params: dict[str, str]) -> dict[str, Any]:
        name = required(params, "ServerGroupName")
        _choice(params, "ServerGroupType", ("Instance",), "Instance")
        vpc_id = required(params, "VpcId")
        if vpc_id != self._vpc_id:
            raise not_found("Vpc", vpc_id)
        protocol = _choice(params, "Protocol", ("HTTP", "HTTPS"), "HTTP")
        health = HealthConfig(protocol=protocol)
        health.update(params)
        drain, drain_timeout = self._drain_config(params, False, 300)
        group = ServerGroup(_new_id("sgp-"), name, vpc_id, protocol, health, drain, drain_timeout, parse_tags(params))
        self._groups[group.id] = group
        return {"ServerGroupId": group.id, **_job()}

    def _group_view(self, group: ServerGroup) -> dict[str, Any]:
        return {"ServerGroupId": group.id, "ServerGroupName": group.name, "ServerGroupType": "Instance",
                "ServerGroupStatus": "Configuring" if time.monotonic() < group.busy_until else "Available",
                "Protocol": group.protocol, "VpcId": group.vpc_id, "Scheduler": "Wrr", "ResourceGroupId": "rg-emulated",
                "HealthCheckConfig": group.health.view(), "Tags": _tag_view(group.tags),
                "ConnectionDrainConfig": {"ConnectionDrainEnabled": group.drain_enabled,
                                          "ConnectionDrainTimeout": group.drain_timeout},
                "StickySessionConfig": {"StickySessionEnabled": False}, "ServerCount": len(group.servers),
                "RelatedLoadBalancerIds": sorted(self._lbs_of(group.id)), "CreateTime": group.created}

    def _list_groups(self, params: dict[str, str]) -> dict[str, Any]:
        ids, names = repeated(params, "ServerGroupIds"), repeated(params, "ServerGroupNames")
        found = [g for g in self._groups.values()
                 if (not ids or g.id in ids) and (not names or g.name in names) and tags_match(g.tags, params)
                 and params.get("VpcId", g.vpc_id) == g.vpc_id]
        return _paged([self._group_view(g) for g in found], params, "ServerGroups")

    def _delete_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "ServerGroupId"))
        users = sorted(li.id for li in self._listeners.values() if li.group_id == group.id)
        if users:
            raise ApiError(400, "ResourceInUse.ServerGroup",
                           f"The specified resource ServerGroup [{group.id}] is in use by {', '.join(users)}.")
        del self._groups[group.id]
        return _job()

    def _update_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "ServerGroupId"))
        health = HealthConfig(**vars(group.health))
        health.update(params)                     # validate everything before changing anything
        drain = self._drain_config(params, group.drain_enabled, group.drain_timeout)
        self._claim(group)
        group.health, (group.drain_enabled, group.drain_timeout) = health, drain
        group.name = params.get("ServerGroupName") or group.name
        self._resync(self._lbs_of(group.id))
        return _job()

    def _servers_param(self, params: Mapping[str, str], adding: bool) -> list[dict[str, str]]:
        servers = indexed(params, "Servers")
        if not servers:
            raise missing("Servers")
        if len(servers) > 200:
            raise illegal("Servers", "At most 200 servers per call.")
        for server in servers:
            if not server.get("ServerId"):
                raise missing("Servers.N.ServerId")
            if (server.get("ServerType") or "Ecs") != "Ecs":
                raise illegal("Servers.N.ServerType", "The emulator serves Ecs servers.")
            port = server.get("Port", "")
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise illegal("Servers.N.Port", "1..65535.")
            weight = server.get("Weight", "")
            if adding and weight and (not weight.isdigit() or int(weight) > 100):
                raise illegal("Servers.N.Weight", "0..100.")
        return servers

    def _add_servers(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "ServerGroupId"))
        servers = self._servers_param(params, adding=True)
        for server in servers:
            inst = self._instance(server["ServerId"])
            if inst is None:
                raise not_found("Instance", server["ServerId"])
            if inst.vpc_id != group.vpc_id:
                raise ApiError(400, "Mismatch.VpcId", f"The {server['ServerId']} and {group.id} are mismatched.")
            if (server["ServerId"], int(server["Port"])) in group.servers:
                raise ApiError(400, "ResourceAlreadyExist.BackendServer",
                               f"The specified resource BackendServer [{server['ServerId']}:{server['Port']}] "
                               "already exists.")
        self._claim(group)
        added = []
        for server in servers:
            inst = self._instance(server["ServerId"])
            key = (server["ServerId"], int(server["Port"]))
            group.servers[key] = Server(key[0], key[1], int(server.get("Weight") or 100),
                                        server.get("Description", ""), inst.private_ip if inst else "")
            added.append(key)
        self._spawn(self._added, group.id, added, time.monotonic() + self.job_seconds)
        return {"ServerGroupId": group.id, **_job()}

    def _added(self, group_id: str, keys: list[tuple[str, int]], done_at: float) -> None:
        if not self._sleep_until(done_at):
            return
        with self._lock:
            group = self._groups.get(group_id)
            if group is None:
                return
            for key in keys:
                server = group.servers.get(key)
                if server is not None and server.status == "Adding":
                    server.status = "Available"
            users = self._lbs_of(group_id)
        for lb_id in users:
            self._sync(lb_id)

    def _find_servers(self, group: ServerGroup, servers: list[dict[str, str]]) -> list[Server]:
        found = []
        for server in servers:
            key = (server["ServerId"], int(server["Port"]))
            if key not in group.servers:
                raise not_found("BackendServer", f"{key[0]}:{key[1]}")
            found.append(group.servers[key])
        return found

    def _remove_servers(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "ServerGroupId"))
        found = self._find_servers(group, self._servers_param(params, adding=False))
        self._claim(group)
        drain = group.drain_enabled and group.drain_timeout > 0
        done_at = time.monotonic() + (group.drain_timeout * self.drain_scale if drain else self.job_seconds)
        for server in found:
            server.status, server.draining = "Removing", drain and server.status == "Available"
            server.generation += 1
            self._spawn(self._removed, group.id, server, server.generation, done_at)
        self._resync(self._lbs_of(group.id))
        return {"ServerGroupId": group.id, **_job()}

    def _removed(self, group_id: str, server: Server, generation: int, done_at: float) -> None:
        if not self._sleep_until(done_at):
            return
        with self._lock:
            group = self._groups.get(group_id)
            key = (server.server_id, server.port)
            if group is None or group.servers.get(key) is not server or server.generation != generation:
                return
            del group.servers[key]
            users = self._lbs_of(group_id)
        for lb_id in users:
            self._sync(lb_id)

    def _update_servers(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(required(params, "ServerGroupId"))
        servers = self._servers_param(params, adding=True)
        found = self._find_servers(group, servers)
        self._claim(group)
        for server, wanted in zip(found, servers, strict=True):
            server.weight = int(wanted.get("Weight") or server.weight)
            server.description = wanted.get("Description", server.description)
        self._resync(self._lbs_of(group.id))
        return _job()

    def _list_servers(self, params: dict[str, str]) -> dict[str, Any]:
        group_id = params.get("ServerGroupId", "")
        groups = [self._group(group_id)] if group_id else list(self._groups.values())
        ids = repeated(params, "ServerIds")
        found = [{"ServerGroupId": g.id, "ServerId": s.server_id, "ServerIp": self._ip(s), "ServerType": "Ecs",
                  "Port": s.port, "Weight": s.weight, "Description": s.description, "Status": s.status}
                 for g in groups for s in g.servers.values() if not ids or s.server_id in ids]
        return _paged(found, params, "Servers")

    # --- listeners --------------------------------------------------------------------------

    def _create_listener(self, params: dict[str, str]) -> dict[str, Any]:
        lb = self._lb(required(params, "LoadBalancerId"))
        protocol = _choice(params, "ListenerProtocol", ("HTTP", "HTTPS"))
        port = as_int(params, "ListenerPort", 0, 1, 65535)
        if not port:
            raise missing("ListenerPort")
        actions: dict[int, dict[str, Any]] = {}
        for key, value in params.items():
            match = _ACTION_KEY.match(key)
            if match:
                action = actions.setdefault(int(match[1]), {"groups": {}})
                if match[3] is None:
                    action["type"] = value
                else:
                    action["groups"][int(match[3])] = value
        if not actions:
            raise missing("DefaultActions")
        if len(actions) != 1 or next(iter(actions.values())).get("type") != "ForwardGroup":
            raise illegal("DefaultActions", "One action of Type ForwardGroup.")
        groups = list(next(iter(actions.values()))["groups"].values())
        if len(groups) != 1:
            raise illegal("DefaultActions.N.ForwardGroupConfig.ServerGroupTuples", "Exactly one server group.")
        group = self._group(groups[0])
        certificates = [c.get("CertificateId", "") for c in indexed(params, "Certificates") if c.get("CertificateId")]
        if protocol == "HTTPS" and not certificates:
            raise missing("Certificates")
        if lb.status != "Active":
            raise incorrect_status("LoadBalancer", lb.id, lb.status)
        if group.vpc_id != lb.vpc_id:
            raise ApiError(400, "Mismatch.VpcId", f"The {group.id} and {lb.id} are mismatched.")
        if any(li.lb_id == lb.id and li.port == port for li in self._listeners.values()):
            raise ApiError(400, "ResourceAlreadyExist.Listener",
                           f"The specified resource Listener [{lb.id}:{port}] already exists.")
        listener = Listener(_new_id("lsn-"), lb.id, protocol, port, group.id, certificates,
                            params.get("ListenerDescription", ""), parse_tags(params))
        self._listeners[listener.id] = listener
        self._resync([lb.id])
        return {"ListenerId": listener.id, **_job()}

    def _listener_view(self, li: Listener) -> dict[str, Any]:
        return {"ListenerId": li.id, "LoadBalancerId": li.lb_id, "ListenerProtocol": li.protocol,
                "ListenerPort": li.port, "ListenerStatus": li.status, "ListenerDescription": li.description,
                "IdleTimeout": 15, "RequestTimeout": 60, "GzipEnabled": True, "Http2Enabled": li.protocol == "HTTPS",
                "DefaultActions": [{"Type": "ForwardGroup",
                                    "ForwardGroupConfig": {"ServerGroupTuples": [{"ServerGroupId": li.group_id}]}}],
                "Tags": _tag_view(li.tags)}

    def _list_listeners(self, params: dict[str, str]) -> dict[str, Any]:
        ids, lbs = repeated(params, "ListenerIds"), repeated(params, "LoadBalancerIds")
        found = [li for li in self._listeners.values()
                 if (not ids or li.id in ids) and (not lbs or li.lb_id in lbs) and tags_match(li.tags, params)
                 and params.get("ListenerProtocol", li.protocol) == li.protocol]
        return _paged([self._listener_view(li) for li in found], params, "Listeners")

    def _get_listener(self, params: dict[str, str]) -> dict[str, Any]:
        li = self._listener(required(params, "ListenerId"))
        return {**self._listener_view(li), "Certificates": [{"CertificateId": c} for c in li.certificates]}

    def _delete_listener(self, params: dict[str, str]) -> dict[str, Any]:
        li = self._listener(required(params, "ListenerId"))
        del self._listeners[li.id]
        self._resync([li.lb_id])
        return _job()

    def _health_status(self, params: dict[str, str]) -> dict[str, Any]:
        """Unlocked (ALB_UNLOCKED): the state is read under the lock, haproxy is asked outside it."""
        with self._lock:
            li = self._listener(required(params, "ListenerId"))
            lb, group = self._lbs.get(li.lb_id), self._groups[li.group_id]
            servers = [(s, s.ip, self._ip(s)) for s in group.servers.values() if s.status == "Available"]
            plane = lb.plane if lb is not None else None
            health = group.health
        if any(old != new for _, old, new in servers) and lb is not None:
            self._spawn(self._sync, lb.id)        # an instance came back on another address
        states: dict[tuple[str, int], str] = {}
        if plane is not None and lb is not None:
            with lb.plane_lock:
                states = plane.health().get(li.id, {})
        abnormal = []
        for server, _, ip in servers:
            if not health.enabled:
                status: str | None = "Unavailable"
            elif server.weight == 0:
                status = "Unused"
            else:   # healthy (and draining) servers are normal: not listed
                status = {"initial": "Initial", "unhealthy": "Unhealthy", "unused": "Unused"}.get(
                    states.get((ip, server.port), "initial"))
            if status is None:
                continue
            reason = {"ReasonCode": "RESPONSE_MISMATCH", "ExpectedResponse": ",".join(health.codes),
                      "ActualResponse": ""} if status == "Unhealthy" else {}
            abnormal.append({"ServerId": server.server_id, "ServerIp": ip, "Port": server.port, "Status": status,
                             "Reason": reason})
        info = {"ServerGroupId": group.id, "ActionType": "ForwardGroup",
                "HealthCheckEnabled": "on" if health.enabled else "off", "NonNormalServers": abnormal}
        return {"ListenerHealthStatus": [{"ListenerId": li.id, "ListenerPort": li.port,
                                          "ListenerProtocol": li.protocol, "ServerGroupInfos": [info]}],
                "RuleHealthStatus": [], "NextToken": ""}

    # --- tags -------------------------------------------------------------------------------

    def _resources(self, params: Mapping[str, str], ids_required: bool) -> tuple[str, list[Any]]:
        kind = _choice(params, "ResourceType", RESOURCE_TYPES)
        table: Mapping[str, Any] = {"loadbalancer": self._lbs, "servergroup": self._groups,
                                    "listener": self._listeners}[kind]
        ids = repeated(params, "ResourceId")
        if ids_required and not ids:
            raise missing("ResourceId")
        name = {"loadbalancer": "LoadBalancer", "servergroup": "ServerGroup", "listener": "Listener"}[kind]
        for resource_id in ids:
            if resource_id not in table:
                raise not_found(name, resource_id)
        return kind, [table[i] for i in ids] if ids else list(table.values())

    def _tag(self, params: dict[str, str]) -> dict[str, Any]:
        _, resources = self._resources(params, ids_required=True)
        tags = parse_tags(params)
        if not tags:
            raise missing("Tag")
        for resource in resources:
            if len({**resource.tags, **tags}) > 20:
                raise illegal("Tag", "At most 20 tags per resource.")
        for resource in resources:
            resource.tags.update(tags)
        return {}

    def _untag(self, params: dict[str, str]) -> dict[str, Any]:
        _, resources = self._resources(params, ids_required=True)
        keys, everything = repeated(params, "TagKey"), as_bool(params, "All")
        for resource in resources:
            for key in list(resource.tags) if everything else keys:
                resource.tags.pop(key, None)
        return {}

    def _list_tags(self, params: dict[str, str]) -> dict[str, Any]:
        kind, resources = self._resources(params, ids_required=False)
        wanted = indexed(params, "Tag")
        found = [{"ResourceId": r.id, "ResourceType": kind, "TagKey": key, "TagValue": value}
                 for r in resources for key, value in r.tags.items()
                 if not wanted or any(w.get("Key") == key and w.get("Value", value) == value for w in wanted)]
        return _paged(found, params, "TagResources")
