"""`ngcx sbom` as a user meets it on images that need no catalog build: bad input, the offline base (no Python
in it), and a project-style image whose model must match the sha256 its build recorded.

The catalog images' SBOMs (cuda, pytorch) are checked package by package in test_sbom_image.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import subprocess

import pytest
from sbom_checks import cyclonedx_errors, in_image

from support import run_ngcx

pytestmark = pytest.mark.docker


def _one_error(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("ngcx: error:"), proc.stderr
    assert proc.stdout == "", "nothing half-done on stdout"
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_bad_input_is_one_line_exit_2(docker_client, base_image, tmp_path):
    _one_error(run_ngcx("sbom", base_image, "--format", "xml"), "--format", "cyclonedx or spdx")
    _one_error(run_ngcx("sbom", f"ngcx-test/absent-{secrets.token_hex(4)}:1"), "no local image")
    _one_error(run_ngcx("sbom", "cuda:99.99"), "unknown release")
    _one_error(run_ngcx("sbom", "cuda:24.05", "--variant", "slim"), "--variant")
    _one_error(run_ngcx("sbom", base_image, "-o", str(tmp_path / "no-such-dir" / "sbom.json")), "does not exist")
    down = run_ngcx("sbom", base_image, env={"DOCKER_HOST": f"unix://{tmp_path}/no-dockerd.sock"})
    _one_error(down, "Docker Engine not reachable")
    assert not list(tmp_path.iterdir())


def test_base_without_python_lists_its_debian_packages(docker_client, base_image, tmp_path):
    """The offline base has dpkg but no python3: the SBOM still lists every package dpkg-query reports, says
    what it could not list, and validates."""
    out = tmp_path / "base.cdx.json"
    proc = run_ngcx("sbom", base_image, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert cyclonedx_errors(doc) == []
    listed = {(c["name"], c["version"]) for c in doc["components"] if c["purl"].startswith("pkg:deb/")}
    rows = in_image(docker_client, base_image, ["dpkg-query", "-W"]).splitlines()
    assert listed == {(r.split("\t")[0].split(":")[0], r.split("\t")[1]) for r in rows}
    image = doc["metadata"]["component"]
    assert image["type"] == "container" and image["version"] == docker_client.images.get(base_image).id
    notes = [p["value"] for p in image["properties"] if p["name"].startswith("ngcx:note.")]
    assert any("no python3" in n for n in notes), notes


def _model_image(client, base: str, model: bytes, label: str) -> str:
    """An image FROM `base` with a model file where a project image keeps it and the label its build writes."""
    import tarfile

    dockerfile = (f"FROM {base}\nCOPY model.onnx /opt/ngcx/model/model.onnx\n"
                  f"LABEL ai.ngcx.project.model-sha256={label}\n").encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("model.onnx", model)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tag = f"ngcx-test/sbom-model:{secrets.token_hex(4)}"
    client.images.build(fileobj=io.BytesIO(buf.getvalue()), custom_context=True, tag=tag, rm=True)
    return tag


def test_model_sha256_is_read_inside_and_a_changed_model_is_refused(docker_client, cuda_image):
    model = secrets.token_bytes(4096)
    sha = hashlib.sha256(model).hexdigest()
    good = _model_image(docker_client, cuda_image, model, sha)
    bad = _model_image(docker_client, cuda_image, model, hashlib.sha256(b"the model that was built").hexdigest())
    try:
        proc = run_ngcx("sbom", good)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        models = [c for c in doc["components"] if c["type"] == "machine-learning-model"]
        assert [(m["name"], m["hashes"][0]["content"]) for m in models] == [("model.onnx", sha)]
        _one_error(run_ngcx("sbom", bad), "model", sha, "not the one its build recorded")
    finally:
        for tag in (good, bad):
            docker_client.images.remove(tag, force=True)


def test_a_pushed_image_is_named_by_the_digest_its_registry_serves(docker_client, base_image, registry):
    """The SBOM names what a signature names: the manifest digest the registry serves (read here from the
    registry's own Docker-Content-Digest header), or the digest `ngcx push` passes; an image never pushed under
    its own name is named by its image ID, not by another repository's digest."""
    import requests

    from ngcx.trust.sbom import make_sbom

    ns = f"ngcx-sbom-{secrets.token_hex(4)}"
    repo = f"{registry}/{ns}/base"
    docker_client.images.get(base_image).tag(repo, "t")
    try:
        docker_client.images.push(repo, "t")
        served = requests.head(f"http://{registry}/v2/{ns}/base/manifests/t", timeout=10, headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json"}).headers["Docker-Content-Digest"]
        pushed = json.loads(run_ngcx("sbom", f"{repo}:t").stdout)["metadata"]["component"]
        assert pushed["version"] == served and pushed["purl"].startswith(f"pkg:oci/base@{served}?")
        local = json.loads(run_ngcx("sbom", base_image).stdout)["metadata"]["component"]
        assert local["version"] == docker_client.images.get(base_image).id
        named = make_sbom(base_image, digest=served)["metadata"]["component"]
        assert named["version"] == served
    finally:
        docker_client.images.remove(f"{repo}:t")
