"""The trust gate every deploy passes before anything starts: the image it runs is the one that was signed.

Why here, once, and not in each flow: every cloud flow (a lone deploy, a service's replicas, a rolling update,
a scaling group's launch template) takes its image through DeployConfig.pick_push, and the workstation through
local/verbs.py prepare; both call this module, so no flow can start an image that skipped it (issue 48, item 4).

What it checks (ngcx.trust.verify, cosign's rules):
- a pushed image: the tag ngcx pushed is resolved at the registry NOW. If it serves another digest than the one
  pushed from here, another image was pushed under the tag: refused. Else the digest's signature and its SLSA
  provenance (and any SBOM attestation) must verify with the key; the deploy then names the digest, never the tag.
- a local image (--cloud local): when it was pushed, its id must carry that push's digest (RepoDigests) and the
  push must verify as above; when it was never pushed, its id must be the one `ngcx build` recorded for the tag
  (state's builds table): a tag re-pointed at another image is refused either way. An image this state neither
  built nor pushed has nothing to be checked against: it is served with a note saying it is unsigned (the local
  engine is the one place that holds it; a cloud host can only pull a pushed, and so signed, digest).
`--allow-unsigned` skips it, and says so on stderr. Verified digests are remembered for the process, so a
service's N replicas pay for one check (0.05-0.13 s each on loopback: cli/trust/verify.py).
"""

from __future__ import annotations

import sys
from typing import Any

from ..core.errors import UserError

_VERIFIED: dict[tuple[str, str, str], str] = {}      # (repository, digest, key) -> the verdict's one line


def checked_pull(config: Any, repository: str, digest: str) -> str:
    """REPOSITORY@DIGEST once the gate passed for a cloud host's pull; raises trust.verify.Refused otherwise."""
    ref = f"{repository}@{digest}"
    if config.allow_unsigned:
        _skipped(ref)
        return ref
    _verify_once(config, repository, digest)
    return ref


def check_local(config: Any, image_id: str, repo_digests: list[str]) -> None:
    """--cloud local: the local image `config.image` (id `image_id`) is one ngcx built or pushed and signed."""
    if config.allow_unsigned:
        _skipped(config.image)
        return
    from ..state import db as state

    pushed = _pushes_of(config.image)
    held = [(repo, digest) for repo, digest, _tag in pushed if f"{repo}@{digest}" in repo_digests]
    if held:
        repository, digest = held[0]
        newest = next(d for r, d, _tag in pushed if r == repository)      # pushed is newest first
        if digest != newest:   # the local tag went back to an older push: the registry is not the one that moved
            from ..trust.verify import Refused

            raise Refused(f"image refused: {config.image} is now {image_id[:19]}…, an older image ngcx pushed "
                          f"({digest[:19]}…), not its newest push to {repository} ({newest[:19]}…)",
                          hint="rebuild or pull the newest, or push this one again (ngcx push signs it)")
        _verify_once(config, repository, digest)
        return
    build = state.build_of(config.image)
    if build is not None and build.tag == config.image and build.image_id == image_id:
        return
    if not pushed and build is None:
        print(f"ngcx: note: {config.image} is not signed (never pushed) and was not built with this state: "
              "served as the engine holds it; `ngcx push` signs it", file=sys.stderr)
        return
    from ..trust.verify import Refused

    was = pushed[0][1] if pushed else build.image_id if build else "?"
    raise Refused(f"image refused: {config.image} is now {image_id[:19]}…, not the image ngcx "
                  f"{'pushed and signed' if pushed else 'built'} under that tag ({was[:19]}…)",
                  hint="rebuild it (ngcx build) or push and sign it again, or pass --allow-unsigned")


def host_key(config: Any) -> str:
    """The public PEM a cloud host checks the image with before `docker run` (host.sh.j2 step 3b); "" with
    --allow-unsigned. Public, so it may travel in user-data (DESIGN.md "Trust")."""
    if config.allow_unsigned:
        return ""
    from ..trust.keys import public_key_for

    return public_key_for(config.trust_key).decode().strip()


def _verify_once(config: Any, repository: str, digest: str) -> None:
    """_verify_push, once per (repository, digest, key) in this process: a service's replicas share one check."""
    key = config.trust_key or ""
    if (repository, digest, key) not in _VERIFIED:
        _VERIFIED[(repository, digest, key)] = _verify_push(config.image, repository, digest, config.trust_key)


def _verify_push(image: str, repository: str, digest: str, key: str | None) -> str:
    """Resolve the tag ngcx pushed (when it knows it) and verify what it serves; the digest otherwise."""
    from ..trust.verify import Refused, require_verified

    tag = next((t for r, d, t in _pushes_of(image) if r == repository and d == digest and t), None)
    ref = f"{repository}:{tag}" if tag else f"{repository}@{digest}"
    verdict = require_verified(ref, key, creds=_credentials(repository.split("/", 1)[0]))
    if verdict.digest != digest:
        raise Refused(f"image refused: {ref} now serves {verdict.digest}, not {digest} that ngcx pushed from "
                      "here: another image was pushed under the tag",
                      hint=f"push {image} again (ngcx push signs it), or deploy with --allow-unsigned")
    return verdict.line()


def _pushes_of(image: str) -> list[tuple[str, str, str]]:
    """(REGISTRY/REPO, digest, tag) of the image's recorded pushes, newest first."""
    from ..state import db as state

    out = []
    for push in state.list_pushes(image):
        name, tag = push.remote_ref, ""
        if ":" in name.rsplit("/", 1)[-1]:
            name, _, tag = name.rpartition(":")
        out.append((name, push.digest, tag))
    return out


def _credentials(host: str) -> Any:
    """A fresh ECR/ACR token for a cloud registry (what the push used); None: stored ones, read on a 401."""
    from ..registry import acr, ecr

    try:
        if (region := ecr.region_of(host)) is not None:
            return ecr.push_login(region)
        if (region := acr.region_of(host)) is not None:
            return acr.temporary_login(region)
    except UserError:
        return None
    return None


def _skipped(ref: str) -> None:
    print(f"ngcx: warning: --allow-unsigned: {ref} is deployed without checking its signature", file=sys.stderr)
