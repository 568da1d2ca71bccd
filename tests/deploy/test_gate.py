"""The trust gate of `ngcx deploy --cloud local` (cli/deploy/gate.py check_local), on real images in the real engine.

What a user notices: an image ngcx built or pushed and signed here is served; the same local tag re-pointed at
another image (`docker tag`, a pull that replaced it) is refused in one line naming both, before anything starts;
`--allow-unsigned` serves it with a warning line; an image this state never built nor pushed is served with a
note that it is not signed. The images are tiny one-file ones (tests/trust/trust_images.py); "built" is the row
`ngcx build` writes (state.record_build), the table check_local reads.
"""

from __future__ import annotations

import secrets

import pytest
from trust.trust_images import push, remove_images, tiny_image

from ngcx.deploy import gate
from ngcx.deploy.common import DeployConfig
from ngcx.state import db as state
from ngcx.trust.verify import Refused

pytestmark = pytest.mark.docker


@pytest.fixture
def images(docker_client):
    """make(name) -> a fresh tiny image under the local tag `name` (a second call re-points the tag)."""
    made: list[str] = []

    def make(ref: str) -> tuple[str, list[str]]:
        repository, tag = ref.rsplit(":", 1)
        tiny_image(docker_client, repository, tag)
        image = docker_client.images.get(ref)
        made.append(image.id)
        return image.id, list(image.attrs.get("RepoDigests") or [])

    yield make
    remove_images(docker_client, *made)


def _local(docker_client, ref: str) -> tuple[str, list[str]]:
    image = docker_client.images.get(ref)
    return image.id, list(image.attrs.get("RepoDigests") or [])


def _config(image: str, **kwargs) -> DeployConfig:
    return DeployConfig(cloud="local", image=image, pull_ref=None, registry=None, labels={}, model=None, **kwargs)


def _name() -> str:
    return f"ngcx-gate/tiny{secrets.token_hex(3)}:v1"


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_an_image_built_here_passes_and_the_tag_repointed_is_refused_naming_both(images, docker_client,
                                                                                 isolated_state, capsys):
    ref = _name()
    built_id, _ = images(ref)
    state.record_build(image=ref, release="test", variant="runtime", tag=ref, image_id=built_id)
    gate.check_local(_config(ref), *_local(docker_client, ref))
    assert capsys.readouterr().err == ""

    other_id, _ = images(ref)           # `docker tag`-ed over: the same local name, another image
    assert other_id != built_id
    with pytest.raises(Refused) as refused:
        gate.check_local(_config(ref), *_local(docker_client, ref))
    line = _one_line(refused.value.line())
    assert line.startswith("image refused: ") and ref in line
    assert other_id[:19] in line and built_id[:19] in line
    assert refused.value.exit_code == 1


def test_an_image_pushed_and_signed_passes_and_the_tag_repointed_is_refused(images, docker_client, registry,
                                                                            isolated_state, capsys):
    ref = _name()
    images(ref)
    _remote, digest = push(ref, f"{registry}/ngcx-gate-{secrets.token_hex(4)}")
    image_id, repo_digests = _local(docker_client, ref)
    assert any(d.endswith(digest) for d in repo_digests), repo_digests
    gate.check_local(_config(ref), image_id, repo_digests)
    assert capsys.readouterr().err == ""

    other_id, _ = images(ref)
    with pytest.raises(Refused) as refused:
        gate.check_local(_config(ref), *_local(docker_client, ref))
    line = _one_line(refused.value.line())
    assert other_id[:19] in line and digest[:19] in line and "pushed and signed" in line


def test_allow_unsigned_passes_a_repointed_tag_with_one_warning_line(images, docker_client, isolated_state, capsys):
    ref = _name()
    built_id, _ = images(ref)
    state.record_build(image=ref, release="test", variant="runtime", tag=ref, image_id=built_id)
    images(ref)
    gate.check_local(_config(ref, allow_unsigned=True), *_local(docker_client, ref))
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("ngcx: warning: --allow-unsigned: ") and ref in line


def test_an_image_never_built_nor_pushed_here_passes_with_a_not_signed_note(images, docker_client, isolated_state,
                                                                            capsys):
    ref = _name()
    images(ref)
    gate.check_local(_config(ref), *_local(docker_client, ref))
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("ngcx: note: ") and ref in line and "not signed" in line


def test_a_tag_put_back_on_an_older_push_is_refused_as_the_local_tag_moving(images, docker_client, registry,
                                                                             isolated_state):
    """Both images were pushed and signed from here; the local tag named the newest, then went back to the older
    one (`docker tag OLD REF`): refused, and the line blames the local tag, not the registry."""
    ref = _name()
    repository = f"{registry}/ngcx-gate-{secrets.token_hex(4)}"
    old_id, _ = images(ref)
    _remote, old_digest = push(ref, repository)
    images(ref)
    _remote, new_digest = push(ref, repository)
    gate.check_local(_config(ref), *_local(docker_client, ref))        # the newest: passes
    docker_client.images.get(old_id).tag(ref)
    with pytest.raises(Refused) as refused:
        gate.check_local(_config(ref), *_local(docker_client, ref))
    line = _one_line(refused.value.line())
    assert "an older image ngcx pushed" in line and old_digest[:19] in line and new_digest[:19] in line
    assert "pushed under the tag" not in line
