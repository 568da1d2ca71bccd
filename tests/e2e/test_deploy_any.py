"""`ngcx deploy --cloud any`: every cloud with credentials ranked on one scale, failing over between clouds.

What a user notices (issue 11, "Done when"): with Alibaba Cloud and AWS credentials both set, `--dry-run`
shows one merged ranking naming each candidate's cloud; when the best-ranked cloud has no capacity for
any fitting type in any zone, the deploy lands on the other cloud and answers, and the record of the
failed attempt says why.
"""

from __future__ import annotations

import json

import pytest
from deploy_helpers import ngcx, one_inference

from ngcx.deploy import offers

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_any_fails_over_from_a_cloud_without_capacity_to_the_next(aliyun, aws, project, tmp_path):
    env = {**aliyun.env, **aws.env, "NGCX_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path),
           "DOCKER_CONFIG": str(tmp_path / ".docker")}
    pushed = ngcx(project, "push", "ngcx-app/onnx-zero-code:latest", "--registry", "acr://cn-hangzhou/any", env=env)
    assert pushed.returncode == 0, pushed.stderr[-2000:]

    writes = aws.emulator.performed("RunInstances"), aliyun.emulator.performed("RunInstances")
    dry = ngcx(project, "deploy", "--cloud", "any", "--gpu", "T4", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    ranked = [line.split()[1] for line in dry.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert ranked[0] == "aws" and "aliyun" in ranked            # g4dn lists cheaper than gn6i: AWS first
    assert writes == (aws.emulator.performed("RunInstances"), aliyun.emulator.performed("RunInstances"))

    t4_types = [t.name for t in offers.load_table("aws")[0] if t.gpu == "T4"]
    for zone in aws.emulator.zones:                             # AWS: no T4 anywhere
        for name in t4_types:
            aws.set_capacity(zone, name, False)
    try:
        done = ngcx(project, "deploy", "--cloud", "any", "--gpu", "T4", "--gpu-mode", "auto", env=env)
    finally:
        for zone in aws.emulator.zones:
            for name in t4_types:
                aws.set_capacity(zone, name, True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "aws: no capacity for any fitting instance type" in done.stderr and "trying the next cloud" in done.stderr
    one_inference(project, done.stdout.strip(), env)
    records = json.loads(ngcx(project, "deployments", "ls", "--all", "--json", env=env).stdout)
    landed, missed = records[0], records[1]
    assert (landed["cloud"], landed["status"]) == ("aliyun", "ready")
    assert (missed["cloud"], missed["status"]) == ("aws", "failed") and "no capacity" in missed["detail"]
    assert not [i for i in aws.emulator.instances() if i["tags"].get("ngcx:deployment") == str(missed["id"])
                and i["state"] not in ("terminated", "shutting-down")]
    gone = ngcx(project, "deployments", "destroy", str(landed["id"]), "--yes", env=env)
    assert gone.returncode == 0, gone.stderr
