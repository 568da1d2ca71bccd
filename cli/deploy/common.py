"""The deploy contract: what every target takes (DeployConfig), gives back (DeployRecord), can do
(Capabilities), and the errors the orchestration in cli/deploy/flow.py reacts to.

Why one contract before the first cloud: SkyPilot's provisioner (cloud-apis.md §11.2) keeps every
cloud behind the same few functions and dataclasses, so failover and state handling are written
once. A workstation and an ECS instance differ in what they can do (a workstation cannot stop or
start its host; ECS can, and keeps the disk), which is declared here as data, not as `if` chains.
Only the standard library is imported: `ngcx --help` stays fast.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import CapacityError as CapacityError  # part of the contract: a target raises it on no stock
from ..core.errors import UserError

# Where the seconds of a deploy go, in order (cold-start.md §7): cloud API calls, the host booting,
# the image pull, the container start, and the model becoming ready (load + warm-up).
PHASES = ("api", "boot", "pull", "start", "ready")

# Deployment statuses, in the order a deploy walks them. `intent` is written BEFORE any cloud call,
# `creating` carries the ClientToken of a RunInstances in flight: a kill -9 after either leaves a
# record that `ngcx deployments gc` reconciles with what the cloud has.
INTENT, CREATING, BOOTING, STARTING, READY, STOPPED, FAILED, DESTROYED, REPLACED = (
    "intent", "creating", "booting", "starting", "ready", "stopped", "failed", "destroyed", "replaced")
LIVE = (INTENT, CREATING, BOOTING, STARTING, READY, STOPPED)   # may own a host or container
IN_FLIGHT = (INTENT, CREATING, BOOTING, STARTING)             # a deploy process is (or was) working on it

# How a deploy got its host (the `path` column): the three cold-start paths plus the workstation.
PATH_RUNNING, PATH_STOPPED, PATH_FRESH, PATH_LOCAL = "running-host", "stopped-host", "fresh-host", "local"

SERVE_PORT = 8000  # the port ngcx-runtime serve listens on inside every image (KServe v2 HTTP)
LABEL_OWNER = "ai.ngcx.deploy.owner"   # on what the workstation target makes (containers, networks): whose store


@dataclass(frozen=True)
class Capabilities:
    """What a target can do; the CLI refuses a verb a target lacks with one line, before any call."""

    stop_start_host: bool        # stop the host keeping its disk, start it again later (ECS, EC2)
    choose_instance: bool        # pick an instance type from a table (--gpu, --workload, --max-price)
    bake: bool                   # `ngcx hosts bake`: a host image with driver, Docker, toolkit, base layers
    list_orphans: bool           # find hosts carrying ngcx's tags that no record owns (gc)


@dataclass
class DeployConfig:
    """Everything a deploy needs, resolved before the first cloud call (bad input fails here)."""

    cloud: str
    image: str                       # local image tag (what was built here)
    pull_ref: str | None             # REGISTRY/REPO@sha256:… of the image's newest push (None: local image)
    registry: str | None             # registry host the pull_ref names
    labels: dict[str, str]           # the image's labels: compute capabilities, driver floor, pins
    model: str | None                # the served model's name, when known (readiness of that model)
    cmd: list[str] = field(default_factory=list)
    gpu: str | None = None           # GPU model (T4, A10, …) or None for the ranking's best
    gpu_mode: str = "require"        # require | auto | off (host without a usable driver: fail / CPU / CPU)
    workload: str = "cnn"
    region: str | None = None
    zone: str | None = None
    max_price: float | None = None
    spot: bool = False
    port: int | None = None          # local: host port to publish on (default: a free one)
    allow_from: str = "0.0.0.0/0"    # cloud: who may reach the endpoint (security group source CIDR)
    ready_timeout: float = 600.0
    env: dict[str, str] = field(default_factory=dict)
    pushes: list[tuple[str, str]] = field(default_factory=list)  # (REGISTRY/REPO, digest), newest first
    auth: bool = True                # a bearer key for every call but health (--no-auth: none)
    tls: bool = False                # HTTPS with the host's own key pair (clouds' default)
    key_hashes: tuple[str, ...] = ()  # SHA-256 of the accepted keys: set by flow.deploy once the key exists
    registry_login: str = "role"     # cloud hosts' ACR/ECR login: their instance role, or a token (roles.py)
    service_id: int | None = None    # a service's replica (service.py): never swapped or reused as a lone deploy's
    replica: int = 0                 # the replica's index in its service: its zone and (locally) its GPU
    version: str | None = None       # what a service rolls between: the image's digest or local image id
    trust_key: str | None = None     # the key the image's signature must verify with (None: ngcx's own; gate.py)
    allow_unsigned: bool = False     # --allow-unsigned: skip the trust gate (gate.py), said on stderr

    def pick_push(self, owns: Any) -> tuple[str, str] | None:
        """(REPO@DIGEST, registry host) of the newest push to a registry `owns(host)` claims (the cloud's own,
        pulled in-region), else of the newest push at all; None when the image was never pushed. The digest
        has passed the trust gate (gate.py: signature and provenance, the tag still serving it)."""
        ranked = sorted(self.pushes, key=lambda p: not owns(p[0].split("/", 1)[0]))
        if not ranked:
            return (self.pull_ref, self.registry) if self.pull_ref and self.registry else None
        repository, digest = ranked[0]
        from .gate import checked_pull  # the trust gate: nothing pulls a digest that failed it (gate.py)

        return checked_pull(self, repository, digest), repository.split("/", 1)[0]

    def spec(self) -> dict[str, Any]:
        """What makes two hosts interchangeable (stored as JSON; no secrets in it)."""
        return {k: v for k, v in asdict(self).items() if k in (
            "cloud", "region", "zone", "gpu", "gpu_mode", "workload", "max_price", "spot", "allow_from", "auth",
            "tls", "registry_login", "version", "replica")}


@dataclass
class DeployRecord:
    """One deployment as the state store keeps it (a row of the `deployments` table)."""

    id: int
    cloud: str
    image: str
    status: str
    created_at: float
    updated_at: float
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    instance_id: str | None = None
    client_token: str | None = None
    host: str | None = None
    container: str | None = None
    endpoint: str | None = None
    model: str | None = None
    detail: str | None = None
    path: str | None = None
    pid: int | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    service_id: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The `--json` shape of `ngcx deployments ls|show` (keys only get added, never renamed)."""
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DeployRecord:
        row = dict(row)
        return cls(id=row["id"], cloud=row["target"], image=row["image_ref"], status=row["status"],
                   created_at=row["created_at"], updated_at=row["updated_at"], region=row.get("region"),
                   zone=row.get("zone"), instance_type=row.get("instance_type"),
                   instance_id=row.get("instance_id"), client_token=row.get("client_token"),
                   host=row.get("host"), container=row.get("container"), endpoint=row.get("endpoint"),
                   model=row.get("model"), detail=row.get("detail"), path=row.get("path"), pid=row.get("pid"),
                   spec=json.loads(row.get("spec") or "{}"), phases=json.loads(row.get("phases") or "{}"),
                   service_id=row.get("service_id"))


