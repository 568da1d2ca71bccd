"""Image names and tags, in one place so build, test, push and run agree.

Local tag: ngcx/<image>:<release>-<variant>   e.g. ngcx/cuda:24.05-runtime
Remote:    <registry>[/<namespace>]/<image>:<release>-<variant>
"""

from __future__ import annotations

LOCAL_REPO_PREFIX = "ngcx"
VARIANTS = ("runtime", "devel")
DEFAULT_VARIANT = "runtime"


def local_tag(image: str, release: str, variant: str = DEFAULT_VARIANT) -> str:
    return f"{LOCAL_REPO_PREFIX}/{image}:{release}-{variant}"


def remote_tag(registry: str, image: str, release: str, variant: str = DEFAULT_VARIANT) -> str:
    return f"{registry.rstrip('/')}/{image}:{release}-{variant}"


def pin_label(component: str) -> str:
    """OCI label key carrying one pin, e.g. ai.ngcx.pin.cudnn."""
    return f"ai.ngcx.pin.{component}"


LABEL_IMAGE = "ai.ngcx.image"
LABEL_RELEASE = "ai.ngcx.release"
LABEL_VARIANT = "ai.ngcx.variant"
LABEL_MIN_DRIVER = "ai.ngcx.min-driver"
LABEL_CUDA = "ai.ngcx.cuda"
LABEL_COMPUTE_CAPABILITIES = "ai.ngcx.compute-capabilities"
