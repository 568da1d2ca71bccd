"""`ngcx deploy --service s1 --canary 10` on the workstation, for real: a service of the example project behind
haproxy under constant load, then a canary that fails 5 % of its requests (rolled back by itself) and a good
canary (promoted in steps to 100 %), judged on the replicas' own /metrics (issue 49, part 2), then a canary whose
ngcx is killed with -9 mid-step, which `ngcx deployments reconcile` rolls back.

What a user notices: the bad canary leaves by itself, no request answered by the old version failed (its own
replicas count no failure, and every failed request the load saw came from the canary's handler), the old
replicas still serve all the traffic, and `ngcx deployments show` says why (requests, errors, p99 of canary and
old version); the good canary ends as the service's version with the old replicas drained, nothing failed.

The load: deploy_helpers.Load, LOAD_CLIENTS threads on keep-alive connections to the balancer, bounded in time
and count. The bad version is the same INT8 model behind a handler whose every 20th call raises (a 500): the
batcher runs a failed merged batch again one by one (runtime/batching.py), so a little over 5 % of its requests
fail. The good one is the same project under another name: its own image, its own version, the same speed.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deploy_helpers import Load, ngcx

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAST = ("--drain", "5", "--health-interval", "1")
WINDOW = ("--canary-window", "15")
FAILING = '''"""convnet as ngcx.yaml serves it, but every 20th call fails (a 500): a canary gone wrong."""
import threading


class EveryTwentieth:
    def load(self, context):
        self.engine, self.calls, self.lock = context.engine, 0, threading.Lock()

    def predict(self, inputs):
        with self.lock:
            self.calls += 1
            bad = self.calls % 20 == 0
        if bad:
            raise RuntimeError("every 20th call fails")
        return self.engine.infer(inputs)
'''


@pytest.fixture
def state(tmp_path, monkeypatch) -> Iterator[dict[str, str]]:
    env = {"NGCX_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    yield env
    from ngcx.deploy import service, store

    for svc in store.services():
        service.destroy(svc)


@pytest.fixture(scope="session")
def versions(project, tmp_path_factory) -> Path:
    """A copy of the built project with two more versions: ngcx.bad.yaml (the failing handler) and ngcx.good.yaml."""
    root = tmp_path_factory.mktemp("canary") / "project"
    shutil.copytree(project, root)
    (root / "failing.py").write_text(FAILING)
    spec = (root / "ngcx.yaml").read_text()
    (root / "ngcx.good.yaml").write_text(spec.replace("name: onnx-zero-code", "name: onnx-zero-code-good", 1))
    (root / "ngcx.bad.yaml").write_text(spec.replace("name: onnx-zero-code", "name: onnx-zero-code-bad", 1)
                                        + "handler: failing:EveryTwentieth\n")
    for name in ("ngcx.good.yaml", "ngcx.bad.yaml"):
        done = ngcx(root, "build", "-f", name, "--progress", "plain")
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return root


def body(project: Path) -> bytes:
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    array = example.inputs["image"]
    return json.dumps({"inputs": [{"name": "image", "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.reshape(-1).tolist()}]}).encode()


def show(cwd: Path, env: dict[str, str]) -> dict:
    done = ngcx(cwd, "deployments", "show", "s1", "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def failures(member: dict, key: str) -> int:
    """How many requests the replica itself counted as failed (its /metrics, with the service's key)."""
    parts = urlsplit(member["endpoint"])
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("nv_inference_request_failure{")))


