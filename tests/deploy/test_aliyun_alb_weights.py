# ruff: noqa: F811 - the fixtures are test_aliyun_alb_client.py's, imported by name
"""Server weights behind Alibaba Cloud ALB (cli/deploy/aliyun/alb.py `set_weights`: UpdateServerGroupServersAttribute)
against the ECS emulator's ALB and its haproxy data plane: what a canary release asks of the balancer.

What a user notices: a replica given a tenth of the others' weight gets about a tenth of its share of requests,
weight 0 gets none (ALB then reports it Unused), full weight again spreads evenly; a server the group no longer
has is left out rather than failing the call, and a weight outside 0..100 is refused by the API.
"""

from __future__ import annotations

from collections import Counter

import pytest
from test_aliyun_alb_client import alb, emu, get, hosts, plane, serving, until  # noqa: F401 - fixtures

from ngcx.clouds.aliyun import AliyunError


def _spread(address, count: int) -> Counter:
    return Counter(body for status, body in (get(address) for _ in range(count)) if status == 200)


def test_weights_move_requests_between_servers_and_back(alb, plane, hosts):
    ref, (a, b) = serving(alb, plane, hosts, 2)
    port = {i: hosts.addresses[i][1] for i in (a, b)}
    address = plane.balancer_address(ref.dns_name, 80)
    alb.set_weights(ref, [])                                           # the probe: no call
    assert plane.performed("UpdateServerGroupServersAttribute") == 0
    alb.set_weights(ref, [(a, port[a], 100), (b, port[b], 10)])
    servers = {s["ServerId"]: s["Weight"] for s in alb.api.alb("ListServerGroupServers",
                                                                {"ServerGroupId": ref.group_id})["Servers"]}
    assert servers == {a: 100, b: 10}
    until(lambda: _spread(address, 20)[b] <= 4, "the plane follows the weights")
    seen = _spread(address, 110)
    assert seen[a] >= 90 and 2 <= seen[b] <= 20, seen

    alb.set_weights(ref, [(a, port[a], 100), (b, port[b], 0)])
    until(lambda: alb.health(ref).get(b) == "unused", "weight 0 is Unused")
    assert _spread(address, 30) == Counter({a: 30})
    alb.set_weights(ref, [(a, port[a], 100), (b, port[b], 100), ("i-gone", 8000, 50)])   # a gone one: left out
    until(lambda: alb.health(ref) == {a: "healthy", b: "healthy"}, "both serve again")
    assert set(_spread(address, 30)) == {a, b}


def test_the_api_refuses_a_weight_outside_0_to_100(alb, plane, hosts):
    ref, (a,) = serving(alb, plane, hosts, 1)
    with pytest.raises(AliyunError, match="Weight"):
        alb.api.alb("UpdateServerGroupServersAttribute", {
            "ServerGroupId": ref.group_id, "Servers.1.ServerId": a, "Servers.1.ServerType": "Ecs",
            "Servers.1.Port": hosts.addresses[a][1], "Servers.1.Weight": 101}, write=True)
