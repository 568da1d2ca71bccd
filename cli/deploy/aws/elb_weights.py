"""Weighted members behind an AWS ALB (balancer.py's `set_weights`, for canary releases: deploy/canary.py).

Why a second target group: an ALB weighs target groups, not targets. A listener's forward action
(ForwardConfig.TargetGroups, weights 0..999) splits requests between groups, and a group spreads its share over
its healthy targets. So members that should take another share than the others live in a second group, the
service group's name + "-w" (elb.side_name), made on demand with the same settings and tags behind the same
listener. Each group's members share one weight, and the listener gives each group the sum of its members'
weights. Which members go to the second group: those already there, else the lighter ones (a canary starts
small, and weight 0 is a member on its way out). A member moves by registering in the other group and then
leaving the first; the leaving is AWS's deregistration, so its in-flight requests finish.

A call whose weights are all one value (a canary's end) brings every member back into the service's group,
waits until they are healthy there (HEALTHY_WAIT_S), forwards to that group alone, and deletes the second one.
So the service is an ordinary one again, and a later register (scale, reconcile) lands where traffic goes. An
empty call does nothing: canary.py uses it to ask whether a balancer can weigh members at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..balancer import WEIGHT, BalancerRef

MAX_GROUP_WEIGHT = 999            # ForwardConfig.TargetGroups[].Weight
HEALTHY_WAIT_S = 600.0            # a member moved back into the service's group until its checks pass there

Member = tuple[str, int]


def side_name(group_name: str) -> str:
    """The weighted group's name beside the service group's (elbv2 names: at most 32 characters, no hyphen at the
    ends; the group's own name already fits, elb.fit_name)."""
    return f"{group_name[:30].rstrip('-')}-w"


class Weights:
    """One Elb's weighted groups. It gets elb.py's state names and bounded poll from the Elb that makes it
    (this module does not import elb.py, which imports it)."""

    def __init__(self, elb: Any, states: dict[str, str], poll: Callable[..., None]) -> None:
        self.elb, self.states, self.poll = elb, states, poll
        self._sides: dict[str, str] = {}

    # --- reading ---------------------------------------------------------------------------------
    def side(self, ref: BalancerRef) -> str | None:
        """The weighted group's ARN, None when there is none (looked up by name; a found one is remembered)."""
        from ...clouds.aws import AwsError

        if ref.group_id in self._sides:
            return self._sides[ref.group_id]
        try:
            [group] = self.elb._call("describe_target_groups", TargetGroupArns=[ref.group_id])["TargetGroups"]
            found = self.elb._call("describe_target_groups", Names=[self._side_name(group)])["TargetGroups"]
        except AwsError as exc:
            if exc.code != "TargetGroupNotFound":
                raise
            return None
        self._sides[ref.group_id] = found[0]["TargetGroupArn"]
        return self._sides[ref.group_id]

    def targets(self, arn: str) -> dict[Member, str]:
        """(instance, port) -> balancer.HEALTH_STATES of a group's targets; {} for a group that is gone."""
        from ...clouds.aws import AwsError

        try:
            rows = self.elb._call("describe_target_health", TargetGroupArn=arn)["TargetHealthDescriptions"]
        except AwsError as exc:
            if exc.code == "TargetGroupNotFound":
                return {}
            raise
        return {(r["Target"]["Id"], int(r["Target"].get("Port") or 0)): self.states.get(r["TargetHealth"]["State"],
                                                                                   "unhealthy") for r in rows}

    # --- the verb ----------------------------------------------------------------------------------
    def set(self, ref: BalancerRef, weights: Sequence[tuple[str, int, int]]) -> None:
        if not weights:
            return
        named = {(i, int(p)): max(0, min(WEIGHT, int(w))) for i, p, w in weights}
        values = set(named.values())
        if len(values) > 2:
            from ...core.errors import UserError

            raise UserError(f"an AWS ALB weighs target groups: at most two weights at once, not {sorted(values)}")
        side = self.side(ref)
        if len(values) == 1:
            return self._collapse(ref, side)
        in_side = {m for m, state in self.targets(side).items() if state != "draining"} if side else set()
        heavy, light = max(values), min(values)
        moving = {m for m, w in named.items() if w == light}
        if in_side & {m for m, w in named.items() if w == heavy}:
            moving = {m for m, w in named.items() if w == heavy}
        side = side or self._make_side(ref)
        self._place(ref, side, moving, named)

    def _place(self, ref: BalancerRef, side: str, moving: set[Member], named: dict[Member, int]) -> None:
        main_members = {m for m, state in self.targets(ref.group_id).items() if state != "draining"} - moving
        in_side = {m for m, state in self.targets(side).items() if state != "draining"}
        for member in moving - in_side:
            self._register(side, member)
        side_weight = next(named[m] for m in moving)
        main_weight = next((named[m] for m in named if m not in moving), WEIGHT)
        side_count = len(in_side | moving)
        main_count = len({m for m in main_members if m not in in_side} | {m for m in named if m not in moving})
        self._forward(ref, [(ref.group_id, main_weight * main_count), (side, side_weight * side_count)])
        for member in moving & set(self.targets(ref.group_id)):
            self._deregister(ref.group_id, member)

    def _collapse(self, ref: BalancerRef, side: str | None) -> None:
        """Every member back in the service's group, healthy there; then the listener forwards to it alone."""
        if side:
            members = {m for m, state in self.targets(side).items() if state != "draining"}
            for member in members:
                self._register(ref.group_id, member)
            self.poll(lambda: all(self.targets(ref.group_id).get(m) == "healthy" for m in members), HEALTHY_WAIT_S,
                  "members moved back into the service's target group are not healthy there")
        self._forward(ref, [(ref.group_id, 1)])
        if side:
            for member in self.targets(side):
                self._deregister(side, member)
            self.elb._gone_ok("delete_target_group", TargetGroupArn=side, busy_ok=True)
            self._sides.pop(ref.group_id, None)

    # --- calls -----------------------------------------------------------------------------------
    def _forward(self, ref: BalancerRef, groups: list[tuple[str, int]]) -> None:
        """The listener's default action: forward to `groups` in proportion to their weights (0..999)."""
        top = max((w for _, w in groups), default=0)
        if len(groups) == 1 or top == 0:
            action: dict[str, Any] = {"Type": "forward", "TargetGroupArn": groups[0][0]}
        else:
            action = {"Type": "forward", "ForwardConfig": {"TargetGroups": [
                {"TargetGroupArn": arn, "Weight": round(MAX_GROUP_WEIGHT * w / top)} for arn, w in groups]}}
        self.elb._call("modify_listener", ListenerArn=ref.listener_id, DefaultActions=[action])

    def _register(self, group: str, member: Member) -> None:
        self.elb._call("register_targets", TargetGroupArn=group, Targets=[{"Id": member[0], "Port": member[1]}])

    def _deregister(self, group: str, member: Member) -> None:
        from ...clouds.aws import AwsError

        try:
            self.elb._call("deregister_targets", TargetGroupArn=group, Targets=[{"Id": member[0], "Port": member[1]}])
        except AwsError as exc:
            if exc.code not in ("InvalidTarget", "TargetGroupNotFound"):
                raise

    def _side_name(self, group: dict[str, Any]) -> str:
        return side_name(group["TargetGroupName"])

    def _make_side(self, ref: BalancerRef) -> str:
        """The weighted group: the service group's settings, tags and deregistration delay, another name."""
        [group] = self.elb._call("describe_target_groups", TargetGroupArns=[ref.group_id])["TargetGroups"]
        tags = self.elb._call("describe_tags", ResourceArns=[ref.group_id])["TagDescriptions"][0].get("Tags", [])
        keys = ("Protocol", "Port", "VpcId", "TargetType", "HealthCheckProtocol", "HealthCheckPort", "HealthCheckPath",
                "HealthCheckIntervalSeconds", "HealthCheckTimeoutSeconds", "HealthyThresholdCount",
                "UnhealthyThresholdCount", "Matcher")
        answer = self.elb._call("create_target_group", Name=self._side_name(group), HealthCheckEnabled=True,
                                Tags=tags, **{k: group[k] for k in keys if k in group})
        arn = str(answer["TargetGroups"][0]["TargetGroupArn"])
        attributes = self.elb._call("describe_target_group_attributes", TargetGroupArn=ref.group_id)["Attributes"]
        delay = [a for a in attributes if a["Key"] == "deregistration_delay.timeout_seconds"]
        if delay:
            self.elb._call("modify_target_group_attributes", TargetGroupArn=arn, Attributes=delay)
        self._sides[ref.group_id] = arn
        return arn
