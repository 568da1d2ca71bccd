"""A service's load balancer, the cloud's own: what the services flow (issue 21) asks of each cloud.

Why the clouds' balancers and not one of ours: they are engines that already scale to internet
traffic, check health from every zone and drain on deregistration (DESIGN.md "Security, services").
Each VM cloud implements this contract in its own package: Alibaba Cloud ALB (aliyun/alb.py, ALB
2020-06-16: layer 7, server groups with health checks and connection draining, several zones; CLB is
the older product), AWS ALB (aws/elb.py, boto3 elbv2: target group + listener). Tests run them
against tests/emulators (aliyun_alb.py, aws_elbv2.py), whose data plane is a real haproxy.

Rules every implementation keeps, because services are found again after an interrupted ngcx:
- `ensure` is idempotent: it finds the balancer, group and listener by their tags (ngcx:owner,
  ngcx:service) or names before creating anything, creates only what is missing (with client tokens
  where the API has them), and returns once the balancer is active;
- every resource carries the spec's tags, so `tagged` (gc) finds what a killed ngcx left;
- `deregister` starts the draining and returns; the cloud keeps the drain (spec.drain_s);
- `delete` of what is already gone is done, not an error; no secret is ever in a name, tag or error;
- `set_weights` (canary releases, canary.py) changes how new requests spread over registered members, each
  (instance, port, weight 0..100) named; a member not named keeps its weight, weight 0 takes no new request
  (in-flight ones finish), and a member that registers again gets the full weight (WEIGHT) back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

HEALTH_PATH = "/v2/health/ready"   # keyless on every ngcx endpoint (runtime/access.py: health needs no key)
WEIGHT = 100                       # a member's full weight: what register gives, the top of set_weights' range
HEALTH_STATES = ("initial", "healthy", "unhealthy", "draining", "unused")


@dataclass(frozen=True)
class BalancerSpec:
    """One service's balancer: where, on which ports, and how it checks and drains the replicas."""

    name: str                        # ngcx-svc-<service id>: unique per owner and region
    zones: tuple[str, ...]           # the replicas' zones (ALBs need two or more)
    tags: dict[str, str] = field(default_factory=dict)   # ngcx:owner, ngcx:service
    port: int = 443                  # the listener the service URL names
    protocol: str = "HTTPS"          # HTTPS with certificate_id, else HTTP
    certificate_id: str | None = None  # the user's certificate (Alibaba Cloud CAS id / ACM ARN)
    target_port: int = 8000          # where the replicas serve
    target_protocol: str = "HTTPS"   # the hosts' own TLS (issue 20), not verified by the balancer
    health_path: str = HEALTH_PATH
    health_interval_s: int = 5
    healthy_threshold: int = 2
    unhealthy_threshold: int = 2
    drain_s: int = 30                # deregistration delay / connection drain timeout


@dataclass(frozen=True)
class BalancerRef:
    """What the record keeps to find the balancer again (ids and the DNS name; nothing secret)."""

    balancer_id: str                 # ALB id / load balancer ARN
    group_id: str                    # server group id / target group ARN
    listener_id: str                 # listener id / ARN
    dns_name: str                    # the service URL's host


class Balancer(Protocol):
    def ensure(self, spec: BalancerSpec) -> BalancerRef: ...
    def register(self, ref: BalancerRef, instance_id: str, port: int) -> None: ...
    def deregister(self, ref: BalancerRef, instance_id: str, port: int) -> None: ...
    def health(self, ref: BalancerRef) -> dict[str, str]: ...   # instance id -> one of HEALTH_STATES
    def delete(self, ref: BalancerRef) -> None: ...
    def tagged(self, tags: dict[str, str]) -> list[BalancerRef]: ...
    def set_weights(self, ref: BalancerRef, weights: Sequence[tuple[str, int, int]]) -> None: ...
