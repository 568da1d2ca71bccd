"""A service's AWS load balancer: balancer.py's contract on an Application Load Balancer (boto3 `elbv2`).

Why ALB: ngcx endpoints are HTTP (KServe v2), so a layer-7 balancer can check the keyless health route
(a NLB checks TCP or HTTP but cannot terminate TLS with an ACM certificate on HTTP semantics, and the
Classic ELB is the previous generation). One service = one internet-facing ALB over the default subnets
of every zone of the VPC (an ALB needs two zones; a replica that fails over to another zone must still
get traffic, and an ALB routes only to targets in its enabled zones), one target group (type
`instance`, the hosts' own TLS on spec.target_port, not verified by the balancer, as AWS does), one
listener forwarding to it (during a canary release a second group, `<group>-w`, beside it and a weighted
forward: elb_weights.py). All three carry the same name (fit_name: elbv2 names are at most 32
characters) and the spec's tags; creates in elbv2 are idempotent by name (same settings: same ARN), and
ensure() finds by name first, so a retry after a lost answer or a killed ngcx makes no duplicate.

Listener: HTTPS on spec.port with spec.certificate_id (an ACM certificate ARN) when one is given; else
plain HTTP, on port 80 when spec.port is 443 (a client of port 443 expects TLS), else on spec.port
(listener_of and service_url say which). Security groups: one per owner and VPC, `ngcx-balancer-<owner>`
(kept, like Ec2's `ngcx-serve-<owner>`), lets each service's listener port in from anywhere and reaches
the targets by its default egress; the hosts' group (Ec2.security_group) gets an ingress rule for
spec.target_port from that group, so the balancer's checks and requests reach port 8000.

Waits, each bounded: ensure polls DescribeLoadBalancers until the balancer is `active` (ACTIVE_WAIT_S:
AWS provisions in one to five minutes); deregister polls until the target reads draining or gone
(DRAIN_START_S: DescribeTargetHealth is eventually consistent; the drain itself, spec.drain_s, is
AWS's); delete retries DeleteTargetGroup while AWS still calls the group in use by the balancer being
deleted (DELETE_WAIT_S). API calls go through Ec2's api (cli/clouds/aws.py: retries, errors without
secrets); what is gone already counts as done.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...core.errors import UserError
from .. import vm
from ..balancer import BalancerRef, BalancerSpec
from .elb_weights import Weights, side_name

if TYPE_CHECKING:
    from .ec2 import Ec2

NAME_MAX = 32                      # elbv2: load balancer and target group names
SSL_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
HTTP_PORT = 80
ACTIVE_WAIT_S = 600.0              # CreateLoadBalancer -> `active`
DRAIN_START_S = 20.0               # DeregisterTargets -> DescribeTargetHealth says draining (or gone)
DELETE_WAIT_S = 300.0              # DeleteLoadBalancer -> its target group may be deleted
CREATE_TRIES = 3                   # CreateListener after a 5xx: looked for first, then sent again
PAGE_SIZE = 400                    # elbv2's largest page
TAG_BATCH = 20                     # DescribeTags takes at most 20 ARNs
DELAY_KEY = "deregistration_delay.timeout_seconds"
sleep = time.sleep                 # the waits' pause (tests replace it)
ACTIVE = ("active", "active_impaired")      # active_impaired serves traffic; it only cannot scale for now
# AWS's target states -> balancer.HEALTH_STATES; `unavailable` (health checks disabled, which ngcx never
# does) counts as unhealthy: nothing vouches for the target.
STATES = {"initial": "initial", "healthy": "healthy", "unhealthy": "unhealthy", "draining": "draining",
          "unused": "unused", "unavailable": "unhealthy"}
SERVING = ("initial", "healthy", "unhealthy")


def fit_name(name: str) -> str:
    """An elbv2 name (letters, digits, hyphens, <= 32, no hyphen at the ends) for spec.name, the same on
    every run: ngcx-svc-<id> as it is when it fits, else its first 23 characters + "-" + 8 of its sha256."""
    clean = re.sub(r"[^A-Za-z0-9-]+", "-", name).strip("-")
    if len(clean) > NAME_MAX:
        clean = f"{clean[:23].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    if not clean or clean.lower().startswith("internal-"):
        raise UserError(f"{name!r} cannot name an AWS load balancer (letters, digits and hyphens; not internal-)")
    return clean


def listener_of(spec: BalancerSpec) -> tuple[str, int]:
    """(protocol, port) of the service's listener: HTTPS only with a certificate (module docstring)."""
    if spec.protocol == "HTTPS" and spec.certificate_id:
        return "HTTPS", spec.port
    return "HTTP", HTTP_PORT if spec.port == 443 else spec.port


