"""A project's model is signed at `ngcx build` (OpenSSF Model Signing, ngcx's key) and checked where it runs.

Issue 48 item 5 and its tamper test, as a user meets them: the built image holds MODEL.sig and MODEL.pub beside
the model, in their own small layer right after the model's; the signature verifies with the `model-signing`
library's own verifier (not ngcx's) and ngcx's public key; an image whose model has one byte changed after
signing does not start: run by hand, `ngcx-runtime serve` refuses in one line naming the file and both sha256;
deployed with `ngcx deploy --cloud local`, the deploy fails in one line saying so and leaves nothing running.

The project is the deploy tests' session build of examples/onnx-zero-code (tests/e2e/clouds.py `project`), not a
build of its own.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import tarfile
from pathlib import Path

import pytest
from e2e.deploy_helpers import ngcx

pytestmark = [pytest.mark.docker]

TAG = "ngcx-app/onnx-zero-code:latest"
MODEL = "/opt/ngcx/model/convnet.onnx"


def _extract(docker_client, image: str, folder: str, into: Path) -> Path:
    """The image's FOLDER copied out (docker cp through the Engine API) into INTO."""
    container = docker_client.containers.create(image, command=["true"])
    try:
        stream, _ = container.get_archive(folder)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(into, filter="data")
    finally:
        container.remove(force=True)
    return into / Path(folder).name


def _require_verifying_runtime(docker_client) -> None:
    """The runtime in the image comes from the base (ngcx/onnxruntime:25.08-runtime); ensure_base rebuilds a base
    only when its ai.ngcx.runtime version differs, so a base built from an older checkout of the same version has
    no verifier. That is a failure to act on (rebuild the base), never a pass."""
    from docker.errors import ContainerError

    try:
        docker_client.containers.run(TAG, ["python", "-c", "import ngcx_runtime.modelsig"], remove=True,
                                     network_disabled=True)
    except ContainerError:
        pytest.fail(f"{TAG}'s ngcx-runtime has no modelsig.py: its base was built before runtime/modelsig.py with "
                    "the same runtime version; rebuild it: ngcx build onnxruntime:25.08, then ngcx build")


@pytest.fixture(scope="module")
def tampered(project, docker_client) -> str:
    """The project image with one byte of its model flipped after signing, built FROM it (no network)."""
    _require_verifying_runtime(docker_client)
    tag = f"ngcx-test/tampered-model:{secrets.token_hex(4)}"
    dockerfile = (f"FROM {TAG}\n"
                  f"RUN python -c \"p='{MODEL}'; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=1; "
                  "open(p,'wb').write(bytes(b))\"\n")
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, pull=False)
    yield tag
    docker_client.images.remove(tag, force=True)


def test_the_built_image_holds_a_signature_the_model_signing_library_verifies_with_ngcxs_key(project, docker_client,
                                                                                            tmp_path):
    import model_signing

    from ngcx.trust.keys import default_key_path, fingerprint

    labels = docker_client.images.get(TAG).labels
    assert labels["ai.ngcx.project.model-signature"] == f"{MODEL}.sig"
    folder = _extract(docker_client, TAG, "/opt/ngcx/model", tmp_path)
    model, sig, pub = folder / "convnet.onnx", folder / "convnet.onnx.sig", folder / "convnet.onnx.pub"
    assert pub.read_bytes() == default_key_path().with_name("cosign.pub").read_bytes()     # ngcx's own key
    assert labels["ai.ngcx.project.model-signing-key"] == fingerprint(pub.read_bytes())
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, sig)   # raises if not
    statement = json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))
    [resource] = statement["predicate"]["resources"]
    assert resource["digest"] == hashlib.sha256(model.read_bytes()).hexdigest() \
        == labels["ai.ngcx.project.model-sha256"]
    assert (project / "model" / "convnet.onnx").read_bytes() == model.read_bytes()


def test_the_signature_is_its_own_small_layer_right_after_the_model(project, docker_client):
    steps = docker_client.images.get(TAG).history()      # newest first
    history, sizes = [h.get("CreatedBy", "") for h in steps], [h.get("Size", 0) for h in steps]
    [model_step] = [i for i, step in enumerate(history) if f"COPY model/convnet.onnx {MODEL}" in step]
    [sig_step] = [i for i, step in enumerate(history) if step.startswith("COPY model/convnet.onnx.sig ")]
    assert sig_step == model_step - 1, history[:model_step + 1]
    assert sizes[sig_step] < 16_384 < sizes[model_step]


def test_a_model_changed_after_signing_stops_the_server_in_one_line(tampered, docker_client):
    """The runtime's own refusal: the tampered image run directly, with its own command."""
    container = docker_client.containers.run(tampered, detach=True, network_disabled=True)
    try:
        code = container.wait(timeout=120)["StatusCode"]
        out = container.logs(stdout=True, stderr=False).decode()
        err = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert line.startswith(f"ngcx-runtime serve: model file {MODEL} changed after signing: sha256 "), line
    assert "listening" not in out and "Traceback" not in err


def test_deploying_the_tampered_image_fails_in_one_line_with_nothing_left_running(tampered, docker_client,
                                                                                  tmp_path):
    state = {"NGCX_STATE_DIR": str(tmp_path / "state")}
    done = ngcx(tmp_path, "deploy", "--cloud", "local", tampered, env=state, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert "changed after signing" in line and MODEL in line, line
    assert not docker_client.containers.list(all=True, filters={"ancestor": tampered})
