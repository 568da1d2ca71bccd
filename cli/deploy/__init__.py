"""`ngcx deploy`: the same image, served on a GPU — this workstation or a cloud instance.

The router (SkyPilot's shape, cloud-apis.md §11.2): every target is a subpackage (local/, aliyun/, aws/;
kubernetes/ writes manifests instead) whose verbs.py has the same verbs — run (create or reuse a host and
start the container), query, start, stop, terminate, logs, orphans, install_key_hashes (the endpoint's
accepted keys), certificate (the host's TLS one) — and a CAPABILITIES declaration (common.Capabilities).
flow.py walks a deploy through them and the state store. The contracts and flows never import a target
(pyproject's import-linter contracts), so a new target is a new folder.
vm.py is what the VM clouds share; image.py says which image a deploy serves, bake.py makes host images,
offers.py ranks instance types, store.py keeps the records, hostscript.py renders what a host runs,
keys.py keeps each endpoint's key, security.py pins TLS, checks and rotates keys.
Only the standard library and typer load at import time: cloud SDKs are imported by the target
that needs them, when it needs them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = ("local", "aliyun", "aws")
CLOUDS = tuple(t for t in TARGETS if t != "local")   # the VM clouds `--cloud any` ranks and fails over across
VERBS = ("CAPABILITIES", "prepare", "run", "container_failure", "cleanup_failed", "query", "start", "stop",
         "terminate", "logs", "orphans", "delete_orphan", "install_key_hashes", "certificate")


def target(cloud: str) -> ModuleType:
    """The module for `cloud`; an unknown name is one line naming the known ones."""
    from ..core.errors import UserError

    if cloud not in TARGETS:
        raise UserError(f"unknown cloud {cloud!r}", hint=f"use one of: {', '.join(TARGETS)}")
    module = importlib.import_module(f"ngcx.deploy.{cloud}.verbs")
    missing = [verb for verb in VERBS if not hasattr(module, verb)]
    assert not missing, f"deploy target {cloud} lacks {missing}"
    return module

