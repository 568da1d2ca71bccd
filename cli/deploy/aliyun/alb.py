"""A service's load balancer on Alibaba Cloud: ALB (2020-06-16) behind the contract of balancer.py.

Why ALB and not CLB: ALB is the layer-7 product Alibaba Cloud develops (CLB is the older one): server
groups with HTTP(S) health checks and connection draining, several zones per balancer, tags on every
resource and ClientTokens on every write, which is what the contract's rules need.

What one service gets, each named spec.name and carrying spec.tags (ngcx:owner, ngcx:service):
- an Internet ALB (Standard edition, pay-as-you-go) in two or more zones of the hosts' VPC: the replicas'
  zones first, then other zones with a vSwitch until there are two (ALB's minimum);
- a server group (Instance type) that reaches the replicas with spec.target_protocol and checks
  spec.health_path for http_2xx, draining a removed server for spec.drain_s (ConnectionDrainConfig);
- one listener forwarding to it: HTTPS on spec.port with the user's certificate (spec.certificate_id, a CAS
  id); without one HTTP, because an ALB HTTPS listener needs a certificate and ngcx has none to give it,
  on port 80 when the spec asks for 443, else on spec.port (`listener_of` says which, for the URL).
Settings of a group or listener found again are kept as they are (ensure creates what is missing).

Idempotency: everything is looked up by tags and name before it is created; a create carries a ClientToken
that is a digest of its parameters (spec.name and the tags among them), so a retry after a lost answer or
a killed ngcx gets the first answer instead of a second balancer. A token whose first answer names
something deleted since (a service deleted, then made again) makes way for the next of a fixed sequence.

Waits, each bounded: ACTIVE_S for a new balancer's Provisioning -> Active (about a minute on the cloud),
RUNNING_S for a new listener's Provisioning -> Running, BUSY_S while ALB answers Conflict.Lock or
IncorrectStatus.* (it takes one change at a time per group and balancer), ResourceInUse on delete (a
listener's deletion still running) and a server's Removing before it is added again. `deregister` returns
once the removal started: the drain is the cloud's.
The hosts' security group (prepare_network's) admits the balancer's vSwitch CIDRs on spec.target_port: ALB
reaches servers from addresses in its own vSwitches. Not done here: checking that ALB sells the chosen zones
(ALB DescribeZones); a zone it does not fails in CreateLoadBalancer's error.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...clouds.aliyun import AliyunError, tag_params
from ...core.errors import UserError
from .. import vm
from ..balancer import BalancerRef, BalancerSpec

if TYPE_CHECKING:
    from .ecs import Ecs

ACTIVE_S, RUNNING_S, BUSY_S = 600.0, 300.0, 180.0
BUSY = ("Conflict.Lock", "IncorrectStatus")      # code prefixes: try again once the other change is done
IN_USE = (*BUSY, "ResourceInUse")
TOKEN_TRIES = 8                                  # generations of one spec.name (made, deleted, made again)
MEMBERSHIP = {"Adding": "initial", "Removing": "draining"}          # ListServerGroupServers Status
# GetListenerHealthStatus lists only non-normal servers. Unavailable (checks turned off, which ngcx never does)
# counts as unhealthy: nothing vouches for the server.
ABNORMAL = {"Initial": "initial", "Unhealthy": "unhealthy", "Unused": "unused", "Unavailable": "unhealthy"}


def listener_of(spec: BalancerSpec) -> tuple[str, int]:
    """(protocol, port) of the service's listener: HTTPS only with a certificate (see the module docstring)."""
    if spec.protocol == "HTTPS" and spec.certificate_id:
        return "HTTPS", spec.port
    return "HTTP", 80 if spec.port == 443 else spec.port


