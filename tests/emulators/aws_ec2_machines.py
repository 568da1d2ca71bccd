"""EC2's instances and the real machines behind them: the state harness under Ec2Emulator (aws_ec2.py).

Why a module of its own: this is the one part every other EC2 family leans on (SSM runs commands on
these machines, CreateImage snapshots them, elbv2 sends traffic to their addresses, Auto Scaling hands
its instances over through `adopt` / `machines_gone`), so it is the base class the families extend
(aws_ec2_images.py, aws_ssm.py, aws_ecr.py) and imports none of them. It owns:

- ClientToken idempotency for RunInstances: the same token (in the same region) gets the first
  answer's body again, and no second instance; other parameters with the same token answer 400
  IdempotentParameterMismatch. boto3 fills a fresh token into every RunInstances *call* (its own
  retries of one call resend the same one), so a retry loop of the product's own must pass its token.
- Instance types: an unknown type answers 400 InvalidParameterValue, as EC2 does (moto's optional
  check answers another code). Capacity per zone and type (`set_capacity`, `fail_restart`).
- Real machines behind the instances (a HostBackend, hosts_api.py): RunInstances -> hosts.create with
  the base64-decoded UserData, as EC2 hands it to cloud-init; Stop/Start/Terminate -> stop/start/delete.
- States: DescribeInstances says `pending` until the machine was created and boot_seconds passed
  (start_seconds after a StartInstances), `stopping` until the machine is off, `shutting-down` until
  it is gone. A stop while pending or a start while stopping answers IncorrectInstanceState.
- Addresses: privateIpAddress / ipAddress / publicIp (and the DNS names spelling them) become the
  machine's own address, which the test process and the other machines can reach. Until a machine
  exists, an instance has no address elements at all (moto's would lead nowhere).
- RunInstances with an IamInstanceProfile and MinCount > 1 associates every instance (moto: the first).
- The moto upstream and `_forward` (every family's way to moto), and the worker threads (`_spawn`).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .aws_elbv2 import Elbv2Balancers
from .aws_imds import PROFILE_KEYS, check_profile, profile_name
from .aws_wire import (
    AwsError,
    Upstream,
    WireRequest,
    WireResponse,
    child,
    child_text,
    items,
    local,
    parse_xml,
    path,
    walk_with_parents,
    xml_bytes,
)
from .hosts_api import HostBackend

STATE_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
USER_DATA_LIMIT = 16 * 1024            # bytes before base64, as EC2 counts them
ADDRESS_ELEMENTS = frozenset({"privateIpAddress", "ipAddress", "publicIp"})
DNS_ELEMENTS = frozenset({"privateDnsName", "dnsName", "publicDnsName"})


@dataclass
class Instance:
    """What the harness knows about one instance on top of moto's record."""

    id: str
    region: str
    zone: str
    instance_type: str
    image_id: str
    client_token: str
    user_data: bytes
    masked: tuple[str, str] | None = None  # (moto's state, the state shown instead) while a transition runs
    private_ip: str = ""
    on_host: bool = False                  # hosts.create returned: there is a machine to stop/delete
    generation: int = 0                    # bumped by every transition; a worker of an older one stands down
    host_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # orders backend calls


def repeated(params: dict[str, str], prefix: str) -> list[str]:
    """`InstanceId.1`, `InstanceId.2`, ... in index order (the query protocol's flattened list)."""
    found = [(int(key[len(prefix) + 1:]), value) for key, value in params.items()
             if key.startswith(prefix + ".") and key[len(prefix) + 1:].isdigit()]
    return [value for _, value in sorted(found)]


def _dashed(ip: str) -> str:
    return ip.replace(".", "-")


