"""images/NAME/image.yaml: which recipe blocks make an image, its own OS packages, entrypoint and ports.

Why a seed (SEED, written by `seed`): reading image.yaml is the only YAML a first `ngcx render` reads
once the catalog comes validated (catalog/cache.py), and importing PyYAML (with core/yamlio.py) for it
took 0.025-0.04 s (python -X importtime of a cold `ngcx render` on this 2-core machine, 2026-11-27) of a
command that hpccm runs in ~0.19 s (bench/results/cli.json). The recipes ngcx ships are checked ahead of
time, each under a stamp of the image name, the exact image.yaml bytes, this module's code, the YAML
loader's and the ngcx version (`stamp`): an edited image.yaml, loader or check misses its stamp and is
read and checked as before, with the same errors. tests/render/test_precompiled.py keeps SEED current
(NGCX_UPDATE_GOLDEN=1 rewrites it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError

# The OS packages every image needs, in the base layer; image.yaml's `apt:` adds an image's own in
# a layer of their own after the CUDA wheels (dockerfile.layer_blocks). Python comes from the base OS.
BASE_APT = ("ca-certificates", "python3", "python3-venv", "libgomp1")
KNOWN_BLOCKS = ("base", "python", "cuda", "framework", "devel", "runtime", "app")
# The blocks whose layers depend only on the base, python and the CUDA stack: identical in every
# image on one stack, so nothing image-specific may come before their end.
STACK_BLOCKS = ("base", "python", "cuda")
# Not written in image.yaml: rendered from its `apt:` list, placed by dockerfile.layer_blocks.
PACKAGES_BLOCK = "packages"
RECIPE_KEYS = {"blocks", "apt", "entrypoint", "cmd", "ports"}
SEED = Path(__file__).with_name("recipes.seed")
# The code a checked recipe depends on (under cli/): this module and the YAML loader.
CODE_FILES = ("render/recipe.py", "core/yamlio.py")


@dataclass(frozen=True)
class Recipe:
    """images/NAME/image.yaml, validated."""

    name: str
    blocks: tuple[str, ...]
    apt: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    ports: tuple[int, ...]
    tests_dir: Path


def load_recipe(image: str) -> Recipe:
    """Read and check images/IMAGE/image.yaml (unknown keys or blocks -> UserError); the seed's copy when current."""
    from ..core import paths

    folder = paths.images_dir() / image
    file = folder / "image.yaml"
    raw = _read(file)
    fields = _seeded(image, raw)
    if fields is None:
        fields = _checked(raw, file)
    return Recipe(name=image, tests_dir=folder / "tests", **fields)


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except FileNotFoundError:
        raise UserError(f"image {file.parent.name!r} has no recipe file {file}",
                        hint="add images/<name>/image.yaml listing its blocks") from None
    except OSError as exc:
        raise UserError(f"cannot read {file}: {exc.strerror or exc.__class__.__name__}") from None


def _checked(raw: bytes, file: Path) -> dict[str, Any]:
    """The recipe fields of image.yaml's bytes, checked (UserError names the file and the fix)."""
    from ..core.yamlio import decode_text, load_yaml

    data = load_yaml(decode_text(raw, str(file)), str(file)) or {}
    if not isinstance(data, dict):
        raise UserError(f"{file}: must be a mapping with the keys {', '.join(sorted(RECIPE_KEYS))}")
    unknown = set(data) - RECIPE_KEYS
    if unknown:
        raise UserError(f"{file}: unknown key(s) {', '.join(sorted(unknown))}",
                        hint=f"allowed: {', '.join(sorted(RECIPE_KEYS))}")
    blocks = tuple(data.get("blocks") or ())
    bad = [b for b in blocks if b not in KNOWN_BLOCKS]
    if bad or not blocks or blocks[0] != "base" or blocks[-1] != "app":
        raise UserError(f"{file}: blocks must start with base, end with app and use only "
                        f"{', '.join(KNOWN_BLOCKS)} (got {', '.join(blocks) or 'none'})")
    return {"blocks": blocks, "apt": tuple(data.get("apt") or ()),
            "entrypoint": tuple(data.get("entrypoint") or ("ngcx-runtime",)),
            "cmd": tuple(data.get("cmd") or ("info",)), "ports": tuple(data.get("ports") or ())}


def image_packages(recipe: Recipe) -> list[str]:
    """The image's own OS packages: image.yaml's `apt:` less what the base layer already installs."""
    return sorted(set(recipe.apt) - set(BASE_APT))


# ----------------------------------------------------------------------------- the seed


def stamp(image: str, raw: bytes) -> str:
    """What a seeded recipe must have been checked from: the image name, image.yaml's bytes and CODE_FILES."""
    from ..catalog.cache import source_digest

    here = Path(__file__).resolve().parent.parent
    code = source_digest([here / name for name in CODE_FILES])
    return hashlib.sha256(f"recipe\0{code}\0{image}\0".encode() + raw).hexdigest()


def _seeded(image: str, raw: bytes) -> dict[str, Any] | None:
    """The seed's checked fields for `image` when its stamp matches these bytes, else None (a miss, never an error)."""
    try:
        entry = json.loads(SEED.read_bytes())[image]
        if entry["stamp"] != stamp(image, raw):
            return None
        return {k: tuple(v) for k, v in entry["recipe"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def seed(images: Path) -> str:
    """What SEED must hold for the image folders under `images`: each image.yaml checked now, with its stamp."""
    entries = {}
    for file in sorted(images.glob("*/image.yaml")):
        raw = file.read_bytes()
        entries[file.parent.name] = {"stamp": stamp(file.parent.name, raw), "recipe": _checked(raw, file)}
    return json.dumps(entries, indent=1, sort_keys=True) + "\n"
