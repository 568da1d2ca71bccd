"""Cloud Assistant (ECS RunCommand / DescribeInvocationResults) and the serial console, run on the machines.

Why apart: Cloud Assistant is the deploy's only way onto an ECS host: its own records (an invocation
per instance of a command), its own states (Running / Success / Failed) and its own encodings (Base64 or
PlainText output), calling the backend's run_command; GetInstanceConsoleOutput likewise reads the backend.
It needs nothing of ECS but the instances (aliyun_ecs_machines.py).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from .aliyun_ecs_machines import EcsMachines, new_id
from .aliyun_rpc import ApiError, as_int, decode_base64, invalid, iso_now, page, required

# Actions that call the backend while answering, so they must not hold the state lock meanwhile.
UNLOCKED = frozenset({"GetInstanceConsoleOutput"})


@dataclass
class Invocation:
    invoke_id: str
    command_id: str
    instance_id: str
    script: str = ""
    status: str = "Running"
    exit_code: int | None = None
    output: str = ""
    error: str = ""
    started: str = field(default_factory=iso_now)
    finished: str = ""


class CloudAssistant(EcsMachines):
    """RunCommand (RunShellScript), DescribeInvocationResults, GetInstanceConsoleOutput."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._invocations: dict[str, list[Invocation]] = {}

    def commands_sent(self, instance_id: str) -> list[str]:
        """The scripts of the Cloud Assistant commands this instance has been sent, in order (each one a round
        trip of a deploy)."""
        with self._lock:
            return [i.script for batch in self._invocations.values() for i in batch if i.instance_id == instance_id]


    def _run_command(self, params: dict[str, str]) -> dict[str, Any]:
        if required(params, "Type") != "RunShellScript":
            raise invalid("Type", "Linux instances run RunShellScript.")
        content = required(params, "CommandContent")
        if (params.get("ContentEncoding") or "PlainText").lower() == "base64":
            raw = decode_base64(content)
            if raw is None:
                raise invalid("CommandContent", "ContentEncoding is Base64 but the content is not.")
            content = raw.decode("utf-8", "replace")
        timeout = as_int(params, "Timeout", 60, 10, 86400)
        instances = [self._instance(i) for i in self._instance_ids(params)]
        for inst in instances:
            if inst.status != "Running":
                raise self._incorrect_status(inst, "Running")
        command_id, invoke_id = new_id("c-hz"), new_id("t-hz")
        self._invocations[invoke_id] = []
        for inst in instances:
            invocation = Invocation(invoke_id, command_id, inst.id, script=content)
            self._invocations[invoke_id].append(invocation)
            self._spawn(self._execute, invocation, content, timeout)
        return {"CommandId": command_id, "InvokeId": invoke_id}

    def _execute(self, invocation: Invocation, script: str, timeout: int) -> None:
        try:
            result = self.hosts.run_command(invocation.instance_id, script, timeout)
        except Exception as exc:  # Cloud Assistant reports it as a failed invocation
            self._host_failed(invocation.instance_id, "run_command", exc)
            with self._lock:
                invocation.status, invocation.error, invocation.finished = "Failed", str(exc)[:500], iso_now()
            return
        with self._lock:
            invocation.exit_code, invocation.output, invocation.finished = result.exit_code, result.output, iso_now()
            invocation.status = "Success" if result.exit_code == 0 else "Failed"

    def _describe_invocation_results(self, params: dict[str, str]) -> dict[str, Any]:
        plain = (params.get("ContentEncoding") or "Base64").lower() == "plaintext"
        found = [i for batch in self._invocations.values() for i in batch
                 if all(params.get(k, "") in ("", v) for k, v in
                        (("InvokeId", i.invoke_id), ("InstanceId", i.instance_id), ("CommandId", i.command_id)))]
        items, paging = page(found, params)
        results = [{"CommandId": i.command_id, "InvokeId": i.invoke_id, "InstanceId": i.instance_id,
                    "InvocationStatus": i.status, "InvokeRecordStatus": "Running" if i.status == "Running" else
                    "Finished", "ExitCode": i.exit_code, "ErrorInfo": i.error, "StartTime": i.started,
                    "FinishedTime": i.finished, "Dropped": 0,
                    "Output": i.output if plain else base64.b64encode(i.output.encode()).decode()} for i in items]
        return {"Invocation": {"InvocationResults": {"InvocationResult": results}, **paging}}

    def _console_output(self, params: dict[str, str]) -> dict[str, Any]:
        instance_id = required(params, "InstanceId")
        with self._lock:
            on_host = self._instance(instance_id).on_host
        try:
            text = self.hosts.console_output(instance_id) if on_host else ""
        except Exception as exc:  # the console could not be read this time
            self._host_failed(instance_id, "console_output", exc)
            raise ApiError(500, "InternalError") from None
        return {"InstanceId": instance_id, "LastUpdateTime": iso_now(),
                "ConsoleOutput": base64.b64encode(text.encode()).decode()}
