"""The contract between the ECS emulator (aliyun_ecs.py) and the machines behind its instances.

Why a contract: the emulator keeps the API state (signature, ClientToken, state machine, tags,
faults) and delegates "be a VM" to a HostBackend. docker_hosts.DockerHosts is the real one: each
instance is a container running its own dockerd on its own disk (a docker volume) in its own
network namespace, and it runs the user-data exactly as ECS passes it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    """What Cloud Assistant (RunCommand + DescribeInvocationResults) reports for one command."""

    exit_code: int
    output: str


class HostBackend(Protocol):
    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        """Provision the machine's disk from `image_id` and power it on; return its private IP.

        Returns once the machine is booting (its dockerd may still be starting). The user-data
        (raw bytes, already base64-decoded) runs once, on the first boot only, as cloud-init does.
        """

    def start(self, instance_id: str) -> str:
        """Power a stopped machine on again (disk kept); return its private IP (it may change)."""

    def stop(self, instance_id: str) -> None:
        """Power the machine off; its disk (pulled layers included) is kept."""

    def delete(self, instance_id: str) -> None:
        """Destroy the machine and its disk."""

    def snapshot(self, instance_id: str, image_id: str) -> None:
        """CreateImage: copy the machine's disk into a new image `image_id` for later create()."""

    def delete_image(self, image_id: str) -> None:
        """DeleteImage: drop a snapshot made by snapshot()."""

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        """Cloud Assistant: run a shell script as root on the running machine."""

    def console_output(self, instance_id: str) -> str:
        """GetInstanceConsoleOutput: the boot log (user-data output included), last 64 KB."""

    def close(self) -> None:
        """Remove every machine and image this backend made (test teardown)."""


class PaperHosts:
    """A HostBackend on paper: the emulator keeps its API state, and no machine exists behind an instance (each
    gets the next address of 10.98.0.0/24; commands succeed with no output). Tests of the API and of ngcx's
    decisions subclass it and override what they exercise; docker_hosts.DockerHosts is the real one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def _next_ip(self) -> str:
        with self._lock:
            self._last += 1
            return f"10.98.0.{self._last}"

    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        return self._next_ip()

    def start(self, instance_id: str) -> str:
        return self._next_ip()

    def stop(self, instance_id: str) -> None: ...
    def delete(self, instance_id: str) -> None: ...
    def snapshot(self, instance_id: str, image_id: str) -> None: ...
    def delete_image(self, image_id: str) -> None: ...

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        return CommandResult(0, "")

    def console_output(self, instance_id: str) -> str:
        return ""

    def close(self) -> None: ...
