"""The scaling-group verbs service_group.py asks of a VM cloud, written once over each cloud's client.

Why apart from aws/asg.py and aliyun/ess.py: those speak one cloud's scaling API each (EC2 Auto Scaling,
ESS); what a service needs of either is the same sequence — the image and pull role from the cloud's
prepare, the zones' subnets / vSwitches, the host script as user-data (the service key's hash in it, never
the key; a registry login by the instance role, since a host launches long after any token from now has
expired), the group behind the balancer's target / server group, its target-tracking rule on requests per
host — and lives here once. A cloud hands over a GroupKit: its client and the few things that differ
(how its spec, ref and metric are spelled, and its instances' lifecycle states). Refs travel as plain dicts
(the service's row keeps them).

The contract each cloud's client (aws/asg.py AutoScalingGroups, aliyun/ess.py) implements for issue 49, beyond
ensure_group / sizes / set_size / put_target_tracking / instances / complete_lifecycle / delete / tagged:
- `start_refresh(ref, spec) -> str`: move the group to the launch template version / scaling configuration
  made from `spec` and replace every host in batches, new hosts up (healthy behind the balancer) before old
  ones drain; returns the refresh's id. AWS: StartInstanceRefresh, MinHealthyPercentage=100 and
  MaxHealthyPercentage=200 (above 100: launch before terminate), DesiredConfiguration's template version, the
  group's ELB health check. ESS: its instance refresh (or a new configuration replaced in batches).
- `refresh_state(ref, refresh_id) -> RefreshState` (below: status pending / running / done / failed /
  cancelled, percent, reason).
- `cancel_refresh(ref, refresh_id) -> None`.
- the cloud's GroupSpec gains `spot: bool = False`, `on_demand_base: int = 0`, `instance_types: tuple[str, ...]
  = ()` (several types; AWS: MixedInstancesPolicy, OnDemandBaseCapacity, OnDemandPercentageAboveBaseCapacity=0,
  SpotAllocationStrategy capacity-optimized, one Override per type, CapacityRebalance on; ESS: spot with
  on-demand compensation); its Member and the Member here gain `market: str = "on-demand"` ("spot" or
  "on-demand").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from .balancer import BalancerRef
    from .common import DeployConfig

LEAVING, PENDING, IN_SERVICE = "leaving", "pending", "in-service"
REFRESH_STATUSES = ("pending", "running", "done", "failed", "cancelled")
TYPES = 3                       # instance types a spot group may launch (the offers table's first candidates)


@dataclass(frozen=True)
class RefreshState:
    """Where a group's instance refresh stands, in words both clouds map to (AWS InstanceRefresh.Status,
    ESS's refresh task status)."""

    status: str                 # one of REFRESH_STATUSES
    percent: int                # 0..100: hosts replaced so far
    reason: str = ""            # the cloud's own words (why it failed / was cancelled), empty when none


@dataclass(frozen=True)
class Member:
    instance_id: str
    zone: str
    state: str                  # pending / in-service / leaving / stopped / warming (service_group's words)
    health: str                 # the group's own health verdict
    market: str = "on-demand"   # "spot" or "on-demand": what the host was bought as


@dataclass(frozen=True)
class GroupKit:
    """One cloud's scaling client and how its names are spelled (aws/asg.py kit, aliyun/ess.py kit)."""

    client: Any                                     # ensure_group, sizes, set_size, put_target_tracking, ...
    ref: type                                       # its GroupRef
    spec: Callable[..., Any]                        # GroupSpec from the keyword arguments ensure() passes
    metric: Callable[[BalancerRef, float], tuple[float, Any]]   # (target value in its unit, its Metric)
    states: dict[str, str]                          # the cloud's lifecycle states -> LEAVING / PENDING / ...


