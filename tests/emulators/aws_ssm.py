"""SSM for Ec2Emulator: Run Command on the machines, and the public parameters in AWS's JSON.

Why apart: Run Command is its own API (JSON protocol, its own invocation records and states) and the
deploy's only way onto a host; it needs nothing of EC2 but the instances and their machines
(aws_ec2_machines.py). moto records SendCommand and reports Success at once, running nothing; here:

- SendCommand of AWS-RunShellScript runs `commands` (joined by newlines) on the machine through
  hosts.run_command, bounded by the executionTimeout parameter; GetCommandInvocation answers from that
  run in AWS's shape (Pending / InProgress / Success / Failed / TimedOut, ResponseCode -1 until done,
  StandardOutputContent = the first 24,000 characters). As on AWS, the first GetCommandInvocation of a
  command answers InvocationDoesNotExist (the agent has not picked it up yet), and SendCommand to an
  instance that is not running, has no machine yet, or has no IamInstanceProfile associated now (its agent
  could not register) answers 400 InvalidInstanceId.
- Parameters: moto serves the ECS-optimized AMI parameters as Python dict reprs; they become JSON, as AWS
  serves them.
"""

from __future__ import annotations

import ast
import json
import time
from dataclasses import dataclass
from typing import Any

from .aws_ec2_machines import Ec2Machines, Instance
from .aws_imds import association_of
from .aws_wire import AwsError, WireRequest, WireResponse, child_text, items, new_request_id, parse_xml, path


@dataclass
class Invocation:
    """One SSM Run Command invocation (a command on one instance), run on the machine."""

    command_id: str
    instance_id: str
    comment: str
    script: str = ""
    status: str = "Pending"
    code: int = -1
    output: str = ""
    error: str = ""
    started: float = 0.0
    ended: float = 0.0
    polled: bool = False


SSM_OUTPUT_LIMIT = 24_000   # GetCommandInvocation: the first 24,000 characters of stdout (and of stderr)