def test_a_bad_canary_rolls_itself_back_and_a_good_one_is_promoted_under_load(versions, state):
    made = ngcx(versions, "deploy", "--cloud", "local", "--replicas", "2", *FAST, env=state)
    assert made.returncode == 0, made.stderr[-3000:]
    url = made.stdout.strip().splitlines()[-1]
    key = ngcx(versions, "deployments", "key", "s1", env=state).stdout.strip()
    before = show(versions, state)
    v1, olds = before["version"], before["members"]
    payload = body(versions)

    with Load(url, key, payload) as load:
        load.settle()
        bad = ngcx(versions, "deploy", "-f", "ngcx.bad.yaml", "--service", "s1", "--canary", "10", *WINDOW, env=state)
        load.settle()
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert [ln for ln in bad.stderr.splitlines() if ln.startswith("ngcx: error")] == \
        [next(ln for ln in bad.stderr.splitlines() if ln.startswith("ngcx: error: service s1: canary"))]
    assert "rolled back at 10 %: error rate" in bad.stderr and "above the 1 % limit" in bad.stderr
    assert "canary step 10 %: 2 new replica(s) take 10 % of requests" in bad.stderr
    svc = show(versions, state)
    assert svc["status"] == "ready" and svc["version"] == v1
    assert [m["id"] for m in svc["members"]] == [m["id"] for m in olds]        # the old replicas, never touched
    assert sum(failures(m, key) for m in svc["members"]) == 0, "the old version failed a request"
    assert load.errors and all(e.startswith("500") and "every 20th call fails" in e for e in load.errors), \
        load.errors[:5]
    judged = svc["canary"]
    assert judged["outcome"] == "rolled back" and judged["version"] != v1
    [step] = judged["steps"]
    assert step["percent"] == 10 and step["outcome"] == "fail"
    assert step["canary"]["errors"] > 0 and step["canary"]["requests"] >= step["canary"]["errors"]
    assert step["baseline"]["errors"] == 0 and step["baseline"]["requests"] > step["canary"]["requests"]
    assert "canary" in svc["detail"] and "rolled back" in svc["detail"]
    print(f"bad canary: {load.total()} requests, {len(load.errors)} failed, all from the canary; judged on "
          f"{step['canary']} against {step['baseline']} in {step['seconds']} s")

    with Load(url, key, payload) as load:
        load.settle()
        good = ngcx(versions, "deploy", "-f", "ngcx.good.yaml", "--service", "s1", "--canary", "10", *WINDOW,
                    env=state)
        load.settle()
    assert good.returncode == 0, good.stderr[-3000:]
    assert not load.errors and load.total() > 100, (load.seen, load.errors[:5])
    assert "canary step 10 % passed" in good.stderr and "canary step 50 % passed" in good.stderr
    svc = show(versions, state)
    assert svc["status"] == "ready" and svc["version"] not in (v1, judged["version"])
    assert svc["image"].startswith("ngcx-app/onnx-zero-code-good")
    assert len(svc["members"]) == 2 and {m["spec"]["version"] for m in svc["members"]} == {svc["version"]}
    assert not {m["id"] for m in olds} & {m["id"] for m in svc["members"]}          # the old ones drained out
    assert svc["canary"]["outcome"] == "promoted"
    assert [s["percent"] for s in svc["canary"]["steps"]] == [10, 50, 100]
    assert all(s["outcome"] == "pass" for s in svc["canary"]["steps"])
    assert all(s["canary"]["requests"] >= 100 for s in svc["canary"]["steps"][:2])
    shares = [s["canary"]["requests"] / (s["canary"]["requests"] + s["baseline"]["requests"])
              for s in svc["canary"]["steps"][:2]]
    assert shares[0] < 0.2 and 0.3 < shares[1] < 0.7, shares        # the balancer's weights: 10 %, then 50 %
    human = ngcx(versions, "deployments", "show", "s1", env=state)
    assert "canary" in human.stdout and "promoted" in human.stdout, human.stdout

    # kill -9 of the ngcx running a canary: the row still says "running"; reconcile rolls it back under load
    log = versions / "killed-canary.log"
    with Load(url, key, payload) as load, log.open("w") as err:
        load.settle()
        running = subprocess.Popen([sys.executable, "-m", "ngcx", "deploy", "--service", "s1", "--canary", "10",
                                    "--canary-window", "600"], cwd=versions, stdout=subprocess.DEVNULL, stderr=err,
                                   env={**os.environ, "NGCX_BASE": "offline", **state})
        try:
            deadline = time.monotonic() + 300
            while "canary step 10 %:" not in log.read_text() and running.poll() is None and \
                    time.monotonic() < deadline:
                time.sleep(0.5)
            assert "canary step 10 %:" in log.read_text(), log.read_text()[-3000:]
        finally:
            running.send_signal(signal.SIGKILL)
            running.wait(30)
        left = show(versions, state)
        assert left["canary"]["outcome"] == "running" and len(left["members"]) == 4, left["canary"]
        fixed = ngcx(versions, "deployments", "reconcile", "s1", env=state)
        load.settle()
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "interrupted canary is rolled back" in fixed.stderr, fixed.stderr[-3000:]
    assert not load.errors and load.total() > 50, (load.seen, load.errors[:5])
    after = show(versions, state)
    assert after["status"] == "ready" and after["version"] == svc["version"]
    assert sorted(m["id"] for m in after["members"]) == sorted(m["id"] for m in svc["members"])  # the canary's gone
    assert after["canary"]["outcome"] == "rolled back" and "interrupted" in after["canary"]["reason"]
