"""Alibaba Cloud ALB (Application Load Balancer, 2020-06-16) for the ECS emulator, with a real haproxy as data plane.

Why: ngcx services sit behind the cloud's own load balancer (issue 21), and that code must meet, through the
real SDK (CommonRequest, product "Alb"), a balancer with real state — Provisioning before Active, servers
added and removed asynchronously (JobId; Adding -> Available; Removing, with connection draining), listeners,
health checks, tags, ClientToken replays, the gateway's faults (aliyun_rpc fail_next/hold work here too) —
whose traffic really flows: each Active balancer gets a BalancerPlane (balancer_plane.py, haproxy) converged
to its state, and haproxy's own health checks decide which emulated host gets requests. EcsEmulator owns
the instances, serves these actions on its port and says where a listener serves (balancer_address()).

Emulated: Create/Get/List/DeleteLoadBalancer; Create/List/Delete/UpdateServerGroupAttribute; AddServersTo/
RemoveServersFrom/ListServerGroupServers, UpdateServerGroupServersAttribute (Weight and Description of servers
already in the group, as the API reference's Servers.N; the plane's `set server weight`); Create/List/Delete/
GetListenerAttribute, GetListenerHealthStatus; Tag/ListTagResources.
Names follow aliyun-python-sdk-alb's requests and aliyun-java-sdk-alb's unmarshallers;
statuses the API reference (LoadBalancerStatus Provisioning/Active, ListenerStatus Provisioning/Running, server
Adding/Available/Removing, ServerGroupStatus Available/Configuring, health Initial/Unhealthy/Unused/Unavailable).
Not emulated: rules, ACLs, security policies, logs, zone changes, QUIC, UnTagResources, servers other than Ecs,
Ip/Fc server groups, the Certificate Management Service's own API (CAS: certificates are registered by the test,
below), TLS security policies; LoadBalancerAddresses are made up.

TLS and addresses (for clients in another process, the CLI):
- `add_certificate(cert_pem, key_pem, cert_id=None)` (a test helper standing in for CAS's upload) keeps a
  certificate under an id ("<digits>-<region>", as CAS ids read); an HTTPS listener whose CertificateId is
  one of them serves TLS with it in the plane; another id (not registered) leaves that listener plain HTTP.
- `own_addresses` (off by default): each balancer gets its own loopback address (balancer_plane.
  loopback_address(), 127.0.100.0/24), its plane serves every listener there at the listener's own port, and
  its DNSName is that IP literal, so the CLI reaches it by the name the API returns (the emulator's limit:
  no DNS offline; ports 80/443 need root or CAP_NET_BIND_SERVICE).

Choices and guesses:
- DeleteLoadBalancer takes its listeners with it (its documented errors have no "in use" code); DeleteServerGroup
  of a group a listener uses answers 400 ResourceInUse.ServerGroup. Deletions are immediate, not Deleting.
- A server group is Configuring for `job_seconds` after a change; another change meanwhile answers 400
  Conflict.Lock (a real code; exactly when ALB answers it is not documented).
- GetListenerHealthStatus lists only NonNormalServers, as the real API (a server not listed is healthy): plane
  initial -> Initial, unhealthy -> Unhealthy (ReasonCode RESPONSE_MISMATCH is a guess: the plane does not say
  why), weight 0 -> Unused, checks off -> Unavailable; draining servers are not listed. ListServerGroupServers
  Status is the server's lifecycle, not its health (as the real API).
- Guessed codes: ResourceNotFound.Instance (unknown ECS ServerId), ResourceAlreadyExist.BackendServer,
  Mismatch.VpcId, ResourceNotFound.Vpc, IllegalParam.<Name> (NLB documents IllegalParam.%s). A ClientToken
  reused with other parameters answers the gateway's IdempotentParameterMismatch (NLB: IdempotenceSignatureMismatch).
- `health_scale`/`drain_scale` multiply HealthCheckInterval/Timeout and ConnectionDrainTimeout for the plane
  (tests keep real values, wait little); `data_plane = False` runs without haproxy.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .aliyun_alb_params import (
    HEALTH_DEFAULTS,
    bad,
    choice,
    drain_config,
    health_config,
    illegal,
    job,
    new_id,
    not_found,
    paged,
    parse_tags,
    tag_view,
    tags_match,
)
from .aliyun_rpc import Action, as_bool, as_int, indexed, iso_now, missing, repeated, required
from .balancer_config import HealthCheck, Target
from .balancer_config import Listener as PlaneListener
from .balancer_plane import BalancerPlane, loopback_address, release_loopback

ALB_VERSION = "2020-06-16"
# Actions whose ClientToken makes a retry safe (same token + same params -> the first answer).
ALB_IDEMPOTENT = frozenset({
    "CreateLoadBalancer", "DeleteLoadBalancer", "CreateServerGroup", "DeleteServerGroup",
    "UpdateServerGroupAttribute", "AddServersToServerGroup", "RemoveServersFromServerGroup",
    "UpdateServerGroupServersAttribute", "CreateListener", "DeleteListener"})
# Actions that ask haproxy while answering, so they must not hold the emulator's lock meanwhile.
ALB_UNLOCKED = frozenset({"GetListenerHealthStatus"})
KINDS = {"loadbalancer": "LoadBalancer", "servergroup": "ServerGroup", "listener": "Listener"}
FORWARD = "DefaultActions.1.ForwardGroupConfig.ServerGroupTuples.1.ServerGroupId"
FIXED = {"ResourceGroupId": "rg-emulated"}        # fields every view of that kind shows as they are
LB_FIXED = {**FIXED, "LoadBalancerBussinessStatus": "Normal", "AddressAllocatedMode": "Dynamic",
            "AddressIpVersion": "IPv4", "ModificationProtectionConfig": {"Status": "NonProtection"},
            "LoadBalancerOperationLocks": []}
GROUP_FIXED = {**FIXED, "Scheduler": "Wrr", "StickySessionConfig": {"StickySessionEnabled": False}}
LISTENER_FIXED = {"IdleTimeout": 15, "RequestTimeout": 60, "GzipEnabled": True}


def plane_health(h: Mapping[str, Any], scale: float) -> HealthCheck:
    interval = max(0.05, h["HealthCheckInterval"] * scale)
    return HealthCheck(h["HealthCheckPath"], interval, min(h["HealthCheckTimeout"] * scale, interval),
                       h["HealthyThreshold"], h["UnhealthyThreshold"], ",".join(h["HealthCheckCodes"]),
                       h["HealthCheckProtocol"].lower(), h["HealthCheckEnabled"])


@dataclass
class Resource:                 # a load balancer, server group or listener: the API fields as they were set, tags
    id: str
    view: dict[str, Any]
    tags: dict[str, str]


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
class ServerGroup(Resource):
    health: dict[str, Any] = field(default_factory=dict)    # HealthCheckConfig, as ListServerGroups shows it
    drain: tuple[bool, int] = (False, 300)                  # ConnectionDrainEnabled, ConnectionDrainTimeout
    servers: dict[tuple[str, int], Server] = field(default_factory=dict)
    busy_until: float = 0.0


@dataclass
class Listener(Resource):
    lb_id: str = ""
    port: int = 0
    group_id: str = ""
    status: str = "Provisioning"


@dataclass
class LoadBalancer(Resource):
    zones: list[tuple[str, str]] = field(default_factory=list)
    status: str = "Provisioning"
    address: str = ""                 # its own loopback address (own_addresses): its DNSName then
    plane: BalancerPlane | None = None
    plane_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Alb:
    """ALB state and actions. `lock` is the emulator's own (actions already run under it, except ALB_UNLOCKED);
    `spawn`/`sleep_until` are its worker helpers; `instance` finds an ECS instance (status, private_ip, vpc_id)."""

    def __init__(self, lock: threading.RLock, spawn: Callable[..., None], sleep_until: Callable[[float], bool],
                 vpc_id: str, vswitches: Mapping[str, str], instance: Callable[[str], Any], region: str) -> None:
        self._lock, self._spawn, self._sleep_until = lock, spawn, sleep_until
        self._vpc_id, self._vswitches, self._instance, self.region = vpc_id, vswitches, instance, region
        # Provisioning -> Active; Adding -> Available and a server group's Configuring; see the module docstring.
        self.provision_seconds, self.job_seconds, self.health_scale, self.drain_scale = 0.5, 0.2, 1.0, 1.0
        self.data_plane = True
        self.own_addresses = False                       # see the module docstring
        self._pems = Path(tempfile.mkdtemp(prefix="alb-certs-"))
        self.certificates: dict[str, str] = {}           # CAS id -> PEM file (certificate, key) the plane loads
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
            "ListServerGroupServers": self._list_servers, "UpdateServerGroupServersAttribute": self._update_servers,
            "CreateListener": self._create_listener,
            "ListListeners": self._list_listeners, "GetListenerAttribute": self._get_listener,
            "DeleteListener": self._delete_listener, "GetListenerHealthStatus": self._health_status,
            "TagResources": self._tag, "ListTagResources": self._list_tags}

    def address(self, load_balancer: str, listener_port: int) -> tuple[str, int]:
        """Where the data plane serves this listener (load balancer by id or DNSName); LookupError if nowhere."""
        with self._lock:
            lb = next((b for b in self._lbs.values() if load_balancer in (b.id, self._dns(b))), None)
            li = next((li for li in self._listeners.values() if lb and (li.lb_id, li.port) == (lb.id, listener_port)),
                      None)
            if lb is None or li is None or lb.plane is None:
                raise LookupError(f"no data plane for {load_balancer}:{listener_port} "
                                  f"({lb.status + ' ' + dict(self.plane_errors).get(lb.id, '') if lb else '-'})")
            plane = lb.plane
        return plane.address(li.id)

    def add_certificate(self, cert_pem: bytes, key_pem: bytes, cert_id: str | None = None) -> str:
        """Keep a certificate (PEM, with its chain) and its key as CAS would; returns its id for a listener."""
        cert_id = cert_id or f"{secrets.randbelow(10**8):08d}-{self.region}"
        path = self._pems / f"{cert_id}.pem"
        path.touch(mode=0o600)
        path.write_bytes(cert_pem.strip() + b"\n" + key_pem.strip() + b"\n")
        with self._lock:
            self.certificates[cert_id] = str(path)
        return cert_id

    def close(self) -> None:
        with self._lock:
            planes, lbs, self._lbs = [lb.plane for lb in self._lbs.values()], list(self._lbs.values()), {}
        for lb in lbs:
            release_loopback(lb.address)
        for plane in planes:
            self._close_plane(plane)
        shutil.rmtree(self._pems, ignore_errors=True)

    def _dns(self, lb: LoadBalancer) -> str:
        return lb.address or f"{lb.id}.{self.region}.alb.aliyuncs.com"

    def _get(self, table: Mapping[str, Any], kind: str, params: Mapping[str, str], name: str) -> Any:
        resource_id = required(params, name)
        if resource_id not in table:
            raise not_found(kind, resource_id)
        return table[resource_id]

    def _vpc(self, params: Mapping[str, str]) -> str:
        return self._get({self._vpc_id: self._vpc_id}, "Vpc", params, "VpcId")

    def _group(self, params: Mapping[str, str]) -> ServerGroup:
        return self._get(self._groups, "ServerGroup", params, "ServerGroupId")

    def _lbs_of(self, group_id: str) -> set[str]:
        return {li.lb_id for li in self._listeners.values() if li.group_id == group_id}

    def _claim(self, group: ServerGroup) -> None:
        """A server group takes one change at a time: Configuring for job_seconds, else Conflict.Lock."""
        if (now := time.monotonic()) < group.busy_until:
            raise bad("Conflict.Lock", f"The Lock [{group.id}] is conflict.")
        group.busy_until = now + self.job_seconds

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.plane_errors.append((what, f"{type(exc).__name__}: {exc}"[:500]))

    def _provision(self, lb: LoadBalancer, ready_at: float) -> None:
        """Provisioning for provision_seconds, then Active with its data plane (none without haproxy)."""
        if not self._sleep_until(ready_at):
            return
        try:
            own = {"bind": lb.address, "listener_ports": True} if lb.address else {}
            lb.plane = BalancerPlane(lb.id, **own) if self.data_plane else None
        except Exception as exc:  # no haproxy: the API works, balancer_address() says why there is no plane
            self._failed(lb.id, exc)
        lb.status = "Active"
        self._sync(lb)                            # closes the plane if the balancer was deleted meanwhile

    def _close_plane(self, plane: BalancerPlane | None, address: str = "") -> None:
        """Stop the plane, then give its address back (a new balancer may bind it once haproxy is gone)."""
        try:
            if plane is not None:
                plane.close()
        except Exception as exc:  # reported; the API already forgot the balancer
            self._failed("close", exc)
        release_loopback(address)

    def _ip(self, server: Server) -> str:
        inst = self._instance(server.server_id)
        if inst is not None and inst.status == "Running" and inst.private_ip:
            server.ip = inst.private_ip          # a restarted instance may come back on another address
        return server.ip

    def _desired(self, lb: LoadBalancer) -> list[PlaneListener]:
        wanted = []
        for li in sorted(self._listeners.values(), key=lambda item: item.port):
            if li.lb_id == lb.id:
                group = self._groups[li.group_id]
                targets = tuple(Target(ip, s.port, s.weight, s.draining) for s in group.servers.values()
                                if (s.status == "Available" or s.draining) and (ip := self._ip(s)))
                ids = [c["CertificateId"] for c in li.view.get("Certificates", [])]
                pem = self.certificates.get(ids[0]) if ids and li.view["ListenerProtocol"] == "HTTPS" else None
                wanted.append(PlaneListener(li.id, li.port, group.view["Protocol"].lower(), targets,
                                            plane_health(group.health, self.health_scale), pem))
        return wanted

    def _sync(self, lb: LoadBalancer) -> None:
        """Converge the balancer's plane to its state (read and applied under plane_lock: the newest wins)."""
        with lb.plane_lock:
            with self._lock:
                plane, desired, gone = lb.plane, self._desired(lb), self._lbs.get(lb.id) is not lb
            try:
                if gone:                          # deleted while provisioning
                    lb.plane = None
                    return self._close_plane(plane)
                if plane is not None:
                    plane.apply(desired)
            except Exception as exc:  # reported; its listeners stay Provisioning
                self._failed(lb.id, exc)
                return
        with self._lock:
            for li in self._listeners.values():
                if li.lb_id == lb.id and li.status == "Provisioning":
                    li.status = "Running"

    def _resync(self, lb_ids: Iterable[str]) -> None:
        for lb_id in set(lb_ids):
            self._spawn(self._sync, self._lbs[lb_id])

    def _create_lb(self, params: dict[str, str]) -> dict[str, Any]:
        view = {"VpcId": self._vpc(params), "AddressType": choice(params, "AddressType", ("Internet", "Intranet")),
                "LoadBalancerEdition": choice(params, "LoadBalancerEdition",
                                               ("Basic", "Standard", "StandardWithWaf"), "Standard"),
                "LoadBalancerBillingConfig": {"PayType": choice(
                    params, "LoadBalancerBillingConfig.PayType", ("PostPay",), "PostPay")},
                "LoadBalancerName": params.get("LoadBalancerName", ""), "CreateTime": iso_now(),
                "DeletionProtectionConfig": {"Enabled": as_bool(params, "DeletionProtectionEnabled")}}
        if view["LoadBalancerName"] and not re.fullmatch(r"[^\W\d_][\w.-]{1,127}", view["LoadBalancerName"]):
            raise illegal("LoadBalancerName", "2..128 characters, starting with a letter.")
        zones = []
        for mapping in indexed(params, "ZoneMappings"):
            zone, vswitch = required(mapping, "ZoneId"), required(mapping, "VSwitchId")
            if vswitch not in self._vswitches:
                raise not_found("VSwitch", vswitch)
            if self._vswitches[vswitch] != zone:
                raise bad("Mismatch.ZoneIdAndVSwitchId", f"The {zone} and {vswitch} are mismatched.")
            zones.append((zone, vswitch))
        if len({zone for zone, _ in zones}) < 2:
            raise illegal("ZoneMappings", "At least two zones.")
        lb = LoadBalancer(new_id("alb-"), view, parse_tags(params), zones,
                          address=loopback_address() if self.own_addresses else "")
        self._lbs[lb.id] = lb
        self._spawn(self._provision, lb, time.monotonic() + self.provision_seconds)
        return job(LoadBalancerId=lb.id)

    def _lb_view(self, lb: LoadBalancer, full: bool) -> dict[str, Any]:
        view = {"LoadBalancerId": lb.id, **lb.view, **LB_FIXED, "LoadBalancerStatus": lb.status,
                "DNSName": self._dns(lb), "Tags": tag_view(lb.tags)}
        if full:
            view["RegionId"], view["ZoneMappings"] = self.region, [
                {"ZoneId": zone, "VSwitchId": vswitch, "Status": "Active",
                 "LoadBalancerAddresses": [{"Address": f"172.{16 + n}.0.{1 + sum(map(ord, lb.id)) % 250}"}]}
                for n, (zone, vswitch) in enumerate(lb.zones)]
        return view

    def _get_lb(self, params: dict[str, str]) -> dict[str, Any]:
        return self._lb_view(self._get(self._lbs, "LoadBalancer", params, "LoadBalancerId"), full=True)

    def _list_lbs(self, params: dict[str, str]) -> dict[str, Any]:
        ids, names = repeated(params, "LoadBalancerIds"), repeated(params, "LoadBalancerNames")
        views = [self._lb_view(lb, full=False) for lb in self._lbs.values()
                 if (not ids or lb.id in ids) and tags_match(lb.tags, params)]
        found = [v for v in views if (not names or v["LoadBalancerName"] in names)
                 and all(params.get(k, v[k]) == v[k] for k in ("LoadBalancerStatus", "AddressType", "DNSName"))]
        return paged(found, params, "LoadBalancers")

    def _delete_lb(self, params: dict[str, str]) -> dict[str, Any]:
        lb: LoadBalancer = self._get(self._lbs, "LoadBalancer", params, "LoadBalancerId")
        if lb.view["DeletionProtectionConfig"]["Enabled"]:
            raise bad("OperationDenied.DeletionProtectionEnabled", "The operation is not allowed: DeletionProtection.")
        if lb.status != "Active":
            raise bad("IncorrectStatus.LoadBalancer", f"The status of LoadBalancer [{lb.id}] is incorrect.")
        del self._lbs[lb.id]
        self._listeners = {key: li for key, li in self._listeners.items() if li.lb_id != lb.id}
        self._spawn(self._close_plane, lb.plane, lb.address)
        lb.plane = None
        return job()

    def _create_group(self, params: dict[str, str]) -> dict[str, Any]:
        view = {"ServerGroupName": required(params, "ServerGroupName"), "VpcId": self._vpc(params),
                "ServerGroupType": choice(params, "ServerGroupType", ("Instance",), "Instance"),
                "Protocol": choice(params, "Protocol", ("HTTP", "HTTPS"), "HTTP"), "CreateTime": iso_now()}
        health = health_config(params, {**HEALTH_DEFAULTS, "HealthCheckProtocol": view["Protocol"]})
        group = ServerGroup(new_id("sgp-"), view, parse_tags(params), health, drain_config(params, (False, 300)))
        self._groups[group.id] = group
        return job(ServerGroupId=group.id)

    def _group_view(self, group: ServerGroup) -> dict[str, Any]:
        return {"ServerGroupId": group.id, **group.view, **GROUP_FIXED, "Tags": tag_view(group.tags),
                "ServerGroupStatus": "Configuring" if time.monotonic() < group.busy_until else "Available",
                "HealthCheckConfig": group.health, "ServerCount": len(group.servers),
                "ConnectionDrainConfig": dict(zip(("ConnectionDrainEnabled", "ConnectionDrainTimeout"), group.drain,
                                                  strict=True)),
                "RelatedLoadBalancerIds": sorted(self._lbs_of(group.id))}

    def _list_groups(self, params: dict[str, str]) -> dict[str, Any]:
        ids, names = repeated(params, "ServerGroupIds"), repeated(params, "ServerGroupNames")
        found = [self._group_view(g) for g in self._groups.values()
                 if (not ids or g.id in ids) and (not names or g.view["ServerGroupName"] in names)
                 and tags_match(g.tags, params) and params.get("VpcId", g.view["VpcId"]) == g.view["VpcId"]]
        return paged(found, params, "ServerGroups")

    def _delete_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        if users := sorted(li.id for li in self._listeners.values() if li.group_id == group.id):
            raise bad("ResourceInUse.ServerGroup", f"The resource ServerGroup [{group.id}] is in use: {users}.")
        del self._groups[group.id]
        return job()

    def _update_group(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        health, drain = health_config(params, group.health), drain_config(params, group.drain)  # checked first
        self._claim(group)
        group.health, group.drain = health, drain
        group.view["ServerGroupName"] = params.get("ServerGroupName") or group.view["ServerGroupName"]
        self._resync(self._lbs_of(group.id))
        return job()

    @staticmethod
    def _servers_param(params: Mapping[str, str]) -> list[dict[str, str]]:
        servers = indexed(params, "Servers")
        if not 1 <= len(servers) <= 200:
            raise missing("Servers") if not servers else illegal("Servers", "At most 200 servers per call.")
        for server in servers:
            required(server, "ServerId")
            if (server.get("ServerType") or "Ecs") != "Ecs":
                raise illegal("Servers.N.ServerType", "The emulator serves Ecs servers.")
            port, weight = server.get("Port", ""), server.get("Weight") or "0"
            if not (port.isdigit() and 1 <= int(port) <= 65535 and weight.isdigit() and int(weight) <= 100):
                raise illegal("Servers.N", "Port 1..65535, Weight 0..100.")
        return servers

    def _find_servers(self, group: ServerGroup, servers: list[dict[str, str]]) -> list[Server]:
        keys = [(server["ServerId"], int(server["Port"])) for server in servers]
        if missed := [f"{key[0]}:{key[1]}" for key in keys if key not in group.servers]:
            raise not_found("BackendServer", missed[0])
        return [group.servers[key] for key in keys]

    def _add_servers(self, params: dict[str, str]) -> dict[str, Any]:
        group, servers = self._group(params), self._servers_param(params)
        for server in servers:
            inst = self._instance(server["ServerId"])
            if inst is None:
                raise not_found("Instance", server["ServerId"])
            if inst.vpc_id != group.view["VpcId"]:
                raise bad("Mismatch.VpcId", f"The {server['ServerId']} and {group.id} are mismatched.")
            if (server["ServerId"], int(server["Port"])) in group.servers:
                raise bad("ResourceAlreadyExist.BackendServer", f"The BackendServer [{server['ServerId']}:"
                          f"{server['Port']}] already exists.")
        self._claim(group)
        for server in servers:
            key = (server["ServerId"], int(server["Port"]))
            added = group.servers[key] = Server(key[0], key[1], int(server.get("Weight") or 100),
                                                server.get("Description", ""), self._instance(key[0]).private_ip)
            self._spawn(self._settle, group, added, 0, time.monotonic() + self.job_seconds)
        return job(ServerGroupId=group.id)

    def _remove_servers(self, params: dict[str, str]) -> dict[str, Any]:
        found = self._find_servers(group := self._group(params), self._servers_param(params))
        self._claim(group)
        drain = group.drain[0] and group.drain[1] > 0
        done_at = time.monotonic() + (group.drain[1] * self.drain_scale if drain else self.job_seconds)
        for server in found:
            server.status, server.draining = "Removing", drain and server.status == "Available"
            server.generation += 1
            self._spawn(self._settle, group, server, server.generation, done_at)
        self._resync(self._lbs_of(group.id))
        return job(ServerGroupId=group.id)

    def _update_servers(self, params: dict[str, str]) -> dict[str, Any]:
        """New weights (and descriptions) of servers in the group; the group is Configuring meanwhile (a guess: the
        reference says it is an asynchronous job, as adding one)."""
        servers = self._servers_param(params)
        found = self._find_servers(group := self._group(params), servers)
        self._claim(group)
        for server, asked in zip(found, servers, strict=True):
            server.weight = int(asked["Weight"]) if asked.get("Weight") else server.weight
            server.description = asked.get("Description", server.description)
        self._resync(self._lbs_of(group.id))
        return job(ServerGroupId=group.id)

    def _settle(self, group: ServerGroup, server: Server, generation: int, done_at: float) -> None:
        """The end of a server's job: Adding -> Available, Removing -> gone (after the drain when draining)."""
        if not self._sleep_until(done_at):
            return
        with self._lock:
            key = (server.server_id, server.port)
            if group.servers.get(key) is not server or server.generation != generation:
                return                           # removed (or removed again) meanwhile
            if server.status == "Removing":
                del group.servers[key]
            server.status = "Available"
            users = [self._lbs[i] for i in self._lbs_of(group.id)] if self._groups.get(group.id) is group else []
        for lb in users:
            self._sync(lb)

    def _list_servers(self, params: dict[str, str]) -> dict[str, Any]:
        groups = [self._group(params)] if params.get("ServerGroupId") else list(self._groups.values())
        ids = repeated(params, "ServerIds")
        found = [{"ServerGroupId": g.id, "ServerId": s.server_id, "ServerIp": self._ip(s), "ServerType": "Ecs",
                  "Port": s.port, "Weight": s.weight, "Description": s.description, "Status": s.status}
                 for g in groups for s in g.servers.values() if not ids or s.server_id in ids]
        return paged(found, params, "Servers")

    def _create_listener(self, params: dict[str, str]) -> dict[str, Any]:
        lb: LoadBalancer = self._get(self._lbs, "LoadBalancer", params, "LoadBalancerId")
        protocol = choice(params, "ListenerProtocol", ("HTTP", "HTTPS"))
        port = as_int(params, "ListenerPort", 0, 1, 65535) or int(required(params, "ListenerPort"))
        choice(params, "DefaultActions.1.Type", ("ForwardGroup",))
        if any(key.startswith(("DefaultActions.2.", FORWARD.replace(".1.ServerGroupId", ".2."))) for key in params):
            raise illegal("DefaultActions", "One ForwardGroup action to one server group.")
        group: ServerGroup = self._get(self._groups, "ServerGroup", params, FORWARD)
        certificates = [{"CertificateId": required(c, "CertificateId")} for c in indexed(params, "Certificates")]
        if protocol == "HTTPS" and not certificates:
            raise missing("Certificates")
        if lb.status != "Active":
            raise bad("IncorrectStatus.LoadBalancer", f"The status of LoadBalancer [{lb.id}] is incorrect.")
        if group.view["VpcId"] != lb.view["VpcId"]:
            raise bad("Mismatch.VpcId", f"The {group.id} and {lb.id} are mismatched.")
        if any(li.lb_id == lb.id and li.port == port for li in self._listeners.values()):
            raise bad("ResourceAlreadyExist.Listener", f"The resource Listener [{lb.id}:{port}] already exists.")
        view = {"ListenerProtocol": protocol, "ListenerDescription": params.get("ListenerDescription", ""),
                "Http2Enabled": protocol == "HTTPS", "Certificates": certificates}
        listener = Listener(new_id("lsn-"), view, parse_tags(params), lb.id, port, group.id)
        self._listeners[listener.id] = listener
        self._resync([lb.id])
        return job(ListenerId=listener.id)

    @staticmethod
    def _listener_view(li: Listener, full: bool = False) -> dict[str, Any]:
        view = {"ListenerId": li.id, "LoadBalancerId": li.lb_id, "ListenerPort": li.port, **li.view,
                **LISTENER_FIXED, "ListenerStatus": li.status, "Tags": tag_view(li.tags),
                "DefaultActions": [{"Type": "ForwardGroup",
                                    "ForwardGroupConfig": {"ServerGroupTuples": [{"ServerGroupId": li.group_id}]}}]}
        return view if full else {k: v for k, v in view.items() if k != "Certificates"}

    def _list_listeners(self, params: dict[str, str]) -> dict[str, Any]:
        ids, lbs = repeated(params, "ListenerIds"), repeated(params, "LoadBalancerIds")
        found = [self._listener_view(li) for li in self._listeners.values()
                 if (not ids or li.id in ids) and (not lbs or li.lb_id in lbs) and tags_match(li.tags, params)
                 and params.get("ListenerProtocol", li.view["ListenerProtocol"]) == li.view["ListenerProtocol"]]
        return paged(found, params, "Listeners")

    def _get_listener(self, params: dict[str, str]) -> dict[str, Any]:
        return self._listener_view(self._get(self._listeners, "Listener", params, "ListenerId"), full=True)

    def _delete_listener(self, params: dict[str, str]) -> dict[str, Any]:
        li: Listener = self._get(self._listeners, "Listener", params, "ListenerId")
        del self._listeners[li.id]
        self._resync([li.lb_id])
        return job()

    def _health_status(self, params: dict[str, str]) -> dict[str, Any]:
        """Unlocked (ALB_UNLOCKED): the state is read under the lock, haproxy is asked outside it."""
        with self._lock:
            li: Listener = self._get(self._listeners, "Listener", params, "ListenerId")
            lb, group = self._lbs[li.lb_id], self._groups[li.group_id]
            servers = [(s, s.ip, self._ip(s)) for s in group.servers.values() if s.status == "Available"]
            plane, enabled, codes = lb.plane, group.health["HealthCheckEnabled"], group.health["HealthCheckCodes"]
        if any(old != new for _, old, new in servers):
            self._spawn(self._sync, lb)           # an instance came back on another address
        states = plane.health().get(li.id, {}) if plane is not None else {}
        reason = {"ReasonCode": "RESPONSE_MISMATCH", "ExpectedResponse": ",".join(codes), "ActualResponse": ""}
        abnormal = []
        for server, _, ip in servers:             # healthy servers are normal: not listed
            status = "Unavailable" if not enabled else "Unused" if server.weight == 0 else {
                "initial": "Initial", "unhealthy": "Unhealthy"}.get(states.get((ip, server.port), "initial"))
            abnormal += [{"ServerId": server.server_id, "ServerIp": ip, "Port": server.port, "Status": status,
                          "Reason": reason if status == "Unhealthy" else {}}] if status else []
        info = {"ServerGroupId": group.id, "ActionType": "ForwardGroup", "HealthCheckEnabled": "on" if enabled
                else "off", "NonNormalServers": abnormal}
        return {"ListenerHealthStatus": [{"ListenerId": li.id, "ListenerPort": li.port, "ServerGroupInfos": [info],
                                          "ListenerProtocol": li.view["ListenerProtocol"]}],
                "RuleHealthStatus": [], "NextToken": ""}

    def _resources(self, params: Mapping[str, str], ids_required: bool) -> tuple[str, list[Resource]]:
        kind, ids = choice(params, "ResourceType", tuple(KINDS)), repeated(params, "ResourceId")
        table: Mapping[str, Resource] = {"loadbalancer": self._lbs, "servergroup": self._groups,
                                         "listener": self._listeners}[kind]
        if ids_required and not ids:
            raise missing("ResourceId")
        return kind, [self._get(table, KINDS[kind], {"Id": i}, "Id") for i in ids] if ids else list(table.values())

    def _tag(self, params: dict[str, str]) -> dict[str, Any]:
        _, resources = self._resources(params, ids_required=True)
        if not (tags := parse_tags(params)) or any(len({**resource.tags, **tags}) > 20 for resource in resources):
            raise illegal("Tag", "1..20 tags per resource.")
        for resource in resources:
            resource.tags.update(tags)
        return {}

    def _list_tags(self, params: dict[str, str]) -> dict[str, Any]:
        kind, resources = self._resources(params, ids_required=False)
        wanted = indexed(params, "Tag")
        found = [{"ResourceId": r.id, "ResourceType": kind, "TagKey": key, "TagValue": value}
                 for r in resources for key, value in r.tags.items()
                 if not wanted or any(w.get("Key") == key and w.get("Value", value) == value for w in wanted)]
        return paged(found, params, "TagResources")
