"""The images this workstation built: state rows joined with what the engine still holds."""

from __future__ import annotations

import time


def rows() -> list[dict]:
    """Newest build per tag, with whether the engine still has that exact image."""
    from ..core.engine import engine_client, image_or_none
    from ..state import db as state

    client = engine_client()
    seen: set[str] = set()
    out = []
    for b in state.list_builds():
        if b.tag in seen:
            continue
        seen.add(b.tag)
        img = image_or_none(client, b.tag)
        present = img is not None and img.id == b.image_id
        digests = (img.attrs.get("RepoDigests") or []) if img is not None else []
        out.append({
            "tag": b.tag, "image": b.image, "release": b.release, "variant": b.variant,
            "size_bytes": b.size_bytes, "image_id": b.image_id,
            "digest": digests[0].split("@", 1)[1] if digests else None,
            "built_at": time.strftime("%Y-%m-%d %H:%M", time.localtime(b.built_at)),
            "build_seconds": b.duration_s, "present": present,
        })
    return out
