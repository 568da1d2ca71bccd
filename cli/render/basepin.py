"""Which image a local base tag was when it was made: the offline base's pin (state folder, bases.json).

Why an image ID and not a registry digest: `ngcx base bootstrap` makes ngcx/base:<suite> with `docker import`,
which gives an image no registry digest, and the engine's BuildKit resolves `name@sha256:...` only through one
(a build FROM ngcx/base:bookworm@sha256:<image id> asks Docker Hub for that manifest and fails offline; tried on
this machine's docker.io 20.10). So the ID is recorded when the base is made (build/base.py), the rendered
Dockerfile names it (recipes/base.j2), and `ngcx build` refuses the tag if it now names another image and checks
the result sits on the recorded image's layers (build/image.py pin_base), as a project build checks its base.
A base pulled from a registry has a digest: the build names it `repo@sha256:...`, which BuildKit resolves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

FILE = "bases.json"


def _file() -> Path:
    from ..core import paths

    return paths.state_dir() / FILE


def _load() -> dict:
    try:
        data = json.loads(_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded(tag: str) -> str | None:
    """The image ID recorded for `tag`, or None (never made by this ngcx, or made before pins were recorded)."""
    entry = _load().get(tag)
    value = entry.get("id") if isinstance(entry, dict) else None
    return value if isinstance(value, str) and value.startswith("sha256:") else None


def record(tag: str, image_id: str) -> None:
    """Pin `tag` to `image_id` (written whole through a temp file: a reader never sees half a file)."""
    data = _load()
    data[tag] = {"id": image_id, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = _file()
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:      # a full or read-only state folder: one line, and no half-written pin left
        import shutil

        from ..core.errors import UserError

        tmp.unlink(missing_ok=True)
        free = shutil.disk_usage(path.parent).free // 1024 if path.parent.is_dir() else 0
        raise UserError(f"cannot record the base pin in {path}: {exc.strerror.lower()}, {free} KB free there",
                        hint="free some space there, or set NGCX_STATE_DIR to a folder on a disk with room") from None
