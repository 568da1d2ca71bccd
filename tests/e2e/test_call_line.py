"""The "call it: curl ..." line a deploy ends with, pasted into a shell as a user would: it must answer.

What a user notices (issue 46): the line printed the project's name (`onnx-zero-code`) where the served
model's name (`convnet`, model.name in examples/onnx-zero-code/ngcx.yaml) belongs, and the pasted call
answered `unknown model 'onnx-zero-code'; this server serves 'convnet'`. Both ready lines are run here:
a single deployment's (deploy/security.py how_to_call) and a service's (commands/services.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_helpers import MODEL, ngcx

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A state store of the test's own; whatever the test deployed is destroyed afterwards."""
    env = {"NGCX_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    yield env
    from ngcx.deploy import service, store

    for svc in store.services():
        service.destroy(svc)
    for record in store.records():
        if record.status == "ready":
            ngcx(tmp_path, "deployments", "destroy", str(record.id), "--yes", env=env)


def call_line(stderr: str) -> str:
    """The printed call, as the user copies it: everything after "ngcx: call it: " on its one line."""
    [line] = [line for line in stderr.splitlines() if line.startswith("ngcx: call it: ")]
    return line.removeprefix("ngcx: call it: ")


def paste(project: Path, line: str, env: dict[str, str]) -> tuple[int, dict]:
    """Run the line in bash as pasted (its `$(ngcx deployments key ID)` included, ngcx on PATH, in the
    project folder); curl's own options after it only capture the status and the body."""
    assert line.startswith("curl "), line
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", f"{line} -sS -o answer.json -w '%{{http_code}}'"], cwd=project,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env, "PATH": path})
    assert done.returncode == 0, done.stderr
    body = (project / "answer.json").read_text()
    (project / "answer.json").unlink()
    return int(done.stdout), json.loads(body)


def test_the_printed_call_of_a_deployment_answers(project: Path, state: dict[str, str]) -> None:
    done = ngcx(project, "deploy", "--cloud", "local", env=state)
    assert done.returncode == 0, done.stderr[-2000:]
    status, answer = paste(project, call_line(done.stderr), state)
    assert (status, answer.get("name")) == (200, MODEL), answer


def test_the_printed_call_of_a_service_answers(project: Path, state: dict[str, str]) -> None:
    done = ngcx(project, "deploy", "--cloud", "local", "--replicas", "1", "--health-interval", "1", env=state)
    assert done.returncode == 0, done.stderr[-2000:]
    status, answer = paste(project, call_line(done.stderr), state)
    assert (status, answer.get("name")) == (200, MODEL), answer
