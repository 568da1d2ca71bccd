"""Which build-cache records a build bench run may remove: the layers its own RUN commands made, and the
cache mounts that hold downloaded wheels (emptied before a cold build). Pure functions over the engine's
`docker system df` records, unit-tested in tests/bench/test_bench_build.py."""

from __future__ import annotations

import re
from typing import Any


def run_markers(dockerfile: str) -> set[str]:
    """The start of each RUN's command (flags and line continuations removed): how the engine's
    build-cache records name the layers these Dockerfiles made (`... exec /bin/sh -c <command>`)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    out = set()
    for line in joined.splitlines():
        if not line.startswith("RUN "):
            continue
        words = line[4:].split()
        while words and words[0].startswith("--"):
            words.pop(0)
        if words:
            out.add(" ".join(words)[:24])
    return out


def removable_records(records: list[dict[str, Any]], before: set[str], markers: set[str]) -> list[str]:
    """Build-cache records this run made that no image and no running build uses: new since the run
    began, a layer made by one of its RUN commands or stacked on one, not shared, not in use."""
    new = {r["ID"]: r for r in records if r["ID"] not in before}
    mine: set[str] = set()
    grew = True
    while grew:
        grew = False
        for rid, r in new.items():
            if rid in mine:
                continue
            described = " ".join((r.get("Description") or "").split())
            if any(f"-c {m}" in described for m in markers) or r.get("Parent") in mine:
                mine.add(rid)
                grew = True
    return sorted(rid for rid in mine
                  if new[rid].get("Type") == "regular" and not new[rid].get("Shared") and not new[rid].get("InUse"))


# The cache mounts a build downloads into: ngcx's wheel pool (recipes/macros.j2) and pip's own cache.
DOWNLOAD_CACHES = ("/root/.cache/ngcx-wheels", "/root/.cache/pip")


def download_cache_records(records: list[dict[str, Any]]) -> list[str]:
    """The build-cache records that hold downloaded wheels (DOWNLOAD_CACHES), whoever made them.

    Why: `--no-cache` ignores cache mounts, so after the warm-up builds a "cold" ngcx build would take
    every wheel from its pool and download nothing. Emptied before each cold build, the pool then holds
    what a user's first build leaves in it, which is what the rebuilds after it may use."""
    return sorted(r["ID"] for r in records
                  if r.get("Type") == "exec.cachemount" and not r.get("InUse")
                  and any((r.get("Description") or "").startswith(f"cached mount {path} ") for path in DOWNLOAD_CACHES))
