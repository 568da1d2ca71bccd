"""Start a project's image as a served model on this host, wait until it is ready, stop it.

Why shared by `ngcx run` and `ngcx test`: both must start the image exactly as a user's host
would (all GPUs when present, the first project port on loopback, the host's plan cache mounted
so an optimized plan survives restarts: app-projects.md §9.7), and both need one clear line
when the container dies before it is ready (its last log lines, not a timeout).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from .spec import Project

PLAN_CACHE_IN_IMAGE = "/var/cache/ngcx/plans"
LABEL_RUN = "ai.ngcx.project.run"


def plan_cache_dir() -> Path:
    """Host folder for optimized plans: $NGCX_PLAN_CACHE, else <state dir>/plans."""
    from ..core import paths

    folder = Path(os.environ.get("NGCX_PLAN_CACHE") or paths.state_dir() / "plans")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A running project container and where it answers."""

    container: Any
    url: str
    model: str
    ready_s: float = 0.0

    def logs(self, tail: int = 20) -> str:
        return self.container.logs(tail=tail).decode(errors="replace")

    def stop(self, timeout: int = 10) -> None:
        """SIGTERM (the server drains in-flight requests), then remove the container."""
        from docker.errors import APIError, NotFound

        try:
            self.container.stop(timeout=timeout)
            self.container.remove(force=True)
        except (NotFound, APIError):
            pass


def start(project: Project, *, port: int | None = None, gpu: bool = False, ready_timeout: float = 300,
          env: dict[str, str] | None = None) -> Served:
    """docker run -d the project image, publish its first port on 127.0.0.1, wait until ready."""
    from docker.types import DeviceRequest

    from ..core.engine import engine_client, image_or_none
    from .client import Client, wait_ready

    client = engine_client()
    if image_or_none(client, project.image_tag) is None:
        raise UserError(f"{project.image_tag} is not built", hint=f"run `ngcx build` in {project.root}")
    host_port = port or free_port()
    inner = project.spec.ports[0]
    kwargs: dict[str, Any] = {"device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])]} if gpu else {}
    container = client.containers.run(
        project.image_tag, detach=True, ports={f"{inner}/tcp": ("127.0.0.1", host_port)},
        volumes={str(plan_cache_dir()): {"bind": PLAN_CACHE_IN_IMAGE, "mode": "rw"}},
        environment=env or {}, labels={LABEL_RUN: project.name}, **kwargs)
    served = Served(container, f"http://127.0.0.1:{host_port}", project.model_name)
    try:
        served.ready_s = wait_ready(Client(served.url), served.model, ready_timeout, lambda: _died(served))
    except BaseException:
        served.stop(timeout=2)
        raise
    return served


def _died(served: Served) -> str | None:
    """Why the container stopped before it was ready (its exit code and last log lines), or None."""
    served.container.reload()
    if served.container.status not in ("exited", "dead"):
        return None
    code = served.container.attrs.get("State", {}).get("ExitCode")
    tail = " | ".join(line for line in served.logs(tail=5).splitlines() if line.strip())
    return f"the project container exited with code {code} before it was ready: {tail[-400:]}"
