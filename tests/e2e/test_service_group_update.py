"""An autoscaled AWS service's service verbs, for real (issue 49): `ngcx deploy … --min 2 --max 2 --spot
--on-demand-base 1`, then under constant inference load through its balancer a rolling update to a new version,
a spot host reclaimed by EC2, a rollback, the key rotated — zero failed requests in each — then logs, stop / start
and destroy.

What a user notices: the update is the group's own instance refresh (new hosts healthy behind the ALB before old
ones drain), so the URL never changes and nothing fails; the group keeps one on-demand host and buys the other as
spot, `show` says which and what the service costs per hour against all on demand; when EC2 takes the spot host
back (the rebalance recommendation and the two-minute notice in its IMDS) the group launches a replacement and
the reclaimed host drains from the balancer before it goes; stop leaves no host running and start brings the
recorded bounds back, one host on demand and one spot again, answering. rotate-key gives every host the new key
(two instance refreshes) while clients on the old key keep being answered until the grace ends; then the old
key is refused and the new one opens the service.

One service through every step (CI time). The load: LOAD_CLIENTS clients at RATE paced requests/s each (the
example project's inference, with the key, over the balancer's HTTPS), 2 x 4 = 8 requests/s. The doubles are
test_service_groups.py's (group_cloud): moto behind aws_ec2 + aws_autoscaling (aws_refresh.py: the refresh,
markets and reclaims), hosts that boot the user-data in their own dockerd, each ALB a real haproxy, time at
TIME_SCALE (a 30 s drain is 3 s, the two-minute notice 12 s).
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deploy_helpers import Load
from e2e.test_service_clouds import CHANGED, _image_command, payload, show
from e2e.test_service_groups import _service_of, group_cloud, hosts, wait_for  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOAD_CLIENTS = 2
RATE = 4.0
STEP_S = 420.0


def serving(cloud, ref: str, count: int, but: set[str] = frozenset()) -> list[dict]:
    """Until `count` hosts are in service and healthy in the balancer, none of them in `but`."""
    return wait_for(f"{count} hosts serving", lambda: (found := [
        h for h in hosts(cloud, ref) if h["state"] == "in-service" and h["balancer"] == "healthy"]) and len(
        found) == count and not {h["instance_id"] for h in found} & but and found, timeout=STEP_S, pause=1.0)


def answer(url: str, key: str, body: bytes, context: ssl.SSLContext) -> int:
    """The status of one inference through the balancer's HTTPS with `key`."""
    parts = urlsplit(url)
    conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=30, context=context)
    try:
        conn.request("POST", "/v2/models/convnet/infer", body, {"Authorization": f"Bearer {key}"})
        return conn.getresponse().status
    finally:
        conn.close()


def rotate_under_load(cloud, ref: str, url: str, key: str, body: bytes, context: ssl.SSLContext,
                      env: dict[str, str], log: Path, grace: float = 10.0) -> str:
    """`ngcx deployments rotate-key REF --grace GRACE` while clients on the old key send LOAD_CLIENTS x RATE
    requests/s: none fails until the new key is in place on every host (the first refresh); once the command is
    done the old key is refused (401) and the new one (returned) answers. Bounded by each refresh's own limit."""
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load, log.open("w") as err:
        load.settle(5)
        rotating = subprocess.Popen([sys.executable, "-m", "ngcx", "deployments", "rotate-key", ref, "--grace",
                                     f"{grace:g}"], cwd=cloud.project, stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, "NGCX_BASE": "offline", **cloud.env, **env})
        try:
            wait_for("the new key in place", lambda: "the new key is in place" in log.read_text()
                     or rotating.poll() is not None, timeout=STEP_S)
            load.settle(5)
        finally:
            load.stop.set()
            out, _ = rotating.communicate(timeout=STEP_S + grace)
    text = log.read_text()
    cloud.outputs += [out, text]                                    # the secrets check reads these too
    assert rotating.returncode == 0 and "the new key is in place" in text, text[-3000:]
    assert not load.errors and load.total() > 20, (load.seen, load.errors[:5])
    new_key = cloud.ngcx("deployments", "key", ref).stdout.strip()
    assert new_key.startswith("ngcx_") and new_key != key
    assert [answer(url, k, body, context) for k in (key, new_key)] == [401, 200]
    return new_key


