"""The shipped catalog's Dockerfiles rendered ahead of time: a first `ngcx render` of one is a lookup.

Why: with the catalog and the image.yaml files seeded and the recipes compiled (precompiled.py), a first
`ngcx render pytorch:24.11` (empty cache folder) still took 0.237 s against hpccm's 0.191 s, 1.23x
(bench/results/cli.json, 2026-11-27): importing Jinja2 (~0.04 s, `python -X importtime -m ngcx render`)
and the render itself; issue 24 asks for no slower than hpccm. The Dockerfile of every release x variant x
base (the catalog's public base and its offline one) ngcx ships is the same text for every user, so it
ships once, rendered: 44 Dockerfiles, ~20 KB compressed.

Why it can never give a stale text: an entry is found by the digest of every input of the render
(dockerfile.render_inputs: the release's data, the variant, the resolved base, the description, the
image.yaml, every recipe file, the render code and the ngcx version) with Jinja2's own `__init__.py`,
which holds its version (read, not imported: the import is what this saves). A recipe, image.yaml or
catalog edited since, another Jinja2 or a base of the user's own misses it and renders as before; the
file is rewritten (dockerfile.seed_texts, pack) and checked like the goldens by tests/render/test_precompiled.py.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from importlib.util import find_spec
from pathlib import Path

SEED = Path(__file__).with_name("dockerfiles.seed")


def key(inputs: str) -> str:
    """The seed's key for one render: its inputs' digest and the installed Jinja2's `__init__.py` bytes."""
    spec = find_spec("jinja2")
    if spec is None or not spec.origin:
        raise OSError("jinja2 is not installed")
    return hashlib.sha256(f"seed\0{inputs}\0".encode() + Path(spec.origin).read_bytes()).hexdigest()


def lookup(inputs: str) -> str | None:
    """The seeded Dockerfile rendered from exactly these inputs, or None (a miss, never an error)."""
    try:
        return json.loads(zlib.decompress(SEED.read_bytes()))[key(inputs)]
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return None


def pack(texts: dict[str, str]) -> bytes:
    """What SEED holds for `texts` ({key: Dockerfile}, dockerfile.seed_texts renders them): zlib'd sorted JSON."""
    return zlib.compress(json.dumps(texts, sort_keys=True, separators=(",", ":")).encode(), 9)
