# ruff: noqa: F811 - the fixtures are test_aws_elb_client.py's, imported by name
"""Weighted members behind an AWS ALB (cli/deploy/aws/elb_weights.py, balancer.py's set_weights) against the AWS
double, through the real boto3 `elbv2`: what a canary release asks of the balancer.

What a user notices: a member given a quarter of the others' weight gets about a fifth of the requests (it sits
in a second target group, and the listener forwards by group weights), a member at weight 0 gets none, and a
call with one weight for everyone leaves an ordinary balancer again (one group, forwarded alone, the second
group deleted) without a failed request; deregister and delete find members and groups in either place.
The replicas and the double are test_aws_elb_client.py's (loopback hosts, the real haproxy data plane).
"""

from __future__ import annotations

import pytest
from emulators.traffic import spread
from test_aws_elb_client import double, elb, elbv2, emulator, replicas, spec, until  # noqa: F401 - fixtures

from ngcx.deploy.aws.elb_weights import side_name


def _listener(elb, ref) -> dict:
    [found] = elbv2(elb, "describe_listeners", ListenerArns=[ref.listener_id])["Listeners"]
    return found


def test_weights_split_requests_by_group_and_one_weight_collapses_back_to_one_group(elb, emulator, replicas):
    ref = elb.ensure(spec("ngcx-svc-canary"))
    (a, ra), (b, rb) = replicas(elb, "127.0.0.41"), replicas(elb, "127.0.0.42")
    for instance, replica in ((a, ra), (b, rb)):
        elb.register(ref, instance, replica.port)
    until("both healthy", lambda: elb.health(ref) == {a: "healthy", b: "healthy"})
    address = emulator.balancer_address(ref.dns_name, 80)

    elb.set_weights(ref, [])                                     # the probe: nothing changes
    elb.set_weights(ref, [(a, ra.port, 100), (b, rb.port, 25)])
    side = elb.weights.side(ref)
    assert side and elbv2(elb, "describe_target_groups", TargetGroupArns=[side])["TargetGroups"][0][
        "TargetGroupName"] == side_name("ngcx-svc-canary")
    weighted = _listener(elb, ref)["DefaultActions"][0]["ForwardConfig"]["TargetGroups"]
    assert {g["TargetGroupArn"]: g["Weight"] for g in weighted} == {ref.group_id: 999, side: 250}
    until("b healthy in the weighted group", lambda: elb.health(ref).get(b) == "healthy" and
          b not in {t["Target"]["Id"] for t in elbv2(elb, "describe_target_health", TargetGroupArn=ref.group_id)[
              "TargetHealthDescriptions"]})
    seen = spread(address, 200)
    assert set(seen) == {"127.0.0.41", "127.0.0.42"} and 20 <= seen["127.0.0.42"] <= 60, seen

    elb.set_weights(ref, [(a, ra.port, 100), (b, rb.port, 0)])   # weight 0: no request
    until("the plane follows", lambda: spread(address, 20) == {"127.0.0.41": 20}, timeout=10)

    elb.set_weights(ref, [(a, ra.port, 100), (b, rb.port, 100)])  # one weight: an ordinary balancer again
    action = _listener(elb, ref)["DefaultActions"][0]
    assert action.get("TargetGroupArn") == ref.group_id and len(action.get("ForwardConfig", {}).get(
        "TargetGroups", [1])) == 1
    assert elb.weights.side(ref) is None
    assert elb.health(ref) == {a: "healthy", b: "healthy"}
    seen = spread(address, 40)
    assert set(seen) == {"127.0.0.41", "127.0.0.42"}, seen


def test_deregister_and_delete_reach_the_weighted_group_too(elb, emulator, replicas):
    ref = elb.ensure(spec("ngcx-svc-canary2"))
    (a, ra), (b, rb) = replicas(elb, "127.0.0.43"), replicas(elb, "127.0.0.44")
    for instance, replica in ((a, ra), (b, rb)):
        elb.register(ref, instance, replica.port)
    elb.set_weights(ref, [(a, ra.port, 100), (b, rb.port, 10)])
    until("b healthy", lambda: elb.health(ref).get(b) == "healthy")
    elb.deregister(ref, b, rb.port)
    until("b gone", lambda: elb.health(ref).get(b) in (None, "draining"), timeout=15)
    assert elb.tagged({"ngcx:service": "ngcx-svc-canary2"}) == [ref]          # the weighted group is not an orphan
    elb.delete(ref)
    assert elb.tagged({"ngcx:service": "ngcx-svc-canary2"}) == []
    with pytest.raises(Exception, match="TargetGroupNotFound|not found"):
        elbv2(elb, "describe_target_groups", Names=[side_name("ngcx-svc-canary2")])