class ServiceGroups:
    """check / ensure / members / size / resize / idle / release / delete / tagged for one service's region."""

    def __init__(self, config: DeployConfig | None, cloud: Any, prepare: Callable[[DeployConfig], Any],
                 wrap_user_data: Callable[[str], str], kit: GroupKit) -> None:
        """`cloud`: the region's vm.Cloud; `prepare`: the cloud module's (image, pull role, login);
        `wrap_user_data`: what the cloud adds to every host's user-data (aws: the SSM agent check)."""
        self.config, self.cloud, self.prepare, self.wrap, self.kit = config, cloud, prepare, wrap_user_data, kit
        self.types: tuple[str, ...] = ()

    def check(self) -> None:
        """Before any row: a token login cannot be in what a group launches later."""
        if self.config is not None and self.config.registry_login == "token":
            raise UserError("--min/--max: a scaling group launches hosts later, when a registry token from now has "
                            "expired", hint="use --registry-login role (the default): hosts pull with their role")

    def ensure(self, name: str, balancer: BalancerRef, sizes: tuple[int, int, int], target_requests: float,
               tags: dict[str, str], drain_s: int, label: int, market: tuple[bool, int] = (False, 0)
               ) -> dict[str, str]:
        """The group as the config says (made, or moved to a new template / configuration when it changed),
        and its target-tracking rule on `target_requests` requests per host per minute. `market`: (spot, the
        on-demand floor)."""
        spec = self._spec(name, balancer, sizes, tags, drain_s, label, market)
        ref = self.kit.client.ensure_group(spec)
        value, metric = self.kit.metric(balancer, target_requests)
        self.kit.client.put_target_tracking(ref, value, metric)
        return asdict(ref)

    def roll(self, ref: dict[str, str], name: str, balancer: BalancerRef, sizes: tuple[int, int, int],
             tags: dict[str, str], drain_s: int, label: int, market: tuple[bool, int] = (False, 0)) -> str:
        """A rolling update to what the config says now: the cloud's instance refresh (start_refresh); its id."""
        return str(self.kit.client.start_refresh(self.kit.ref(**ref),
                                                 self._spec(name, balancer, sizes, tags, drain_s, label, market)))

    def refresh_state(self, ref: dict[str, str], refresh_id: str) -> RefreshState:
        return self.kit.client.refresh_state(self.kit.ref(**ref), refresh_id)

    def cancel_refresh(self, ref: dict[str, str], refresh_id: str) -> None:
        self.kit.client.cancel_refresh(self.kit.ref(**ref), refresh_id)

    def logs(self, instance_id: str, tail: int) -> str:
        """The host's container log through the cloud's command channel (SSM / Cloud Assistant), as a
        deployment's `logs` reads it (vm.logs_with)."""
        _code, out = self.cloud.run_command(instance_id, f"docker logs --tail {int(tail)} ngcx-serve 2>&1 || "
                                                         f"tail -n {int(tail)} /var/log/cloud-init-output.log", 60)
        return str(out)

    def _spec(self, name: str, balancer: BalancerRef, sizes: tuple[int, int, int], tags: dict[str, str],
              drain_s: int, label: int, market: tuple[bool, int]) -> Any:
        """The cloud's GroupSpec from the config: host image and script, zones, sizes, and the instance types
        the offers table ranked for this GPU (up to TYPES of them: more spot pools, fewer interruptions)."""
        from . import gate, hostscript, vm

        config = self.config
        if config is None:
            raise UserError("a scaling group needs its service's config")
        plan = self.prepare(config)
        for note in plan.notes:
            vm.say(note)
        self.cloud.prepare_network(config.allow_from)
        role = self.cloud.ensure_pull_role(plan.grant) if plan.grant is not None else None
        zones = vm.service_zones_with(self.cloud, self.cloud.name, config)
        networks = _networks(self.cloud)
        job = hostscript.HostJob(label, plan.pull_ref, plan.registry, config.labels.get("ai.ngcx.min-driver", "0"),
                                 config.gpu_mode, plan.login(), tuple(config.cmd), tuple(sorted(config.env.items())),
                                 auth_hashes=config.key_hashes, tls=config.tls, verify_key=gate.host_key(config))
        low, high, desired = sizes
        spot, base = market
        types = tuple(dict.fromkeys(c.itype.name for c in plan.candidates))[:TYPES]
        self.types = types if spot else types[:1]           # kept in the service's row: `show`'s cost
        return self.kit.spec(name=name, image_id=plan.host_image,
                             user_data=self.wrap(hostscript.render(job, "user-data")),
                             instance_type=types[0], networks=tuple(networks[z] for z in zones),
                             balancer=balancer, min_size=low, max_size=high, desired=desired, tags=tags, role=role,
                             security_group=self.cloud.security_group, drain_wait_s=max(30, drain_s),
                             spot=spot, on_demand_base=base, instance_types=types if spot else ())

    def members(self, ref: dict[str, str]) -> list[Member]:
        return [Member(m.instance_id, m.zone, self.kit.states.get(m.state, m.state.lower()), m.health,
                       getattr(m, "market", "on-demand")) for m in self.kit.client.instances(self.kit.ref(**ref))]

    def size(self, ref: dict[str, str]) -> tuple[int, int, int] | None:
        """(min, max, desired) as the group has them now (its rule moves desired); None: no such group."""
        return self.kit.client.sizes(self.kit.ref(**ref))

    def resize(self, ref: dict[str, str], low: int, high: int, desired: int) -> None:
        self.kit.client.set_size(self.kit.ref(**ref), low, high, desired)

    def idle(self, ref: dict[str, str], balancer: BalancerRef, on: bool) -> None:
        """Scale to zero (on): hosts that scale in stop and stay (AWS warm pool / ESS recycle mode: the disk
        with the image's layers kept, the GPU no longer billed), and an alarm on the balancer's own 503s
        adds a host back when a request finds none. Off: both gone, hosts that scale in terminate again."""
        group = self.kit.ref(**ref)
        if on:
            self.kit.client.set_idle_stop(group, True)
            self.kit.client.put_wake(group, balancer, True)
        else:
            self.kit.client.put_wake(group, balancer, False)
            self.kit.client.set_idle_stop(group, False)

    def wake(self, ref: dict[str, str], balancer: BalancerRef, on: bool) -> None:
        """Only the wake alarm on or off, the warm pool left as it is (a stopped --min 0 service: its hosts park
        in the pool, but a request must not start one: group_update.stop)."""
        self.kit.client.put_wake(self.kit.ref(**ref), balancer, on)

    def release(self, ref: dict[str, str], instance_id: str) -> None:
        self.kit.client.complete_lifecycle(self.kit.ref(**ref), instance_id)

    def delete(self, ref: dict[str, str]) -> None:
        self.kit.client.delete(self.kit.ref(**ref))

    def tagged(self, tags: dict[str, str]) -> list[dict[str, str]]:
        return [asdict(ref) for ref in self.kit.client.tagged(tags)]


def _networks(cloud: Any) -> dict[str, str]:
    """Zone -> the subnet (AWS) / vSwitch (Alibaba Cloud) id its hosts launch into."""
    subnets = getattr(cloud, "subnets", None)
    if subnets is not None:
        return {zone: subnet.id for zone, subnet in subnets.items()}
    return dict(getattr(cloud, "vswitches", None) or {})
