"""What this host has, and which local image a reference means.

Why one module: run, test, push and deploy's local target all ask the same two questions before
they start anything. "Which GPUs and which driver are here, and is the driver new enough for this
release on these GPUs?" (a CUDA 13 image on a 550 driver otherwise fails deep inside the framework
with "CUDA driver version is insufficient"); and "which local image does IMAGE[:RELEASE] or a tag
mean?" (a typo is one line naming the build command, not an engine error later).
The NVML probe, the catalog and the docker SDK are imported inside functions so `ngcx --help`
stays fast.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..core.errors import UserError

# ----------------------------------------------------------------------------- GPUs and driver


def host_has_gpu() -> tuple[bool, str]:
    """Can containers get a GPU here? Needs an NVIDIA driver and the container toolkit."""
    if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return False, "no GPU: no NVIDIA driver on this host"
    if not (shutil.which("nvidia-container-runtime") or shutil.which("nvidia-container-cli")):
        return False, "no GPU: NVIDIA Container Toolkit not installed"
    return True, ""


def host_gpus() -> tuple[str | None, list[dict]]:
    """Host driver version and GPUs, read with the same NVML probe that runs inside images."""
    from ngcx_runtime import probe

    driver, gpus, _reason = probe.driver_and_gpus()
    return (driver or {}).get("version"), gpus


def check_driver(labels: dict[str, str], release, driver: str | None, gpus: list[dict]) -> None:
    """Refuse when the host driver is below what the image needs on this host's GPUs."""
    from packaging.version import Version

    if not gpus or not driver:
        return
    for gpu in gpus:
        cc = gpu.get("compute_capability")
        need = release.min_driver_for(cc) if release is not None else labels.get("ai.ngcx.min-driver", "0")
        if Version(driver) < Version(need):
            raise UserError(
                f"host driver {driver} is too old for {labels.get('ai.ngcx.image')}:{labels.get('ai.ngcx.release')}"
                f" on GPU {gpu.get('index')} ({gpu.get('name')}, compute capability {cc}): it needs >= {need}",
                hint="upgrade the NVIDIA driver or pick an older release (`ngcx catalog ls`)")
        supported = labels.get("ai.ngcx.compute-capabilities", "").split(",")
        if cc and supported and cc not in supported:
            raise UserError(
                f"GPU {gpu.get('index')} ({gpu.get('name')}) has compute capability {cc}, which "
                f"{labels.get('ai.ngcx.image')}:{labels.get('ai.ngcx.release')} has no kernels for "
                f"(supported: {', '.join(supported)})", hint="pick a release that lists it (`ngcx catalog show`)")


# ----------------------------------------------------------------------------- local images


def resolve_image(ref: str, variant: str, catalog_file: Path | None) -> str:
    """IMAGE_REF (a local tag) or IMAGE[:RELEASE] from the catalog -> local tag."""
    from ..catalog import load_catalog
    from ..core import naming
    from ..core.engine import engine_client, image_or_none

    client = engine_client()
    if "/" in ref and image_or_none(client, ref) is not None:
        return ref
    release = load_catalog(catalog_file).resolve(ref)
    tag = naming.local_tag(release.image, release.tag, variant)
    if image_or_none(client, tag) is None:
        raise UserError(f"image {tag} is not built", hint=f"run `ngcx build {release.ref} --variant {variant}`")
    return tag


def resolve_local(client, ref: str, variant: str) -> tuple[str, str, str]:
    """(local image reference, remote image name, remote tag) for a catalog or local reference.

    A reference with '/' that exists locally is used as is (e.g. ngcx/base:bookworm). Otherwise the
    catalog names it, and the variant's build (ngcx/<image>:<release>-<variant>) must exist.
    """
    from ..core import naming
    from ..core.engine import image_or_none

    if "/" in ref:  # catalog names have no '/': this is a local image reference
        if image_or_none(client, ref) is None:
            raise UserError(f"no local image {ref!r}", hint="check `docker images`, or build it first")
        return _direct(ref)
    try:
        from ..catalog import load_catalog

        release = load_catalog().resolve(ref)
    except ImportError:
        release = None
    except UserError:
        if image_or_none(client, ref) is not None:
            return _direct(ref)
        raise
    if release is None:
        if image_or_none(client, ref) is not None:
            return _direct(ref)
        raise UserError(f"no local image {ref!r}", hint="build it (ngcx build) or check `docker images`")
    local = naming.local_tag(release.image, release.tag, variant)
    if image_or_none(client, local) is None:
        raise UserError(f"{local} is not built", hint=f"run: ngcx build {release.ref} --variant {variant}")
    return local, release.image, f"{release.tag}-{variant}"


def _direct(ref: str) -> tuple[str, str, str]:
    """'ngcx/base:bookworm' -> ('ngcx/base:bookworm', 'base', 'bookworm'); no tag means latest.

    The remote name and tag must be valid in Docker's grammar: a bad one is a UserError now, not a
    registry error after the upload.
    """
    from ..core.naming import PATH_COMPONENT, TAG

    if "@" in ref:
        raise UserError(f"cannot push a digest reference {ref!r}", hint="pass a tagged image reference")
    last = ref.rsplit("/", 1)[-1]
    name, _, tag = last.partition(":")
    if not PATH_COMPONENT.fullmatch(name) or (tag and not TAG.fullmatch(tag)):
        raise UserError(f"{ref!r} is not an image reference NAME[:TAG]",
                        hint="e.g. ngcx/base:bookworm (lowercase name; tag of letters, digits, '_', '.', '-')")
    return ref, name, tag or "latest"
