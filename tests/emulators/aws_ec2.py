"""AWS EC2 (with ECR and SSM) for tests: moto's server, and in front of it a harness that adds what moto lacks.

Why moto behind a proxy: moto 5 keeps a faithful EC2 API state (instances, reservations, volumes,
tags, AMIs, the SSM public parameters, ECR), but it ignores ClientToken, accepts unknown instance
types, never runs out of capacity, never runs user-data, reports `running` at once and invents
addresses nothing can reach. The deploy code must meet the real boto3 wire, so the harness sits on
the wire (aws_wire.py): it forwards every request to moto unchanged and adds, around moto, one module
per API family, each a class Ec2Emulator inherits (none imports this module):

- aws_ec2_machines.py: the instances and the real machines behind them (HostBackend, hosts_api.py):
  ClientToken idempotency, instance types, capacity, pending / stopping / shutting-down while a machine
  changes, the machines' own addresses; the base of the others.
- aws_ec2_images.py: CreateImage / DeregisterImage / DescribeImages as snapshots of the machines.
- aws_ssm.py: SSM Run Command run on the machines; the public parameters as JSON.
- aws_ecr.py: ECR tokens valid 12 hours, one password per call, recorded in `issued_tokens` / `token_grants`.
- Instance profiles and IMDSv2 (aws_imds.py), load balancers (aws_elbv2.py): helpers this module wires in.

This module owns the wire itself: the lifecycle (moto, the proxy, IMDS), the request path (who is
calling, fault injection, which family answers), the credentials check and the profile calls:

- Faults: `set_capacity`, `fail_restart`, `fail_next` (EC2's XML error shape; JSON for ECR/SSM), `hold`;
  `after_effect=True` carries the call out and loses the answer.
- Credentials: with `access_keys`, every request must carry a valid SigV4 signature by one of them
  (EC2 answers 401 AuthFailure, ECR/SSM UnrecognizedClientException / InvalidSignatureException, STS
  403 InvalidClientTokenId / SignatureDoesNotMatch); moto alone accepts any credentials.
- Instance profiles and IMDSv2 (aws_imds.py): RunInstances with IamInstanceProfile (Name or Arn),
  Associate / Describe / Replace / DisassociateIamInstanceProfile(Associations) act on moto's state;
  an unknown profile answers 400 InvalidParameterValue (moto: IAM's NoSuchEntity), Replace makes a new
  association (moto kept the id and left DescribeInstances on the old profile). `metadata_address` serves
  IMDSv2 to the machines (the caller is its source address), handing out the role's session credentials;
  requests signed with them need their X-Amz-Security-Token, are refused once expired, and are authorized
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
DNAT'ed there) and the API through a relay to `.endpoint`; ECR's registry: see aws_ecr.py.

Limits (moto's, or kept out on purpose): moto's state is one per process, so only one Ec2Emulator
runs at a time; DescribeInstances *filters* on instance-state-name see moto's state, not the
pending/stopping the answer shows; a RunInstances naming no zone and no subnet lands in REGION + "a"
(moto's choice), so capacity for that zone decides; CreateImage never reboots the instance (a running
machine is paused for a crash-consistent copy, as with NoReboot=true).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from moto.server import ThreadedMotoServer

from .aws_ec2_images import Ec2Images
from .aws_ecr import EcrTokens
from .aws_imds import Caller, Machine, MetadataService, authorize, caller_at, caller_identity, replace_association
from .aws_ssm import SsmRunCommand
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
    parse_xml,
    xml_bytes,
)
from .hosts_api import HostBackend

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
class Fault:
    code: str
    http_status: int
    remaining: int
    after_effect: bool


class Ec2Emulator(SsmRunCommand, EcrTokens, Ec2Images):
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
        super().__init__(hosts, region=region, zones=zones, boot_seconds=boot_seconds, start_seconds=start_seconds)
        self.access_keys = dict(access_keys) if access_keys is not None else None
        self.calls: list[tuple[str, Any]] = []          # (action, form fields or JSON body) as clients sent them
        self.metadata_host = metadata_host
        self._imds: MetadataService | None = None
        self._imds_errors: list[str] = []
        self._profile_lock = threading.Lock()           # Replace (two moto calls) vs IMDS reading the profile
        self._faults: dict[str, list[Fault]] = {}
        self._holds: dict[str, threading.Event] = {}
        self._moto: ThreadedMotoServer | None = None
        self._proxy: ProxyServer | None = None
        self._proxy_errors: list[str] = []
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

    def issued_secrets(self) -> list[str]:
        """Every session credential's secret key and token IMDS handed out (tests look for leaks)."""
        return self._credentials.secrets()

    def expire_session_credentials(self) -> None:
        """Every session credential issued so far expires now; IMDS hands out new ones on the next read."""
        self._credentials.expire_all()

    # --- the request path -------------------------------------------------------------------------

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