class Alb:
    """balancer.Balancer on ALB, in the region and VPC of an Ecs cloud whose network is prepared."""

    def __init__(self, ecs: Ecs) -> None:
        self.ecs, self.api = ecs, ecs.api

    # ------------------------------------------------------------------------------------ the contract

    def ensure(self, spec: BalancerSpec) -> BalancerRef:
        vpc = self._vpc()
        lb_id = self._find("ListLoadBalancers", "LoadBalancers", "LoadBalancerNames", spec) or self._create(
            "CreateLoadBalancer", self._lb_params(spec, vpc), "LoadBalancerId", self._lb_exists)
        dns = self._wait(f"ALB {lb_id} to become Active", lambda: self._lb_ready(lb_id), ACTIVE_S)
        self._admit(lb_id, vpc, spec.target_port)
        group_id = self._find("ListServerGroups", "ServerGroups", "ServerGroupNames", spec, VpcId=vpc) or self._create(
            "CreateServerGroup", _group_params(spec, vpc), "ServerGroupId", self._group_exists)
        listener_id = self._listener(lb_id, group_id, spec)
        self._wait(f"ALB listener {listener_id} to run", lambda: self._listener_ready(listener_id), RUNNING_S)
        return BalancerRef(lb_id, group_id, listener_id, dns)

    def register(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """Add the instance (ServerType Ecs); one already there is done, one still Removing is added once gone."""
        while True:
            try:
                return self._servers("AddServersToServerGroup", ref, instance_id, port)
            except AliyunError as exc:
                if exc.code != "ResourceAlreadyExist.BackendServer":
                    raise
            if self._member(ref, instance_id, port) != "Removing":
                return
            self._wait(f"{instance_id} to leave {ref.group_id} before it is added again",
                       lambda: self._member(ref, instance_id, port) != "Removing", BUSY_S)

    def deregister(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """Start the removal (and so the drain); one already gone or already Removing is done."""
        if self._member(ref, instance_id, port) in (None, "Removing"):
            return
        try:
            self._servers("RemoveServersFromServerGroup", ref, instance_id, port)
        except AliyunError as exc:
            if not exc.code.startswith("ResourceNotFound."):
                raise

    def set_weights(self, ref: BalancerRef, weights: Sequence[tuple[str, int, int]]) -> None:
        """UpdateServerGroupServersAttribute (Servers.N.Weight, 0..100 as the contract's) for the named servers still in
        the group, 40 per call; one gone or Removing meanwhile is left out (a rollback names replicas leaving)."""
        present = {(s["ServerId"], int(s.get("Port", 0))) for s in
                   self._all("ListServerGroupServers", "Servers", {"ServerGroupId": ref.group_id})
                   if s.get("Status") != "Removing"}
        wanted = [(i, p, max(0, min(100, int(w)))) for i, p, w in weights if (i, p) in present]
        for start in range(0, len(wanted), 40):
            params: dict[str, Any] = {"ServerGroupId": ref.group_id}
            for n, (instance, port, weight) in enumerate(wanted[start:start + 40], 1):
                params.update({f"Servers.{n}.ServerId": instance, f"Servers.{n}.ServerType": "Ecs",
                               f"Servers.{n}.Port": port, f"Servers.{n}.Weight": weight})
            self._write("UpdateServerGroupServersAttribute", params, _nonce())

    def health(self, ref: BalancerRef) -> dict[str, str]:
        """Instance id -> balancer.HEALTH_STATES: membership (Adding, Removing) first, then the listener's checks."""
        members = self._all("ListServerGroupServers", "Servers", {"ServerGroupId": ref.group_id})
        abnormal = self._abnormal(ref)
        return {s["ServerId"]: MEMBERSHIP.get(s.get("Status", "")) or abnormal.get((s["ServerId"], s.get("Port")),
                                                                                     "healthy") for s in members}

    def delete(self, ref: BalancerRef) -> None:
        """Listener, balancer, then server group (in use until the listener is gone); what is gone is done."""
        for action, key, resource_id in (("DeleteListener", "ListenerId", ref.listener_id),
                                         ("DeleteLoadBalancer", "LoadBalancerId", ref.balancer_id),
                                         ("DeleteServerGroup", "ServerGroupId", ref.group_id)):
            if resource_id:
                self._delete(action, {key: resource_id})

    def _delete(self, action: str, params: dict[str, str]) -> None:
        try:
            self._write(action, params, _nonce(), IN_USE)
        except AliyunError as exc:
            if not exc.code.startswith("ResourceNotFound."):
                raise

    def tagged(self, tags: dict[str, str]) -> list[BalancerRef]:
        """Every balancer with these tags, and every such server group no balancer uses (what a killed ngcx left)."""
        groups = {g["ServerGroupId"]: g.get("ServerGroupName") for g in
                  self._all("ListServerGroups", "ServerGroups", tag_params(tags))}
        refs = []
        for lb in self._all("ListLoadBalancers", "LoadBalancers", tag_params(tags)):
            listeners = self._all("ListListeners", "Listeners", {"LoadBalancerIds.1": lb["LoadBalancerId"]})
            used = [_forward_group(li) for li in listeners] or [g for g, n in groups.items()
                                                               if n == lb.get("LoadBalancerName")]
            refs.append(BalancerRef(lb["LoadBalancerId"], (used or [""])[0],
                                    listeners[0]["ListenerId"] if listeners else "", lb.get("DNSName", "")))
        named = {ref.group_id for ref in refs}
        return refs + [BalancerRef("", group_id, "", "") for group_id in groups if group_id not in named]

    # ------------------------------------------------------------------------------------ ensure's steps

    def _vpc(self) -> str:
        """The hosts' VPC, that of the Ecs network's vSwitches (prepare_network)."""
        if not self.ecs.vswitches:
            raise UserError(f"no ngcx network in {self.ecs.region} to put a load balancer in",
                            hint="deploy a host first (it prepares the VPC's vSwitches and security group)")
        switch = next(iter(self.ecs.vswitches.values()))
        found = self.api.ecs("DescribeVSwitches", {"VSwitchId": switch}).get("VSwitches", {}).get("VSwitch", [])
        if not found:
            raise UserError(f"vSwitch {switch} of the ngcx network is gone from {self.ecs.region}")
        return str(found[0]["VpcId"])

    def _admit(self, lb_id: str, vpc: str, port: int) -> None:
        """The hosts' security group lets the balancer in on `port`: ALB talks to servers from addresses of its
        vSwitches, so each one's CIDR (re-authorizing a rule ECS already has is a no-op)."""
        zones = self.api.alb("GetLoadBalancerAttribute", {"LoadBalancerId": lb_id}).get("ZoneMappings") or []
        mine = {z.get("VSwitchId") for z in zones}
        switches = self.api.ecs("DescribeVSwitches", {"VpcId": vpc, "PageSize": 50}).get("VSwitches", {})
        for cidr in sorted({s["CidrBlock"] for s in switches.get("VSwitch", []) if s.get("VSwitchId") in mine}):
            self.api.ecs("AuthorizeSecurityGroup", {
                "SecurityGroupId": self.ecs.security_group, "IpProtocol": "tcp", "PortRange": f"{port}/{port}",
                "SourceCidrIp": cidr, "Description": "ngcx service balancer (ALB)"}, token=_nonce(), write=True)

    def _lb_params(self, spec: BalancerSpec, vpc: str) -> dict[str, Any]:
        switches = self.ecs.vswitches or {}
        zones = list(dict.fromkeys(z for z in spec.zones if z in switches))
        zones += [z for z in sorted(switches) if z not in zones][:max(0, 2 - len(zones))]
        if len(zones) < 2:
            raise UserError(f"an ALB needs vSwitches in two zones; the VPC {vpc} has them in: "
                            f"{', '.join(sorted(switches)) or 'none'}", hint="create a vSwitch in another zone")
        mappings = {f"ZoneMappings.{n}.{k}": v for n, zone in enumerate(zones, 1)
                    for k, v in (("ZoneId", zone), ("VSwitchId", switches[zone]))}
        return {"LoadBalancerName": spec.name, "VpcId": vpc, "AddressType": "Internet",
                "LoadBalancerEdition": "Standard", "LoadBalancerBillingConfig.PayType": "PostPay",
                **mappings, **tag_params(spec.tags)}

    def _listener(self, lb_id: str, group_id: str, spec: BalancerSpec) -> str:
        protocol, port = listener_of(spec)
        found = [li for li in self._all("ListListeners", "Listeners", {"LoadBalancerIds.1": lb_id})
                 if int(li.get("ListenerPort", 0)) == port]
        if found:
            return str(found[0]["ListenerId"])
        if protocol == "HTTP" and spec.protocol == "HTTPS":
            vm.say(f"no certificate for {spec.name}: its balancer listens on plain HTTP port {port} "
                   "(give an Alibaba Cloud certificate id for HTTPS)")
        params = {"LoadBalancerId": lb_id, "ListenerProtocol": protocol, "ListenerPort": port,
                  "ListenerDescription": spec.name, "DefaultActions.1.Type": "ForwardGroup",
                  "DefaultActions.1.ForwardGroupConfig.ServerGroupTuples.1.ServerGroupId": group_id,
                  **({"Certificates.1.CertificateId": spec.certificate_id} if protocol == "HTTPS" else {}),
                  **tag_params(spec.tags)}
        return self._create("CreateListener", params, "ListenerId", self._listener_exists)

    def _find(self, action: str, key: str, names: str, spec: BalancerSpec, **extra: str) -> str | None:
        found = self._all(action, key, {f"{names}.1": spec.name, **tag_params(spec.tags), **extra})
        found.sort(key=lambda item: item.get("CreateTime", ""))
        return str(found[0][key[:-1] + "Id"]) if found else None

    def _create(self, action: str, params: dict[str, Any], id_key: str, exists: Callable[[str], bool]) -> str:
        """Create with the ClientTokens of a fixed sequence: one whose first answer is gone makes way for the next."""
        digest = hashlib.sha256(json.dumps([action, params], sort_keys=True).encode()).hexdigest()[:16]
        for n in range(TOKEN_TRIES):
            new_id = str(self._write(action, params, f"ngcx-{digest}-{n}")[id_key])
            if exists(new_id):
                return new_id
        raise UserError(f"ALB {action} kept answering resources that are gone ({TOKEN_TRIES} client tokens)")

    def _lb_exists(self, lb_id: str) -> bool:
        return self._found("GetLoadBalancerAttribute", {"LoadBalancerId": lb_id})

    def _group_exists(self, group_id: str) -> bool:
        return bool(self.api.alb("ListServerGroups", {"ServerGroupIds.1": group_id}).get("ServerGroups"))

    def _listener_exists(self, listener_id: str) -> bool:
        return self._found("GetListenerAttribute", {"ListenerId": listener_id})

    def _lb_ready(self, lb_id: str) -> str | None:
        view = self.api.alb("GetLoadBalancerAttribute", {"LoadBalancerId": lb_id})
        status = view.get("LoadBalancerStatus")
        if status in ("CreateFailed", "Inactive"):
            raise UserError(f"ALB {lb_id} is {status}", hint="see it in the ALB console; delete it to deploy again")
        return str(view["DNSName"]) if status in ("Active", "Configuring") else None

    def _listener_ready(self, listener_id: str) -> bool:
        status = self.api.alb("GetListenerAttribute", {"ListenerId": listener_id}).get("ListenerStatus")
        return status in ("Running", "Configuring")

    # ------------------------------------------------------------------------------------ servers and health

    def _servers(self, action: str, ref: BalancerRef, instance_id: str, port: int) -> None:
        params = {"ServerGroupId": ref.group_id, "Servers.1.ServerId": instance_id, "Servers.1.ServerType": "Ecs",
                  "Servers.1.Port": port, **({"Servers.1.Weight": 100} if action.startswith("Add") else {})}
        self._write(action, params, _nonce())   # a token per change: a lost answer's retry replays it

    def _member(self, ref: BalancerRef, instance_id: str, port: int) -> str | None:
        """The server's Status in the group (Adding, Available, Removing), None when it is not there."""
        found = self._all("ListServerGroupServers", "Servers", {"ServerGroupId": ref.group_id,
                                                                "ServerIds.1": instance_id})
        return next((str(s.get("Status")) for s in found if int(s.get("Port", 0)) == port), None)

    def _abnormal(self, ref: BalancerRef) -> dict[tuple[str, Any], str]:
        out, token = {}, None
        while True:
            answer = self.api.alb("GetListenerHealthStatus", {"ListenerId": ref.listener_id, "NextToken": token})
            for listener in answer.get("ListenerHealthStatus") or []:
                for info in listener.get("ServerGroupInfos") or []:
                    if info.get("ServerGroupId") == ref.group_id:
                        out.update({(s["ServerId"], s.get("Port")): ABNORMAL.get(s.get("Status"), "unhealthy")
                                    for s in info.get("NonNormalServers") or []})
            if not (token := answer.get("NextToken")):
                return out

    # ------------------------------------------------------------------------------------ calls

    def _all(self, action: str, key: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every page of a NextToken listing."""
        items, token = [], None
        while True:
            answer = self.api.alb(action, {**params, "MaxResults": 100, "NextToken": token})
            items += answer.get(key) or []
            if not (token := answer.get("NextToken")):
                return items

    def _write(self, action: str, params: dict[str, Any], token: str, busy: tuple[str, ...] = BUSY) -> dict[str, Any]:
        """The write, again while ALB answers a `busy` code (another change of it runs), for at most BUSY_S."""
        deadline, pause = time.monotonic() + BUSY_S, 0.2
        while True:
            try:
                return self.api.alb(action, params, token=token, write=True)
            except AliyunError as exc:
                if not exc.code.startswith(busy) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 1.5, 5.0)

    def _found(self, action: str, params: dict[str, str]) -> bool:
        try:
            return bool(self.api.alb(action, params))
        except AliyunError as exc:
            if exc.code.startswith("ResourceNotFound."):
                return False
            raise

    @staticmethod
    def _wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
        """Poll `check` until it answers something true (saying once what it waits for), for at most `timeout`."""
        deadline, pause, said = time.monotonic() + timeout, 0.1, False
        while not (found := check()):
            if time.monotonic() + pause > deadline:
                raise UserError(f"gave up waiting {timeout:.0f} s for {what}", hint="see it in the ALB console")
            if not said:
                vm.say(f"waiting for {what} (at most {timeout / 60:.0f} min)")
                said = True
            time.sleep(pause)
            pause = min(pause * 1.5, 3.0)
        return found


def _group_params(spec: BalancerSpec, vpc: str) -> dict[str, Any]:
    h = "HealthCheckConfig."
    return {"ServerGroupName": spec.name, "ServerGroupType": "Instance", "VpcId": vpc,
            "Protocol": spec.target_protocol, h + "HealthCheckEnabled": True, h + "HealthCheckPath": spec.health_path,
            h + "HealthCheckProtocol": spec.target_protocol, h + "HealthCheckMethod": "GET",
            h + "HealthCheckCodes.1": "http_2xx", h + "HealthCheckInterval": spec.health_interval_s,
            h + "HealthCheckTimeout": min(5, spec.health_interval_s), h + "HealthyThreshold": spec.healthy_threshold,
            h + "UnhealthyThreshold": spec.unhealthy_threshold, "ConnectionDrainConfig.ConnectionDrainEnabled": True,
            "ConnectionDrainConfig.ConnectionDrainTimeout": spec.drain_s, **tag_params(spec.tags)}


def _forward_group(listener: dict[str, Any]) -> str:
    actions = listener.get("DefaultActions") or [{}]
    tuples = (actions[0].get("ForwardGroupConfig") or {}).get("ServerGroupTuples") or [{}]
    return str(tuples[0].get("ServerGroupId", ""))


def _nonce() -> str:
    return uuid.uuid4().hex
