"""`ngcx deploy --service sN --canary 10` behind a cloud's own balancer (issue 49, part 2): the emulated Alibaba
Cloud ALB by default (server weights, UpdateServerGroupServersAttribute), AWS's ALB (a second target group behind
the listener's weighted forward) with NGCX_E2E_SERVICE_CLOUDS=aliyun,aws, as test_service_clouds.py's fixture says.

What a user notices: under constant load through the balancer's https URL, a new version released as a canary
takes about a tenth of the requests at its first step (the replicas' own counts, kept in the row), then half,
then all of them; it ends as the service's version with the old hosts drained, and not one request failed. The
new version is the image's own command with another queue delay (as test_service_clouds.py's rolling update):
no second image to push to the cloud.
"""

from __future__ import annotations

import re
import ssl

import pytest
from deploy_helpers import Load
from test_service_clouds import (  # noqa: F401 - svc_cloud is a fixture
    CHANGED,
    _clean_warm_pool,
    _image_command,
    balancer_view,
    payload,
    show,
    svc_cloud,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_a_canary_behind_the_clouds_balancer_is_weighted_judged_and_promoted(svc_cloud, monkeypatch):  # noqa: F811
    cloud, certificate, tls_env, ca = svc_cloud
    for name, value in {**cloud.env, **tls_env}.items():
        monkeypatch.setenv(name, value)
    body, _ = payload(cloud.project)
    base = ("deploy", "--cloud", cloud.name, "--gpu", cloud.gpu, "--gpu-mode", "auto")
    made = cloud.ngcx(*base, "--replicas", "2", "--certificate", certificate, env=tls_env)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    ref = re.search(r"service (s\d+) ready", made.stderr).group(1)
    key = cloud.ngcx("deployments", "key", ref).stdout.strip()
    olds = {m["id"] for m in show(cloud, ref)["members"]}
    command = _image_command(cloud) + list(CHANGED)

    with Load(url, key, body, ssl.create_default_context(cafile=str(ca))) as load:
        load.settle()
        released = cloud.ngcx(*base, "--service", ref, "--canary", "10", "--canary-window", "20", "--", *command,
                              env=tls_env)
        load.settle()
    assert released.returncode == 0, released.stderr[-3000:]
    assert not load.errors and load.total() > 100, (load.seen, load.errors[:5])
    svc = show(cloud, ref)
    judged = svc["canary"]
    assert judged["outcome"] == "promoted" and [s["percent"] for s in judged["steps"]] == [10, 50, 100]
    first = judged["steps"][0]
    share = first["canary"]["requests"] / (first["canary"]["requests"] + first["baseline"]["requests"])
    assert first["outcome"] == "pass" and share < 0.2, (share, first)       # the balancer's weights, not 50/50
    print(f"{cloud.name}: canary promoted 10/50/100 under load, {load.total()} requests, 0 failed; step 10 %: "
          f"{first['canary']} against {first['baseline']}")
    assert svc["config"]["cmd"] == command and len(svc["members"]) == 2 and not olds & {m["id"] for m in
                                                                                      svc["members"]}
    assert set(balancer_view(cloud, svc).values()) == {"healthy"}
    gone = cloud.ngcx("deployments", "destroy", ref, "--yes")
    assert gone.returncode == 0, gone.stderr[-2000:]
    _clean_warm_pool(cloud)
