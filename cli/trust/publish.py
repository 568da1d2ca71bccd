"""After `ngcx push`: sign the pushed digest and attach its provenance (and its SBOM) as signed attestations.

Why right after the push, by default: issue 48 wants every pushed image provable with no extra step; the digest
is known only once the registry has the manifest (registry/push.py reads it back), and signing that digest, not
a tag, is what makes a later push under the same tag fail verification.

What the provenance says comes from facts recorded when the image was built, never re-derived at push time:
the image's labels (catalog image, release, variant; recipe and catalog sha256, base digest and wheel hashes
where the build wrote them: LABEL_* below) and the build row in the state store (the Dockerfile's sha256, the
base, start and end of the build).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .. import __version__
from .attest import CYCLONEDX, SLSA_PROVENANCE, attach, envelope, provenance, statement
from .keys import Signer, signer_for
from .ociref import Repo, parse_ref
from .sign import sign_image

# Labels a build may carry that pin its inputs (issue 48 item 1 writes them; absent ones are simply left out).
LABEL_PARAMETERS = {
    "ai.ngcx.image": "image", "ai.ngcx.release": "release", "ai.ngcx.variant": "variant",
    "ai.ngcx.recipe-sha256": "recipe_sha256", "ai.ngcx.catalog-sha256": "catalog_sha256",
    "ai.ngcx.project.name": "project", "ai.ngcx.project.lock-sha256": "lock_sha256",
    "ai.ngcx.project.model-sha256": "model_sha256", "org.opencontainers.image.base.name": "base",
}
LABEL_BASE_DIGESTS = ("ai.ngcx.base.digest", "org.opencontainers.image.base.digest")
LABEL_WHEEL_PREFIX = "ai.ngcx.wheel-sha256."   # ai.ngcx.wheel-sha256.torch = HEX (or sha256:HEX)


@dataclass(frozen=True)
class Published:
    digest: str
    signature_tag: str
    key: str                        # fingerprint of the signing key
    attestations: tuple[str, ...]   # predicate types attached
    seconds: float


def sign_and_attest(remote_ref: str, digest: str, *, local_ref: str | None = None, key: str | None = None,
                    creds: Any = None, sbom: dict[str, Any] | None = None, signer: Signer | None = None,
                    started: float | None = None, finished: float | None = None) -> Published:
    """Sign `digest` (pushed as `remote_ref`) and attach SLSA provenance, plus the CycloneDX SBOM when one is
    given or cli/trust/sbom.py can make it. `local_ref`: the local image whose labels and build row describe
    the build. started/finished: epoch seconds of the build, else taken from the build row."""
    t0 = time.perf_counter()
    ref = parse_ref(remote_ref)
    repo = Repo.of(ref, creds)
    signer = signer or signer_for(key)
    signed = sign_image(repo, digest, signer, optional={"creator": f"ngcx {__version__}"})
    labels, build = _build_facts(local_ref)
    began = started if started is not None else _build_start(build)
    ended = finished if finished is not None else (build.built_at if build else None)
    predicate = provenance(_parameters(labels, build), _dependencies(labels, build), started=_rfc3339(began),
                           finished=_rfc3339(ended), invocation=f"urn:uuid:{uuid.uuid4()}", version=__version__)
    envelopes = [(envelope(statement(ref.name, digest, SLSA_PROVENANCE, predicate), signer), SLSA_PROVENANCE)]
    bom = sbom if sbom is not None else _make_sbom(local_ref or remote_ref, digest)
    if bom is not None:
        envelopes.append((envelope(statement(ref.name, digest, CYCLONEDX, bom), signer), CYCLONEDX))
    attach(repo, digest, envelopes)
    return Published(digest, signed.tag, signed.key, tuple(kind for _e, kind in envelopes), time.perf_counter() - t0)


def prepare_signer(key: str | None) -> Signer:
    """The signer for `ngcx push --key` (ngcx's own key made now if needed), its public key read once so that a
    wrong key or an unreachable KMS fails before the push uploads anything."""
    signer = signer_for(key)
    signer.public_pem()
    return signer


def publish_after_push(remote_ref: str, digest: str, *, local_ref: str, registry: str, signer: Signer) -> Published:
    """sign_and_attest for `ngcx push`, with the push's credentials; one stderr line saying what was attached."""
    import sys

    from ..core.errors import UserError

    try:
        done = sign_and_attest(remote_ref, digest, local_ref=local_ref, creds=push_credentials(registry),
                               signer=signer)
    except UserError as exc:
        raise UserError(f"pushed {remote_ref}@{digest}, but signing it failed: {exc.message}", hint=exc.hint) from None
    kinds = ", ".join(kind.rsplit("/", 2)[-2] if kind.endswith("/v1") else "sbom" for kind in done.attestations)
    print(f"signed {digest[:19]}… with key {done.key[:19]}… ({signer.label}); attestations: {kinds} "
          f"({done.seconds:.2f} s)", file=sys.stderr)
    return done


def push_credentials(registry: str) -> Any:
    """The credentials a push to `registry` used (stored ones; a fresh token for acr:// and ecr://)."""
    from ..registry import acr, ecr
    from ..registry.credentials import stored_credentials
    from ..registry.push import target

    host, _ns, service, region = target(registry)
    if service == "ecr" and region:
        return ecr.push_login(region)
    if service == "acr" and region:
        return acr.temporary_login(region)
    return stored_credentials(host)


def _make_sbom(ref: str, digest: str) -> dict[str, Any] | None:
    """The SBOM from cli/trust/sbom.py's make_sbom(ref) when that module exists (a separate piece of issue 48).

    An image the SBOM cannot be made from (one with no Python to list its packages) is still signed, with its
    provenance: the push has happened, and leaving it unsigned would only make every deploy refuse it. One
    stderr line says that no SBOM was attached and why.
    """
    import sys

    from ..core.errors import UserError

    try:
        from .sbom import make_sbom  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        return make_sbom(ref, digest=digest)  # the SBOM names the digest it is attested for
    except UserError as exc:
        print(f"ngcx: warning: no SBOM attested for {ref}: {exc.line()}", file=sys.stderr)
        return None


def _build_facts(local_ref: str | None) -> tuple[dict[str, str], Any]:
    """(the local image's labels, its newest build row) — empty when the image or the row is not here."""
    if not local_ref:
        return {}, None
    from ..core.engine import engine_client, image_or_none
    from ..state import db as state

    image = image_or_none(engine_client(), local_ref)
    labels = dict(((image.attrs.get("Config") or {}).get("Labels") or {}) if image is not None else {})
    build = state.build_of(local_ref)
    return labels, build


def _parameters(labels: dict[str, str], build: Any) -> dict[str, Any]:
    params = {name: labels[label] for label, name in LABEL_PARAMETERS.items() if labels.get(label)}
    if build is not None and build.dockerfile_sha:
        params["dockerfile_sha256"] = build.dockerfile_sha
    return params


def _dependencies(labels: dict[str, str], build: Any) -> list[dict[str, Any]]:
    """SLSA ResourceDescriptors: the base image by digest, then each wheel whose hash the build recorded."""
    deps: list[dict[str, Any]] = []
    base_digest = next((labels[name] for name in LABEL_BASE_DIGESTS if labels.get(name)), None)
    base_name = labels.get("org.opencontainers.image.base.name") or (build.base if build is not None else None)
    if base_digest and base_digest.startswith("sha256:"):
        deps.append({"name": base_name or "base", "uri": f"docker-image:{base_name or 'base'}",
                     "digest": {"sha256": base_digest.removeprefix("sha256:")}})
    for label in sorted(labels):
        if label.startswith(LABEL_WHEEL_PREFIX):
            wheel = label.removeprefix(LABEL_WHEEL_PREFIX)
            deps.append({"name": wheel, "uri": f"pkg:pypi/{wheel}",
                         "digest": {"sha256": labels[label].removeprefix("sha256:")}})
    return deps


def _build_start(build: Any) -> float | None:
    if build is None or build.duration_s is None:
        return None
    return build.built_at - build.duration_s


def _rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
