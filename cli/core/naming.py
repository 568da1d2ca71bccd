"""Image names and tags, in one place so build, test, push and run agree.

Local tag: ngcx/<image>:<release>-<variant>   e.g. ngcx/cuda:24.05-runtime
Remote:    <registry>[/<namespace>]/<image>:<release>-<variant>
"""

from __future__ import annotations

import re

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

# Docker's reference grammar (distribution/reference): a registry host[:port], then lowercase path
# components, then a tag. Checked before any call so a typo is one line now, not an HTTP error later.
REGISTRY_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                           r"|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
