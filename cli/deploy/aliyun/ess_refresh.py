"""Rolling a scaling group's hosts to a new scaling configuration: ESS 2022-02-22's instance refresh
(StartInstanceRefresh / DescribeInstanceRefreshes / CancelInstanceRefresh), mixed into ess.ScalingGroups.

Why the cloud's own refresh (issue 49 item 1): the group replaces its hosts while the user's laptop is closed,
and ESS brings each new host into the ALB server group (InService) before it takes an old one out through the
same path as a scale-in (out of the server group, the ALB's connection drain, the SCALE_IN hook's wait), so
nothing in flight fails. The refresh's settings, from the ess20220222 SDK's StartInstanceRefresh reference:
- DesiredConfiguration.ScalingConfigurationId: a configuration made from the new GroupSpec (ess.py's
  _configuration: found when one already says so). "After the instance refresh task is completed, the active
  scaling configuration of the scaling group is updated to this configuration", so the group is not switched
  first (a scale-out meanwhile launches the old version, which the refresh then replaces too).
- MinHealthyPercentage 100 (no host leaves before its replacement serves) and MaxHealthyPercentage SURGE
  (100..200, the capacity the group may reach above its size: half again, so a group of 3 replaces one host
  at a time, of 4 two).
- SkipMatching true (ESS's default: hosts already on that configuration stay), so a start after a cancel
  only replaces what is left. A task to the same configuration that is still pending or running is the one
  returned (a second `ngcx deploy`, or a retry after a lost answer); the ClientToken is a digest of the group,
  the configuration and the group's earlier tasks, so a later refresh back to an older configuration (a
  rollback) is a new task, not the replay of the old one.
ESS's task states map onto vm_groups.RefreshState's words (STATES); percent is FinishedUpdateCapacity of
TotalNeedUpdateCapacity, reason is the task's Detail (the failure reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...clouds.aliyun import AliyunError
from ...core.errors import UserError

if TYPE_CHECKING:
    from ...clouds.aliyun import Api
    from ..vm_groups import RefreshState

SURGE = 150                       # MaxHealthyPercentage: ESS 100..200, default 120
STATES = {"Pending": "pending", "InProgress": "running", "Paused": "running", "CheckpointPause": "running",
          "Cancelling": "running", "RollbackInProgress": "running", "Successful": "done", "Failed": "failed",
          "RollbackSuccessful": "failed", "RollbackFailed": "failed", "Cancelled": "cancelled"}
FINISHED = ("done", "failed", "cancelled")


class Refreshes:
    """start_refresh / refresh_state / cancel_refresh over ess.ScalingGroups' calls."""

    api: Api

    _configuration: Callable[[Any, str], str]           # ess.ScalingGroups': the configuration of a spec
    _set: Callable[..., dict[str, Any]]                  # ess.ScalingGroups': a call safe to repeat
    _capacity_of: Callable[[Any], dict[str, Any]]        # ess.ScalingGroups': the group's spot settings
    _token: Callable[..., str]                           # ess.ScalingGroups': a digest of the parts

    def start_refresh(self, ref: Any, spec: Any) -> str:
        """Every host of the group replaced by one of `spec`'s configuration, in batches, new before old;
        the task's id. The group's spot settings follow `spec` at once (they decide what the refresh launches)."""
        config_id = self._configuration(spec, ref.group_id)
        self._set("ModifyScalingGroup", ScalingGroupId=ref.group_id, **self._capacity_of(spec))
        tasks = self._tasks(ref)
        for task in tasks:
            if STATES.get(str(task.get("Status"))) in ("pending", "running") and \
                    (task.get("DesiredConfiguration") or {}).get("ScalingConfigurationId") == config_id:
                return str(task["InstanceRefreshTaskId"])
        earlier = sorted(str(t.get("InstanceRefreshTaskId")) for t in tasks)
        params = {"ScalingGroupId": ref.group_id, "DesiredConfiguration.ScalingConfigurationId": config_id,
                  "MinHealthyPercentage": 100, "MaxHealthyPercentage": SURGE, "SkipMatching": True}
        token = f"ngcx-refresh-{self._token(ref.group_id, config_id, earlier)}"
        answer = self.api.ess("StartInstanceRefresh", params, token=token, write=True)
        return str(answer["InstanceRefreshTaskId"])

    def refresh_state(self, ref: Any, refresh_id: str) -> RefreshState:
        from ..vm_groups import RefreshState

        task = self._task(ref, refresh_id)
        if task is None:
            return RefreshState("failed", 0, f"no instance refresh {refresh_id} in group {ref.name}")
        total, finished = int(task.get("TotalNeedUpdateCapacity") or 0), int(task.get("FinishedUpdateCapacity") or 0)
        status = STATES.get(str(task.get("Status")), "running")
        percent = 100 if status == "done" else min(100, 100 * finished // total) if total else 0
        return RefreshState(status, percent, str(task.get("Detail") or ""))

    def cancel_refresh(self, ref: Any, refresh_id: str) -> None:
        """Stop replacing (hosts already replaced stay, the active configuration stays the old one); a task that
        has finished or is gone is done, not an error."""
        task = self._task(ref, refresh_id)
        if task is None or STATES.get(str(task.get("Status"))) in FINISHED or task.get("Status") == "Cancelling":
            return
        try:
            self._set("CancelInstanceRefresh", ScalingGroupId=ref.group_id, InstanceRefreshTaskId=refresh_id)
        except AliyunError as exc:              # it finished between the look and the cancel
            task = self._task(ref, refresh_id)
            if task is not None and STATES.get(str(task.get("Status"))) not in FINISHED:
                raise UserError(f"group {ref.name}: instance refresh {refresh_id} could not be cancelled "
                                f"({exc.code})", hint="run it again") from exc

    def _task(self, ref: Any, refresh_id: str) -> dict[str, Any] | None:
        found = [t for t in self._tasks(ref, refresh_id) if t.get("InstanceRefreshTaskId") == refresh_id]
        return found[0] if found else None

    def _tasks(self, ref: Any, refresh_id: str = "") -> list[dict[str, Any]]:
        """The group's refresh tasks (or the one named), every page."""
        params: dict[str, Any] = {"ScalingGroupId": ref.group_id, "MaxResults": 50}
        if refresh_id:
            params["InstanceRefreshTaskIds.1"] = refresh_id
        found: list[dict[str, Any]] = []
        token = ""
        for _ in range(100):                      # 5000 tasks: more than ESS keeps
            answer = self.api.ess("DescribeInstanceRefreshes", {**params, **({"NextToken": token} if token else {})})
            tasks = answer.get("InstanceRefreshTasks") or []
            if isinstance(tasks, dict):           # wrapped, as other ESS listings answer
                tasks = next(iter(tasks.values()), [])
            found += tasks
            token = str(answer.get("NextToken") or "")
            if not token:
                break
        return found
