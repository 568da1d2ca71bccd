"""The contract between the ECS emulator (aliyun_ecs.py) and the machines behind its instances.

Why a contract: the emulator keeps the API state (signature, ClientToken, state machine, tags,
faults) and delegates "be a VM" to a HostBackend. docker_hosts.DockerHosts is the real one: each
instance is a container running its own dockerd on its own disk (a docker volume) in its own
network namespace, and it runs the user-data exactly as ECS passes it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol


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
    """A HostBackend on paper: the emulator keeps its API state and no machine exists behind an instance.

    One recording backend for every test of the emulators' API and of ngcx's decisions (docker_hosts.DockerHosts
    is the real one): each call is kept in `calls` (see `named`); machines get the addresses a test queues in
    `addresses`, then 10.99.0.N; a command answers what `results` holds for its script, else exit 0 with no output.
    Faults, as a machine that cannot be made: a create of an image in `failing_creates` raises, and so do the next
    `fail_next` creates of any image.
    """

    def __init__(self, create_delay: float = 0.0, snapshot_delay: float = 0.0) -> None:
        self.create_delay, self.snapshot_delay = create_delay, snapshot_delay
        self.calls: list[tuple[Any, ...]] = []
        self.machines: dict[str, dict[str, Any]] = {}
        self.images: set[str] = set()
        self.results: dict[str, CommandResult] = {}
        self.addresses: list[str] = []
        self.failing_creates: set[str] = set()
        self.fail_next = 0
        self.closed = False
        self._lock = threading.Lock()
        self._last_octet = 10

    def _ip(self) -> str:
        with self._lock:
            if self.addresses:
                return self.addresses.pop(0)
            self._last_octet += 1
            return f"10.99.0.{self._last_octet}"

    def _record(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def named(self, method: str) -> list[tuple[Any, ...]]:
        """The calls of one method, oldest first: ("create", instance_id, image_id, user_data), ..."""
        with self._lock:
            return [c for c in self.calls if c[0] == method]

    def made(self) -> list[str]:
        """The instance ids whose machine was made (a create that raised made none), oldest first."""
        with self._lock:
            return list(self.machines)

    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        self._record("create", instance_id, image_id, user_data)
        time.sleep(self.create_delay)
        with self._lock:
            if image_id in self.failing_creates:
                raise RuntimeError(f"no disk for {image_id}")
            if self.fail_next > 0:
                self.fail_next -= 1
                raise RuntimeError("no space left on device")
            self.machines[instance_id] = {"image": image_id, "user_data": user_data, "on": True}
        return self._ip()

    def start(self, instance_id: str) -> str:
        self._record("start", instance_id)
        self.machines[instance_id]["on"] = True
        return self._ip()

    def stop(self, instance_id: str) -> None:
        self._record("stop", instance_id)
        self.machines[instance_id]["on"] = False

    def delete(self, instance_id: str) -> None:
        self._record("delete", instance_id)
        self.machines.pop(instance_id, None)

    def snapshot(self, instance_id: str, image_id: str) -> None:
        self._record("snapshot", instance_id, image_id)
        time.sleep(self.snapshot_delay)
        self.images.add(image_id)

    def delete_image(self, image_id: str) -> None:
        self._record("delete_image", image_id)
        self.images.discard(image_id)

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        self._record("run_command", instance_id, script, timeout)
        return self.results.get(script, CommandResult(0, ""))

    def console_output(self, instance_id: str) -> str:
        machine = self.machines.get(instance_id)
        return "paper boot log\n" + machine["user_data"].decode() if machine else ""

    def close(self) -> None:
        self.closed = True


class LoopbackHosts(PaperHosts):
    """PaperHosts whose machines all have this process's address (unless a test queues others in `addresses`),
    so a test can speak to the emulator's metadata service as the instance."""

    def _ip(self) -> str:
        with self._lock:
            return self.addresses.pop(0) if self.addresses else "127.0.0.1"