class Ec2Machines:
    """Instances in moto, each with a machine on the HostBackend; the base of Ec2Emulator's API families."""

    def __init__(self, hosts: HostBackend, *, region: str, zones: Iterable[str],
                 boot_seconds: float, start_seconds: float) -> None:
        self.hosts = hosts
        self.region = region
        self.zones = tuple(zones)
        self.boot_seconds, self.start_seconds = boot_seconds, start_seconds
        self.host_errors: list[tuple[str, str]] = []    # (instance or image id, what the backend raised)
        self._lock = threading.RLock()
        self._launch_lock = threading.Lock()            # RunInstances vs DescribeInstances: never half-registered
        self._instances: dict[str, Instance] = {}
        self._tokens: dict[tuple[str, str], tuple[dict[str, str], bytes]] = {}
        self._known_types: set[tuple[str, str]] = set()
        self._capacity: dict[tuple[str, str], bool] = {}
        self._restart_failures: set[str] = set()
        self._performed: Counter[str] = Counter()
        self._closing = threading.Event()
        self._workers: list[threading.Thread] = []
        self._upstream: Upstream | None = None
        self.elbv2 = Elbv2Balancers(self._forward, self._need_upstream, self._private_ip)

    # --- capacity and inspection (tests) ------------------------------------------------------------

    def set_capacity(self, zone: str, instance_type: str, available: bool) -> None:
        """Without capacity, RunInstances and StartInstances of that type in that zone answer
        500 InsufficientInstanceCapacity."""
        if zone not in self.zones:
            raise ValueError(f"unknown zone {zone} (this emulator has {', '.join(self.zones)})")
        with self._lock:
            self._capacity[(zone, instance_type)] = available

    def fail_restart(self, instance_id: str) -> None:
        """The next StartInstances naming this instance answers 500 InsufficientInstanceCapacity."""
        with self._lock:
            self._restart_failures.add(instance_id)

    def instances(self) -> list[dict[str, Any]]:
        """Every instance launched through the emulator, as a client would see it now."""
        upstream = self._need_upstream()
        with self._lock:
            regions = sorted({inst.region for inst in self._instances.values()})
        found: list[dict[str, Any]] = []
        for region in regions:
            root = parse_xml(upstream.ec2(region, "DescribeInstances", {}).body)
            for reservation in items(root, "reservationSet"):
                for item in items(reservation, "instancesSet"):
                    self._rewrite_instance(item)
                    view = self._view(item)
                    if view is not None:
                        found.append(view)
        return found

    def _view(self, item) -> dict[str, Any] | None:
        with self._lock:
            inst = self._instances.get(child_text(item, "instanceId"))
            if inst is None:
                return None
            token, image_id = inst.client_token, inst.image_id
        tags = {child_text(t, "key"): child_text(t, "value") for t in items(item, "tagSet")}
        volumes = [child_text(path(m, "ebs"), "volumeId") for m in items(item, "blockDeviceMapping")
                   if path(m, "ebs") is not None]
        options, profile = child(item, "metadataOptions"), child(item, "iamInstanceProfile")
        return {"id": inst.id, "state": child_text(path(item, "instanceState"), "name"),
                "type": child_text(item, "instanceType"),
                "zone": child_text(path(item, "placement"), "availabilityZone"), "tags": tags,
                "client_token": token, "image_id": image_id, "private_ip": child_text(item, "privateIpAddress"),
                "public_ip": child_text(item, "ipAddress"), "volume_ids": volumes,
                "instance_profile": profile_name(child_text(profile, "arn")) if profile is not None else None,
                "metadata_options": {local(o.tag)[:1].upper() + local(o.tag)[1:]: o.text for o in options}
                if options is not None else None}

    # --- the upstream ----------------------------------------------------------------------------------

    def _need_upstream(self) -> Upstream:
        if self._upstream is None:
            raise RuntimeError("Ec2Emulator.start() first")
        return self._upstream

    def _private_ip(self, instance_id: str) -> str:
        """The address of the instance's running machine ("" while it has none): elbv2's instance targets."""
        with self._lock:
            inst = self._instances.get(instance_id)
            return inst.private_ip if inst is not None and inst.on_host and inst.masked is None else ""

    def _forward(self, request: WireRequest) -> WireResponse:
        answer = self._need_upstream().forward(request)
        if answer.ok:
            with self._lock:
                self._performed[request.action] += 1
        return answer

    # --- RunInstances ------------------------------------------------------------------------------

    def _run_instances(self, request: WireRequest) -> WireResponse:
        params, region = request.params, request.region
        token = params.get("ClientToken", "")
        launched: list[Instance] = []
        with self._launch_lock:
            if token and (region, token) in self._tokens:
                first, body = self._tokens[(region, token)]
                if first != params:
                    raise AwsError(400, "IdempotentParameterMismatch",
                                   "Arguments on this idempotent request are inconsistent with arguments used in "
                                   "previous request(s).")
                return WireResponse(200, (("Content-Type", "text/xml;charset=UTF-8"),), body)
            user_data = self._user_data(params)
            self._check_profile(params)
            instance_type = params.get("InstanceType", "m1.small")
            self._check_type(region, instance_type)
            zone = self._zone_of(region, params)
            self._check_capacity(zone, instance_type)
            answer = self._forward(request)
            if not answer.ok:
                return answer
            root = parse_xml(answer.body)
            for item in items(root, "instancesSet"):
                inst = Instance(child_text(item, "instanceId"), region,
                                child_text(path(item, "placement"), "availabilityZone"),
                                child_text(item, "instanceType"), child_text(item, "imageId"), token, user_data,
                                masked=("running", "pending"))
                with self._lock:
                    self._instances[inst.id] = inst
                launched.append(inst)
                self._rewrite_instance(item)
            self._associate_rest(region, params, launched[1:])
            body = xml_bytes(root) if launched else answer.body
            if token:
                self._tokens[(region, token)] = (dict(params), body)
        ready_at = time.monotonic() + self.boot_seconds
        for inst in launched:
            self._spawn(self._boot, inst, inst.generation, ready_at)
        return answer.with_body(body)

    @staticmethod
    def _user_data(params: dict[str, str]) -> bytes:
        encoded = params.get("UserData", "")
        if not encoded:
            return b""
        try:
            raw = base64.b64decode(encoded.encode(), validate=True)
        except (binascii.Error, ValueError):
            raise AwsError(400, "InvalidParameterValue", "Invalid BASE64 encoding of user data.") from None
        if len(raw) > USER_DATA_LIMIT:
            raise AwsError(400, "InvalidParameterValue", f"User data is limited to {USER_DATA_LIMIT} bytes")
        return raw

    def _check_type(self, region: str, instance_type: str) -> None:
        """EC2 refuses a type it does not sell (moto's catalogue: every real type, GPU ones included)."""
        if (region, instance_type) in self._known_types:
            return
        answer = self._need_upstream().ec2(region, "DescribeInstanceTypes", {"InstanceType.1": instance_type})
        root = parse_xml(answer.body) if answer.ok else None
        if not any(child_text(i, "instanceType") == instance_type for i in items(root, "instanceTypeSet")):
            raise AwsError(400, "InvalidParameterValue", f"Invalid value '{instance_type}' for InstanceType.")
        self._known_types.add((region, instance_type))

    def _zone_of(self, region: str, params: dict[str, str]) -> str:
        """The zone a RunInstances lands in: its Placement, its subnet's zone, else moto's REGION + 'a'."""
        zone = params.get("Placement.AvailabilityZone", "")
        subnet = params.get("SubnetId") or params.get("NetworkInterface.1.SubnetId", "")
        if not zone and subnet:
            answer = self._need_upstream().ec2(region, "DescribeSubnets", {"SubnetId.1": subnet})
            root = parse_xml(answer.body) if answer.ok else None
            zone = next((child_text(s, "availabilityZone") for s in items(root, "subnetSet")), "")
            if not zone:
                return ""  # an unknown subnet: moto answers InvalidSubnetID.NotFound
        zone = zone or region + "a"
        if region == self.region and zone not in self.zones:
            raise AwsError(400, "InvalidParameterValue", f"Invalid availability zone: [{zone}]")
        return zone

    def _check_capacity(self, zone: str, instance_type: str) -> None:
        with self._lock:
            if self._capacity.get((zone, instance_type), True):
                return
            elsewhere = [z for z in self.zones if z != zone and self._capacity.get((z, instance_type), True)]
        hint = (f" You can currently get {instance_type} capacity by not specifying an Availability Zone in your "
                f"request or choosing {', '.join(elsewhere)}." if elsewhere else "")
        raise AwsError(500, "InsufficientInstanceCapacity",
                       f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
                       f"requested ({zone}). Our system will be working on provisioning additional capacity.{hint}")

    # --- instances another service launched or terminated inside moto (aws_autoscaling.py) -----------

    def adopt(self, region: str, user_data: Mapping[str, bytes]) -> None:
        """Instances moto launched by itself (an Auto Scaling group's): each gets a machine, as RunInstances does
        (`pending` for boot_seconds, then hosts.create with its user-data)."""
        with self._lock:
            new = [i for i in user_data if i not in self._instances]
        if not new:
            return
        params = {f"InstanceId.{n}": i for n, i in enumerate(new, start=1)}
        root = parse_xml(self._need_upstream().ec2(region, "DescribeInstances", params).body)
        launched = []
        for reservation in items(root, "reservationSet"):
            for item in items(reservation, "instancesSet"):
                inst = Instance(child_text(item, "instanceId"), region,
                                child_text(path(item, "placement"), "availabilityZone"),
                                child_text(item, "instanceType"), child_text(item, "imageId"), "",
                                user_data[child_text(item, "instanceId")], masked=("running", "pending"))
                with self._lock:
                    if inst.id in self._instances:
                        continue
                    self._instances[inst.id] = inst
                launched.append(inst)
        ready_at = time.monotonic() + self.boot_seconds
        for inst in launched:
            self._spawn(self._boot, inst, inst.generation, ready_at)

    def machines_gone(self, region: str, instance_ids: Iterable[str]) -> None:
        """Instances moto already terminated by itself: they leave their target groups (draining), then their
        machines go (`shutting-down` until then)."""
        known = self._known(list(instance_ids))
        self.elbv2.instances_terminated(region, [i.id for i in known])
        for inst in known:
            with self._lock:
                inst.generation += 1
                inst.masked = ("terminated", "shutting-down")
                generation = inst.generation
            self._spawn(self._destroy, inst, generation, 0.0)

    # --- Start / Stop / Terminate ------------------------------------------------------------------

    def _known(self, ids: list[str]) -> list[Instance]:
        with self._lock:
            return [self._instances[i] for i in ids if i in self._instances]

    @staticmethod
    def _incorrect_state(inst: Instance, shown: str, verb: str) -> AwsError:
        return AwsError(400, "IncorrectInstanceState",
                        f"This instance '{inst.id}' is not in a state from which it can be {verb} ({shown}).")

    def _start_instances(self, request: WireRequest) -> WireResponse:
        instances = self._known(repeated(request.params, "InstanceId"))
        with self._lock:
            for inst in instances:
                if inst.masked and inst.masked[1] in ("stopping", "shutting-down"):
                    raise self._incorrect_state(inst, inst.masked[1], "started")
            for inst in instances:
                if inst.id in self._restart_failures:
                    self._restart_failures.discard(inst.id)
                    self._capacity_failure(inst)
                self._check_capacity(inst.zone, inst.instance_type)
        answer = self._forward(request)
        if answer.ok:
            self._transition(answer, ("stopped",), ("running", "pending"), self._start, self.start_seconds)
        return answer

    def _capacity_failure(self, inst: Instance) -> None:
        raise AwsError(500, "InsufficientInstanceCapacity",
                       f"We currently do not have sufficient {inst.instance_type} capacity in the Availability Zone "
                       f"you requested ({inst.zone}). Our system will be working on provisioning additional capacity.")

    def _stop_instances(self, request: WireRequest) -> WireResponse:
        with self._lock:
            for inst in self._known(repeated(request.params, "InstanceId")):
                if inst.masked and inst.masked[1] in ("pending", "shutting-down"):
                    raise self._incorrect_state(inst, inst.masked[1], "stopped")
        answer = self._forward(request)
        if answer.ok:
            self._transition(answer, ("running", "pending"), ("stopped", "stopping"), self._stop, 0.0)
        return answer

    def _terminate_instances(self, request: WireRequest) -> WireResponse:
        answer = self._forward(request)
        if answer.ok:
            self.elbv2.instances_terminated(request.region, repeated(request.params, "InstanceId"))
            self._transition(answer, ("pending", "running", "stopping", "stopped"), ("terminated", "shutting-down"),
                             self._destroy, 0.0)
        return answer

    def _transition(self, answer: WireResponse, sources: tuple[str, ...], masked: tuple[str, str],
                    worker: Callable[[Instance, int, float], None], seconds: float) -> None:
        """For each instance moto moved out of one of `sources`: show `masked`, run the machine's side."""
        done_at = time.monotonic() + seconds
        root = parse_xml(answer.body)
        for item in items(root, "instancesSet"):
            previous = child_text(path(item, "previousState"), "name")
            with self._lock:
                inst = self._instances.get(child_text(item, "instanceId"))
                if inst is None or previous not in sources:
                    continue
                inst.generation += 1
                inst.masked = masked
                generation = inst.generation
            self._spawn(worker, inst, generation, done_at)

    # --- the machines: one worker per transition, ordered per instance by its host_lock ------------

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        """Slow work runs off the request thread so the API answers at once, as EC2 does."""
        worker = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _sleep_until(self, deadline: float) -> bool:
        """Wait for a transition's end; False when the emulator is closing."""
        return not self._closing.wait(max(0.0, deadline - time.monotonic()))

    def _still(self, inst: Instance, generation: int) -> bool:
        with self._lock:
            return inst.generation == generation and not self._closing.is_set()

    def _unmask(self, inst: Instance, generation: int) -> None:
        with self._lock:
            if inst.generation == generation:
                inst.masked = None

    def _host_failed(self, resource_id: str, call: str, exc: BaseException) -> None:
        with self._lock:
            self.host_errors.append((resource_id, f"{call}: {type(exc).__name__}: {exc}"[:500]))

    def _moto_says(self, inst: Instance, generation: int, action: str) -> None:
        """Bring moto's state back to the machine's after a backend failure (the client sees the outcome)."""
        with self._lock:
            if inst.generation != generation:
                return
            inst.generation += 1
            inst.masked = None
        if self._upstream is not None:
            self._upstream.ec2(inst.region, action, {"InstanceId.1": inst.id})

    def _boot(self, inst: Instance, generation: int, ready_at: float) -> None:
        """`pending` first (boot_seconds: EC2 placing and powering on the VM), then the machine boots for real:
        as on EC2, nothing on the machine (its user-data) runs while the API still says pending."""
        if not self._sleep_until(ready_at):
            return
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                ip = self.hosts.create(inst.id, inst.image_id, inst.user_data)
            except Exception as exc:  # a machine that cannot boot: EC2 terminates the instance
                self._host_failed(inst.id, "create", exc)
                self._moto_says(inst, generation, "TerminateInstances")
                return
            with self._lock:
                inst.on_host, inst.private_ip = True, ip
        self._unmask(inst, generation)

    def _start(self, inst: Instance, generation: int, done_at: float) -> None:
        """`pending` for start_seconds, then the machine powers on (its disk and containers as they were)."""
        if not self._sleep_until(done_at):
            return
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                ip = self.hosts.start(inst.id)
            except Exception as exc:  # the start failed: the instance stays stopped
                self._host_failed(inst.id, "start", exc)
                self._moto_says(inst, generation, "StopInstances")
                return
            with self._lock:
                inst.private_ip = ip
        self._unmask(inst, generation)

    def _stop(self, inst: Instance, generation: int, done_at: float) -> None:
        with inst.host_lock:
            if not self._still(inst, generation):
                return
            try:
                if inst.on_host:
                    self.hosts.stop(inst.id)
            except Exception as exc:  # the stop failed: the machine keeps running
                self._host_failed(inst.id, "stop", exc)
                self._moto_says(inst, generation, "StartInstances")
                return
        self._unmask(inst, generation)

    def _destroy(self, inst: Instance, generation: int, done_at: float) -> None:
        with inst.host_lock:        # after a create still in flight, so no machine is left behind
            if inst.on_host:
                try:
                    self.hosts.delete(inst.id)
                    inst.on_host = False
                except Exception as exc:  # reported; EC2 already says terminated
                    self._host_failed(inst.id, "delete", exc)
        self._unmask(inst, generation)

    # --- answers rewritten ---------------------------------------------------------------------------

    def _describe_instances(self, request: WireRequest) -> WireResponse:
        with self._launch_lock:      # a RunInstances in flight registers its instances first
            answer = self._forward(request)
        root = parse_xml(answer.body) if answer.ok else None
        if root is None:
            return answer
        changed = False
        for reservation in items(root, "reservationSet"):
            for item in items(reservation, "instancesSet"):
                changed |= self._rewrite_instance(item)
        for item in items(root, "instanceStatusSet"):
            changed |= self._rewrite_state(item)
        return answer.with_body(xml_bytes(root)) if changed else answer

    def _rewrite_state(self, item) -> bool:
        with self._lock:
            inst = self._instances.get(child_text(item, "instanceId"))
            masked = inst.masked if inst is not None else None
        state = child(item, "instanceState")
        if masked is None or state is None or child_text(state, "name") != masked[0]:
            return False
        for element in state:
            if local(element.tag) == "name":
                element.text = masked[1]
            elif local(element.tag) == "code":
                element.text = str(STATE_CODES[masked[1]])
        return True

    def _rewrite_instance(self, item) -> bool:
        """State masked during a transition; addresses made the machine's own (or left out, before it exists)."""
        with self._lock:
            inst = self._instances.get(child_text(item, "instanceId"))
            ip = inst.private_ip if inst is not None else ""
        if inst is None:
            return False
        changed = self._rewrite_state(item)
        moto_ips = {e.text for _, e in walk_with_parents(item) if local(e.tag) in ADDRESS_ELEMENTS and e.text}
        for parent, element in list(walk_with_parents(item)):
            name = local(element.tag)
            if name in ADDRESS_ELEMENTS:
                if not ip:
                    parent.remove(element)
                    changed = True
                elif element.text != ip:
                    element.text, changed = ip, True
            elif name in DNS_ELEMENTS and element.text:
                spelled = [old for old in moto_ips if _dashed(old) in element.text]
                if spelled and not ip:
                    parent.remove(element)
                    changed = True
                elif spelled:
                    for old in spelled:
                        element.text = element.text.replace(_dashed(old), _dashed(ip))
                    changed = True
        return changed

    # --- instance profiles at launch -----------------------------------------------------------------------

    def _check_profile(self, params: dict[str, str]) -> None:
        check_profile(self._need_upstream(), params)

    def _associate_rest(self, region: str, params: dict[str, str], rest: list[Instance]) -> None:
        """moto associates the profile with the first instance of a RunInstances only; EC2 with each."""
        profile = {k: v for k, v in params.items() if k in PROFILE_KEYS}
        for inst in rest if profile else []:
            self._need_upstream().ec2(region, "AssociateIamInstanceProfile", {"InstanceId": inst.id, **profile})

