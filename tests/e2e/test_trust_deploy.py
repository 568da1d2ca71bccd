"""Issue 48's tamper tests on every target: a deploy of a tampered image is refused in one line, nothing started.

Each target (local, the emulated Alibaba Cloud, the emulated AWS) gets the project image pushed and signed by
`ngcx push` into a repository made for this test, with a state folder of its own (its own signing key, its own
push rows), so the session clouds' repository and state, which the other e2e tests deploy from, stay untouched.
That copy is then tampered with as anyone with push access to the repository could, through the registry's
own HTTP API (tests/trust/trust_images.py): another image pushed under the signed tag (unsigned; or signed by
the same key, as an older build would be: gate.py's tag check), the signature replaced by one of another key,
the provenance edited, the SBOM edited. After each, `ngcx deploy` must exit 1 with one
line on stderr saying why, and start nothing: no instance in the emulator (not even a cloud call past the
registry token), no container on the engine, no deployment record. The registry is put back between tampers
(the exact manifest bytes), and a last `ngcx verify` shows it verifies again: the refusals were the tampers'.

The host's own check (host.sh.j2 step 3b) is tested on an emulated host machine made from the AWS bake: the
real host script, rendered for a digest whose signature was replaced, fails with "image refused" and leaves
no ngcx-serve container; with the signature put back, the same script starts it.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import pytest
from deploy_helpers import ngcx
from trust.trust_images import (
    edit_attestation,
    get_manifest_raw,
    push_other_image,
    put_manifest_raw,
    remove_images,
    replace_signature,
    split,
    tiny_image,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]

IMAGE = "ngcx-app/onnx-zero-code:latest"
SLSA = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"
TOKEN_CALLS = {"GetAuthorizationToken"}   # the gate's registry login: the only cloud call a refused deploy makes


@dataclass
class Target:
    """One deploy target with a state folder of its own and the project image pushed there for this test."""

    name: str
    cli: Callable[..., CompletedProcess[str]]     # ngcx ARGS in the target's env, with this test's state
    deploy_args: tuple[str, ...]
    started: Callable[[], Any]                    # what runs there now (compared before/after a refused deploy)
    calls: Callable[[], list[str]]                # the cloud API calls so far (none for local)
    registry_ns: str = ""                         # --registry of this test's pushes
    remote: str = ""
    digest: str = ""

    def deploy(self) -> CompletedProcess[str]:
        return self.cli("deploy", *self.deploy_args)


def _local(project: Path, docker_client, registry: str, state: Path) -> Target:
    env = {"NGCX_STATE_DIR": str(state)}
    image_id = docker_client.images.get(IMAGE).id

    def started() -> set[str]:
        return {c.id for c in docker_client.containers.list(all=True, filters={"ancestor": image_id})}

    return Target("local", lambda *a: ngcx(project, *a, env=env), ("--cloud", "local"), started, list,
                  registry_ns=f"{registry}/trust-tamper-{secrets.token_hex(4)}")


def _cloud(cloud: Any, state: Path, registry_ns: str) -> Target:
    env = {"NGCX_STATE_DIR": str(state)}

    def started() -> set[str]:
        return {i["id"] for i in cloud.emulator.instances()}

    return Target(cloud.name, lambda *a: cloud.ngcx(*a, env=env),
                  ("--cloud", cloud.name, "--gpu", cloud.gpu, "--gpu-mode", "auto"), started,
                  lambda: [name for name, _ in cloud.emulator.calls], registry_ns=registry_ns)


@pytest.fixture(params=["local", "aliyun", "aws"])
def target(request, project, docker_client, registry, tmp_path) -> Iterator[Target]:
    """The target, its image pushed and signed into a repository of this test (local tags it made: removed)."""
    state = tmp_path / "state"
    ns = f"trust-tamper-{secrets.token_hex(4)}"
    if request.param == "local":
        made = _local(project, docker_client, registry, state)
    else:
        cloud = request.getfixturevalue(request.param)
        where = "acr://cn-hangzhou" if cloud.name == "aliyun" else "ecr://us-east-1"
        made = _cloud(cloud, state, f"{where}/{ns}")
    pushed = made.cli("push", IMAGE, "--registry", made.registry_ns)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    made.remote, _, made.digest = pushed.stdout.strip().splitlines()[-1].partition("@")
    assert made.digest.startswith("sha256:"), pushed.stdout
    yield made
    with contextlib.suppress(Exception):
        docker_client.images.remove(made.remote, noprune=True)


def _refused(target: Target, *words: str) -> str:
    """Deploy; it must exit 1 with one stderr line naming the refusal, with nothing started nor recorded."""
    before, calls_before = target.started(), len(target.calls())
    done = target.deploy()
    assert done.returncode == 1, (target.name, done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, (target.name, done.stderr)
    assert lines[0].startswith("ngcx: error: image refused: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert target.started() == before, f"{target.name}: something started"
    assert set(target.calls()[calls_before:]) <= TOKEN_CALLS, target.calls()[calls_before:]
    listed = target.cli("deployments", "ls", "--all", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stdout
    return lines[0]


def _tampers(target: Target, docker_client) -> list[tuple[str, str, Callable[[], list[str]]]]:
    """(what, the tag it rewrites, do it -> the words the refusal must name)."""
    host, repo, tag = split(target.remote)
    digest = target.digest
    sig, att = digest.replace(":", "-") + ".sig", digest.replace(":", "-") + ".att"

    def retag() -> list[str]:
        return ["no signature for", push_other_image(host, repo, tag)]

    def retag_signed() -> list[str]:
        """Another image that this very key signed (an older build, say) pushed under the tag by `ngcx push`:
        its signature verifies, but it is not the digest this state pushed as IMAGE (gate.py's tag check)."""
        other = tiny_image(docker_client, f"ngcx-trust-old{secrets.token_hex(3)}/{repo.rsplit('/', 1)[-1]}", tag)
        try:
            done = target.cli("push", other, "--registry", target.registry_ns)
        finally:
            remove_images(docker_client, other)
        assert done.returncode == 0, done.stderr[-2000:]
        remote, _, other_digest = done.stdout.strip().splitlines()[-1].partition("@")
        assert remote == target.remote, (remote, target.remote)
        return ["now serves", other_digest, digest, "another image was pushed under the tag"]

    def resign() -> list[str]:
        replace_signature(host, repo, digest)
        return ["signature does not match"]

    def edit(kind: str) -> Callable[[], list[str]]:
        def apply() -> list[str]:
            edit_attestation(host, repo, digest, kind)
            return ["attestation edited", kind]
        return apply

    return [("another image under the signed tag", tag, retag),
            ("another image signed by the same key under the tag", tag, retag_signed),
            ("signature replaced", sig, resign),
            ("provenance edited", att, edit(SLSA)), ("SBOM edited", att, edit(CYCLONEDX))]


def test_each_tamper_is_refused_in_one_line_with_nothing_started(target, docker_client):
    host, repo, _tag = split(target.remote)
    for what, touched, tamper in _tampers(target, docker_client):
        original = get_manifest_raw(host, repo, touched)
        try:
            line = _refused(target, *tamper())
            print(f"{target.name}: {what}: {line}")
        finally:
            put_manifest_raw(host, repo, touched, *original)

    again = target.cli("verify", target.remote)          # put back, it verifies: the refusals were the tampers'
    assert again.returncode == 0 and target.digest in again.stdout, again.stderr


# ------------------------------------------------------------------------------ the host's own check (step 3b)

@contextlib.contextmanager
def _host_machine(cloud: Any) -> Iterator[str]:
    """A machine made from the cloud's bake (the image is on its disk already), booted, with no user-data."""
    instance_id = f"i-trusthost{secrets.token_hex(5)}"
    cloud.hosts.create(instance_id, cloud.baked, b"")
    try:
        deadline = time.monotonic() + 180
        while "ngcx-host: dockerd up" not in cloud.hosts.console_output(instance_id):
            assert time.monotonic() < deadline, cloud.hosts.console_output(instance_id)[-3000:]
            time.sleep(0.5)
        yield instance_id
    finally:
        cloud.hosts.delete(instance_id)


def _serving(cloud: Any, instance_id: str) -> str:
    """`docker ps -a` for ngcx-serve on the machine: its state, or "" when there is no such container."""
    result = cloud.hosts.run_command(instance_id, "docker ps -a --filter name=^ngcx-serve$ --format '{{.State}}'", 30)
    assert result.exit_code == 0, result.output
    return result.output.strip()


def test_the_host_refuses_a_replaced_signature_before_docker_run(aws, relay, docker_client, tmp_path):
    from ngcx.deploy import hostscript

    state = tmp_path / "state"
    pushed = aws.ngcx("push", IMAGE, "--registry", f"ecr://us-east-1/trust-host-{secrets.token_hex(4)}",
                      env={"NGCX_STATE_DIR": str(state)})
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    remote, _, digest = pushed.stdout.strip().splitlines()[-1].partition("@")
    with contextlib.suppress(Exception):
        docker_client.images.remove(remote, noprune=True)     # the local tag the push made: not needed here
    host, repo, _tag = split(remote)
    key = (state / "signing" / "cosign.pub").read_text().strip()
    job = hostscript.HostJob(4801, f"{relay.address}/{repo}@{digest}", relay.address, "0", "auto", None,
                             tls=False, verify_key=key)
    script = hostscript.render(job, "command")
    sig_tag = digest.replace(":", "-") + ".sig"
    original = get_manifest_raw(host, repo, sig_tag)
    with _host_machine(aws) as instance_id:
        replace_signature(host, repo, digest)
        try:
            refused = aws.hosts.run_command(instance_id, script, 300)
        finally:
            put_manifest_raw(host, repo, sig_tag, *original)
        assert refused.exit_code == 1, refused.output[-3000:]
        [failed] = [ln for ln in refused.output.splitlines() if "FAILED:" in ln]
        assert "image refused: " in failed and "signature does not match" in failed, failed
        assert _serving(aws, instance_id) == "", "a container was started from a refused image"

        started = aws.hosts.run_command(instance_id, script, 300)   # the same script, the signature put back
        assert started.exit_code == 0, started.output[-3000:]
        assert "signature and provenance verified on this host" in started.output
        assert "started deployment 4801" in started.output
        assert _serving(aws, instance_id) == "running"
