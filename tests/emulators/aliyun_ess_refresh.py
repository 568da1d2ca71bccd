"""ESS 2022-02-22's instance refresh in the emulator (mixed into aliyun_ess.Ess): StartInstanceRefresh,
DescribeInstanceRefreshes, CancelInstanceRefresh.

Why: ngcx rolls an autoscaled service to a new version by ESS's own refresh (cli/deploy/aliyun/ess_refresh.py),
so what the user notices — every host replaced, zero failed requests through the ALB — depends on what the
refresh does with the server group. Names, ranges and states are the ess20220222 SDK's (StartInstanceRefresh
request, DescribeInstanceRefreshes response): DesiredConfiguration.ScalingConfigurationId (the group's own;
empty: its active one), MinHealthyPercentage 0..100 (default 80), MaxHealthyPercentage 100..200 (default 120),
SkipMatching (default true: members already on that configuration are not replaced); a task is Pending ->
InProgress -> Successful / Failed / Cancelling -> Cancelled, with TotalNeedUpdateCapacity,
FinishedUpdateCapacity and Detail (the failure reason); at Successful the group's active configuration is the
desired one ("after the instance refresh task is completed, the active scaling configuration of the scaling
group is updated to this configuration").

How a task runs (a worker on the ECS emulator): batches of n = max(1, desired x (Max - 100) / 100 rounded
down) + (desired - desired x Min / 100 rounded up) members, capped at what is left; a batch launches n
instances of the desired configuration (through the group's own launch, so the spot choices apply), waits
until all are InService (in the ALB server groups, health checked), then removes n of the old ones, oldest
first, through the scale-in path (out of the server groups: the ALB drain; the SCALE_IN hook's
Removing:Wait) and waits until they have left the server groups before the next batch.
Guessed (the reference does not say): that batch size and its rounding; that a batch's new instances come
up before its old ones leave even when MinHealthyPercentage would allow otherwise; that the group may go
above MaxSize by the surge; that the group's own scaling (desired capacity changes, target tracking) waits
while a refresh runs and is applied at its end; that the next batch starts once the old ones have left the
server groups (not once they are released); the error codes `IncorrectScalingGroupStatus` (the group is not
Active), `InstanceRefreshTask.Conflict` (one runs already), `InvalidInstanceRefreshTaskId.NotFound`,
`IncorrectInstanceRefreshTaskStatus` (cancelling a finished task); that a cancelled task leaves the batch
in flight to the group's next convergence (the active configuration unchanged, so the extra new instances
are the first removed). Not emulated: Checkpoints / CheckpointPauseTime, Strategy, a DesiredConfiguration of
an image, launch template or containers, Suspend / Resume / RollbackInstanceRefresh.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .aliyun_ess_scaling import LIVE, Group, Member, new_id
from .aliyun_rpc import Action, ApiError, as_bool, as_int, invalid, iso_now, repeated

NOT_EMULATED = ("Checkpoints", "CheckpointPauseTime", "Strategy", "DesiredConfiguration.ImageId",
                "DesiredConfiguration.LaunchTemplateId", "DesiredConfiguration.LaunchTemplateVersion")


@dataclass
class RefreshTask:
    id: str
    group_id: str
    config_id: str
    min_healthy: int
    max_healthy: int
    skip_matching: bool
    total: int = 0
    finished: int = 0
    status: str = "Pending"
    detail: str = ""
    started: str = field(default_factory=iso_now)
    ended: str = ""


class Refreshes:
    """The refresh actions and their worker (Ess provides the group state and the launch / remove paths)."""

    ecs: Any
    _lock: threading.RLock
    _groups: dict[str, Group]
    _configs: dict[str, Any]
    _refreshes: dict[str, RefreshTask]

    _activities: dict[str, Any]
    _group: Callable[[Mapping[str, str]], Group]
    _launch: Callable[[Group, int, str, str], list[Member]]
    _remove: Callable[[Group, list[Member], str], None]
    _drained: Callable[[Group, str], bool]
    _converge: Callable[[Group, str], None]
    _failed: Callable[[str, BaseException], None]

    def refresh_actions(self) -> dict[str, Action]:
        return {"StartInstanceRefresh": self._start_refresh, "DescribeInstanceRefreshes": self._describe_refreshes,
                "CancelInstanceRefresh": self._cancel_refresh}

    def _start_refresh(self, params: dict[str, str]) -> dict[str, Any]:
        group = self._group(params)
        for name in NOT_EMULATED:
            if params.get(name) or any(k.startswith(f"{name}.") for k in params):
                raise invalid(name, "The emulator refreshes to a scaling configuration only.")
        if any(k.startswith("DesiredConfiguration.Containers") for k in params):
            raise invalid("DesiredConfiguration.Containers", "The emulator refreshes ECS groups only.")
        if group.state != "Active":
            raise ApiError(400, "IncorrectScalingGroupStatus", "The scaling group is not Active.")
        if group.refresh:
            raise ApiError(400, "InstanceRefreshTask.Conflict", "An instance refresh is already in progress.")
        config_id = params.get("DesiredConfiguration.ScalingConfigurationId") or group.config_id
        if getattr(self._configs.get(config_id), "group_id", "") != group.id:
            raise ApiError(404, "InvalidScalingConfigurationId.NotFound",
                           f"The specified ScalingConfigurationId {config_id!r} does not exist.")
        task = RefreshTask(new_id("ir-"), group.id, config_id, as_int(params, "MinHealthyPercentage", 80, 0, 100),
                           as_int(params, "MaxHealthyPercentage", 120, 100, 200),
                           as_bool(params, "SkipMatching", True))
        self._refreshes[task.id] = task
        group.refresh = task.id
        self.ecs._spawn(self._run_refresh, group, task)
        return {"InstanceRefreshTaskId": task.id}

    def _task(self, params: Mapping[str, str]) -> RefreshTask:
        task = self._refreshes.get(params.get("InstanceRefreshTaskId", ""))
        if task is None or task.group_id != params.get("ScalingGroupId"):
            raise ApiError(404, "InvalidInstanceRefreshTaskId.NotFound", "The instance refresh task does not exist.")
        return task

    def _describe_refreshes(self, params: dict[str, str]) -> dict[str, Any]:
        ids, group_id = repeated(params, "InstanceRefreshTaskIds"), params.get("ScalingGroupId", "")
        found = [t for t in reversed(self._refreshes.values()) if group_id in ("", t.group_id)
                 and (not ids or t.id in ids)]
        size, start = as_int(params, "MaxResults", 10, 1, 50), int(params.get("NextToken") or 0)
        end = start + size
        return {"TotalCount": len(found), "MaxResults": size, "NextToken": str(end) if end < len(found) else "",
                "InstanceRefreshTasks": [self._task_view(t) for t in found[start:end]]}

    def _task_view(self, t: RefreshTask) -> dict[str, Any]:
        return {"InstanceRefreshTaskId": t.id, "ScalingGroupId": t.group_id, "RegionId": self.ecs.region,
                "Status": t.status, "Detail": t.detail, "StartTime": t.started, "EndTime": t.ended,
                "TotalNeedUpdateCapacity": t.total, "FinishedUpdateCapacity": t.finished,
                "MinHealthyPercentage": t.min_healthy, "MaxHealthyPercentage": t.max_healthy,
                "SkipMatching": t.skip_matching, "DesiredConfiguration": {"ScalingConfigurationId": t.config_id}}

    def _cancel_refresh(self, params: dict[str, str]) -> dict[str, Any]:
        task = self._task(params)
        if task.status not in ("Pending", "InProgress"):
            raise ApiError(400, "IncorrectInstanceRefreshTaskStatus", f"The task is {task.status}.")
        task.status = "Cancelling"
        return {}

    # --- the worker -----------------------------------------------------------------------------

    def _end(self, group: Group, task: RefreshTask, status: str, detail: str = "") -> None:
        """Under the lock: the task finished; the group's own scaling resumes."""
        task.status, task.detail, task.ended = status, detail[:300], iso_now()
        if status == "Successful":
            group.config_id = task.config_id
        if group.refresh == task.id:
            group.refresh = ""
        if self._groups.get(group.id) is group:
            self._converge(group, "instance refresh")

    def _batch(self, group: Group, task: RefreshTask, left: int) -> int:
        desired = group.desired
        surge = desired * (task.max_healthy - 100) // 100
        down = desired - math.ceil(desired * task.min_healthy / 100)
        return min(left, max(1, surge + down))

    def _run_refresh(self, group: Group, task: RefreshTask) -> None:
        try:
            self._refresh_steps(group, task)
        except Exception as exc:  # reported, and the task fails as a real one would
            self._failed(task.id, exc)
            with self._lock:
                self._end(group, task, "Failed", f"{type(exc).__name__}: {exc}")

    def _refresh_steps(self, group: Group, task: RefreshTask) -> None:
        with self._lock:
            old = [m for m in group.members.values() if m.state in LIVE and not m.doomed
                   and not (task.skip_matching and m.config_id == task.config_id)]
            task.total, task.status = len(old), "InProgress" if task.status == "Pending" else task.status
        while True:
            with self._lock:
                if self._groups.get(group.id) is not group:
                    return self._end(group, task, "Failed", "The scaling group was deleted.")
                if task.status == "Cancelling":
                    return self._end(group, task, "Cancelled")
                old = sorted((m for m in old if group.members.get(m.instance_id) is m and m.state in LIVE
                              and not m.doomed), key=lambda m: m.created)
                if not old:
                    task.finished = task.total
                    return self._end(group, task, "Successful")
                count = self._batch(group, task, len(old))
                made = self._launch(group, count, f"instance refresh {task.id}", task.config_id)
                if len(made) < count:
                    failed = [a for a in self._activities.values() if a.group_id == group.id]
                    reason = failed[-1].message if failed else "the new instances could not be created"
                    return self._end(group, task, "Failed", reason)
            if not self._serving(group, made):
                with self._lock:
                    return self._end(group, task, "Failed", "a new instance did not come into service")
            with self._lock:
                victims = [m for m in old[:count] if group.members.get(m.instance_id) is m and m.state in LIVE]
                self._remove(group, victims, f"instance refresh {task.id}")
            if not self._left(group, victims):
                return
            with self._lock:
                task.finished = min(task.total, task.finished + count)

    def _serving(self, group: Group, made: list[Member]) -> bool:
        """Every new member InService; False when one is gone (its launch failed) or the emulator closes."""
        while True:
            with self._lock:
                if any(group.members.get(m.instance_id) is not m for m in made):
                    return False
                if all(m.state == "InService" for m in made):
                    return True
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return False

    def _left(self, group: Group, victims: list[Member]) -> bool:
        """Wait until the old members are out of every server group; False: the emulator closes."""
        while True:
            with self._lock:
                if all(self._drained(group, m.instance_id) for m in victims):
                    return True
            if not self.ecs._sleep_until(time.monotonic() + 0.05):
                return False
