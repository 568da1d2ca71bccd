"""AWS EC2 (with ECR and SSM) for tests: moto's server, and in front of it a harness that adds what moto lacks.

Why moto behind a proxy: moto 5 keeps a faithful EC2 API state (instances, reservations, volumes,
tags, AMIs, the SSM public parameters, ECR), but it ignores ClientToken, accepts unknown instance
types, never runs out of capacity, never runs user-data, reports `running` at once and invents
addresses nothing can reach. The deploy code must meet the real boto3 wire, so the harness sits on
the wire (aws_wire.py): it forwards every request to moto unchanged and adds, around moto:

- ClientToken idempotency for RunInstances: the same token (in the same region) gets the first
  answer's body again, and no second instance; other parameters with the same token answer 400
  IdempotentParameterMismatch. boto3 fills a fresh token into every RunInstances *call* (its own
  retries of one call resend the same one), so a retry loop of the product's own must pass its token.
- Instance types: an unknown type answers 400 InvalidParameterValue, as EC2 does (moto's optional
  check answers another code).
- Capacity and faults: `set_capacity`, `fail_restart`, `fail_next` (EC2's XML error shape; JSON
  for ECR/SSM), `hold`; `after_effect=True` carries the call out and loses the answer.
- Real machines behind the instances (a HostBackend, hosts_api.py): RunInstances -> hosts.create with
  the base64-decoded UserData, as EC2 hands it to cloud-init; Stop/Start/Terminate -> stop/start/delete;
  CreateImage -> snapshot (image id = moto's new AMI id; `pending` until the copy is done);
  DeregisterImage -> delete_image.
- States: DescribeInstances says `pending` until the machine was created and boot_seconds passed
  (start_seconds after a StartInstances), `stopping` until the machine is off, `shutting-down` until
  it is gone. A stop while pending or a start while stopping answers IncorrectInstanceState.
- Addresses: privateIpAddress / ipAddress / publicIp (and the DNS names spelling them) become the
  machine's own address, which the test process and the other machines can reach. Until a machine
  exists, an instance has no address elements at all (moto's would lead nowhere).
- Credentials: with `access_keys`, every request must carry a valid SigV4 signature by one of them
  (EC2 answers 401 AuthFailure, ECR/SSM UnrecognizedClientException / InvalidSignatureException, STS
  403 InvalidClientTokenId / SignatureDoesNotMatch); moto alone accepts any credentials.
- SSM: moto serves the ECS-optimized AMI parameters as Python dict reprs; they become JSON, as AWS
  serves them. Run Command (moto records SendCommand and reports Success at once, running nothing):
  SendCommand of AWS-RunShellScript runs `commands` (joined by newlines) on the machine through
  hosts.run_command, bounded by the executionTimeout parameter; GetCommandInvocation answers from that
  run in AWS's shape (Pending / InProgress / Success / Failed / TimedOut, ResponseCode -1 until done,
  StandardOutputContent = the first 24,000 characters). As on AWS, the first GetCommandInvocation of a
  command answers InvocationDoesNotExist (the agent has not picked it up yet), and SendCommand to an
  instance that is not running, has no machine yet, or has no IamInstanceProfile associated (its agent
  could not register) answers 400 InvalidInstanceId.
- ECR: moto's authorization token expired in 2015; expiresAt becomes now + 12 h. moto's password is
  the same for everyone; each GetAuthorizationToken gets a password of its own instead (any works on
  the test registry), recorded in `issued_tokens` and, with who got it, in `token_grants`.
- Instance profiles and IMDSv2 (aws_imds.py): RunInstances with IamInstanceProfile (Name or Arn),
  Associate / Describe / Replace / DisassociateIamInstanceProfile(Associations) act on moto's state;
  an unknown profile answers 400 InvalidParameterValue (moto: IAM's NoSuchEntity), Replace makes a new
  association (moto kept the id and left DescribeInstances on the old profile), RunInstances with
  MinCount > 1 associates every instance (moto: the first). `metadata_address` serves IMDSv2 to the
  machines (the caller is its source address), handing out the role's session credentials; requests
  signed with them need their X-Amz-Security-Token, are refused once expired, and are authorized
  against the role's policies in moto's IAM (ECR GetAuthorizationToken -> AccessDeniedException).
  SSM Run Command needs an instance whose association exists now (not: was launched with a profile).
- Load balancers (elbv2): aws_elbv2.Elbv2Balancers (`.elbv2`) takes every request signed for
  elasticloadbalancing: a real haproxy per balancer, target health, draining, idempotent creates.
- Other services on the same wire: `routes` (request -> handler or None) and `closers`; aws_autoscaling.py
  hooks in there, and gives the instances moto launches or terminates by itself machines through `adopt` /
  `machines_gone`.

What the product must do to run against it (documented for the deploy tests): point boto3 at
`.endpoint` (AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_EC2/_ECR/_SSM), any access key, region = `region`;
clear HTTP(S)_PROXY. Machines reach IMDS at `metadata_address` (on `metadata_host`: the docker
bridge's gateway for DockerHosts, loopback for paper hosts; a machine's own 169.254.169.254:80 is
DNAT'ed there) and the API through a relay to `.endpoint`.
ECR's proxyEndpoint names https://123456789012.dkr.ecr.REGION.amazonaws.com, which does not exist:
tests give the product the loopback registry instead (NGCX_ECR_ENDPOINT=127.0.0.1:5000 for pushes, a
RegistryRelay address for the machines), and a token's password works there only because that
registry has no auth (so `token_grants` says what each token would be allowed to pull).

Limits (moto's, or kept out on purpose): moto's state is one per process, so only one Ec2Emulator
runs at a time; DescribeInstances *filters* on instance-state-name see moto's state, not the
pending/stopping the answer shows; a RunInstances naming no zone and no subnet lands in REGION + "a"
(moto's choice), so capacity for that zone decides; CreateImage never reboots the instance (a running
machine is paused for a crash-consistent copy, as with NoReboot=true).
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self
from urllib.parse import urlencode

from moto.server import ThreadedMotoServer

from .aws_elbv2 import Elbv2Balancers
from .aws_imds import (
    PROFILE_KEYS,
    Caller,
    CredentialStore,
    Machine,
    MetadataService,
    association_of,
    authorize,
    caller_at,
    caller_identity,
    check_profile,
    profile_name,
    replace_association,
    resources_allowing,
    role_statements,
)
from .aws_wire import (
    AwsError,
    ProxyServer,
    Upstream,
    WireRequest,
    WireResponse,
    access_key_of,
    check_signature,
    child,
    child_text,
    error_response,
    items,
    local,
    new_request_id,
    parse_xml,
    path,
    walk_with_parents,
    xml_bytes,
)
from .hosts_api import HostBackend

STATE_CODES = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}
USER_DATA_LIMIT = 16 * 1024            # bytes before base64, as EC2 counts them
ECR_TOKEN_SECONDS = 12 * 3600
ADDRESS_ELEMENTS = frozenset({"privateIpAddress", "ipAddress", "publicIp"})
DNS_ELEMENTS = frozenset({"privateDnsName", "dnsName", "publicDnsName"})
MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient capacity to fulfill your request.",
    "RequestLimitExceeded": "Request limit exceeded.",
    "InternalError": "An internal error has occurred.",
    "Unavailable": "The server is overloaded and can't handle the request.",
    "ThrottlingException": "Rate exceeded",
    "Throttling": "Rate exceeded",
    "AuthFailure": "AWS was not able to validate the provided access credentials",
    "UnauthorizedOperation": "You are not authorized to perform this operation.",
}


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


@dataclass
class Image:
    id: str
    source_instance: str
    state: str = "pending"
    done: threading.Event = field(default_factory=threading.Event, repr=False)


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


@dataclass
class Fault:
    code: str
    http_status: int
    remaining: int
    after_effect: bool


def repeated(params: dict[str, str], prefix: str) -> list[str]:
    """`InstanceId.1`, `InstanceId.2`, ... in index order (the query protocol's flattened list)."""
    found = [(int(key[len(prefix) + 1:]), value) for key, value in params.items()
             if key.startswith(prefix + ".") and key[len(prefix) + 1:].isdigit()]
    return [value for _, value in sorted(found)]


def _dashed(ip: str) -> str:
    return ip.replace(".", "-")


class Ec2Emulator:
    """EC2 + ECR + SSM on 127.0.0.1 (`.endpoint`): moto's ThreadedMotoServer behind the harness proxy."""

    _live_lock: ClassVar[threading.Lock] = threading.Lock()
    _live: ClassVar[Ec2Emulator | None] = None

    def __init__(self, hosts: HostBackend, *, region: str = "us-east-1",
                 zones: Iterable[str] = ("us-east-1a", "us-east-1b", "us-east-1c"),
                 boot_seconds: float = 0.5, start_seconds: float = 0.5,
                 access_keys: Mapping[str, str] | None = None, metadata_host: str = "127.0.0.1") -> None:
        """access_keys: key id -> secret; when given, every request must carry a valid SigV4 signature
        by one of them (moto alone accepts anything), so a wrong credential fails as on AWS. Session
        credentials from IMDS are always checked. metadata_host: where IMDS listens (an address the
        machines reach; it knows them by their source address)."""
        self.hosts = hosts
        self.access_keys = dict(access_keys) if access_keys is not None else None
        self.region = region
        self.zones = tuple(zones)
        self.boot_seconds, self.start_seconds = boot_seconds, start_seconds
        self.calls: list[tuple[str, Any]] = []          # (action, form fields or JSON body) as clients sent them
        self.host_errors: list[tuple[str, str]] = []    # (instance or image id, what the backend raised)
        self.issued_tokens: list[str] = []              # ECR passwords handed out (tests look for leaks)
        self.token_grants: list[dict[str, Any]] = []    # each ECR password: who got it, what it may pull
        self.metadata_host = metadata_host
        self._credentials = CredentialStore()
        self._imds: MetadataService | None = None
        self._imds_errors: list[str] = []
        self._profile_lock = threading.Lock()           # Replace (two moto calls) vs IMDS reading the profile
        self._lock = threading.RLock()
        self._launch_lock = threading.Lock()            # RunInstances vs DescribeInstances: never half-registered
        self._instances: dict[str, Instance] = {}
        self._images: dict[str, Image] = {}
        self._tokens: dict[tuple[str, str], tuple[dict[str, str], bytes]] = {}
        self._known_types: set[tuple[str, str]] = set()
        self._capacity: dict[tuple[str, str], bool] = {}
        self._restart_failures: set[str] = set()
        self._faults: dict[str, list[Fault]] = {}
        self._invocations: dict[tuple[str, str], Invocation] = {}
        self._holds: dict[str, threading.Event] = {}
        self._performed: Counter[str] = Counter()
        self._closing = threading.Event()
        self._workers: list[threading.Thread] = []
        self._moto: ThreadedMotoServer | None = None
        self._upstream: Upstream | None = None
        self._proxy: ProxyServer | None = None
        self._proxy_errors: list[str] = []
        self.elbv2 = Elbv2Balancers(self._forward, self._need_upstream, self._private_ip)
        # other services on this wire (aws_autoscaling.py): request -> its handler, or None; closed before the hosts
        self.routes: list[Callable[[WireRequest], Callable[[WireRequest], WireResponse] | None]] = []
        self.closers: list[Callable[[], None]] = []
        self._actions: dict[tuple[str, str], Callable[[WireRequest], WireResponse]] = {
            ("query", "RunInstances"): self._run_instances,
            ("query", "StartInstances"): self._start_instances,
            ("query", "StopInstances"): self._stop_instances,
            ("query", "TerminateInstances"): self._terminate_instances,
            ("query", "DescribeInstances"): self._describe_instances,
            ("query", "DescribeInstanceStatus"): self._describe_instances,
            ("query", "CreateImage"): self._create_image,
            ("query", "DeregisterImage"): self._deregister_image,
            ("query", "DescribeImages"): self._describe_images,
            ("query", "DescribeAvailabilityZones"): self._describe_zones,
            ("json", "GetParameter"): self._ssm_parameters,
            ("json", "GetParameters"): self._ssm_parameters,
            ("json", "GetParametersByPath"): self._ssm_parameters,
            ("json", "GetAuthorizationToken"): self._ecr_token,
            ("query", "AssociateIamInstanceProfile"): self._associate_profile,
            ("query", "ReplaceIamInstanceProfileAssociation"): self._replace_association,
            ("query", "GetCallerIdentity"): self._caller_identity,
            ("json", "SendCommand"): self._ssm_send_command,
            ("json", "GetCommandInvocation"): self._ssm_command_invocation,
        }

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start moto (reset to an empty cloud) and the proxy in front of it, both on loopback."""
        with Ec2Emulator._live_lock:
            if Ec2Emulator._live is not None:
                raise RuntimeError("an Ec2Emulator is already running in this process; moto keeps one state "
                                   "per process, so run them one after another")
            Ec2Emulator._live = self
        try:
            import logging

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request line
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            self._upstream = Upstream(*self._moto.get_host_and_port())
            self._upstream.reset()
            # AWS's managed policies exist in every account (AmazonSSMManagedInstanceCore for SSM hosts); moto
            # (in this process) has them only when its config says so, read when an account's IAM first appears
            from moto.core.config import default_user_config

            default_user_config.setdefault("iam", {})["load_aws_managed_policies"] = True
            self._proxy = ProxyServer(self._handle, self.region).start()
            self._proxy_errors = self._proxy.errors
            self._imds = MetadataService(self.metadata_host, self._metadata_caller, self._credentials).start()
            self._imds_errors = self._imds.errors
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop serving, let the workers finish, have the backend remove its machines, stop moto."""
        try:
            for server in (self._proxy, self._imds):
                if server is not None:
                    server.close()
            self._proxy = self._imds = None
            self._closing.set()
            for closer in self.closers:
                closer()
            self.elbv2.close()
            for worker in list(self._workers):
                worker.join(timeout=120)
            self.hosts.close()
        finally:
            if self._upstream is not None:
                self._upstream.reset()
                self._upstream = None
            if self._moto is not None:
                self._moto.stop()
                self._moto = None
            with Ec2Emulator._live_lock:
                if Ec2Emulator._live is self:
                    Ec2Emulator._live = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        """What boto3's endpoint_url (or AWS_ENDPOINT_URL) must be: http://127.0.0.1:PORT."""
        if self._proxy is None:
            raise RuntimeError("Ec2Emulator.start() first")
        return self._proxy.endpoint

    @property
    def moto_endpoint(self) -> str:
        """moto itself, without the harness (for tests that compare the two wires)."""
        upstream = self._need_upstream()
        return f"http://{upstream.host}:{upstream.port}"

    @property
    def metadata_address(self) -> str:
        """IMDS as "host:port" (AWS's is 169.254.169.254:80): plain HTTP, IMDSv2, caller = source address."""
        if self._imds is None:
            raise RuntimeError("Ec2Emulator.start() first")
        return self._imds.address

    @property
    def proxy_errors(self) -> list[str]:
        """Harness bugs that were answered as 500 InternalError (a test should assert there are none)."""
        return list(self._proxy_errors) + list(self._imds_errors) + list(self.elbv2.errors)

    def balancer_address(self, dns_name_or_arn: str, listener_port: int) -> tuple[str, int]:
        """Where a load balancer's listener is served (its haproxy): send its traffic there."""
        return self.elbv2.balancer_address(dns_name_or_arn, listener_port)

    # --- fault injection and inspection (tests) ---------------------------------------------------

    def fail_next(self, action: str, code: str, http_status: int, times: int = 1, after_effect: bool = False) -> None:
        """The next `times` calls of `action` answer this error; with after_effect the call is carried
        out first (the cloud did it, the answer got lost)."""
        with self._lock:
            self._faults.setdefault(action, []).append(Fault(code, http_status, times, after_effect))

    def hold(self, action: str, event: threading.Event) -> None:
        """After carrying out `action`, answer only once `event` is set (a client can die meanwhile)."""
        with self._lock:
            self._holds[action] = event

    def performed(self, action: str) -> int:
        """How many calls of `action` moto carried out (ClientToken replays and refusals excluded)."""
        with self._lock:
            return self._performed[action]

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

    def commands_sent(self, instance_id: str) -> list[str]:
        """The scripts of the Run Commands this instance has been sent, in order (each a round trip of a deploy)."""
        with self._lock:
            return [i.script for i in self._invocations.values() if i.instance_id == instance_id]

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

    def issued_secrets(self) -> list[str]:
        """Every session credential's secret key and token IMDS handed out (tests look for leaks)."""
        return self._credentials.secrets()

    def expire_session_credentials(self) -> None:
        """Every session credential issued so far expires now; IMDS hands out new ones on the next read."""
        self._credentials.expire_all()

    def images(self) -> list[dict[str, str]]:
        """Images made by CreateImage through the emulator: id, state, source instance."""
        with self._lock:
            return [{"id": m.id, "state": m.state, "source_instance": m.source_instance}
                    for m in self._images.values()]

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

    # --- the request path -------------------------------------------------------------------------

    def _need_upstream(self) -> Upstream:
        if self._upstream is None:
            raise RuntimeError("Ec2Emulator.start() first")
        return self._upstream

    def _handle(self, request: WireRequest) -> WireResponse:
        with self._lock:
            self.calls.append((request.action, dict(request.params) if request.protocol != "json"
                               else request.document))
        try:
            self._authenticate(request)
        except AwsError as error:
            return error_response(request, error)
        fault = self._take_fault(request.action)
        if fault is not None and not fault.after_effect:
            return self._fault_answer(request, fault)
        action = (self.elbv2.route(request) or next((h for r in self.routes if (h := r(request)) is not None), None)
                  or self._actions.get((request.protocol, request.action), self._forward))
        try:
            answer = action(request)
        except AwsError as error:
            answer = error_response(request, error)
        if answer.ok:
            self._wait_hold(request.action)
        if fault is not None:
            return self._fault_answer(request, fault)
        return answer

    def _private_ip(self, instance_id: str) -> str:
        """The address of the instance's running machine ("" while it has none): elbv2's instance targets."""
        with self._lock:
            inst = self._instances.get(instance_id)
            return inst.private_ip if inst is not None and inst.on_host and inst.masked is None else ""

    def _authenticate(self, request: WireRequest) -> None:
        """Long-term keys when access_keys is set; session credentials always, then their role's policies."""
        session = self._credentials.get(access_key_of(request))
        if self.access_keys is not None or session is not None:
            check_signature(request, self.access_keys or {},
                            sessions={session.access_key_id: session} if session is not None else None)
        if session is not None:
            authorize(self._need_upstream(), request, session)

    @staticmethod
    def _fault_answer(request: WireRequest, fault: Fault) -> WireResponse:
        message = MESSAGES.get(fault.code, f"The request failed: {fault.code}.")
        return error_response(request, AwsError(fault.http_status, fault.code, message))

    def _take_fault(self, action: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(action) or []
            if not queue:
                return None
            fault = queue[0]
            fault.remaining -= 1
            if fault.remaining <= 0:
                queue.pop(0)
            return fault

    def _wait_hold(self, action: str) -> None:
        with self._lock:
            event = self._holds.get(action)
        while event is not None and not event.wait(0.05) and not self._closing.is_set():
            pass

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

    def _create_image(self, request: WireRequest) -> WireResponse:
        name = request.params.get("Name", "")
        taken = parse_xml(self._need_upstream().ec2(request.region, "DescribeImages", {
            "Owner.1": "self", "Filter.1.Name": "name", "Filter.1.Value.1": name}).body)
        for item in items(taken, "imagesSet"):   # EC2 keeps image names unique per account and region; moto does not
            raise AwsError(400, "InvalidAMIName.Duplicate",
                           f"AMI name {name} is already in use by AMI {child_text(item, 'imageId')}")
        forwarded, snapshot_tags = _without_snapshot_tags(request)
        answer = self._forward(forwarded)
        root = parse_xml(answer.body) if answer.ok else None
        image_id = child_text(root, "imageId") if root is not None else ""
        if not image_id:
            return answer
        if snapshot_tags:
            self._tag_snapshots(request.region, image_id, snapshot_tags)
        source = request.params.get("InstanceId", "")
        with self._lock:
            inst = self._instances.get(source)
            image = Image(image_id, source)
            self._images[image_id] = image
        self._spawn(self._snapshot, inst, image)
        return answer

    def _tag_snapshots(self, region: str, image_id: str, tags: list[tuple[str, str]]) -> None:
        """What moto cannot do in CreateImage (TagSpecifications for `snapshot`): tag the image's snapshots."""
        upstream = self._need_upstream()
        root = parse_xml(upstream.ec2(region, "DescribeImages", {"ImageId.1": image_id}).body)
        snapshots = [child_text(path(m, "ebs"), "snapshotId") for i in items(root, "imagesSet")
                     for m in items(i, "blockDeviceMapping") if path(m, "ebs") is not None]
        params = {f"ResourceId.{n}": s for n, s in enumerate((s for s in snapshots if s), start=1)}
        if params:
            for n, (key, value) in enumerate(tags, start=1):
                params[f"Tag.{n}.Key"], params[f"Tag.{n}.Value"] = key, value
            upstream.ec2(region, "CreateTags", params)

    def _snapshot(self, inst: Instance | None, image: Image) -> None:
        try:
            if inst is None:
                raise RuntimeError("the instance was not launched through this emulator")
            with inst.host_lock:    # after a stop in flight: the machine is off (or paused by the backend)
                if not inst.on_host:
                    raise RuntimeError("the instance has no machine (terminated or never booted)")
                self.hosts.snapshot(inst.id, image.id)
            state = "available"
        except Exception as exc:  # reported as the image's `failed` state
            self._host_failed(image.id, "snapshot", exc)
            state = "failed"
        with self._lock:
            image.state = state
        image.done.set()

    def _deregister_image(self, request: WireRequest) -> WireResponse:
        answer = self._forward(request)
        if answer.ok:
            with self._lock:
                image = self._images.pop(request.params.get("ImageId", ""), None)
            if image is not None:
                self._spawn(self._drop_image, image)
        return answer

    def _drop_image(self, image: Image) -> None:
        while not image.done.wait(0.1):
            if self._closing.is_set():
                return
        if image.state == "available":
            try:
                self.hosts.delete_image(image.id)
            except Exception as exc:  # reported; the API already forgot the image
                self._host_failed(image.id, "delete_image", exc)

    def _describe_images(self, request: WireRequest) -> WireResponse:
        answer = self._forward(request)
        root = parse_xml(answer.body) if answer.ok else None
        if root is None:
            return answer
        changed = False
        for item in items(root, "imagesSet"):
            with self._lock:
                image = self._images.get(child_text(item, "imageId"))
                state = image.state if image is not None else ""
            element = child(item, "imageState")
            if state and element is not None and element.text != state:
                element.text, changed = state, True
        return answer.with_body(xml_bytes(root)) if changed else answer

    def _describe_zones(self, request: WireRequest) -> WireResponse:
        """Only the emulator's zones exist in its region (so a product's zone failover stays inside them)."""
        answer = self._forward(request)
        root = parse_xml(answer.body) if answer.ok and request.region == self.region else None
        zone_set = child(root, "availabilityZoneInfo") if root is not None else None
        if zone_set is None:
            return answer
        dropped = [z for z in zone_set if child_text(z, "zoneName") not in self.zones]
        for zone in dropped:
            zone_set.remove(zone)
        return answer.with_body(xml_bytes(root)) if dropped else answer

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

    def _ecr_token(self, request: WireRequest) -> WireResponse:
        """ECR tokens are valid 12 hours (moto's expired in 2015, which a token cache would never reuse);
        each call gets its own password, recorded with its caller and what that caller may pull."""
        answer = self._forward(request)
        if not answer.ok:
            return answer
        document = json.loads(answer.body)
        session = self._credentials.get(access_key_of(request))
        caller = f"role:{session.role}" if session is not None else f"key:{access_key_of(request)}"
        pull = (resources_allowing(role_statements(self._need_upstream(), session.role), "ecr:BatchGetImage")
                if session is not None else ["*"])
        for data in document.get("authorizationData") or []:
            password = secrets.token_urlsafe(96)
            data["authorizationToken"] = base64.b64encode(f"AWS:{password}".encode()).decode()
            with self._lock:
                self.issued_tokens.append(password)
                self.token_grants.append({"token": password, "caller": caller, "pull": pull,
                                          "instance": session.instance_id if session is not None else None})
            expires = data.get("expiresAt")
            if isinstance(expires, int | float) and expires < time.time():
                data["expiresAt"] = time.time() + ECR_TOKEN_SECONDS
        return answer.with_body(json.dumps(document).encode())

    # --- instance profiles, IMDS, session callers ---------------------------------------------------------

    def _check_profile(self, params: dict[str, str]) -> None:
        check_profile(self._need_upstream(), params)

    def _associate_rest(self, region: str, params: dict[str, str], rest: list[Instance]) -> None:
        """moto associates the profile with the first instance of a RunInstances only; EC2 with each."""
        profile = {k: v for k, v in params.items() if k in PROFILE_KEYS}
        for inst in rest if profile else []:
            self._need_upstream().ec2(region, "AssociateIamInstanceProfile", {"InstanceId": inst.id, **profile})

    def _associate_profile(self, request: WireRequest) -> WireResponse:
        self._check_profile(request.params)
        with self._profile_lock:
            return self._forward(request)

    def _replace_association(self, request: WireRequest) -> WireResponse:
        """One lock with IMDS's profile reads: it never sees the gap between the two moto calls."""
        with self._profile_lock:
            answer = replace_association(self._need_upstream(), request.region, request.params)
        if answer.ok:
            with self._lock:
                self._performed[request.action] += 1
        return answer

    def _caller_identity(self, request: WireRequest) -> WireResponse:
        session = self._credentials.get(access_key_of(request))
        return caller_identity(self._need_upstream(), session) if session is not None else self._forward(request)

    def _metadata_caller(self, ip: str) -> Caller | None:
        """IMDS's caller: the running instance whose machine has this address (moto says its profile)."""
        with self._lock:
            near = [Machine(i.id, i.region, i.zone, i.instance_type, i.image_id, i.private_ip, i.user_data)
                    for i in self._instances.values() if i.on_host and i.masked is None and i.private_ip == ip]
        if not near:
            return None
        with self._profile_lock:
            return caller_at(self._need_upstream(), near)

    # --- SSM Run Command: the commands run on the machine ----------------------------------------------

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


def _without_snapshot_tags(request: WireRequest) -> tuple[WireRequest, list[tuple[str, str]]]:
    """CreateImage's TagSpecification.N for ResourceType=snapshot (moto raises NotImplementedError on them),
    taken out of the request moto gets; the harness applies them itself."""
    params = request.params
    numbers = {key.split(".")[1] for key, value in params.items()
               if key.startswith("TagSpecification.") and key.endswith(".ResourceType") and value == "snapshot"}
    if not numbers:
        return request, []
    prefixes = tuple(f"TagSpecification.{n}." for n in numbers)
    tags = [(params[key], params.get(key[:-len("Key")] + "Value", "")) for key in sorted(params)
            if key.startswith(prefixes) and key.endswith(".Key")]
    kept = {key: value for key, value in params.items() if not key.startswith(prefixes)}
    return replace(request, body=urlencode(kept).encode(), params=kept), tags
