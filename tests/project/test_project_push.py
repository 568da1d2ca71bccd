"""`ngcx push --registry R` in a project folder pushes the project's image, as build, test and deploy find it.

What a user notices (issue 46): in a folder with ngcx.yaml, `ngcx build`, `ngcx test` and `ngcx deploy` take
no IMAGE, but `ngcx push --registry R` stopped with "Missing argument 'ref'". Here the deploy tests' session build
of examples/onnx-zero-code (tests/e2e/clouds.py `project`: an ONNX model on onnxruntime:25.08, `ngcx build` in its
folder) is pushed with no IMAGE to the loopback registry, and the registry must serve the digest the command
printed; `-f FILE` from elsewhere pushes the same image, and a folder without ngcx.yaml, or a project not built
yet, is one line with exit 2.

Why the session build and not one of its own: a project built here had layers of its own, and pushing its
3.9 GB to the registry took two minutes of CI (tests/ci timings, 2026-11-29); the session image's layers are in
the registry already (the deploy tests pushed them), so the engine mounts them across repositories.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402

pytestmark = pytest.mark.docker

ACCEPT = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"


def ngcx(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real `ngcx` command run in `cwd`, as a user would."""
    done = subprocess.run([sys.executable, "-m", "ngcx", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, **env})
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def write_project(root: Path, name: str) -> Path:
    root.mkdir(parents=True)
    models.mlp(root / "model.onnx")
    (root / "ngcx.yaml").write_text(f"name: {name}\nbase: onnxruntime:25.08\nmodel: {{path: model.onnx}}\n")
    return root


@pytest.fixture(scope="module")
def env(tmp_path_factory, docker_client) -> dict[str, str]:
    """Isolated ngcx state and config; a missing base release is built on the offline base."""
    root = tmp_path_factory.mktemp("ngcx-push-state")
    return {"NGCX_STATE_DIR": str(root / "state"), "NGCX_CONFIG_DIR": str(root / "config"), "NGCX_BASE": "offline"}


def registry_digest(registry: str, repo: str, tag: str) -> str:
    resp = requests.head(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10)
    assert resp.status_code == 200, resp.status_code
    return resp.headers["Docker-Content-Digest"]


def pushed(done: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The last stdout line, REPO:TAG@DIGEST."""
    assert done.returncode == 0, done.stderr[-3000:]
    ref, _, digest = done.stdout.strip().splitlines()[-1].partition("@")
    assert digest.startswith("sha256:"), done.stdout
    return ref, digest


def test_push_in_a_project_folder_pushes_the_projects_image(project, registry, docker_client, tmp_path):
    namespace = f"ngcx-test-{secrets.token_hex(4)}"
    name = project.name
    ref, digest = pushed(ngcx("push", "--registry", f"{registry}/{namespace}", "--no-sign", cwd=project, env={}))
    assert ref == f"{registry}/{namespace}/{name}:latest"
    assert registry_digest(registry, f"{namespace}/{name}", "latest") == digest
    local = docker_client.images.get(f"ngcx-app/{name}:latest")
    assert f"{registry}/{namespace}/{name}@{digest}" in local.attrs["RepoDigests"]

    elsewhere = ngcx("push", "-f", str(project / "ngcx.yaml"), "--registry", f"{registry}/{namespace}",
                     "--no-sign", cwd=tmp_path, env={})
    assert pushed(elsewhere) == (ref, digest)
    with contextlib.suppress(Exception):
        docker_client.images.remove(ref, noprune=True)


def test_push_without_image_outside_a_project_is_one_line(registry, env, tmp_path):
    done = ngcx("push", "--registry", registry, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ngcx: error: no IMAGE given and no ngcx.yaml in "), line


def test_push_of_a_project_not_built_is_one_line(registry, env, tmp_path):
    root = write_project(tmp_path / "unbuilt", f"unbuilt-{secrets.token_hex(4)}")
    done = ngcx("push", "--registry", registry, cwd=root, env=env)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "is not built" in line and "ngcx build" in line, line
