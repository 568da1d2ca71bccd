"""Behind `ngcx push`: tag a built image for a registry, push it, and prove the registry has it.

Why verify after pushing: a push that "succeeded" but left the registry with a different manifest
(a proxy rewriting it, a racing push to the same tag) would make every later deploy pull
something nobody tested. We read the manifest digest back from the registry's /v2/ API and
require it to equal the digest the engine reported for the push and the local RepoDigests, then
record local tag -> remote ref@digest in the state store.
"""

from __future__ import annotations

from ..core.errors import UserError


def target(registry: str) -> tuple[str, str, str | None, str | None]:
    """(host, namespace, cloud registry "acr" | "ecr" | None, its region) for HOST[:PORT][/NS], acr://REGION/NS
    or ecr://REGION[/REPO].

    A cloud target resolves to the region's registry endpoint (registry/acr.py, registry/ecr.py) and push_image logs
    in with a short-lived token from the SDK (ACR 1 h, ECR 12 h); nothing is stored in the docker config.
    """
    from . import acr, ecr
    from .api import split_registry

    parsed = acr.parse(registry)
    if parsed is not None:
        region, namespace = parsed
        return acr.endpoint(region), namespace, "acr", region
    parsed = ecr.parse(registry)
    if parsed is not None:
        region, namespace = parsed
        return ecr.endpoint(region), namespace, "ecr", region
    host, namespace = split_registry(registry)
    return host, namespace, None, None


def push_image(local_ref: str, registry: str, *, name: str | None = None, tag: str | None = None,
               ecr_tag_mutability: str | None = None) -> tuple[str, str]:
    """Push `local_ref` to `registry` (also acr://, ecr://), verify the digest, record it; (remote ref, digest).

    ecr://: the repository is created when missing (tag mutability: ecr_tag_mutability, else
    $NGCX_ECR_TAG_MUTABILITY, else MUTABLE; see registry/ecr.py).
    """
    from ..core.engine import engine_client
    from ..state import db as state
    from ..workstation.host import _direct
    from . import acr, ecr

    host, namespace, service, region = target(registry)
    if name is None or tag is None:
        _ref, name, tag = _direct(local_ref)
    repository = f"{host}/{namespace}/{name}" if namespace else f"{host}/{name}"
    if service == "ecr" and region:
        ecr.ensure_repository(region, repository.split("/", 1)[1], ecr_tag_mutability)
        creds = ecr.push_login(region)
    else:
        creds = acr.temporary_login(region) if service == "acr" and region else check_access(host)
    state.check()  # a locked, full or unwritable store fails before the upload, not after it
    digest = push_and_verify(engine_client(), local_ref, repository, tag, host, creds)
    state.record_push(tag=local_ref, remote_ref=f"{repository}:{tag}", digest=digest)
    return f"{repository}:{tag}", digest


def check_access(host: str):
    """Stored credentials for `host`, after proving the registry is up and accepts them."""
    from .api import registry_status
    from .credentials import stored_credentials

    creds = stored_credentials(host)
    status = registry_status(host, creds)
    if status == 401 and creds is None:
        raise UserError(f"registry {host} requires a login", hint=f"run: ngcx login {host}")
    if status == 401:
        raise UserError(f"registry {host} rejected the stored credentials for {creds.username}",
                        hint=f"run: ngcx login {host}")
    if status != 200:
        raise UserError(f"registry {host} answered HTTP {status} on /v2/",
                        hint="is this a Docker/OCI registry?")
    return creds


def push_and_verify(client, local_ref: str, repository: str, tag: str, host: str, creds) -> str:
    """Tag, push with per-layer progress, then check the registry's manifest digest."""
    from ..core.engine import image_or_none
    from .api import manifest_digest

    remote = f"{repository}:{tag}"
    had_tag = image_or_none(client, remote) is not None
    image = client.images.get(local_ref)
    image.tag(repository, tag)
    try:
        digest = stream_push(client, repository, tag, creds)
    except BaseException:
        if not had_tag:
            client.images.remove(remote, noprune=True)
        raise
    repo_path = repository.split("/", 1)[1]
    served = manifest_digest(host, repo_path, tag, creds)
    if served != digest:
        raise UserError(f"pushed {remote} but the registry serves {served}, the engine reported {digest}",
                        hint="another push to the same tag may have raced this one; push again")
    image.reload()
    if f"{repository}@{digest}" not in (image.attrs.get("RepoDigests") or []):
        raise UserError(f"pushed {remote} ({digest}) but the local image does not list that repo digest",
                        hint="push again; if it persists, check the engine's logs")
    return digest


def stream_push(client, repository: str, tag: str, creds) -> str:
    """Push through the engine, one progress bar per layer; returns the digest the engine reports."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from ..core.output import human_size

    auth = {"username": creds.username, "password": creds.password} if creds else None
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[bytes]}"))
    digest = None
    tasks: dict[str, int] = {}
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        for event in client.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
            if "error" in event:
                raise UserError(f"push of {repository}:{tag} failed: {_one_line(event['error'])}",
                                hint=_push_hint(event["error"], repository.split("/")[0]))
            if "aux" in event and event["aux"].get("Digest"):
                digest = event["aux"]["Digest"]
            layer, status = event.get("id"), event.get("status", "")
            if not layer or layer == tag:
                continue
            if layer not in tasks:
                tasks[layer] = progress.add_task(layer, total=None, bytes="")
            detail = event.get("progressDetail") or {}
            done = status in ("Pushed", "Layer already exists") or status.startswith("Mounted from")
            if detail.get("total"):
                current, total = detail.get("current", 0), detail["total"]
                progress.update(tasks[layer], total=total, completed=current, description=f"{layer} {status}",
                                bytes=f"{human_size(current, places=1)} / {human_size(total, places=1)}")
            elif done:
                progress.update(tasks[layer], total=1, completed=1, description=f"{layer} {status}")
            else:
                progress.update(tasks[layer], description=f"{layer} {status}")
    if not digest:
        raise UserError(f"push of {repository}:{tag} ended without a digest from the engine",
                        hint="check `docker info` and the registry's logs")
    return digest


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:240]


def _push_hint(error: str, host: str) -> str:
    low = error.lower()
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return f"run: ngcx login {host}"
    if "method not allowed" in low or " 405 " in low or "read-only" in low or "readonly" in low:
        return "the registry refuses uploads (read-only mode, or a pull-through mirror?)"
    if "connection refused" in low or "no such host" in low or "timeout" in low:
        return "is the registry running and reachable from the Docker Engine?"
    if " 500 " in low or "internal server error" in low or "no space left" in low:
        return "the registry could not store the upload (is its storage full?); nothing was recorded, see its logs"
    return "see the registry's logs"