def service_url(spec: BalancerSpec, ref: BalancerRef) -> str:
    protocol, port = listener_of(spec)
    default = {"HTTPS": 443, "HTTP": 80}[protocol]
    return f"{protocol.lower()}://{ref.dns_name}{'' if port == default else f':{port}'}"


class Elb:
    """balancer.Balancer on AWS ALB, in the region and VPC of an Ec2 cloud whose prepare_network ran."""

    def __init__(self, ec2: Ec2) -> None:
        self.ec2, self.api = ec2, ec2.api
        self.weights = Weights(self, STATES, _poll)

    # ------------------------------------------------------------ ensure

    def ensure(self, spec: BalancerSpec) -> BalancerRef:
        name = fit_name(spec.name)
        subnets = self._subnets(spec)
        hosts = self._call_ec2("describe_security_groups", GroupIds=[self.ec2.security_group])["SecurityGroups"][0]
        vpc = hosts["VpcId"]
        front = self._security_groups(hosts, spec)
        balancer = self._find(name, "load balancer", spec.tags)
        balancer_arn = balancer["LoadBalancerArn"] if balancer else self._create_balancer(name, spec, subnets, front)
        group = self._find(name, "target group", spec.tags)
        group_arn = group["TargetGroupArn"] if group else self._create_group(name, spec, vpc)
        self._call("modify_target_group_attributes", TargetGroupArn=group_arn,
                   Attributes=[{"Key": DELAY_KEY, "Value": str(spec.drain_s)}])
        listener_arn = self._listener(balancer_arn, group_arn, spec)
        return BalancerRef(balancer_arn, group_arn, listener_arn, self._wait_active(name, balancer_arn))

    def _subnets(self, spec: BalancerSpec) -> list[str]:
        """One default subnet per zone: spec.zones first, then every other zone of the VPC."""
        subnets = self.ec2.subnets or {}
        if not self.ec2.security_group or not subnets:
            raise RuntimeError("Elb needs an Ec2 whose prepare_network ran (subnets, security group)")
        zones = [z for z in spec.zones if z in subnets] + sorted(z for z in subnets if z not in spec.zones)
        if len(zones) < 2:
            raise UserError(f"an AWS load balancer needs subnets in two zones; the default VPC of "
                            f"{self.ec2.region} has {len(zones)}",
                            hint=f"aws ec2 create-default-subnet --region {self.ec2.region} --availability-zone ZONE")
        return [subnets[z].id for z in zones]

    def _security_groups(self, hosts: dict[str, Any], spec: BalancerSpec) -> str:
        """ngcx-balancer-<owner>, open on the listener port; the hosts' group, open to it on the target port."""
        from .. import store

        owner = store.owner_id()
        front, rules = self._security_group(hosts["VpcId"], f"ngcx-balancer-{owner}", owner)
        _, port = listener_of(spec)
        if not any(_covers(r, port) and "0.0.0.0/0" in [x.get("CidrIp") for x in r.get("IpRanges", [])]
                   for r in rules):
            self._authorize(front, {"IpProtocol": "tcp", "FromPort": port, "ToPort": port, "IpRanges": [
                {"CidrIp": "0.0.0.0/0", "Description": "ngcx service listener"}]})
        target = spec.target_port
        if not any(_covers(r, target) and front in [p.get("GroupId") for p in r.get("UserIdGroupPairs", [])]
                   for r in hosts.get("IpPermissions", [])):
            self._authorize(hosts["GroupId"], {"IpProtocol": "tcp", "FromPort": target, "ToPort": target,
                                               "UserIdGroupPairs": [{"GroupId": front,
                                                                     "Description": "ngcx service balancer"}]})
        return front

    def _security_group(self, vpc: str, name: str, owner: str) -> tuple[str, list[dict[str, Any]]]:
        from ...clouds.aws import AwsError

        def found() -> list[dict[str, Any]]:
            return self._call_ec2("describe_security_groups", Filters=[
                {"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": [name]}])["SecurityGroups"]

        groups = found()
        if groups:
            return groups[0]["GroupId"], groups[0].get("IpPermissions", [])
        try:
            return self.api.call("ec2", "create_security_group", idempotent=False, GroupName=name, VpcId=vpc,
                                 Description="ngcx services: load balancer listeners", TagSpecifications=[{
                                     "ResourceType": "security-group",
                                     "Tags": _tags({vm.TAG_OWNER: owner, "Name": name})}])["GroupId"], []
        except AwsError as exc:      # a concurrent ngcx made it first
            if exc.code != "InvalidGroup.Duplicate":
                raise
        groups = found()
        return groups[0]["GroupId"], groups[0].get("IpPermissions", [])

    def _authorize(self, group: str, permission: dict[str, Any]) -> None:
        from ...clouds.aws import AwsError

        try:
            self._call_ec2("authorize_security_group_ingress", GroupId=group, IpPermissions=[permission])
        except AwsError as exc:
            if exc.code != "InvalidPermission.Duplicate":
                raise

    def _find(self, name: str, kind: str, tags: dict[str, str]) -> dict[str, Any] | None:
        """The balancer or group of that name, None when there is none; one that lacks the spec's tags is
        someone else's (another owner or service whose name fits to the same one): refused, not adopted."""
        from ...clouds.aws import AwsError

        noun = "".join(w.capitalize() for w in kind.split())       # LoadBalancer, TargetGroup
        try:
            found = self._call(f"describe_{kind.replace(' ', '_')}s", Names=[name])[f"{noun}s"]
        except AwsError as exc:
            if exc.code != f"{noun}NotFound":
                raise
            return None
        if not self._matching([found[0][f"{noun}Arn"]], tags):
            raise UserError(f"the AWS {kind} {name} in {self.ec2.region} exists but is not this service's "
                            "(its ngcx tags differ)", hint="delete it, or give the service another name")
        return found[0]

    def _create_balancer(self, name: str, spec: BalancerSpec, subnets: list[str], group: str) -> str:
        vm.say(f"creating the AWS load balancer {name} ({len(subnets)} zones of {self.ec2.region})")
        answer = self._call("create_load_balancer", Name=name, Subnets=subnets, SecurityGroups=[group],
                            Scheme="internet-facing", Type="application", IpAddressType="ipv4",
                            Tags=_tags(spec.tags))
        return str(answer["LoadBalancers"][0]["LoadBalancerArn"])

    def _create_group(self, name: str, spec: BalancerSpec, vpc: str) -> str:
        interval = spec.health_interval_s
        answer = self._call(
            "create_target_group", Name=name, Protocol=spec.target_protocol, Port=spec.target_port, VpcId=vpc,
            TargetType="instance", HealthCheckEnabled=True, HealthCheckProtocol=spec.target_protocol,
            HealthCheckPort="traffic-port", HealthCheckPath=spec.health_path, HealthCheckIntervalSeconds=interval,
            HealthCheckTimeoutSeconds=max(2, min(5, interval - 1)), HealthyThresholdCount=spec.healthy_threshold,
            UnhealthyThresholdCount=spec.unhealthy_threshold, Matcher={"HttpCode": "200"}, Tags=_tags(spec.tags))
        return str(answer["TargetGroups"][0]["TargetGroupArn"])

    def _listener(self, balancer: str, group: str, spec: BalancerSpec) -> str:
        """The listener on the service's port, made, or set to forward to the group with the spec's protocol."""
        protocol, port = listener_of(spec)
        settings: dict[str, Any] = {"Protocol": protocol, "DefaultActions": [
            {"Type": "forward", "TargetGroupArn": group}]}
        if protocol == "HTTPS":
            settings.update(Certificates=[{"CertificateArn": spec.certificate_id}], SslPolicy=SSL_POLICY)
        found = self._listener_on(balancer, port) or self._create_listener(balancer, port, settings, spec.tags)
        if not _same_listener(found, settings):
            self._call("modify_listener", ListenerArn=found["ListenerArn"], Port=port, **settings)
        return str(found["ListenerArn"])

    def _create_listener(self, balancer: str, port: int, settings: dict[str, Any], tags: dict[str, str]
                         ) -> dict[str, Any]:
        """CreateListener, not resent blindly after a 5xx (AWS answers a repeat with the same settings with the
        same listener; moto, and so the double, makes a second one): the port is looked at again first."""
        from ...clouds.aws import AwsError

        attempt = 1
        while True:
            try:
                return dict(self.api.call("elbv2", "create_listener", idempotent=False, LoadBalancerArn=balancer,
                                          Port=port, Tags=_tags(tags), **settings)["Listeners"][0])
            except AwsError as exc:
                found = self._listener_on(balancer, port)
                if found is not None:
                    return found
                if (exc.status < 500 and exc.code != "DuplicateListener") or attempt == CREATE_TRIES:
                    raise
                attempt += 1

    def _listener_on(self, balancer: str, port: int) -> dict[str, Any] | None:
        listeners = self._pages("describe_listeners", "Listeners", LoadBalancerArn=balancer)
        return next((x for x in listeners if x.get("Port") == port), None)

    def _wait_active(self, name: str, arn: str) -> str:
        """The balancer's DNS name once it is active (ACTIVE_WAIT_S at most)."""
        deadline, pause = time.monotonic() + ACTIVE_WAIT_S, 1.0
        while True:
            balancer = self._call("describe_load_balancers", LoadBalancerArns=[arn])["LoadBalancers"][0]
            state = balancer.get("State") or {}
            if state.get("Code") in ACTIVE:
                return str(balancer["DNSName"])
            if state.get("Code") == "failed":
                raise UserError(f"AWS load balancer {name} failed: {state.get('Reason', 'no reason given')}")
            if time.monotonic() + pause > deadline:
                raise UserError(f"AWS load balancer {name} is still {state.get('Code')} after {ACTIVE_WAIT_S:.0f} s",
                                hint="run the command again: it finds the balancer and waits again")
            sleep(pause)
            pause = min(10.0, pause * 1.5)

    # ------------------------------------------------------------ targets

    def register(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """RegisterTargets: registering a registered target again changes nothing."""
        self._call("register_targets", TargetGroupArn=ref.group_id, Targets=[{"Id": instance_id, "Port": port}])

    def deregister(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """DeregisterTargets, then wait until AWS shows the drain started (DRAIN_START_S at most); AWS
        then finishes the in-flight requests for spec.drain_s. Not registered (any more): done."""
        from ...clouds.aws import AwsError

        target = {"Id": instance_id, "Port": port}
        for group in (ref.group_id, self.weights.side(ref)):       # the weighted group (canary) too, if any
            if not group:
                continue
            try:
                self._call("deregister_targets", TargetGroupArn=group, Targets=[target])
            except AwsError as exc:
                if exc.code in ("InvalidTarget", "TargetGroupNotFound"):
                    continue
                raise

            def started(group: str = group) -> bool:
                rows = self._call("describe_target_health", TargetGroupArn=group,
                                  Targets=[target])["TargetHealthDescriptions"]
                return all(STATES.get(r["TargetHealth"]["State"]) not in SERVING for r in rows)

            _poll(started, DRAIN_START_S)

    def health(self, ref: BalancerRef) -> dict[str, str]:
        """Instance id -> balancer.HEALTH_STATES (STATES maps AWS's), over the service's group and its weighted
        one (a target in both: the state that serves); a deleted group has no targets."""
        out: dict[str, str] = {}
        for arn in (ref.group_id, self.weights.side(ref)):
            for (instance, _), state in (self.weights.targets(arn) if arn else {}).items():
                if out.get(instance) not in ("healthy",):
                    out[instance] = state
        return out

    def set_weights(self, ref: BalancerRef, weights: Sequence[tuple[str, int, int]]) -> None:
        """Weights through a second target group (elb_weights.py says how and why)."""
        self.weights.set(ref, weights)

    # ------------------------------------------------------------ delete, gc

    def delete(self, ref: BalancerRef) -> None:
        """Listeners, the balancer, then the group (retried while AWS says it is still in use, DELETE_WAIT_S)."""
        from ...clouds.aws import AwsError

        if ref.balancer_id:
            try:
                listeners = self._pages("describe_listeners", "Listeners", LoadBalancerArn=ref.balancer_id)
            except AwsError as exc:
                if exc.code != "LoadBalancerNotFound":
                    raise
                listeners = []
            for listener in listeners:
                self._gone_ok("delete_listener", ListenerArn=listener["ListenerArn"])
            self._gone_ok("delete_load_balancer", LoadBalancerArn=ref.balancer_id)
        side = self.weights.side(ref) if ref.group_id else None
        for group in (ref.group_id, side):
            if group:
                _poll(lambda group=group: self._gone_ok("delete_target_group", TargetGroupArn=group, busy_ok=True),
                      DELETE_WAIT_S, f"AWS still calls target group {group.rpartition(':')[2]} in use")

    def _gone_ok(self, operation: str, *, busy_ok: bool = False, **params: Any) -> bool:
        """True when done or already gone; False while busy (ResourceInUse) when busy_ok."""
        from ...clouds.aws import AwsError

        try:
            self._call(operation, **params)
        except AwsError as exc:
            if busy_ok and exc.code == "ResourceInUse":
                return False
            if not exc.code.endswith("NotFound"):
                raise
        return True

    def tagged(self, tags: dict[str, str]) -> list[BalancerRef]:
        """Every ALB with these tags (with its group and first listener), and every such group whose balancer
        is gone (a delete that was interrupted): BalancerRef("", group, "", "")."""
        balancers = [b for b in self._pages("describe_load_balancers", "LoadBalancers")
                     if b.get("Type", "application") == "application"]
        groups = self._pages("describe_target_groups", "TargetGroups")
        ours = self._matching([b["LoadBalancerArn"] for b in balancers], tags)
        tagged_groups = self._matching([g["TargetGroupArn"] for g in groups], tags)
        our_groups = {g["TargetGroupName"]: g["TargetGroupArn"] for g in groups if g["TargetGroupArn"] in tagged_groups}
        refs = []
        for balancer in [b for b in balancers if b["LoadBalancerArn"] in ours]:
            listeners = self._pages("describe_listeners", "Listeners", LoadBalancerArn=balancer["LoadBalancerArn"])
            our_groups.pop(side_name(balancer["LoadBalancerName"]), None)      # deleted with its balancer's ref
            refs.append(BalancerRef(balancer["LoadBalancerArn"], our_groups.pop(balancer["LoadBalancerName"], ""),
                                    listeners[0]["ListenerArn"] if listeners else "", balancer["DNSName"]))
        return refs + [BalancerRef("", arn, "", "") for arn in our_groups.values()]

    def _matching(self, arns: list[str], tags: dict[str, str]) -> set[str]:
        """The ARNs that carry every one of `tags` (DescribeTags, TAG_BATCH at a time)."""
        found: set[str] = set()
        for start in range(0, len(arns), TAG_BATCH):
            answer = self._call("describe_tags", ResourceArns=arns[start:start + TAG_BATCH])
            for item in answer.get("TagDescriptions", []):
                have = {t["Key"]: t.get("Value", "") for t in item.get("Tags", [])}
                if all(have.get(k) == v for k, v in tags.items()):
                    found.add(item["ResourceArn"])
        return found

    # ------------------------------------------------------------ calls

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """elbv2 through Ec2's api: every call here may be repeated (creates are idempotent by name)."""
        return self.api.call("elbv2", operation, **params)

    def _call_ec2(self, operation: str, **params: Any) -> dict[str, Any]:
        return self.api.call("ec2", operation, **params)

    def _pages(self, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """elbv2 pages with Marker / NextMarker (not NextToken)."""
        found: list[dict[str, Any]] = []
        marker = None
        while True:
            answer = self._call(operation, PageSize=PAGE_SIZE, **params, **({"Marker": marker} if marker else {}))
            found += answer.get(key) or []
            marker = answer.get("NextMarker")
            if not marker:
                return found


def _same_listener(found: dict[str, Any], settings: dict[str, Any]) -> bool:
    actions = found.get("DefaultActions") or []
    forwards = [a.get("TargetGroupArn") for a in actions if a.get("Type") == "forward"]
    certificates = [c.get("CertificateArn") for c in found.get("Certificates") or []]
    wanted = [c["CertificateArn"] for c in settings.get("Certificates", [])]
    return (found.get("Protocol") == settings["Protocol"] and len(actions) == 1
            and forwards == [settings["DefaultActions"][0]["TargetGroupArn"]] and certificates[:1] == wanted[:1])


def _covers(rule: dict[str, Any], port: int) -> bool:
    return rule.get("IpProtocol") == "-1" or (
        rule.get("IpProtocol") == "tcp" and rule.get("FromPort", 0) <= port <= rule.get("ToPort", -1))


def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in sorted(tags.items())]


def _poll(done: Callable[[], bool], bound_s: float, failure: str | None = None) -> None:
    """Until done(), every 0.2 s growing to 5 s, for bound_s; then UserError(failure), or return without one."""
    deadline, pause = time.monotonic() + bound_s, 0.2
    while not done():
        if time.monotonic() + pause > deadline:
            if failure:
                raise UserError(f"{failure} after {bound_s:.0f} s", hint="run the command again to finish")
            return
        sleep(pause)
        pause = min(5.0, pause * 1.5)
