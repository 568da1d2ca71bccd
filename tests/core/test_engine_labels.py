"""`engine.image_labels`: what a deploy reads of the image it serves, straight from the engine's socket.

It reads the labels the deploy passes on (the image's pins, its runtime command, its model); it must say exactly
what the docker SDK says, tell a missing image from a down engine, and say a down engine in one line.
"""

from __future__ import annotations

import io
import secrets

import pytest

from ngcx.core.engine import image_labels
from ngcx.core.errors import UserError


@pytest.fixture()
def labelled_image(docker_client, base_image):
    """A tiny image FROM the offline base with labels that need quoting (a slash, a colon, spaces)."""
    tag = f"ngcx-test/labels-{secrets.token_hex(4)}:v1"
    dockerfile = (f"FROM {base_image}\n"
                  'LABEL org.ngcx.model="convnet v2" org.ngcx.cmd="ngcx-runtime serve --port 8000" '
                  "org.ngcx.ref=registry.example.com/team/app:1\n")
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    try:
        yield tag, image
    finally:
        docker_client.images.remove(image.id, force=True)


@pytest.mark.docker
def test_the_labels_are_what_the_docker_sdk_reads_by_tag_and_by_id(labelled_image):
    tag, image = labelled_image
    assert image_labels(tag) == image.labels
    assert image_labels(image.id) == image.labels
    assert image_labels(tag)["org.ngcx.cmd"] == "ngcx-runtime serve --port 8000"


@pytest.mark.docker
def test_an_image_the_engine_lacks_is_none(docker_client):
    assert image_labels(f"ngcx-test/never-built-{secrets.token_hex(4)}:latest") is None


def test_an_engine_that_is_not_there_is_one_line_naming_its_socket(tmp_path, monkeypatch):
    socket_path = tmp_path / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket_path}")
    with pytest.raises(UserError) as caught:
        image_labels("ngcx/base:bookworm")
    assert f"Docker Engine not reachable at unix://{socket_path}" in str(caught.value)
    assert "\n" not in str(caught.value)
