"""Deploys onto cloud VMs, whatever the cloud: the running host, else a stopped one, else a new one.

Why one module for every VM cloud: the paths (cold-start.md §7), the record transitions, the
failover and the per-phase split are the same on Alibaba Cloud ECS and AWS EC2; only the API
calls differ. A cloud's verbs (aliyun/verbs.py, aws/verbs.py) supplies a `Cloud` object with the primitives
below and re-exports this module's verbs, so the router sees the same contract for both.

- A running host of the same spec serving the same image gets the new container through the
  cloud's command channel (Cloud Assistant / SSM Run Command): nothing boots, nothing is pulled.
- A stopped host (its GPU released, its disk and pulled layers kept) is started; when the zone has
  no capacity to give the GPU back, the deploy creates a new host instead.
- Otherwise create: candidates in rank order x zones with capacity, one ClientToken per attempt,
  written into the record BEFORE the call, so a retry or a re-run never doubles an instance.
The host script (recipes/deploy/host.sh.j2) stamps when it started, pulled and started the
container; those stamps split the wait into pull / start / ready.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from ..core.errors import UserError
from . import store
from .common import (
    BOOTING,
    CREATING,
    IN_FLIGHT,
    PATH_FRESH,
    PATH_RUNNING,
    PATH_STOPPED,
    READY,
    SERVE_PORT,
    STARTING,
    STOPPED,
    CapacityError,
    DeployConfig,
    DeployRecord,
    HostStatus,
    NoCapacity,
)

BOOT_TIMEOUT_S = 900.0
BOOT_TRIES = 2           # a fresh host the cloud deletes while it boots is made once more in its zone
COMMAND_TIMEOUT_S = 900.0
TAG_OWNER, TAG_DEPLOYMENT, TAG_HOST_IMAGE, TAG_ROLE = "ngcx:owner", "ngcx:deployment", "ngcx:host-image", "ngcx:role"
TAG_SERVICE = "ngcx:service"      # a service's balancer and scaling group, and the hosts its group launches


class ChannelError(UserError):
    """The host command channel (Cloud Assistant, SSM Run Command) refused for good: an unknown action, a
    permission the caller lacks, an instance the channel does not know (issue 47 item 6). It ends any wait at
    once with the cloud's own code: asking again cannot help, and a readiness wait that swallowed it ran out
    its whole --ready-timeout (143 RunCommands in 5 minutes) and then blamed the image size."""

    def __init__(self, cloud: str, code: str, action: str, instance_id: str, hint: str, what: str = "") -> None:
        self.code = code
        super().__init__(what or f"{cloud} refused {action} on {instance_id} for good: {code}", hint=hint)


class Cloud(Protocol):
    """The primitives a VM cloud supplies (one region)."""

    name: str
    region: str

    def describe(self, ids: list[str]) -> dict[str, HostStatus]: ...
    def start(self, instance_id: str) -> None: ...            # CapacityError when the GPU cannot come back
    def stop(self, instance_id: str) -> None: ...             # keep the disk, stop paying for the GPU
    def delete(self, instance_id: str) -> None: ...           # gone already is fine
    def zones_for(self, instance_type: str, zone: str | None) -> list[str]: ...
    def prepare_network(self, allow_from: str) -> None: ...   # subnets per zone, a security group for port 8000
    def read_network(self) -> str: ...                        # the VPC and its subnets per zone; reads only
    def create(self, spec: CreateSpec) -> str: ...            # CapacityError on no stock in that zone
    def run_command(self, instance_id: str, script: str, timeout: float) -> tuple[int, str]: ...
    def tagged(self, tags: dict[str, str]) -> list[str]: ...  # instance ids carrying all these tags
    def ensure_pull_role(self, grant: Any) -> str: ...        # roles.PullGrant -> the role (profile) to attach
    def pull_role_name(self, grant: Any) -> str: ...          # the name ensure_pull_role would return; no call
    def attach_role(self, instance_id: str, role: str) -> None: ...  # swaps a reused host's role when it differs


@dataclass(frozen=True)
class CreateSpec:
    instance_type: str
    zone: str
    image_id: str
    user_data: str
    token: str
    tags: dict[str, str]
    name: str
    spot: bool = False
    max_price: float | None = None
    role: str | None = None        # the pull role (ECS RAM role / EC2 instance profile) the host gets


@dataclass
class Plan:
    cloud: Any                          # a Cloud
    candidates: list[Any]               # offers.Candidate, best first
    pick_image: Callable[[], str]       # the image a new host boots (baked_or); asked only when one is made
    pull_ref: str
    registry: str
    login: Any                          # () -> RoleLogin | Credentials | None: per host job (roles.py)
    notes: list[str] = field(default_factory=list)
    grant: Any = None                   # roles.PullGrant: the one repository the host's role may pull
    role: str | None = None             # its role, made (or found) by run() before any host is touched

    @cached_property
    def host_image(self) -> str:
        return self.pick_image()


def baked_or(cloud: Any, fallback: Callable[[], str], note: str) -> Callable[[], str]:
    """The newest baked ngcx host image of `cloud` (host_images(), oldest first), else `fallback()` with `note`
    said. Asked only when a host is made: a redeploy onto a running host makes none, and its cloud calls
    (DescribeImages; on AWS also SSM's GPU AMI parameter) were ~0.2 s of its ~3 s (issue 24 item 6)."""
    def pick() -> str:
        baked = cloud.host_images()
        if baked:
            return baked[-1][0]
        say(note)
        return fallback()
    return pick


def choose(cloud_name: str, config: DeployConfig) -> Any:
    """The ranked instance types of `cloud_name`'s table for this image (its compute capabilities and driver floor)."""
    from . import offers

    caps = [c for c in config.labels.get("ai.ngcx.compute-capabilities", "").split(",") if c]
    return offers.choose(cloud_name, compute_capabilities=caps, driver_floor=config.labels.get("ai.ngcx.min-driver"),
                         gpu=config.gpu, workload=config.workload, max_price=config.max_price, spot=config.spot)


def say(line: str) -> None:
    print(f"ngcx: {line}", file=sys.stderr)


def run(config: DeployConfig, record: DeployRecord, plan: Plan) -> DeployRecord:
    """Reuse a running host, else start a stopped one, else create; the container is started either way."""
    for note in plan.notes:
        say(note)
    t0 = time.time()
    names = {c.itype.name for c in plan.candidates}
    hosts = reusable_hosts(plan, names, config, record.id)
    if plan.grant is not None:
        plan.role = _pull_role(plan, hosts)
    for old, status in hosts:
        if not store.claim_host(old, record.id):
            continue            # a deploy beside this one (another replica of the service) took it first
        if status.state == "running":
            return _swap(config, record, plan, old, status, {"api": 0.0, "boot": 0.0}, PATH_RUNNING)
        try:
            plan.cloud.start(old.instance_id)
        except CapacityError as exc:
            say(f"stopped host {old.instance_id} cannot start again ({exc.code}: its GPU was released); "
                "creating a new host")
            store.release_host(old, record.id, f"restart failed for capacity ({exc.code}) at {time.ctime()}")
            continue
        t_api = time.time()
        status = wait_state(plan.cloud, old.instance_id or "", "running", BOOT_TIMEOUT_S)
        # dockerd's own start is waited for by the host script (its first step), in the one command _swap runs
        phases = {"api": round(t_api - t0, 3), "boot": round(time.time() - t_api, 3)}
        return _swap(config, record, plan, old, status, phases, PATH_STOPPED)
    return _create(config, record, plan, t0)


def _pull_role(plan: Plan, hosts: list[tuple[DeployRecord, Any]]) -> str:
    """The role this deploy's host gets. A running host first in line already holds it when its record says so
    (_swap and _boot_in_zone write it): that deploy made or found it, and the host's deployment keeps it in use,
    so the redeploy asks IAM / RAM nothing (their 2-4 calls were ~0.2 s of its ~3 s, issue 24 item 6)."""
    wanted = plan.cloud.pull_role_name(plan.grant)
    if hosts and hosts[0][1].state == "running" and hosts[0][0].spec.get("role") == wanted:
        return wanted
    return plan.cloud.ensure_pull_role(plan.grant)


def reusable_hosts(plan: Plan, names: set[str], config: DeployConfig, new_id: int) -> list[tuple[DeployRecord, Any]]:
    """(record, status) of hosts of the same spec this store owns: running ones first, then stopped.

    A running host is reused only by a deploy of the same image (a redeploy swaps its container);
    one serving another model is never taken over. A stopped host is the warm pool: any image may
    take it (its record becomes `replaced`), keeping the layers the two images share. A service's
    replica is never taken (service.py rolls them), and a replica takes only a stopped host: a running
    one serves someone.
    """
    lone = config.service_id is None
    olds = [r for r in store.records(cloud=plan.cloud.name) if r.id != new_id and r.instance_id
            and r.service_id is None and r.region == plan.cloud.region and r.instance_type in names
            and (config.zone is None or r.zone == config.zone)
            and (r.status == STOPPED or (lone and r.status == READY and r.image == config.image))]
    if not olds:
        return []
    found = plan.cloud.describe([r.instance_id for r in olds])
    pairs = [(r, found[r.instance_id]) for r in olds if r.instance_id in found]
    return sorted((p for p in pairs if p[1].state in ("running", "stopped")),
                  key=lambda p: (p[1].state != "running", -p[0].id))


def _swap(config: DeployConfig, record: DeployRecord, plan: Plan, old: DeployRecord, status: HostStatus,
          phases: dict[str, float], path: str) -> DeployRecord:
    """Run the host script on the host `old` handed to `record` (store.claim_host) through the command channel."""
    record = store.update(record.id, status=STARTING, instance_id=old.instance_id, instance_type=old.instance_type,
                          zone=old.zone, host=status.address, endpoint=endpoint(status.address, config.tls), path=path,
                          region=plan.cloud.region, phases=phases, spec=dict(record.spec, role=plan.role))
    if plan.role and old.spec.get("role") != plan.role:     # a host that has it keeps it (ECS / EC2 hold one)
        plan.cloud.attach_role(old.instance_id or "", plan.role)
    code, output = plan.cloud.run_command(record.instance_id, host_script(config, record, plan, "command"),
                                          COMMAND_TIMEOUT_S)
    if code != 0:
        raise UserError(f"the host script failed on {record.instance_id}: {last_lines(output)}")
    found = _certificate(output)
    certificate = {"certificate": {"pem": found[0], "pin": found[1]}} if found else {}
    return store.update(record.id, spec=dict(record.spec, marks=_marks(output), **certificate))


def _create(config: DeployConfig, record: DeployRecord, plan: Plan, t0: float) -> DeployRecord:
    """Create over candidates x zones with capacity; the first host that boots wins."""
    plan.cloud.prepare_network(config.allow_from)
    tried: list[str] = []
    attempts = itertools.count(1)
    for cand in plan.candidates:
        for zone in plan.cloud.zones_for(cand.itype.name, config.zone):
            made = _boot_in_zone(config, record, plan, cand.itype.name, zone, attempts, tried, t0)
            if made is not None:
                return made
    raise NoCapacity(f"no capacity for any fitting instance type in {plan.cloud.name} {plan.cloud.region}: "
                     f"{'; '.join(tried) or 'no zone offers one'}", hint="try another --region or --gpu, or later")


def _boot_in_zone(config: DeployConfig, record: DeployRecord, plan: Plan, itype: str, zone: str,
                  attempts: Iterator[int], tried: list[str], t0: float) -> DeployRecord | None:
    """A fresh host of `itype` in `zone`, booted; None (why appended to `tried`) when the zone has no capacity
    or the cloud deleted BOOT_TRIES hosts while they booted (ECS: SystemFailure.Delete; EC2: terminated). Each
    attempt has its own ClientToken, so a retried create never returns the deleted instance again."""
    for tries_left in range(BOOT_TRIES - 1, -1, -1):
        token = f"ngcx-{store.owner_id()}-{record.id}-{next(attempts)}"
        record = store.update(record.id, status=CREATING, client_token=token, zone=zone, instance_id=None,
                              instance_type=itype, region=plan.cloud.region, path=PATH_FRESH)
        spec = CreateSpec(itype, zone, plan.host_image, host_script(config, record, plan, "user-data"), token,
                          {TAG_OWNER: store.owner_id(), TAG_DEPLOYMENT: str(record.id)}, f"ngcx-deploy-{record.id}",
                          config.spot, config.max_price, plan.role)
        try:
            instance_id = plan.cloud.create(spec)
        except CapacityError as exc:
            tried.append(f"{itype} in {zone}: {exc.code}")
            say(f"{itype} in {zone}: {exc.code}; trying the next")
            return None
        record = store.update(record.id, status=BOOTING, instance_id=instance_id)
        t_api = time.time()
        status = wait_state(plan.cloud, instance_id, "running", BOOT_TIMEOUT_S)
        if status.state != "gone":
            phases = {"api": round(t_api - t0, 3), "boot": round(time.time() - t_api, 3)}
            return store.update(record.id, status=STARTING, host=status.address, spec=dict(record.spec, role=plan.role),
                                endpoint=endpoint(status.address, config.tls), phases=phases)
        plan.cloud.delete(instance_id)      # idempotent: nothing of it is left billed, seen or not
        record = store.update(record.id, status=CREATING, instance_id=None)     # the record names no lost host
        tried.append(f"{itype} in {zone}: {instance_id} deleted by the cloud while booting")
        then = "creating another" if tries_left else f"no more tries in {zone}"
        say(f"{instance_id} ({itype} in {zone}) was deleted by the cloud while booting; {then}")
    return None


def wait_state(cloud: Any, instance_id: str, state: str, timeout: float) -> HostStatus:
    """Poll until `state` (bounded, backing off to 1 s); 'gone' when the instance disappears.

    Why 1 s: EC2's pending -> running takes ~16-18 s (cold-start.md [V1]); steps capped at 2 s saw it up to 2 s
    late (the emulated 17.8 s launch at 19.2 s, bench/suites/deploy_phases.py), at 1 s up to 1 s, for ~17
    DescribeInstances calls a boot instead of ~12, far under EC2's and ECS's API rate limits."""
    deadline, pause = time.monotonic() + timeout, 0.25
    while True:
        status = cloud.describe([instance_id]).get(instance_id, HostStatus("gone"))
        if status.state in (state, "gone"):
            return status
        if time.monotonic() > deadline:
            raise UserError(f"instance {instance_id} is still {status.state} after {timeout:.0f} s (wanted {state})",
                            hint="check it in the console; `ngcx deployments gc` finds it if it lingers")
        time.sleep(pause)
        pause = min(1.0, pause * 1.5)


def host_script(config: DeployConfig, record: DeployRecord, plan: Plan, mode: str) -> str:
    from . import gate, hostscript

    job = hostscript.HostJob(record.id, plan.pull_ref, plan.registry, config.labels.get("ai.ngcx.min-driver", "0"),
                             config.gpu_mode, plan.login(), tuple(config.cmd), tuple(sorted(config.env.items())),
                             auth_hashes=config.key_hashes, tls=config.tls, verify_key=gate.host_key(config))
    return hostscript.render(job, mode)


def poll_pause(started: float) -> float:
    """Seconds to wait before polling again a command started at `started` (time.monotonic): a tenth of its
    age, 0.05 s to 1 s, so the finish is seen at most ~10 % late. The running-host deploy is a host script of
    about a second (bench/results/deploy.json: pull + start 0.9-1.5 s); the old steps (0.1 s x 1.5) saw that
    finish up to 0.7 s late. A pull of minutes is still polled once a second."""
    return min(1.0, max(0.05, (time.monotonic() - started) / 10))


AUTH_DIR = "/var/lib/ngcx/auth"   # host.sh.j2's $STATE/auth: the key hashes and the TLS key pair


def install_key_hashes_with(cloud: Any, record: DeployRecord, hashes_text: str) -> None:
    """Replace the host's accepted key hashes (ngcx-runtime re-reads the file; no restart, no downtime)."""
    import shlex

    script = (f"umask 077; printf '%s' {shlex.quote(hashes_text)} > {AUTH_DIR}/keys.tmp && "
              f"mv -f {AUTH_DIR}/keys.tmp {AUTH_DIR}/keys")
    code, out = cloud.run_command(record.instance_id or "", script, 60)
    if code != 0:
        raise UserError(f"could not write the key hashes on {record.instance_id}: {last_lines(out)}")


def certificate_with(cloud: Any, record: DeployRecord) -> tuple[str, str]:
    """(PEM, curl's --pinnedpubkey value) of the host's own TLS certificate: from the host script's own output
    when it ran through the command channel (a running or stopped host: _swap keeps it), else read with a
    command of its own (a fresh host, whose user-data output no command returns)."""
    from .hostscript import certificate_probe

    kept = record.spec.get("certificate")
    if kept:
        return kept["pem"], kept["pin"]
    code, out = cloud.run_command(record.instance_id or "", certificate_probe(AUTH_DIR), 60)
    found = _certificate(out) if code == 0 else None
    if not found:
        raise UserError(f"could not read the TLS certificate of {record.instance_id}: {last_lines(out)}")
    return found


def _certificate(output: str) -> tuple[str, str] | None:
    """The last certificate and pin that hostscript.certificate_probe printed in `output`, if whole."""
    from .hostscript import CERTIFICATE_MARK

    begin, end = output.rfind("-----BEGIN CERTIFICATE-----"), output.rfind("-----END CERTIFICATE-----")
    if begin == -1 or end < begin:
        return None
    pins = [line.removeprefix(CERTIFICATE_MARK).strip() for line in output[end:].splitlines()
            if line.startswith(CERTIFICATE_MARK)]
    if not pins or not pins[-1]:
        return None
    return output[begin:end] + "-----END CERTIFICATE-----\n", pins[-1]


def _marks(output: str) -> dict[str, float]:
    for line in reversed(output.splitlines()):
        if "started deployment" in line and "{" in line:
            return json.loads(line[line.index("{"):])
    return {}


def report_phases_with(cloud: Any, record: DeployRecord, t_ready: float) -> dict[str, float]:
    """Split the time after boot into pull / start / ready with the host script's own timestamps. Its wait for
    dockerd (script -> engine: a restarted host's engine starts with it) counts as boot: the host is up when its
    engine answers. Marks from a host script without `engine` count it as pull, as they did."""
    marks = record.spec.get("marks") or _fetch_marks(cloud, record)
    phases = dict(record.phases)
    if marks:
        engine = marks.get("engine", marks["script"])
        phases["boot"] = round(phases.get("boot", 0.0) + max(0.0, engine - marks["script"]), 3)
        phases["pull"] = round(max(0.0, marks["pulled"] - engine), 3)
        phases["start"] = round(max(0.0, marks["started"] - marks["pulled"]), 3)
        phases["ready"] = round(max(0.0, t_ready - marks["started"]), 3)
    return phases


def _fetch_marks(cloud: Any, record: DeployRecord) -> dict[str, float]:
    try:
        code, out = cloud.run_command(record.instance_id or "", "cat /var/lib/ngcx/phases.json", 60)
        return json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
    except (UserError, ValueError, IndexError):
        return {}


def endpoint(address: str | None, tls: bool) -> str | None:
    return f"{'https' if tls else 'http'}://{address}:{SERVE_PORT}" if address else None


def last_lines(text: str, n: int = 400) -> str:
    return " | ".join(line for line in text.splitlines() if line.strip())[-n:]


# The container runs with --restart unless-stopped (it must come back with the host), so a crash shows
# as "restarting" or as a restart count, not only as "exited".
FAILURE_PROBE = ("cat /var/lib/ngcx/failed 2>/dev/null && exit 3; "
                 "s=$(docker inspect -f '{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}' ngcx-serve "
                 "2>/dev/null) || exit 0; set -- $s; "
                 "if [ \"$1\" = exited ] || [ \"$1\" = dead ] || [ \"$1\" = restarting ] || [ \"${3:-0}\" -gt 0 ]; "
                 "then echo \"the container exited (code $2, restarted ${3:-0} times): "
                 "$(docker logs --tail 6 ngcx-serve 2>&1 | tr '\\n' '|')\"; exit 4; fi")


def container_failure_with(cloud: Any, record: DeployRecord) -> str | None:
    """The host script's failure, or the container's exit with its last lines; None while all is well."""
    if not record.instance_id:
        return None
    try:
        code, out = cloud.run_command(record.instance_id, FAILURE_PROBE, 60)
    except ChannelError:
        raise                      # permanent: the wait ends now, with the cloud's code
    except UserError:
        return None
    if code == 3:
        return f"the host script failed: {last_lines(out)}"
    return last_lines(out, 600) if code == 4 else None


def cleanup_failed_with(cloud: Any, record: DeployRecord) -> str:
    """A host this deploy created is deleted (billed); a reused host keeps running without the container."""
    if record.path == PATH_FRESH:
        ids = [record.instance_id] if record.instance_id else cloud.tagged({TAG_DEPLOYMENT: str(record.id),
                                                                           TAG_OWNER: store.owner_id()})
        for instance_id in ids:
            cloud.delete(instance_id)
        return f"instance {', '.join(ids)} deleted" if ids else "no instance was created"
    if record.instance_id:
        cloud.run_command(record.instance_id, "docker rm -f ngcx-serve >/dev/null 2>&1; true", 60)
        return f"host {record.instance_id} kept, its container removed"
    return ""


def start_with(cloud: Any, record: DeployRecord) -> DeployRecord:
    """Start the stopped host; its container comes back by itself (--restart unless-stopped)."""
    try:
        cloud.start(record.instance_id or "")
    except CapacityError as exc:
        raise UserError(f"host {record.instance_id} cannot start: {exc.code} (its GPU was released while stopped and "
                        "the zone has none now)", hint="deploy again to create a new host, or try later") from None
    status = wait_state(cloud, record.instance_id or "", "running", BOOT_TIMEOUT_S)
    return store.update(record.id, status=STARTING, host=status.address,
                        endpoint=endpoint(status.address, bool(record.spec.get("tls"))))


def stop_with(cloud: Any, record: DeployRecord) -> DeployRecord:
    cloud.stop(record.instance_id or "")
    wait_state(cloud, record.instance_id or "", "stopped", 600)
    return record


def terminate_with(cloud: Any, record: DeployRecord) -> DeployRecord:
    if record.instance_id:
        cloud.delete(record.instance_id)
    return store.mark_destroyed(record.id)


def logs_with(cloud: Any, record: DeployRecord, tail: int) -> str:
    if not record.instance_id:
        return ""
    _code, out = cloud.run_command(record.instance_id, f"docker logs --tail {int(tail)} ngcx-serve 2>&1 || "
                                                       f"tail -n {int(tail)} /var/log/cloud-init-output.log", 60)
    return out


def orphans_in(clouds: list[Any]) -> list[dict[str, str]]:
    """Instances tagged with this store's owner id that no live record owns, in the given regions."""
    found = []
    for cloud in clouds:
        owned = store.owned_instance_ids(cloud.name) | _in_flight(cloud) | _grouped(cloud)
        ids = [i for i in cloud.tagged({TAG_OWNER: store.owner_id()}) if i not in owned]
        statuses = cloud.describe(ids)
        for instance_id in ids:
            status = statuses.get(instance_id, HostStatus("gone"))
            if status.state != "gone":
                found.append({"id": instance_id, "region": cloud.region, "status": status.state,
                              "type": status.instance_type or ""})
    return found


def _grouped(cloud: Any) -> set[str]:
    """Hosts a service's scaling group launched (service_group.py): they carry the service's tag and no record
    (the group owns them and ends them; gc deals with the group itself, never with its hosts one by one)."""
    groups = [s for s in store.services(cloud=cloud.name, include_gone=True) if s.config.get("group")]
    return {i for s in groups for i in cloud.tagged({TAG_OWNER: store.owner_id(), TAG_SERVICE: str(s.id)})}


def _in_flight(cloud: Any) -> set[str]:
    """Instances of deploys still running in another ngcx (a live pid) whose record has no instance id yet:
    their RunInstances is in flight, so gc must not take the instance for an orphan."""
    busy = [r for r in store.records(cloud=cloud.name) if r.status in IN_FLIGHT and not r.instance_id
            and r.region in (None, cloud.region)]
    return {i for r in busy for i in cloud.tagged({TAG_OWNER: store.owner_id(), TAG_DEPLOYMENT: str(r.id)})}


def record_regions(cloud_name: str, default: str) -> list[str]:
    """The regions this store has used on a cloud, plus the default: where gc looks."""
    return sorted({r.region for r in store.records(cloud=cloud_name, include_gone=True) if r.region} | {default})


@dataclass(frozen=True)
class Verbs:
    """The contract's verbs for a VM cloud, bound to how that cloud finds a record's region client.

    A cloud module binds them once (`run, stop, … = vm.Verbs(cloud_for_record).all()`), so aliyun/ and
    aws/ hold only what differs between clouds: the primitives and prepare()."""

    cloud_of: Any   # (DeployRecord) -> Cloud

    def run(self, config: DeployConfig, record: DeployRecord, plan: Plan) -> DeployRecord:
        return run(config, record, plan)

    def report_phases(self, record: DeployRecord, t_ready: float) -> dict[str, float]:
        return report_phases_with(self.cloud_of(record), record, t_ready)

    def container_failure(self, record: DeployRecord) -> str | None:
        return container_failure_with(self.cloud_of(record), record)

    def cleanup_failed(self, record: DeployRecord, plan: Plan) -> str:
        return cleanup_failed_with(plan.cloud, record)

    def query(self, record: DeployRecord) -> HostStatus:
        if not record.instance_id:
            return HostStatus("gone")
        return self.cloud_of(record).describe([record.instance_id]).get(record.instance_id, HostStatus("gone"))

    def start(self, record: DeployRecord) -> DeployRecord:
        return start_with(self.cloud_of(record), record)

    def stop(self, record: DeployRecord) -> DeployRecord:
        return stop_with(self.cloud_of(record), record)

    def terminate(self, record: DeployRecord) -> DeployRecord:
        return terminate_with(self.cloud_of(record), record)

    def logs(self, record: DeployRecord, tail: int = 50) -> str:
        return logs_with(self.cloud_of(record), record, tail)

    def install_key_hashes(self, record: DeployRecord, hashes_text: str) -> None:
        install_key_hashes_with(self.cloud_of(record), record, hashes_text)

    def certificate(self, record: DeployRecord) -> tuple[str, str]:
        return certificate_with(self.cloud_of(record), record)

    def all(self) -> tuple[Any, ...]:
        """(run, report_phases, container_failure, cleanup_failed, query, start, stop, terminate, logs,
        install_key_hashes, certificate)."""
        return (self.run, self.report_phases, self.container_failure, self.cleanup_failed, self.query, self.start,
                self.stop, self.terminate, self.logs, self.install_key_hashes, self.certificate)


# ---------------------------------------------------------------- services (issue 21): what both VM clouds share

def check_service(options: Any, cloud_label: str, certificate_what: tuple[str, str]) -> None:
    """A cloud service needs the user's certificate (refused before any cloud call): the balancer's listener
    is HTTPS and terminates TLS with it. TLS passthrough to the hosts' own self-made certificates (issue 20)
    is not offered: a client could pin only one host's certificate, and the balancer's health checks and
    draining work on HTTP semantics."""
    if not getattr(options, "certificate_id", None):
        what, example = certificate_what
        raise UserError(f"a service on {cloud_label} needs --certificate (the balancer's HTTPS listener terminates "
                        f"TLS with your certificate: {what})",
                        hint=f"ngcx deploy --cloud {cloud_label} --replicas N --certificate {example}")


def service_spec(name: str, zones: tuple[str, ...], tags: dict[str, str], options: Any, cloud_label: str,
                 certificate_what: tuple[str, str]) -> Any:
    """HTTPS on 443 with the user's certificate; the replicas reached over their own TLS on SERVE_PORT (not
    verified by the balancer, as the clouds do); checked on the keyless health route."""
    from .balancer import BalancerSpec

    check_service(options, cloud_label, certificate_what)
    return BalancerSpec(name=name, zones=zones, tags=tags, port=options.port or 443, protocol="HTTPS",
                        certificate_id=options.certificate_id, target_port=SERVE_PORT, target_protocol="HTTPS",
                        health_interval_s=options.health_interval_s, healthy_threshold=options.healthy_threshold,
                        unhealthy_threshold=options.unhealthy_threshold, drain_s=options.drain_s)


def member(record: DeployRecord) -> tuple[str, int]:
    """What the balancer registers for a replica: its instance on SERVE_PORT ("" before it has one)."""
    return record.instance_id or "", SERVE_PORT


def service_zones_with(cloud: Any, cloud_name: str, config: DeployConfig) -> tuple[str, ...]:
    """The zones that sell the best-ranked instance type for this image and have a subnet / vSwitch (the replicas
    are spread over them, and the balancer is enabled in them first); config.zone alone when one is given.
    Reads only: service.py asks for the zones before the spec, so nothing is made for a service that
    check_service then refuses."""
    if config.zone:
        return (config.zone,)
    candidates = choose(cloud_name, config).candidates
    if not candidates:
        return ()
    cloud.read_network()
    return tuple(cloud.zones_for(candidates[0].itype.name, None))
