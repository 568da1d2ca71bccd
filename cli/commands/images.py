"""`ngcx images`: the images ngcx built here, from the state store, checked against the engine.

Why both sources: the state store remembers what was built from which release (and how long
it took); the engine says whether the image still exists and what it weighs now.
"""

from __future__ import annotations

import typer

from .options import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command("images")
    def images_cmd(json_out: JsonOpt = False) -> None:
        """Table of images built by ngcx: tag, release, size, digest, built at."""
        from ..core import output
        from ..workstation.images import rows

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
