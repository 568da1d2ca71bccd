"""Which image a deploy serves (a catalog release, a local tag or the project here) and where hosts pull it from."""

from __future__ import annotations

from pathlib import Path

from ..core.engine import image_labels
from ..core.errors import UserError


def resolve(ref: str | None, project_file: Path | None, variant: str | None,
            catalog_file: Path | None) -> tuple[str, dict[str, str]]:
    """(local image tag, its labels) for IMAGE[:RELEASE], a local tag, or the project here."""
    if ref is None:
        from ..project import find_project_file
        from ..project.spec import load_project

        file = find_project_file(project_file) if project_file else find_project_file()
        if file is None:
            raise UserError(f"no IMAGE given and no ngcx.yaml in {project_file or Path.cwd()}",
                            hint="give an image, or run `ngcx init` here")
        tag = load_project(file).image_tag
        labels = image_labels(tag)
        if labels is None:
            raise UserError(f"{tag} is not built", hint=f"run `ngcx build` in {file.parent}")
        return tag, labels
    from ..core.engine import engine_client
    from ..workstation.host import resolve_image

    tag = resolve_image(ref, variant or "runtime", catalog_file)
    return tag, dict(engine_client().images.get(tag).labels or {})


def pushes(image: str, registry: str | None, sign: bool = True) -> list[tuple[str, str]]:
    """(REGISTRY/REPO, digest) of the image's verified pushes, newest first (pushed now with --registry);
    each cloud then pulls from its own registry when the image is there (DeployConfig.pick_push). A push made
    here is signed with ngcx's key unless `sign` is off (--allow-unsigned)."""
    if registry:
        from ..registry.push import push_image

        signer = None
        if sign:    # signed as `ngcx push` signs, or the trust gate would refuse what this deploy just pushed
            from ..trust.publish import prepare_signer, publish_after_push

            signer = prepare_signer(None)
        done = [push_image(image, registry)]
        if signer is not None:
            publish_after_push(*done[0], local_ref=image, registry=registry, signer=signer)
    else:
        from ..state import db as state

        done = [(p.remote_ref, p.digest) for p in state.list_pushes(image)]
        if not done:
            raise UserError(f"{image} has never been pushed, and a cloud host pulls from a registry",
                            hint="pass --registry acr://REGION/NAMESPACE (or HOST[:PORT]/NS) to push it first")
    return [(remote.rsplit(":", 1)[0] if ":" in remote.rsplit("/", 1)[-1] else remote, digest)
            for remote, digest in done]
