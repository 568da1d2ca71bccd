"""Spot (preemptible) capacity in the ESS emulator (mixed into aliyun_ess.Ess before Scaling): which market and
instance type a launch uses, on-demand compensation, and a reclaim with its notice and ESS's remedy.

Why: a service with `--spot` is a group whose hosts are mostly spot with an on-demand floor
(cli/deploy/aliyun/ess.py _capacity); what its user notices is that a reclaimed host takes no request with it
and comes back. From the ess20220222 SDK's reference (CreateScalingGroup, CreateScalingConfiguration):
- MultiAZPolicy COST_OPTIMIZED: "creates instances from the instance types with the lowest vCPU unit price
  ... if the scaling configuration includes multiple spot instance types, spot instances are prioritized";
  OnDemandBaseCapacity ("when the number of on-demand instances in the scaling group is less than this value,
  the system preferentially creates on-demand instances") and OnDemandPercentageAboveBaseCapacity (the
  on-demand share above it); CompensateWithOnDemand ("creates on-demand instances to meet capacity
  requirements when spot instances are unavailable due to price or inventory", default true);
  SpotInstanceRemedy ("Auto Scaling attempts to create a new instance to replace a spot instance that is about
  to be reclaimed"). The configuration's SpotStrategy (NoSpot, SpotWithPriceLimit, SpotAsPriceGo) and
  InstanceTypes.N (up to 10, "if an instance cannot be created from an instance type with a higher priority,
  Auto Scaling automatically tries the next").
- ECS: a preemptible instance that is interrupted is released 5 minutes later (ECS's "What are preemptible
  instances"); meanwhile the metadata service answers instance/spot/termination-time with the UTC time of
  the release (aliyun_metadata.py; 404 for an instance not being reclaimed).
`reclaim(instance_id, notice_s)` is that interruption, on a shorter notice a test chooses: the metadata
service answers the time, and with SpotInstanceRemedy the group launches a replacement at once (the doomed
member no longer counts towards the capacity), and once the replacement is InService — or when the notice
is half over, whichever is first — takes the doomed host out through its scale-in path (out of the ALB
server groups with the drain, the SCALE_IN hook's wait); at the end of the notice ECS releases the machine
whatever its state. Without the remedy the machine is released at the end of the notice and the group
replaces the lost member afterwards (what ESS's health check would do).
Guessed (the reference does not say): that the remedy's removal goes through the lifecycle hooks and the
server groups' drain like a scale-in and waits for the replacement to serve; the half-notice deadline; that
the emulator keeps the configuration's type order (no price table: "lowest vCPU unit price" is not modelled);
the base and the percentage apply only under COST_OPTIMIZED / COMPOSABLE (under PRIORITY / BALANCE every
launch uses the configuration's SpotStrategy, without compensation); `spot_market = False` (a test's knob:
the region has no spot stock) makes ECS refuse spot launches with OperationDenied.NoStock. Not emulated:
SpotWithPriceLimit prices (taken as SpotAsPriceGo), SpotInstancePools, SpotAllocationStrategy,
SpotAutoReplaceOnDemand, CapacityOptions.*, ECS's OperationLocks (Recycling) in DescribeInstances.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .aliyun_ess_scaling import LIVE, Group, Member
from .aliyun_rpc import ApiError, as_bool, as_int, invalid

MULTI_AZ = ("PRIORITY", "COST_OPTIMIZED", "BALANCE", "COMPOSABLE")
MIXED = ("COST_OPTIMIZED", "COMPOSABLE")            # the policies that honour the on-demand base and share


class Spot:
    """The market choice (_placements, _run), the group's spot settings (_spot_settings), reclaim."""

    ecs: Any
    _lock: threading.RLock
    _groups: dict[str, Group]
    _launch: Callable[..., list[Member]]
    _remove: Callable[[Group, list[Member], str], None]
    _converge: Callable[[Group, str], None]
    _servers: Callable[[str, Group, str], None]
    spot_market: bool = True                        # False: ECS has no spot stock (a test's knob)

    @staticmethod
    def _spot_settings(group: Group, params: Mapping[str, str]) -> None:
        """MultiAZPolicy and the spot parameters of Create/ModifyScalingGroup, checked, onto the group."""
        policy = params.get("MultiAZPolicy") or group.multi_az
        if policy not in MULTI_AZ:
            raise invalid("MultiAZPolicy", f"Expected one of {', '.join(MULTI_AZ)}.")
        group.multi_az = policy
        group.on_demand_base = as_int(params, "OnDemandBaseCapacity", group.on_demand_base, 0, 1000)
        group.on_demand_above = as_int(params, "OnDemandPercentageAboveBaseCapacity", group.on_demand_above, 0, 100)
        group.spot_remedy = as_bool(params, "SpotInstanceRemedy", group.spot_remedy)
        group.compensate = as_bool(params, "CompensateWithOnDemand", group.compensate)

    @staticmethod
    def _spot_view(group: Group) -> dict[str, Any]:
        return {"MultiAZPolicy": group.multi_az, "OnDemandBaseCapacity": group.on_demand_base,
                "OnDemandPercentageAboveBaseCapacity": group.on_demand_above,
                "SpotInstanceRemedy": group.spot_remedy, "CompensateWithOnDemand": group.compensate}

    def _placements(self, group: Group, config: Any) -> list[tuple[str, str]]:
        """(type, SpotStrategy) in the order a launch tries them: the configuration's types in its order;
        spot first when the on-demand floor and share are met, then on-demand if compensation is on."""
        types = list(config.instance_types or [config.instance_type])
        strategy = config.spot_strategy
        if strategy == "NoSpot":
            return [(t, "NoSpot") for t in types]
        if group.multi_az not in MIXED:
            return [(t, strategy) for t in types]
        live = [m for m in group.members.values() if m.state in LIVE and not m.doomed]
        on_demand = sum(m.spot_strategy == "NoSpot" for m in live)
        above, on_demand_above = len(live) - min(len(live), group.on_demand_base), max(0, on_demand -
                                                                                         group.on_demand_base)
        if on_demand < group.on_demand_base or on_demand_above * 100 < group.on_demand_above * (above + 1):
            return [(t, "NoSpot") for t in types]
        return [(t, strategy) for t in types] + ([(t, "NoSpot") for t in types] if group.compensate else [])

    def _run(self, params: dict[str, str]) -> list[str]:
        if params.get("SpotStrategy", "NoSpot") != "NoSpot" and not self.spot_market:
            raise ApiError(400, "OperationDenied.NoStock", "The spot instance type is out of stock in this zone.")
        return list(self.ecs._run_instances(params)["InstanceIdSets"]["InstanceIdSet"])

    # --- reclaim ---------------------------------------------------------------------------------

    def reclaim(self, instance_id: str, notice_s: float) -> str:
        """ECS interrupts this spot instance: released `notice_s` seconds from now (the metadata service says
        when), ESS's remedy replaces it first. The termination time (ISO 8601 UTC)."""
        with self._lock:
            inst = self.ecs._instances[instance_id]
            if inst.spot_strategy == "NoSpot":
                raise ValueError(f"{instance_id} is not a spot instance")
            at = datetime.now(UTC) + timedelta(seconds=notice_s)
            inst.termination_time = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            found = [(g, g.members[instance_id]) for g in self._groups.values() if instance_id in g.members]
            group, member = found[0] if found else (None, None)
            made: list[Member] = []
            if group is not None and member is not None and group.spot_remedy and member.state in LIVE:
                member.doomed = True
                made = self._launch(group, 1, "spot instance remedy") if group.state == "Active" else []
        deadline = time.monotonic() + notice_s
        self.ecs._spawn(self._reclaimed, instance_id, group, member, made, deadline)
        return inst.termination_time

    def _reclaimed(self, instance_id: str, group: Group | None, member: Member | None, made: list[Member],
                   deadline: float) -> None:
        """The remedy's removal once the replacement serves (or half the notice is gone), then ECS's release."""
        if group is not None and member is not None and member.doomed:
            half = deadline - (deadline - time.monotonic()) / 2
            while time.monotonic() < half and not all(m.state == "InService" for m in made):
                if not self.ecs._sleep_until(min(half, time.monotonic() + 0.05)):
                    return
            with self._lock:
                if group.members.get(instance_id) is member and member.state in LIVE:
                    self._remove(group, [member], "spot instance remedy")
        if not self.ecs._sleep_until(deadline):
            return
        with self._lock:
            if instance_id in self.ecs._instances:
                self.ecs._delete_instances({"InstanceId.1": instance_id, "Force": "true"})
            lost = group is not None and member is not None and group.members.get(instance_id) is member \
                and member.state in LIVE
            if lost:
                assert group is not None
                group.members.pop(instance_id, None)
        if lost:                                      # no remedy: out of the server groups only now
            assert group is not None
            self._servers("remove", group, instance_id)
            with self._lock:
                self._converge(group, "an instance was released")
