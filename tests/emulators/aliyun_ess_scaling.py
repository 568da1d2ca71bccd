"""The moving part of the ESS emulator (aliyun_ess.py): a group's instances launched, brought into its ALB server
groups, drained through lifecycle hooks and released, and the target-tracking controller.

Why a module of its own: aliyun_ess.py reads as the API (parameters, views, errors); this one as what a group
does over time, in workers spawned on the ECS emulator (they stand down when it closes). Everything here runs
under the emulator's lock except the waits and haproxy's stats. See aliyun_ess.py's docstring for the behaviour
(what is emulated, what is not, what is guessed).
"""

from __future__ import annotations

import math
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .aliyun_alb import Alb
from .aliyun_ecs_machines import Instance, SecurityGroup
from .aliyun_rpc import ApiError, iso_now

QPS_METRIC = "LoadBalancerRealServerAverageQps"   # ESS 2022-02-22 CreateScalingRule: with AlarmDimensions rulePool
LIVE = ("Pending", "InService")
RECYCLE = ("recycle", "forceRecycle")        # ScalingPolicy values that keep scaled-in instances Stopped


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(20))


@dataclass
class Member:
    instance_id: str
    config_id: str
    zone: str
    state: str = "Pending"
    created: float = field(default_factory=time.monotonic)
    creation_time: str = field(default_factory=iso_now)
    spot_strategy: str = "NoSpot"            # what ECS launched it as (aliyun_ess_spot.py chooses)
    doomed: bool = False                     # a spot reclaim notice: no longer counts towards the capacity


@dataclass
class Activity:
    id: str
    group_id: str
    description: str
    cause: str
    total: int
    instances: list[str]
    started: str = field(default_factory=iso_now)
    ended: str = ""
    status: str = "InProgress"
    message: str = ""
    done: int = 0


@dataclass
class LifecycleAction:
    token: str
    hook_id: str
    activity_id: str
    instance_id: str
    deadline: float
    status: str = "Pending"
    result: str = ""


@dataclass
class Group:
    id: str
    name: str
    min: int
    max: int
    desired: int
    vswitches: list[str]
    server_groups: list[dict[str, Any]]
    tags: dict[str, str]
    cooldown: int
    state: str = "Inactive"
    config_id: str = ""
    created: str = field(default_factory=iso_now)
    members: dict[str, Member] = field(default_factory=dict)
    below: int = 0
    policy: str = "release"                  # ScalingPolicy: release / recycle (economical mode) / force*
    multi_az: str = "PRIORITY"               # MultiAZPolicy, and the spot settings (aliyun_ess_spot.py)
    on_demand_base: int = 0
    on_demand_above: int = 100               # OnDemandPercentageAboveBaseCapacity
    spot_remedy: bool = False                # SpotInstanceRemedy
    compensate: bool = True                  # CompensateWithOnDemand
    refresh: str = ""                        # the instance refresh task in progress (aliyun_ess_refresh.py)


class Ecs(Protocol):
    """What ESS uses of EcsEmulator (aliyun_ecs.py): its lock, workers, instance actions and ALB. A Protocol,
    not an import of aliyun_ecs.py, because that module imports ESS (no two modules import each other)."""

    region: str
    alb: Alb
    _lock: threading.RLock
    _closing: threading.Event
    _instances: dict[str, Instance]
    _vpc_id: str
    _vswitches: dict[str, str]

    def _spawn(self, target: Callable[..., None], *args: Any) -> None: ...
    def _sleep_until(self, deadline: float) -> bool: ...
    def _group(self, group_id: str) -> SecurityGroup: ...
    def _user_data(self, params: dict[str, str]) -> bytes: ...
    def _run_instances(self, params: dict[str, str]) -> dict[str, Any]: ...
    def _start_instances(self, params: dict[str, str]) -> dict[str, Any]: ...
    def _stop_instances(self, params: dict[str, str]) -> dict[str, Any]: ...
    def _delete_instances(self, params: dict[str, str]) -> dict[str, Any]: ...


