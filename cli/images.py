"""`ngcx images`: the images ngcx built here, from the state store, checked against the engine.

Why both sources: the state store remembers what was built from which release (and how long
it took); the engine says whether the image still exists and what it weighs now.
"""

from __future__ import annotations

import time

import typer

from ngcx.options import JsonOpt


def rows() -> list[dict]:
    """Newest build per tag, with whether the engine still has that exact image."""
    from ngcx import state
    from ngcx.engine import engine_client, image_or_none

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


def register(app: typer.Typer) -> None:
    @app.command("images")
    def images_cmd(json_out: JsonOpt = False) -> None:
        """Table of images built by ngcx: tag, release, size, digest, built at."""
        from ngcx import output

        data = rows()
        if json_out:
            output.emit_json(data)
            return
        if not data:
            print("no images built yet: run `ngcx build IMAGE[:RELEASE]`")
            return
        output.table("images built by ngcx", ["tag", "release", "size", "digest / id", "built at", "build s", ""],
                     [[r["tag"], f"{r['image']}:{r['release']}", output.human_size(r["size_bytes"]),
                       (r["digest"] or r["image_id"])[:19], r["built_at"], r["build_seconds"],
                       "" if r["present"] else "gone (rebuilt or removed)"] for r in data])