def _iso(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z" if stamp else ""


class SsmRunCommand(Ec2Machines):
    """SendCommand / GetCommandInvocation run on the machines; GetParameter(s) answer JSON values."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._invocations: dict[tuple[str, str], Invocation] = {}

    def refuse(self, action: str, code: str | None, http_status: int = 400) -> None:
        """Every call of `action` (SendCommand, GetCommandInvocation) answers this error from now on: a permanent
        refusal such as AccessDeniedException; code None lifts it (issue 47 item 6)."""
        with self._lock:
            self._faults[action] = []     # Ec2Emulator's fault queue (aws_ec2.py), which this class is a part of
        if code is not None:
            self.fail_next(action, code, http_status, times=1 << 62)  # type: ignore[attr-defined]

    def commands_sent(self, instance_id: str) -> list[str]:
        """The scripts of the Run Commands this instance has been sent, in order (each a round trip of a deploy)."""
        with self._lock:
            return [i.script for i in self._invocations.values() if i.instance_id == instance_id]

    def _ssm_parameters(self, request: WireRequest) -> WireResponse:
        """AWS's public parameters hold JSON; moto stores the ECS AMI ones as Python dict reprs."""
        answer = self._forward(request)
        if not answer.ok:
            return answer
        document = json.loads(answer.body)
        found = [document["Parameter"]] if isinstance(document.get("Parameter"), dict) else []
        found += [p for p in document.get("Parameters") or [] if isinstance(p, dict)]
        changed = False
        for parameter in found:
            value = parameter.get("Value")
            if not str(parameter.get("Name", "")).startswith("/aws/service/") or not isinstance(value, str):
                continue
            try:
                json.loads(value)
                continue
            except ValueError:
                pass
            try:
                literal = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                continue
            if isinstance(literal, dict):
                parameter["Value"], changed = json.dumps(literal), True
        return answer.with_body(json.dumps(document).encode()) if changed else answer

    def _ssm_send_command(self, request: WireRequest) -> WireResponse:
        """moto records the command (and its id); the harness runs it on each instance's machine."""
        document = request.document if isinstance(request.document, dict) else {}
        if document.get("DocumentName") != "AWS-RunShellScript":
            return self._forward(request)
        ids = [str(i) for i in document.get("InstanceIds") or []]
        instances = [self._online(request.region, instance_id) for instance_id in ids]
        parameters = document.get("Parameters") or {}
        script = "\n".join(str(line) for line in parameters.get("commands") or [])
        try:
            timeout = int((parameters.get("executionTimeout") or ["3600"])[0])
        except (TypeError, ValueError):
            raise AwsError(400, "InvalidParameters", "executionTimeout must be a number of seconds") from None
        answer = self._forward(request)
        if not answer.ok:
            return answer
        body = json.loads(answer.body)
        command = body.get("Command") or {}
        command.update(Status="Pending", StatusDetails="Pending", TargetCount=len(instances), CompletedCount=0)
        for inst in instances:
            invocation = Invocation(str(command.get("CommandId")), inst.id, str(document.get("Comment") or ""),
                                    script=script)
            with self._lock:
                self._invocations[(invocation.command_id, inst.id)] = invocation
            self._spawn(self._execute, invocation, script, timeout)
        return answer.with_body(json.dumps(body).encode())

    def _online(self, region: str, instance_id: str) -> Instance:
        """An instance whose SSM agent would be registered: running, its machine up, an instance profile."""
        with self._lock:
            inst = self._instances.get(instance_id)
            ready = inst is not None and inst.region == region and inst.on_host and inst.masked is None
        if ready and inst is not None and association_of(self._need_upstream(), region, instance_id) is not None:
            root = parse_xml(self._need_upstream().ec2(region, "DescribeInstances", {"InstanceId.1": instance_id}).body)
            states = [child_text(path(i, "instanceState"), "name")
                      for r in items(root, "reservationSet") for i in items(r, "instancesSet")]
            if states == ["running"]:
                return inst
        raise AwsError(400, "InvalidInstanceId", f"Instances [[{instance_id}]] not in a valid state for account "
                                                 "123456789012")

    def _execute(self, invocation: Invocation, script: str, timeout: int) -> None:
        with self._lock:
            invocation.status, invocation.started = "InProgress", time.time()
        try:
            result = self.hosts.run_command(invocation.instance_id, script, timeout)
        except Exception as exc:  # the agent reports a failed invocation
            self._host_failed(invocation.instance_id, "run_command", exc)
            with self._lock:
                invocation.status, invocation.error, invocation.ended = "Failed", str(exc)[:500], time.time()
            return
        with self._lock:
            invocation.code, invocation.output, invocation.ended = result.exit_code, result.output, time.time()
            invocation.status = ("Success" if result.exit_code == 0 else
                                 "TimedOut" if result.exit_code == 124 else "Failed")

    def _ssm_command_invocation(self, request: WireRequest) -> WireResponse:
        document = request.document if isinstance(request.document, dict) else {}
        key = (str(document.get("CommandId") or ""), str(document.get("InstanceId") or ""))
        with self._lock:
            invocation = self._invocations.get(key)
            first = invocation is not None and not invocation.polled
            if invocation is not None:
                invocation.polled = True
            view = dict(vars(invocation)) if invocation is not None else {}
        if invocation is None or first:
            raise AwsError(400, "InvocationDoesNotExist", "")
        done = view["status"] not in ("Pending", "InProgress")
        details = "ExecutionTimedOut" if view["status"] == "TimedOut" else view["status"]
        elapsed = (view["ended"] or time.time()) - view["started"] if view["started"] else 0.0
        body = {"CommandId": key[0], "InstanceId": key[1], "Comment": view["comment"],
                "DocumentName": "AWS-RunShellScript", "DocumentVersion": "$DEFAULT", "PluginName": "aws:runShellScript",
                "ResponseCode": view["code"] if done and view["code"] >= 0 else -1,
                "ExecutionStartDateTime": _iso(view["started"]), "ExecutionElapsedTime": f"PT{elapsed:.3f}S",
                "ExecutionEndDateTime": _iso(view["ended"]), "Status": view["status"], "StatusDetails": details,
                "StandardOutputContent": view["output"][:SSM_OUTPUT_LIMIT], "StandardOutputUrl": "",
                "StandardErrorContent": view["error"][:SSM_OUTPUT_LIMIT], "StandardErrorUrl": "",
                "CloudWatchOutputConfig": {"CloudWatchLogGroupName": "", "CloudWatchOutputEnabled": False}}
        headers = (("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-RequestId", new_request_id()))
        return WireResponse(200, headers, json.dumps(body).encode())