# Service statuses (service.py). A service is `creating`, `updating`, `scaling` or `reconciling` while an
# ngcx (its pid) works on it; a kill -9 leaves one of those with a dead pid, which `reconcile` finishes.
SVC_CREATING, SVC_UPDATING, SVC_SCALING, SVC_RECONCILING = "creating", "updating", "scaling", "reconciling"
SVC_BUSY = (SVC_CREATING, SVC_UPDATING, SVC_SCALING, SVC_RECONCILING)
SVC_LIVE = (*SVC_BUSY, READY, STOPPED, FAILED)   # may own a balancer or replicas (failed: until destroy or gc)


@dataclass
class ServiceRecord:
    """One service as the state store keeps it (a row of the `services` table); its replicas are deployments
    rows carrying its id. `config` is the DeployConfig its replicas are made from (no key, no secret);
    `previous` the one before the last update (`ngcx deployments rollback`)."""

    id: int
    cloud: str
    name: str
    status: str
    replicas: int
    created_at: float
    updated_at: float
    region: str | None = None
    endpoint: str | None = None
    balancer: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    previous: dict[str, Any] = field(default_factory=dict)
    detail: str | None = None
    pid: int | None = None

    @property
    def ref(self) -> str:
        return f"s{self.id}"

    @property
    def canary(self) -> dict[str, Any]:
        """The last canary release's judgement (canary.py): kept in `config` so that no schema change is needed and
        a rolled-back canary's story stays beside the config it left serving; {} when there was none."""
        return dict(self.config.get("canary") or {})

    def as_json(self) -> dict[str, Any]:
        return dict(asdict(self), ref=self.ref, image=self.config.get("image"), version=self.config.get("version"),
                    canary=self.canary or None)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ServiceRecord:
        row = dict(row)
        return cls(id=row["id"], cloud=row["target"], name=row["name"], status=row["status"],
                   replicas=row["replicas"], created_at=row["created_at"], updated_at=row["updated_at"],
                   region=row.get("region"), endpoint=row.get("endpoint"), detail=row.get("detail"),
                   pid=row.get("pid"),
                   **{k: json.loads(row.get(k) or "{}") for k in ("balancer", "config", "previous")})


@dataclass(frozen=True)
class HostStatus:
    """What a target reports about a record's host: its state and where it answers."""

    state: str                # running | stopped | starting | stopping | pending | gone
    address: str | None = None
    instance_type: str | None = None
    zone: str | None = None


class NoCapacity(UserError):
    """No fitting instance type had capacity in any zone of this cloud: `--cloud any` tries the next cloud."""


class NotReady(UserError):
    """The container never answered /v2/health/ready; the message carries its last log lines."""


def format_phases(phases: dict[str, float]) -> str:
    """'api 0.3 s · boot 21.0 s · pull 0.0 s · start 0.9 s · ready 4.2 s · total 26.4 s'."""
    parts = [f"{name} {phases[name]:.1f} s" for name in PHASES if name in phases]
    total = sum(phases.get(name, 0.0) for name in PHASES)
    return " · ".join([*parts, f"total {total:.1f} s"])
