"""An autoscaled spot service on Alibaba Cloud, for real: `ngcx deploy --cloud aliyun --min 2 --max 2 --spot
--on-demand-base 1`, then `ngcx deploy NEW --service sN` under constant inference load, then ECS reclaims its
spot host, then the other service verbs: rollback, logs, rotate-key, stop and start.

What a user notices (issue 49): the service runs one on-demand and one spot host (ESS COST_OPTIMIZED with an
on-demand floor); the new version replaces both hosts through ESS's instance refresh with zero failed
requests (each new host serves behind the ALB before an old one drains); when ECS reclaims the spot host,
ESS's remedy launches a replacement and takes the doomed host out of the ALB server group with its drain
before ECS releases it: zero failed requests, two hosts serving again, one of them spot. A rollback is the same
refresh back (zero failed); logs come from each host through Cloud Assistant; rotate-key answers old-key clients
until the grace ends, then only the new key opens the service; stop leaves no host, start brings the on-demand
and the spot host back, answering.

The doubles: the ECS emulator's ESS (aliyun_ess.py, aliyun_ess_refresh.py, aliyun_ess_spot.py) and ALB (a
real haproxy); hosts are containers with their own dockerd, booting the group's user-data. Balancer and group
time run at TIME_SCALE (test_service_clouds / test_service_groups'). The load: LOAD_CLIENTS paced clients at
RATE requests/s each, the example's inference through the ALB with the service's key and its CA checked.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from deploy_helpers import Load
from e2e.clouds import Cloud, state_of
from e2e.test_service_clouds import (
    CHANGED,
    _can_bind_443,
    _image_command,
    balancers_back,
    balancers_on_loopback,
    payload,
    show,
)
from e2e.test_service_group_update import rotate_under_load
from e2e.test_service_groups import TIME_SCALE, _service_of, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LOAD_CLIENTS = 2
RATE = 4.0                # requests/s per client: 8 requests/s through the ALB, constant
NOTICE_S = 120.0          # the reclaim notice (ECS gives 5 minutes; a host boots well within this here)
GONE = ("deleted", "")


@pytest.fixture
def aliyun_group(request, tmp_path_factory) -> Iterator[tuple[Cloud, str, dict[str, str], ssl.SSLContext, Any]]:
    """(cloud, certificate id, env with SSL_CERT_FILE, the CA's context, the emulator's Ess) on fast time."""
    if not _can_bind_443():
        pytest.skip("the emulated balancers listen on 443 of 127.0.100.x: needs root or CAP_NET_BIND_SERVICE")
    cloud: Cloud = request.getfixturevalue("aliyun")
    certificate, ca = balancers_on_loopback(cloud, tmp_path_factory.mktemp("group-update-ca"))
    ess = cloud.emulator.ess
    ess.time_scale = TIME_SCALE
    try:
        yield cloud, certificate, {"SSL_CERT_FILE": str(ca)}, ssl.create_default_context(cafile=str(ca)), ess
    finally:
        ess.time_scale = 1.0
        balancers_back(cloud)
    assert ess.errors == [], ess.errors


def serving(cloud: Cloud, ref: str) -> list[dict]:
    return [h for h in show(cloud, ref)["hosts"] if h["state"] == "in-service" and h["balancer"] == "healthy"]


def test_an_autoscaled_spot_service_rolls_survives_a_reclaim_rolls_back_rotates_its_key_stops_and_starts(
        aliyun_group, monkeypatch):
    cloud, certificate, tls_env, context, ess = aliyun_group
    for name, value in {**cloud.env, **tls_env}.items():
        monkeypatch.setenv(name, value)
    body, _ = payload(cloud.project)
    base = ("deploy", "--cloud", "aliyun", "--gpu", cloud.gpu, "--gpu-mode", "auto", "--certificate", certificate)
    made = cloud.ngcx(*base, "--min", "2", "--max", "2", "--spot", "--on-demand-base", "1", env=tls_env)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    assert urlsplit(url).scheme == "https", url
    ref = _service_of(cloud, url)
    key = cloud.ngcx("deployments", "key", ref).stdout.strip()
    first = wait_for("two hosts serving", lambda: len(found := serving(cloud, ref)) == 2 and found, timeout=300)
    assert sorted(h["market"] for h in first) == ["on-demand", "spot"], first

    # a new version under constant load: ESS's instance refresh, every host replaced, 0 failed
    command = _image_command(cloud) + list(CHANGED)
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle()
        t0 = time.monotonic()
        rolled = cloud.ngcx(*base, "--service", ref, "--", *command, env=tls_env)
        rolling = time.monotonic() - t0
        assert rolled.returncode == 0, f"after {rolling:.0f} s: {rolled.stderr[-3000:]}"
        load.settle()
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    svc = show(cloud, ref)
    assert svc["config"]["cmd"] == command and svc["status"] == "ready", svc
    now = wait_for("two new hosts serving", lambda: len(found := serving(cloud, ref)) == 2 and found, timeout=120)
    assert not {h["instance_id"] for h in now} & {h["instance_id"] for h in first}
    print(f"aliyun group: rolling update of 2 hosts (1 spot) in {rolling:.1f} s under {LOAD_CLIENTS} clients at "
          f"{RATE:.0f} req/s each, {load.total()} requests, 0 failed")

    # ECS reclaims the spot host: ESS's remedy replaces it and drains it from the ALB before it is released
    [doomed] = [h["instance_id"] for h in now if h["market"] == "spot"]
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle()
        t0 = time.monotonic()
        ess.reclaim(doomed, NOTICE_S)
        after = wait_for("a replacement serving and the reclaimed host gone", lambda: len(
            found := serving(cloud, ref)) == 2 and doomed not in {h["instance_id"] for h in found} and found,
            timeout=NOTICE_S + 60)
        replaced = time.monotonic() - t0
        wait_for("ECS released the reclaimed host", lambda: {i["id"]: state_of(i) for i in cloud.emulator.instances(
        )}.get(doomed, "") in GONE, timeout=NOTICE_S + 30)
        load.settle()
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    assert sorted(h["market"] for h in after) == ["on-demand", "spot"], after
    print(f"aliyun group: spot host reclaimed ({NOTICE_S:.0f} s notice), replaced and drained in {replaced:.1f} s; "
          f"{load.total()} requests under {LOAD_CLIENTS} clients at {RATE:.0f} req/s each, 0 failed")

    # rollback under load: ESS's refresh back to the first version
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle()
        back = cloud.ngcx("deployments", "rollback", ref, env=tls_env)
        assert back.returncode == 0, back.stderr[-3000:]
        wait_for("two hosts of the first version serving", lambda: len(found := serving(cloud, ref)) == 2 and not {
            h["instance_id"] for h in found} & {h["instance_id"] for h in after}, timeout=120)
        load.settle()
    assert not load.errors and load.total() > 40, (load.seen, load.errors[:5])
    assert show(cloud, ref)["config"]["cmd"] != command

    logs = cloud.ngcx("deployments", "logs", ref, env=tls_env)
    assert logs.returncode == 0 and logs.stdout.count("==> host ") == 2, logs.stderr[-2000:]
    key = rotate_under_load(cloud, ref, url, key, body, context, tls_env, cloud.project.parent / "rotate-aliyun.log")

    stopped = cloud.ngcx("deployments", "stop", ref, env=tls_env)
    assert stopped.returncode == 0 and "terminate" in stopped.stderr, stopped.stderr[-2000:]
    wait_for("no host left", lambda: show(cloud, ref)["hosts"] == [], timeout=120)
    assert show(cloud, ref)["status"] == "stopped"
    started = cloud.ngcx("deployments", "start", ref, env=tls_env)
    assert started.returncode == 0 and started.stdout.strip().splitlines()[-1] == url, started.stderr[-2000:]
    back_up = wait_for("two hosts serving", lambda: len(found := serving(cloud, ref)) == 2 and found, timeout=300)
    assert sorted(h["market"] for h in back_up) == ["on-demand", "spot"], back_up      # the spot split kept
    with Load(url, key, body, context, clients=LOAD_CLIENTS, rate=RATE) as load:
        load.settle(20)
    assert not load.errors, (load.seen, load.errors[:5])
    print("aliyun group: rollback (0 failed), logs of 2 hosts, key rotated under load, stopped and started")

    gone = cloud.ngcx("deployments", "destroy", ref, "--yes")
    assert gone.returncode == 0, gone.stderr[-2000:]