def test_an_autoscaled_spot_service_rolls_survives_a_reclaim_rolls_back_rotates_its_key_stops_and_starts(
        group_cloud, monkeypatch):  # noqa: F811 (test_service_groups' fixture)
    cloud, certificate, tls_env, context, scaling = group_cloud
    if cloud.name != "aws":
        pytest.skip("the Alibaba Cloud side of issue 49 has its own test")
    for name, value in {**cloud.env, **tls_env}.items():
        monkeypatch.setenv(name, value)
    scaling.refresh.launch_timeout_s = STEP_S                  # a host boots a real container: not scaled time
    body, _ = payload(cloud.project)
    base = ("deploy", "--cloud", cloud.name, "--gpu", cloud.gpu, "--gpu-mode", "auto", "--certificate", certificate)
    made = cloud.ngcx(*base, "--min", "2", "--max", "2", "--spot", "--on-demand-base", "1", "--target-requests",
                      "100000", env=tls_env)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    ref = _service_of(cloud, url)
    key = cloud.ngcx("deployments", "key", ref).stdout.strip()
    first = serving(cloud, ref, 2)
    assert sorted(h["market"] for h in first) == ["on-demand", "spot"], first
    cost = show(cloud, ref)["cost"]
    assert cost["spot_hosts"] == 1 and cost["per_hour"] < cost["on_demand_per_hour"], cost
    shown = cloud.ngcx("deployments", "show", ref)
    assert "1 spot, 1 on demand" in shown.stdout and "saved" in shown.stdout, shown.stdout

    # rolling update to a new version under load: the group's instance refresh, nothing fails
    command = _image_command(cloud) + list(CHANGED)
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle(5)
        started = time.monotonic()
        rolled = cloud.ngcx(*base, "--service", ref, "--", *command, env=tls_env)
        rolling = time.monotonic() - started
        assert rolled.returncode == 0, rolled.stderr[-3000:]
        assert "instance refresh" in rolled.stderr and "100 % of the hosts replaced" in rolled.stderr
        after = serving(cloud, ref, 2, but={h["instance_id"] for h in first})
        load.settle(5)
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    svc = show(cloud, ref)
    assert svc["status"] == "ready" and svc["config"]["cmd"] == command and svc["previous"]
    print(f"aws group: rolling update of 2 hosts {rolling:.1f} s, {load.total()} requests, 0 failed")

    # EC2 reclaims the spot host: notices in its IMDS, a replacement, the drain before it goes
    [spot] = [h for h in after if h["market"] == "spot"]
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle(5)
        scaling.refresh.reclaim(cloud.env["AWS_DEFAULT_REGION"], spot["instance_id"])
        replaced = serving(cloud, ref, 2, but={spot["instance_id"]})
        load.settle(5)
    assert not load.errors and load.total() > 20, (load.seen, load.errors[:5])
    assert sorted(h["market"] for h in replaced) == ["on-demand", "spot"], replaced
    print(f"aws group: spot host {spot['instance_id']} reclaimed and replaced, {load.total()} requests, 0 failed")

    # rollback: the same rolling update back to the first version
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle(5)
        back = cloud.ngcx("deployments", "rollback", ref, env=tls_env)
        assert back.returncode == 0, back.stderr[-3000:]
        serving(cloud, ref, 2, but={h["instance_id"] for h in replaced})
        load.settle(5)
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    assert show(cloud, ref)["config"]["cmd"] != command

    key = rotate_under_load(cloud, ref, url, key, body, context, tls_env, cloud.project.parent / "rotate.log")
    print("aws group: key rotated on 2 hosts (two instance refreshes), old-key clients answered until the grace")

    logs = cloud.ngcx("deployments", "logs", ref, env=tls_env)
    assert logs.returncode == 0 and logs.stdout.count("==> host ") == 2, logs.stderr[-2000:]

    # stop: no host left running (they terminate: no warm pool without --min 0); start: the bounds again
    stopped = cloud.ngcx("deployments", "stop", ref, env=tls_env)
    assert stopped.returncode == 0 and "terminate" in stopped.stderr, stopped.stderr[-2000:]
    wait_for("no host left", lambda: hosts(cloud, ref) == [], timeout=STEP_S)
    assert show(cloud, ref)["status"] == "stopped"
    started = cloud.ngcx("deployments", "start", ref, env=tls_env)
    assert started.returncode == 0 and started.stdout.strip().splitlines()[-1] == url, started.stderr[-2000:]
    back_up = serving(cloud, ref, 2)
    assert sorted(h["market"] for h in back_up) == ["on-demand", "spot"], back_up    # the spot split kept
    assert show(cloud, ref)["status"] == "ready"
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle(20)
    assert not load.errors and load.total() >= 20, (load.seen, load.errors[:5])

    gone = cloud.ngcx("deployments", "destroy", ref, "--yes")
    assert gone.returncode == 0, gone.stderr[-2000:]