class Scaling:
    """Mixed into aliyun_ess.Ess: the state it keeps (below) and what the groups do with it."""

    ecs: Ecs
    _lock: threading.RLock
    time_scale: float
    scale_in_periods: int
    decisions: list[tuple[str, int, int, float]]
    errors: list[str]
    metrics: dict[tuple[str, str], float]
    _groups: dict[str, Group]
    _configs: dict[str, Any]
    _hooks: dict[str, Any]
    _rules: dict[str, Any]
    _activities: dict[str, Activity]
    _actions: dict[str, LifecycleAction]
    _counts: dict[str, int]
    _controller: threading.Thread | None

    @property
    def period_s(self) -> float:
        return 60.0 * self.time_scale

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}"[:500])

    def _converge(self, group: Group, cause: str) -> None:
        """Launch or remove until the group's live instances are its DesiredCapacity (under the lock); a member
        under a reclaim notice does not count (its replacement does); nothing while a refresh runs (its end
        converges)."""
        if group.state != "Active" or group.config_id not in self._configs or group.refresh:
            return
        live = [m for m in group.members.values() if m.state in LIVE and not m.doomed]
        if len(live) < group.desired:
            missing = group.desired - len(live) - self._restart(group, group.desired - len(live), cause)
            if missing > 0:
                self._launch(group, missing, cause)
        elif len(live) > group.desired:
            order = sorted(live, key=lambda m: (m.config_id == group.config_id, m.created))
            self._remove(group, order[:len(live) - group.desired], cause)

    def _activity(self, group: Group, what: str, count: int, cause: str) -> Activity:
        activity = Activity(new_id("asa-"), group.id, f'{what} "{count}" ECS instance(s)',
                            f"{cause} changed the group's desired capacity to {group.desired}", count, [])
        self._activities[activity.id] = activity
        return activity

    def _step(self, activity: Activity, failure: str = "") -> None:
        with self._lock:
            activity.done += 1
            if failure:
                activity.status, activity.message = "Failed", failure[:300]
            if activity.done >= activity.total:
                activity.ended = iso_now()
                activity.status = "Successful" if activity.status == "InProgress" else activity.status

    def _restart(self, group: Group, count: int, cause: str) -> int:
        """Recycle mode: up to `count` Stopped members started again (StartInstance), oldest first, each Pending
        until it runs and is back in the server groups; how many started (a refused start counts as not)."""
        stopped = sorted((m for m in group.members.values() if m.state == "Stopped"), key=lambda m: m.created)
        if not stopped[:count]:
            return 0
        activity, started = self._activity(group, "Add", len(stopped[:count]), cause), 0
        for member in stopped[:count]:
            activity.instances.append(member.instance_id)
            try:
                self.ecs._start_instances({"InstanceId.1": member.instance_id})
            except ApiError as exc:
                self._step(activity, f"{member.instance_id}: {exc.code}: {exc.message}")
                continue
            member.state, started = "Pending", started + 1
            self.ecs._spawn(self._bring_in, group, member, activity)
        return started

    def _launch(self, group: Group, count: int, cause: str, config_id: str = "") -> list[Member]:
        """`count` new instances of `config_id` (else the active configuration); the members made. Each tries
        the placements _placements gives (type x market, aliyun_ess_spot.py) until ECS takes one."""
        config = self._configs[config_id or group.config_id]
        activity, made = self._activity(group, "Add", count, cause), []
        for _ in range(count):
            zones = {s: self.ecs._vswitches[s] for s in group.vswitches}
            load = {z: sum(m.zone == z and m.state in LIVE for m in group.members.values()) for z in zones.values()}
            switch = min(group.vswitches, key=lambda s: load[zones[s]])
            params = {"ImageId": config.image_id, "VSwitchId": switch,
                      "UserData": config.user_data, "RamRoleName": config.ram_role,
                      "InstanceName": config.instance_name or f"ESS-{group.name}",
                      "SecurityGroupId": config.security_group,
                      **{f"Tag.{n}.{k}": v for n, (key, value) in enumerate(config.tags.items(), 1)
                         for k, v in (("Key", key), ("Value", value))}}
            refusal: ApiError | None = None
            for itype, market in self._placements(group, config):
                try:
                    [instance_id] = self._run(params | {"InstanceType": itype, "SpotStrategy": market})
                    break
                except ApiError as exc:
                    refusal = exc
            else:
                assert refusal is not None
                activity.status, activity.message = "Failed", f"{refusal.code}: {refusal.message}"
                activity.ended = iso_now()
                return made
            member = group.members[instance_id] = Member(instance_id, config.id, zones[switch], spot_strategy=market)
            activity.instances.append(instance_id)
            made.append(member)
            self.ecs._spawn(self._bring_in, group, member, activity)
        return made

    def _placements(self, group: Group, config: Any) -> list[tuple[str, str]]:
        """(instance type, SpotStrategy) to try in order (aliyun_ess_spot.py overrides this)."""
        return [(config.instance_type, "NoSpot")]

    def _run(self, params: dict[str, str]) -> list[str]:
        """RunInstances (aliyun_ess_spot.py refuses spot launches when the test took the spot market away)."""
        return list(self.ecs._run_instances(params)["InstanceIdSets"]["InstanceIdSet"])

    def _servers(self, action: str, group: Group, instance_id: str) -> None:
        """Add or remove the instance in every attached server group, retrying ALB's Conflict.Lock."""
        for sg in group.server_groups:
            params = {"ServerGroupId": sg["ServerGroupId"], "Servers.1.ServerId": instance_id,
                      "Servers.1.ServerType": "Ecs", "Servers.1.Port": str(sg["Port"]),
                      "Servers.1.Weight": str(sg["Weight"])}
            while True:
                with self._lock:
                    try:
                        handler = self.ecs.alb._add_servers if action == "add" else self.ecs.alb._remove_servers
                        handler(params)
                        break
                    except ApiError as exc:
                        if exc.code.startswith(("ResourceNotFound.", "ResourceAlreadyExist.")):
                            break
                        if exc.code != "Conflict.Lock":
                            raise
                if not self.ecs._sleep_until(time.monotonic() + 0.05):
                    return

    def _bring_in(self, group: Group, member: Member, activity: Activity) -> None:
        """Pending until the instance runs, then into the server groups, then InService."""
        while True:
            with self._lock:
                inst = self.ecs._instances.get(member.instance_id)
                if member.state != "Pending" or group.members.get(member.instance_id) is not member:
                    return self._step(activity)
                if inst is None:                     # the backend failed to make the machine
                    group.members.pop(member.instance_id, None)
                    return self._step(activity, f"{member.instance_id} failed to start")
                if inst.status == "Running" and inst.private_ip:
                    break
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return
        try:
            self._servers("add", group, member.instance_id)
        except ApiError as exc:
            self._failed(member.instance_id, exc)
            return self._step(activity, f"{exc.code}: {exc.message}")
        while True:                                   # InService once every server group took it (Available)
            with self._lock:
                gone = member.state != "Pending"      # taken out while it was being added: out again
                if not gone and self._attached(group, member.instance_id):
                    member.state = "InService"
                if gone or member.state == "InService":
                    break
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return
        if gone:
            self._servers("remove", group, member.instance_id)
        self._step(activity)

    def _attached(self, group: Group, instance_id: str) -> bool:
        found = [self.ecs.alb._groups.get(sg["ServerGroupId"]) for sg in group.server_groups]
        return all(g is None or getattr(g.servers.get((instance_id, sg["Port"])), "status", "") == "Available"
                   for g, sg in zip(found, group.server_groups, strict=True))

    def _remove(self, group: Group, victims: list[Member], cause: str) -> None:
        activity = self._activity(group, "Remove", len(victims), cause)
        hooks = [h for h in self._hooks.values() if h.group_id == group.id and h.transition == "SCALE_IN"]
        for member in victims:
            activity.instances.append(member.instance_id)
            member.state = "Removing:Wait" if hooks else "Removing"
            for hook in hooks:
                token = str(uuid.uuid4())
                self._actions[token] = LifecycleAction(token, hook.id, activity.id, member.instance_id,
                                                       time.monotonic() + hook.timeout * self.time_scale)
            self.ecs._spawn(self._take_out, group, member, activity)

    def _drained(self, group: Group, instance_id: str) -> bool:
        groups = self.ecs.alb._groups
        return not any(key[0] == instance_id for sg in group.server_groups
                       for key in getattr(groups.get(sg["ServerGroupId"]), "servers", {}))

    def _take_out(self, group: Group, member: Member, activity: Activity | None) -> None:
        """Out of the server groups (the drain), the lifecycle wait, then the instance is released."""
        try:
            self._servers("remove", group, member.instance_id)
        except ApiError as exc:
            self._failed(member.instance_id, exc)
        while True:
            with self._lock:
                now, waiting = time.monotonic(), False
                for action in self._actions.values():
                    if action.instance_id == member.instance_id and action.status == "Pending":
                        if activity is None:
                            action.status = "Completed"
                        elif now >= action.deadline:
                            action.status, action.result = "Timeout", self._hooks[action.hook_id].default_result \
                                if action.hook_id in self._hooks else "CONTINUE"
                        else:
                            waiting = True
                if not waiting and member.state == "Removing:Wait":
                    member.state = "Removing"
                if not waiting and self._drained(group, member.instance_id):
                    break
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return
        with self._lock:
            inst = self.ecs._instances.get(member.instance_id)
            recycle = activity is not None and group.policy in RECYCLE and self._groups.get(group.id) is group \
                and inst is not None and inst.status == "Running"
            if recycle:                   # economical mode: stopped, its disk kept, still the group's
                self.ecs._stop_instances({"InstanceId.1": member.instance_id, "StoppedMode": "StopCharging",
                                          "ForceStop": "true"})
            else:
                group.members.pop(member.instance_id, None)
                if inst is not None:
                    self.ecs._delete_instances({"InstanceId.1": member.instance_id, "Force": "true"})
        if recycle and not self._stopped(member):
            return
        if activity is not None:
            self._step(activity)

    def _stopped(self, member: Member) -> bool:
        """Wait until the ECS instance is Stopped, then the member is `Stopped`; False: the emulator closes."""
        while True:
            with self._lock:
                inst = self.ecs._instances.get(member.instance_id)
                if inst is None or inst.status == "Stopped":
                    if inst is not None and member.state == "Removing":
                        member.state = "Stopped"
                    return True
                if inst.status not in ("Stopping", "Running"):      # started again meanwhile
                    return True
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return False

    # --- the target-tracking controller ------------------------------------------------------------

    def _start_controller(self) -> None:
        if self._controller is None:
            self._controller = threading.Thread(target=self._control, name="ess", daemon=True)
            self._controller.start()

    def _control(self) -> None:
        while not self.ecs._closing.wait(self.period_s):
            with self._lock:
                rules = [r for r in self._rules.values() if r.type == "TargetTrackingScalingRule"]
            for rule in rules:
                try:
                    self._track(rule)
                except Exception as exc:  # reported; the next period tries again
                    self._failed(rule.id, exc)
            self._evaluate_alarms()

    def _evaluate_alarms(self) -> None:
        """The alarm tasks' period (aliyun_ess_alarms.py overrides this)."""

    def _track(self, rule: Any) -> None:
        with self._lock:
            group = self._groups.get(rule.group_id)
            if group is None or group.state != "Active" or group.refresh:
                return
            serving = [m for m in group.members.values() if m.state == "InService"]
            pending = any(m.state == "Pending" for m in group.members.values())
        metric = self._metric(group, rule.metric, max(1, len(serving)))
        with self._lock:
            if metric is None or pending or self._groups.get(group.id) is not group:
                return                                    # no datapoint, or warming up: no decision
            wanted = min(max(math.ceil(round(len(serving) * metric / rule.target, 6)), group.min), group.max)
            before = group.desired
            if wanted < before and not rule.disable_scale_in:
                group.below += 1
                if group.below < self.scale_in_periods:
                    return
            elif wanted <= before:
                group.below = 0
                return
            group.below, group.desired = 0, wanted
            self.decisions.append((group.name, before, wanted, metric))
            self._converge(group, f"target tracking rule {rule.name}")

    def _metric(self, group: Group, name: str, serving: int) -> float | None:
        if name != QPS_METRIC:
            with self._lock:
                return self.metrics.get((group.id, name))
        with self._lock:
            ids = {sg["ServerGroupId"] for sg in group.server_groups}
            listeners = [(li.id, self.ecs.alb._lbs.get(li.lb_id)) for li in self.ecs.alb._listeners.values()
                         if li.group_id in ids]
        delta = 0
        for listener_id, lb in listeners:
            delta += self._requests(listener_id, lb.plane if lb is not None else None)
        return delta / (self.period_s / self.time_scale) / serving

    def _requests(self, listener_id: str, plane: Any) -> int:
        """Requests the listener's plane sent its targets since the last period (haproxy's backend `stot`, read
        through the plane's stats socket: BalancerPlane has no public counter)."""
        from .balancer_plane import stat_table

        proxy = getattr(plane, "_proxies", {}).get(listener_id)
        if proxy is None:
            return 0
        total = sum(int(r.get("stot") or 0) for r in stat_table(proxy.run(f"show stat {proxy.backend} 2 -1"), ","))
        with self._lock:
            before = self._counts.get(listener_id, 0)
            self._counts[listener_id] = total
        return total - before if total >= before else total
