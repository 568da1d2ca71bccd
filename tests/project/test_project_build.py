"""`ngcx build` / `ngcx lock` of an ngcx.yaml project on the real engine, as a user sees them.

One tiny project (an ONNX MLP, a handler, `six` from the package index) on onnxruntime:25.08 is
built once for the module and then edited: a code edit must rebuild only from 'code' and keep the
model layer, a model change must keep the wheels layer, `ngcx lock` must produce the lock the
build then installs, and a requirement that would replace a pin must fail in one line with no
image and no state left behind. The base image is the catalog's (built by test_build.py's matrix
or by this module's first build); nothing here builds a framework.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from support import SecretScan, local_layers

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
import models  # noqa: E402

pytestmark = pytest.mark.docker

BASE_TAG = "ngcx/onnxruntime:25.08-runtime"
CONFLICT = "onnxconverter-common==1.14.0"      # pure Python; pins protobuf==3.20.2, the base ships protobuf 7


def ngcx(*args: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The real `ngcx` command run in a project folder."""
    return subprocess.run([sys.executable, "-m", "ngcx", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("ngcx: error:")]


def write_project(root: Path, name: str, packages: list[str]) -> Path:
    root.mkdir(parents=True)
    models.mlp(root / "model.onnx")
    (root / "handler.py").write_text(
        "class Handler:\n"
        "    def load(self, context):\n        self.engine = context.engine\n\n"
        "    def predict(self, inputs):\n        return self.engine.infer(inputs)\n")
    (root / "labels.txt").write_text("a\nb\n")
    (root / "ngcx.yaml").write_text(
        f"name: {name}\nbase: onnxruntime:25.08\npython_packages: {json.dumps(packages)}\n"
        "model: {path: model.onnx, batch: [1, 8]}\nhandler: handler:Handler\nfiles: [labels.txt]\n")
    return root


@pytest.fixture(scope="module")
def env(tmp_path_factory, docker_client, base_image) -> dict[str, str]:
    """Isolated ngcx state and config; a missing base release would be built on the offline base."""
    root = tmp_path_factory.mktemp("ngcx-project-state")
    return {"NGCX_STATE_DIR": str(root / "state"), "NGCX_CONFIG_DIR": str(root / "config"), "NGCX_BASE": "offline"}


@pytest.fixture(scope="module")
def project(tmp_path_factory, docker_client, env):
    """The shared project, built once (with `ngcx build` in its folder, no arguments)."""
    name = f"it-{secrets.token_hex(4)}"
    root = write_project(tmp_path_factory.mktemp("proj") / name, name, ["six"])
    result = ngcx("build", cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    tag = f"ngcx-app/{name}:latest"
    yield {"root": root, "name": name, "tag": tag, "first": result}
    for ref in {tag, *(i.id for i in docker_client.images.list(name=f"ngcx-app/{name}"))}:
        with contextlib.suppress(Exception):  # already gone
            docker_client.images.remove(ref, force=True)


def layers(client, ref: str) -> list[str]:
    return list(client.images.get(ref).attrs["RootFS"]["Layers"])


def in_image(client, tag: str, *cmd: str) -> str:
    return client.containers.run(tag, list(cmd), entrypoint=[], remove=True).decode()


def project_layer(client, tag: str, which: str) -> str:
    """The diff ID of a project layer: the image's layers after the base's are
    [folders (RUN), wheels (RUN), model (COPY), its signature (COPY), code (COPY), ngcx.yaml (COPY)]."""
    img = client.images.get(tag)
    base_layers = client.images.get(img.labels["ai.ngcx.project.base-id"]).attrs["RootFS"]["Layers"]
    ours = img.attrs["RootFS"]["Layers"][len(base_layers):]
    return ours[["folders", "wheels", "model", "signature", "code", "config"].index(which)]


def test_the_image_builds_on_the_base_with_traceable_labels(project, docker_client, env):
    first = project["first"]
    assert "building every layer (first build of this project)" in first.stdout
    img = docker_client.images.get(project["tag"])
    labels = img.labels
    base = docker_client.images.get(labels["ai.ngcx.project.base-id"])
    assert BASE_TAG in base.tags or labels["ai.ngcx.project.base"] == "onnxruntime:25.08"
    base_layers = base.attrs["RootFS"]["Layers"]
    assert layers(docker_client, project["tag"])[:len(base_layers)] == base_layers
    model = (project["root"] / "model.onnx").read_bytes()
    assert labels["ai.ngcx.project.model-sha256"] == hashlib.sha256(model).hexdigest()
    assert labels["ai.ngcx.project.lock-sha256"] == hashlib.sha256(b"six\n").hexdigest()
    assert labels["ai.ngcx.pin.onnxruntime"] == "1.22.0"                      # the base's pins, inherited
    config = img.attrs["Config"]
    assert config["Cmd"] == ["ngcx-runtime", "serve", "/opt/ngcx/model/model.onnx", "--host", "0.0.0.0", "--port",
                             "8000", "--name", project["name"], "--handler", "handler:Handler", "--precision", "fp32",
                             "--batch-profile", "1,8", "--max-queue-delay-ms", "1"]
    assert "NGCX_RUNTIME_CACHE=/var/cache/ngcx/plans" in config["Env"] and "/var/cache/ngcx/plans" in config["Volumes"]
    listing = in_image(docker_client, project["tag"], "sh", "-c", "ls /opt/ngcx/model; ls /opt/ngcx/app")
    assert listing.split() == ["model.onnx", "model.onnx.pub", "model.onnx.sig", "handler.py", "labels.txt",
                               "ngcx.yaml"]
    frozen = in_image(docker_client, project["tag"], "pip", "freeze").split()
    base_frozen = in_image(docker_client, labels["ai.ngcx.project.base-id"], "pip", "freeze").split()
    assert set(base_frozen) <= set(frozen)                      # nothing the base ships was replaced
    assert [p for p in set(frozen) - set(base_frozen)] == [next(p for p in frozen if p.startswith("six=="))]
    rows = json.loads(ngcx("images", "--json", cwd=project["root"], env=env).stdout)
    assert [r["present"] for r in rows if r["tag"] == project["tag"]] == [True]


def test_a_code_edit_rebuilds_only_from_code_and_keeps_the_model_layer(project, docker_client, env):
    tag, root = project["tag"], project["root"]
    before = {k: project_layer(docker_client, tag, k) for k in ("wheels", "model", "signature", "code")}
    with open(root / "handler.py", "a") as f:
        f.write("# edited: code-only change\n")
    result = ngcx("build", "-f", str(root / "ngcx.yaml"), cwd=root.parent, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rebuilding from layer 'code' (handler.py changed); wheels, model: cached" in result.stdout
    after = {k: project_layer(docker_client, tag, k) for k in ("wheels", "model", "signature", "code")}
    assert (after["wheels"], after["model"], after["signature"]) == (before["wheels"], before["model"],
                                                                     before["signature"])
    assert after["code"] != before["code"]
    assert "edited: code-only change" in in_image(docker_client, tag, "cat", "/opt/ngcx/app/handler.py")


def test_a_model_change_rebuilds_from_the_model_and_keeps_the_wheels(project, docker_client, env):
    tag, root = project["tag"], project["root"]
    before = {k: project_layer(docker_client, tag, k) for k in ("wheels", "model", "signature")}
    models.mlp(root / "model.onnx", hidden=48)
    result = ngcx("build", cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rebuilding from layer 'model' (the model changed); wheels: cached" in result.stdout
    assert project_layer(docker_client, tag, "wheels") == before["wheels"]
    assert project_layer(docker_client, tag, "model") != before["model"]
    assert project_layer(docker_client, tag, "signature") != before["signature"]     # signed again
    assert docker_client.images.get(tag).labels["ai.ngcx.project.model-sha256"] == \
        hashlib.sha256((root / "model.onnx").read_bytes()).hexdigest()


def test_lock_resolves_in_the_base_and_build_installs_the_lock(project, docker_client, env):
    tag, root = project["tag"], project["root"]
    result = ngcx("lock", cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (root / "ngcx.lock").read_text()
    base_id = docker_client.images.get(tag).labels["ai.ngcx.project.base-id"]
    assert f"# base-id: {base_id}" in text and "# platform: python 3.11" in text
    assert re.findall(r"^[^#].*$", text, re.M) == [re.search(r"^six==\S+ --hash=sha256:[0-9a-f]{64}$", text,
                                                            re.M).group(0)]
    # The build must install the lock, not the loose `six`: pin an older release there (with its wheel's sha256,
    # PyPI's six-1.16.0-py2.py3-none-any.whl: the build checks it) and look inside.
    six_116 = "six==1.16.0 --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254"
    (root / "ngcx.lock").write_text(re.sub(r"^six==.*$", six_116, text, flags=re.M))
    result = ngcx("build", cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wheels from ngcx.lock" in result.stdout
    assert "rebuilding from layer 'wheels' (ngcx.lock changed)" in result.stdout
    assert "six==1.16.0" in in_image(docker_client, tag, "pip", "freeze").split()
    assert docker_client.images.get(tag).labels["ai.ngcx.project.lock-sha256"] == \
        hashlib.sha256((root / "ngcx.lock").read_bytes()).hexdigest()


def test_a_stale_lock_is_refused_in_one_line_and_the_image_stays(project, docker_client, env):
    tag, root = project["tag"], project["root"]
    image_id = docker_client.images.get(tag).id
    lock = (root / "ngcx.lock").read_text()
    (root / "ngcx.lock").write_text(re.sub(r"^# base-(id|layers): .*$", r"# base-\1: sha256:" + "0" * 64, lock,
                                           flags=re.M))
    result = ngcx("build", cwd=root, env=env)
    assert result.returncode == 2 and len(errors(result)) == 1, result.stderr[-2000:]
    assert "was resolved on onnxruntime:25.08" in errors(result)[0] and "run `ngcx lock` again" in errors(result)[0]
    (root / "ngcx.lock").write_text(lock)
    yaml = (root / "ngcx.yaml").read_text()
    (root / "ngcx.yaml").write_text(yaml.replace('["six"]', '["six", "packaging"]'))
    try:
        result = ngcx("build", cwd=root, env=env)
    finally:
        (root / "ngcx.yaml").write_text(yaml)
    assert result.returncode == 2 and "is older than the requirements" in errors(result)[0]
    assert docker_client.images.get(tag).id == image_id


def test_a_requirement_that_would_replace_a_pin_fails_in_one_line_and_leaves_nothing(
        tmp_path, docker_client, env):
    name = f"it-bad-{secrets.token_hex(4)}"
    root = write_project(tmp_path / name, name, [CONFLICT])
    result = ngcx("build", cwd=root, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert errors(result) == [errors(result)[0]] and "Traceback" not in result.stderr
    line = errors(result)[0]
    assert f"requirement '{CONFLICT}' needs protobuf==3.20.2" in line and "pins protobuf==" in line
    assert not docker_client.images.list(name=f"ngcx-app/{name}")
    rows = json.loads(ngcx("images", "--json", cwd=root, env=env).stdout)
    assert not [r for r in rows if r["image"] == name]
    assert not (Path(env["NGCX_STATE_DIR"]) / "projects" / name).exists()
    result = ngcx("lock", cwd=root, env=env)
    assert result.returncode == 2 and f"requirement '{CONFLICT}' needs protobuf==3.20.2" in errors(result)[0]
    assert not (root / "ngcx.lock").exists()


TOOL = "name: x\nbase: onnxruntime:25.08\ncommand: [sleep, '1']\n"


@pytest.mark.parametrize(("files", "args", "expect"), [
    ({}, ["build"], "no ngcx.yaml in"),
    ({"ngcx.yaml": TOOL + "modle: {}\n"}, ["build"],
     "ngcx.yaml:4: modle: unknown key"),
    ({"ngcx.yaml": TOOL}, ["build", "cuda:24.05", "-f", "ngcx.yaml"],
     "pass either IMAGE (cuda:24.05) or -f"),
    ({"ngcx.yaml": TOOL}, ["build", "--tag", "me/x:1"],
     "--tag does not apply to a project"),
    ({"ngcx.yaml": TOOL}, ["lock"], "nothing to lock"),
])
def test_project_bad_input_is_one_line_exit_2_and_builds_nothing(tmp_path, files, args, expect):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    state = tmp_path / "state"
    result = ngcx(*args, cwd=tmp_path, env={"NGCX_STATE_DIR": str(state), "NGCX_CONFIG_DIR": str(tmp_path / "c")})
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.returncode == 2 and len(lines) == 1 and expect in lines[0], result.stderr
    assert not (state / "projects").exists()


def test_no_ca_or_index_password_in_the_project_image_lock_or_state(docker_client, base_image, tmp_path, env,
                                                                    secret_canaries):
    """Build and lock through a canary CA bundle and a password index URL; then search everything for both.
    The requirement text is unique, so the wheels step really runs (with the secrets mounted). Most of this
    test's minute is `docker save` of the 3.9 GB image; the base's layers are then skipped, the new ones read."""

    older = local_layers(docker_client)
    name = f"it-sec-{secrets.token_hex(4)}"
    root = write_project(tmp_path / name, name, [f"six!=0.0.{secrets.randbelow(10**9)}"])
    run_env = {**env, "NGCX_STATE_DIR": str(tmp_path / "state")}
    flags = ["--ca-cert", str(secret_canaries.ca_bundle), "--pip-index-url", secret_canaries.pip_index_url()]
    scan = SecretScan(secret_canaries.needles())
    try:
        build = ngcx("build", "--progress", "plain", *flags, cwd=root, env=run_env)
        assert build.returncode == 0, build.stderr[-3000:]
        assert "pip install" in build.stderr or "Collecting" in build.stderr      # the wheels step ran here
        lock = ngcx("lock", *flags, cwd=root, env=run_env)
        assert lock.returncode == 0, lock.stderr[-3000:]
        for label, proc in (("build", build), ("lock", lock)):
            scan.process(label, proc)
        scan.image(docker_client, f"ngcx-app/{name}:latest", tmp_path, older)
        scan.tree(root)
        scan.tree(tmp_path / "state")
        scan.sqlite(tmp_path / "state" / "state.db")
        print(scan.summary())
        assert scan.places > 10 and scan.hits == []
    finally:
        with contextlib.suppress(Exception):
            docker_client.images.remove(f"ngcx-app/{name}:latest", force=True)
